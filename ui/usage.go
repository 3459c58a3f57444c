package ui

// The Usage page (/usage): GPU-hours per owner per day, held against busy,
// and each machine's utilisation now — charts drawn here as SVG, so the
// page fetches nothing from elsewhere and works under the dashboard's
// content security policy.

import (
	"html"
	"html/template"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// usageRanges are the periods the page offers, in days.
var usageRanges = []int{7, 14, 30, 90}

// usageTopOwners is how many owners get a chart of their own; the rest are
// summed as "others".
const usageTopOwners = 10

// usagePage is what the "usage" template sees.
type usagePage struct {
	pageData
	Days, Since, Until string
	Ranges             []int
	Range              int
	Owners             template.HTML // the owners' charts
	Machines           template.HTML // utilisation per machine now
	Rows               []arbiter.UsageRow
	Total              arbiter.UsageRow
	v                  *view
}

// OwnerClass is the owner's colour, as on the dashboard.
func (p *usagePage) OwnerClass(owner string) string { return p.v.OwnerClass(owner) }

// handleUsage serves the Usage page, or the sign-in form.
func (u *Dashboard) handleUsage(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	c, ok := u.authenticate(r)
	if !ok {
		return u.render(w, http.StatusOK, "login", &pageData{})
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "days"); err != nil {
		return err
	}
	days := 14
	if v := q.Get("days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 400 {
			return arbiter.Errorf(arbiter.EInvalid, "days %q: want a number of days from 1 to 400", arbiter.Clip(v, 20))
		}
		days = n
	}
	v := u.newView(r, c)
	now := v.Now
	until := now.UTC().Format(time.DateOnly)
	since := now.UTC().AddDate(0, 0, -(days - 1)).Format(time.DateOnly)
	live := u.plane.Allocations(arbiter.AllocationFilter{State: arbiter.StateReady})
	ds := arbiter.CollectUsageDays(u.plane.Records(arbiter.RecordUsageDay), live, since, until, now)
	rows, _ := arbiter.SummarizeUsage(ds, arbiter.UsageByOwner) // a known grouping: no error
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].GPUHours > rows[j].GPUHours })
	var total arbiter.UsageRow
	for _, row := range rows {
		total.GPUHours += row.GPUHours
		total.BusyGPUHours += row.BusyGPUHours
		total.IdleGPUHours += row.IdleGPUHours
		total.Allocations += row.Allocations
	}
	p := &usagePage{
		pageData: pageData{Caller: c, Open: u.open, Now: now, Version: u.version, Page: "usage", Cluster: u.clusterNow()},
		Since:    since, Until: until, Ranges: usageRanges, Range: days,
		Owners:   v.ownerCharts(ds, rows, since, days),
		Machines: v.machineChart(v.Machines()),
		Rows:     rows, Total: total, v: v,
	}
	return u.renderUsage(w, p)
}

// renderUsage executes the "usage" template, as render does the page.
func (u *Dashboard) renderUsage(w http.ResponseWriter, p *usagePage) error {
	p.static = u.static
	var b strings.Builder
	if err := u.pages.ExecuteTemplate(&b, "usage", p); err != nil {
		return err
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(b.String()))
	return nil
}

// ownerCharts draws, for each of the owners who held the most GPU time
// (and "others" for the rest), a bar per day: its height the GPU-hours
// held, the solid part the hours busy. All charts share one scale, so
// their bars compare.
func (v *view) ownerCharts(ds []arbiter.UsageDay, rows []arbiter.UsageRow, since string, days int) template.HTML {
	if len(rows) == 0 {
		return template.HTML(`<p class="empty">No GPU time was held in these days.</p>`)
	}
	start, _ := time.Parse(time.DateOnly, since)
	dayIndex := map[string]int{}
	for i := 0; i < days; i++ {
		dayIndex[start.AddDate(0, 0, i).Format(time.DateOnly)] = i
	}
	type series struct {
		owner      string
		held, busy []float64
	}
	top := map[string]*series{}
	var order []*series
	for i, row := range rows {
		if i == usageTopOwners && len(rows) > usageTopOwners+1 {
			break
		}
		s := &series{owner: row.Key, held: make([]float64, days), busy: make([]float64, days)}
		top[row.Key] = s
		order = append(order, s)
	}
	var others *series
	if len(order) < len(rows) {
		others = &series{owner: "", held: make([]float64, days), busy: make([]float64, days)}
		order = append(order, others)
	}
	peak := 0.0
	for _, d := range ds {
		i, ok := dayIndex[d.Day]
		if !ok {
			continue
		}
		s := top[d.Owner]
		if s == nil {
			s = others
		}
		s.held[i] += d.GPUS / 3600
		s.busy[i] += d.BusyGPUS / 3600
		peak = max(peak, s.held[i])
	}
	if peak == 0 {
		peak = 1
	}
	const w, h, gap = 560, 64, 2
	bw := float64(w)/float64(days) - gap
	var b strings.Builder
	b.WriteString(`<div class="charts">`)
	for _, s := range order {
		name, class := "others", "others"
		if s != others {
			name, class = arbiter.ShortOwner(s.owner), v.OwnerClass(s.owner)
		}
		var held, busy float64
		for i := range s.held {
			held += s.held[i]
			busy += s.busy[i]
		}
		b.WriteString(`<figure class="chart ` + class + `"><figcaption><span class="chip-name">` + html.EscapeString(name) + `</span> ` +
			hours(held) + ` held · ` + hours(busy) + ` busy</figcaption>`)
		b.WriteString(`<svg viewBox="0 0 ` + itoa(w) + ` ` + itoa(h) + `" role="img" aria-label="` + html.EscapeString(name) + `: GPU-hours held and busy per day">`)
		for i := range s.held {
			x := strconv.FormatFloat(float64(i)*(bw+gap), 'f', 1, 64)
			day := start.AddDate(0, 0, i).Format(time.DateOnly)
			hh := s.held[i] / peak * h
			bh := s.busy[i] / peak * h
			b.WriteString(`<g><title>` + day + `: ` + hours(s.held[i]) + ` held, ` + hours(s.busy[i]) + ` busy</title>`)
			b.WriteString(`<rect class="day" x="` + x + `" y="0" width="` + f1(bw) + `" height="` + itoa(h) + `"/>`)
			if hh > 0 {
				b.WriteString(`<rect class="held" x="` + x + `" y="` + f1(h-hh) + `" width="` + f1(bw) + `" height="` + f1(hh) + `"/>`)
			}
			if bh > 0 {
				b.WriteString(`<rect class="busy" x="` + x + `" y="` + f1(h-bh) + `" width="` + f1(bw) + `" height="` + f1(bh) + `"/>`)
			}
			b.WriteString(`</g>`)
		}
		b.WriteString(`</svg></figure>`)
	}
	b.WriteString(`</div>`)
	return template.HTML(b.String())
}

// machineChart draws each GPU machine's utilisation now: a bar per
// machine, its length the mean utilisation of the GPUs that reported it,
// with how many of its GPUs are held and how many reported.
func (v *view) machineChart(ms []arbiter.MachineStatus) template.HTML {
	const w, rowH = 720, 22
	type line struct {
		name           string
		util           float64
		sampled, total int
		held           int
	}
	var lines []line
	for _, m := range ms {
		if m.Kind != arbiter.KindGPU || len(m.Devices) == 0 {
			continue
		}
		l := line{name: m.Name, total: len(m.Devices)}
		sum := 0
		for _, d := range m.Devices {
			if d.Allocation != nil {
				l.held++
			}
			if d.Usage != nil && d.Usage.UtilPct != nil {
				l.sampled++
				sum += *d.Usage.UtilPct
			}
		}
		if l.sampled > 0 {
			l.util = float64(sum) / float64(l.sampled)
		}
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return template.HTML(`<p class="empty">No GPU machines.</p>`)
	}
	var b strings.Builder
	b.WriteString(`<svg class="util-chart" viewBox="0 0 ` + itoa(w) + ` ` + itoa(rowH*len(lines)) + `" role="img" aria-label="GPU utilisation per machine now">`)
	for i, l := range lines {
		y := i * rowH
		text := "no samples"
		if l.sampled > 0 {
			text = strconv.Itoa(int(l.util+0.5)) + "% of " + arbiter.Plural(l.sampled, "GPU")
		}
		text += " · " + strconv.Itoa(l.held) + "/" + strconv.Itoa(l.total) + " held"
		b.WriteString(`<g><title>` + html.EscapeString(l.name+": "+text) + `</title>`)
		b.WriteString(`<text class="label" x="0" y="` + itoa(y+15) + `">` + html.EscapeString(arbiter.Clip(l.name, 18)) + `</text>`)
		b.WriteString(`<rect class="track" x="160" y="` + itoa(y+4) + `" width="280" height="14"/>`)
		if l.sampled > 0 {
			b.WriteString(`<rect class="util" x="160" y="` + itoa(y+4) + `" width="` + f1(l.util/100*280) + `" height="14"/>`)
		}
		b.WriteString(`<text class="value" x="450" y="` + itoa(y+15) + `">` + html.EscapeString(text) + `</text></g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// hours writes GPU-hours briefly: "0.4 h", "12 h", "1,204 h".
func hours(h float64) string {
	if h < 10 {
		return strconv.FormatFloat(h, 'f', 1, 64) + " h"
	}
	s := strconv.FormatFloat(h, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s + " h"
}

func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

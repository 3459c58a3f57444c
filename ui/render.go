package ui

import (
	"hash/fnv"
	"html"
	"html/template"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// funcs are the helpers the dashboard's templates may call.
var funcs = template.FuncMap{
	"iso":     isoTime,
	"abs":     abs,
	"ago":     ago,
	"rel":     relTime,
	"model":   shortModel,
	"gib":     gib,
	"wants":   wants,
	"devices": arbiter.DevicesText,
	"holds":   holds,
	"held":    held,
	"deref":   func(p *string) string { return arbiter.StrOr(p, "") },
	// etaless is why_queued without its "; ETA …" (the queue shows the ETA in a column).
	"etaless": func(p *string) string {
		s := arbiter.StrOr(p, "")
		if i := strings.LastIndex(s, "; ETA "); i >= 0 {
			return s[:i]
		}
		return s
	},
	"who": arbiter.ShortOwner,
	// isolated shows an event summary's parts (joined by " · ") each
	// isolated, so that a right-to-left owner's name does not reorder the
	// parts around it (a cron after it).
	"isolated": func(summary string) template.HTML {
		parts := strings.Split(summary, " · ")
		for i, p := range parts {
			parts[i] = "<bdi>" + template.HTMLEscapeString(p) + "</bdi>"
		}
		return template.HTML(strings.Join(parts, " · "))
	},
	"plural": arbiter.Plural,
	"join":   strings.Join,
	"secs":   secs,
	"num":    num,
	"cls":    class,
}

// class turns an event kind into a class name: "allocation-ready".
func class(s string) string { return strings.ReplaceAll(s, ".", "-") }

// num writes a keepalive interval as a plain number of seconds for the
// page's script ("" for never).
func num(p *float64) string {
	if p == nil {
		return ""
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}

// isoTime is the machine-readable form of t in a <time datetime>.
func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// abs is the absolute form of t shown on hover (the page's script turns it
// into the reader's local time).
func abs(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

// ago says how long before now t was ("3 min ago", "just now" under
// 5 s), or how long after ("in 20 s"). Under a second ahead is "just now"
// too: that is the page's millisecond rounding or two clocks, not a time
// to come. ui/static/app.js has the same rule, to keep the words in step
// between renderings.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	if d > -time.Second && d < 5*time.Second {
		return "just now"
	}
	future := d < 0
	if future {
		d = -d
	}
	var s string
	switch {
	case d < time.Minute:
		s = strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		s = strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		s = strconv.Itoa(int(d/time.Hour)) + " h"
	default:
		s = strconv.Itoa(int(d/(24*time.Hour))) + " d"
	}
	if future {
		return "in " + s
	}
	return s + " ago"
}

// relTime renders t (a time.Time or *time.Time) as a <time> element with
// the relative words as text and the absolute time on hover; "—" for nil.
func relTime(now time.Time, t any) template.HTML {
	var tt time.Time
	switch x := t.(type) {
	case time.Time:
		tt = x
	case *time.Time:
		if x == nil {
			return "—"
		}
		tt = *x
	default:
		return "—"
	}
	if tt.IsZero() {
		return "—"
	}
	return relTimeAttrs(now, tt)
}

// relTimeAttrs is relTime with more attributes: name, value pairs.
func relTimeAttrs(now, t time.Time, attrs ...string) template.HTML {
	var b strings.Builder
	b.WriteString(`<time datetime="` + isoTime(t) + `" title="` + abs(t) + `" data-rel`)
	for i := 0; i+1 < len(attrs); i += 2 {
		b.WriteString(" " + attrs[i] + `="` + html.EscapeString(attrs[i+1]) + `"`)
	}
	b.WriteString(">" + html.EscapeString(ago(now, t)) + "</time>")
	return template.HTML(b.String()) //nolint:gosec // every part is escaped or our own
}

// shortModel drops the vendor from a GPU model: "H100 80GB HBM3".
func shortModel(m string) string {
	m = strings.TrimSpace(m)
	for _, p := range []string{"NVIDIA ", "Nvidia ", "GeForce ", "Tesla "} {
		m = strings.TrimPrefix(m, p)
	}
	if m == "" {
		return "GPU"
	}
	return m
}

// gib writes an amount of VRAM: "80 GiB", "23.5 GiB".
func gib(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64) + " GiB"
}

func itoa(n int) string { return strconv.Itoa(n) }

// ownerPalette is how many owner colours app.css defines (.o0 … .o15:
// eight hues, plain and hatched).
const ownerPalette = 16

// ownerClass gives an owner one of the palette's colours from its name
// alone (view.OwnerClass avoids clashes between the owners on the page).
func ownerClass(owner string) string {
	return "o" + strconv.Itoa(ownerHash(owner))
}

func ownerHash(owner string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(owner))
	return int(h.Sum32() % ownerPalette)
}

// wants says what a request asks for: "4 GPUs · ≥ 40 GiB · *H100* · on
// gpu1", "2 × 1 triads · on spin5", "a slot of pool small".
func wants(r arbiter.Request) string {
	switch {
	case r.Grid != nil:
		s := gridWants(r.Grid)
		if r.Machine != "" {
			s += " · on " + r.Machine
		}
		return s
	case r.Pool != "":
		return "a slot of pool " + r.Pool
	}
	parts := []string{arbiter.Plural(r.GPUs, "GPU")}
	if r.MinVRAMGiB > 0 {
		parts = append(parts, "≥ "+gib(r.MinVRAMGiB))
	}
	if r.Model != "" {
		parts = append(parts, "model "+r.Model)
	}
	if r.MinCompute != "" {
		parts = append(parts, "compute ≥ "+r.MinCompute)
	}
	if r.RequireCUDA {
		parts = append(parts, "CUDA")
	}
	if len(r.Tags) > 0 {
		parts = append(parts, "tags "+strings.Join(r.Tags, ", "))
	}
	if r.Machine != "" {
		parts = append(parts, "on "+r.Machine)
	}
	return strings.Join(parts, " · ")
}

// held says how long an ended allocation held its devices, or that it
// never got any.
func held(a arbiter.Allocation) string {
	if a.ReadyAt == nil || a.DestroyedAt == nil {
		return "never placed"
	}
	d := a.DestroyedAt.Sub(*a.ReadyAt)
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + " h " + strconv.Itoa(int(d%time.Hour/time.Minute)) + " min"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + " d"
}

// secs writes a keepalive interval: "30 s", "never".
func secs(p *float64) string {
	if p == nil {
		return "never"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64) + " s"
}

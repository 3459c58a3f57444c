package ui

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Fair share (docs/guides/fair-share.md): the groups' standings and
// quotas, and the reservations on a timeline. The queue panel (panels.go)
// shows each request's position, group, factor and ETA.

// standings are the groups' standings brought to the page's time, by
// group (nil when no group is configured).
func (v *view) standings() map[string]arbiter.GroupStanding {
	raw := records[arbiter.GroupStanding](v, arbiter.RecordStanding)
	if len(raw) == 0 {
		return nil
	}
	out := map[string]arbiter.GroupStanding{}
	for _, s := range arbiter.StandingsAt(raw, v.Now) {
		out[s.Group] = s
	}
	return out
}

// fairshare is what the fair-share panel shows.
type fairshare struct {
	HalfLife string
	Groups   []standing
	Quotas   []quotaRow
}

type standing struct {
	arbiter.GroupStanding
	FactorText string
	FactorPct  int // the factor as a bar, 0–100
}

type quotaRow struct {
	arbiter.QuotaStatus
	Max  string // "8 GPUs", "100 GPU-h / 7d"
	Used string // "6 GPUs", "42.0 GPU-h (+8.0 committed)"
	Pct  int
}

func fairshareData(v *view) (any, bool) {
	st := v.standings()
	qs := records[arbiter.QuotaStatus](v, arbiter.RecordQuotaStatus)
	if len(st) == 0 && len(qs) == 0 {
		return nil, false
	}
	var d fairshare
	if pol := records[arbiter.FairSharePolicy](v, arbiter.RecordFairSharePolicy); len(pol) == 1 {
		d.HalfLife = arbiter.HumanDuration(time.Duration(pol[0].HalfLifeS * float64(time.Second)))
	}
	for _, g := range st {
		d.Groups = append(d.Groups, standing{GroupStanding: g, FactorText: arbiter.FormatShare(g.Factor), FactorPct: int(g.Factor*100 + 0.5)})
	}
	sort.Slice(d.Groups, func(i, j int) bool {
		if d.Groups[i].Rank != d.Groups[j].Rank {
			return d.Groups[i].Rank < d.Groups[j].Rank
		}
		return d.Groups[i].Group < d.Groups[j].Group
	})
	arbiter.SortQuotaStatuses(qs)
	for _, q := range qs {
		r := quotaRow{QuotaStatus: q}
		var parts, used []string
		if q.MaxGPUs != nil {
			parts = append(parts, arbiter.Plural(*q.MaxGPUs, "GPU"))
			used = append(used, arbiter.Plural(q.HeldGPUs, "GPU"))
			if *q.MaxGPUs > 0 {
				r.Pct = min(100, 100*q.HeldGPUs / *q.MaxGPUs)
			}
		}
		if q.MaxGPUHours != nil {
			parts = append(parts, fmt.Sprintf("%g GPU-h / %s", *q.MaxGPUHours, arbiter.HumanDuration(q.Window())))
			used = append(used, fmt.Sprintf("%.1f GPU-h (+%.1f committed)", q.UsedGPUHours, q.CommittedGPUHours))
			if *q.MaxGPUHours > 0 {
				r.Pct = max(r.Pct, min(100, int(100*(q.UsedGPUHours+q.CommittedGPUHours) / *q.MaxGPUHours)))
			}
		}
		if q.Model != "" {
			parts[0] += " of " + q.Model
		}
		r.Max, r.Used = strings.Join(parts, ", "), strings.Join(used, ", ")
		d.Quotas = append(d.Quotas, r)
	}
	return d, true
}

// queueGroup is the queue panel's group cell: the group and its factor.
func (v *view) queueGroup(a *arbiter.Allocation, st map[string]arbiter.GroupStanding) string {
	if a.Group == "" {
		return ""
	}
	if g, ok := st[a.Group]; ok {
		return fmt.Sprintf("%s · F %s", a.Group, arbiter.FormatShare(g.Factor))
	}
	return a.Group
}

// Reservations on a timeline: from now, timelineSpan wide, drawn in SVG
// (the page's Content-Security-Policy allows no inline styles) on an axis
// of timelineWidth units.

const (
	timelineSpan  = 7 * 24 * time.Hour
	timelineWidth = 1000
)

type reservations struct {
	Rows  []resRow
	Ticks []tick // day marks
	Span  string
}

type resRow struct {
	arbiter.Reservation
	Devices string
	When    string // "open until …", "Sun 02:00 for 4h"
	X, W    string // the bar's place on the axis
	Shown   bool   // the window falls within the span
}

type tick struct {
	X     string // on the axis
	Label string
}

func reservationsData(v *view) (any, bool) {
	rs := records[arbiter.Reservation](v, arbiter.RecordReservation)
	if len(rs) == 0 {
		return nil, false
	}
	arbiter.SortReservations(rs)
	now := v.Now
	pct := func(t time.Time) float64 {
		return timelineWidth * min(max(t.Sub(now).Seconds(), 0), timelineSpan.Seconds()) / timelineSpan.Seconds()
	}
	d := reservations{Span: arbiter.HumanDuration(timelineSpan)}
	day := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	for ; day.Before(now.Add(timelineSpan)); day = day.Add(24 * time.Hour) {
		d.Ticks = append(d.Ticks, tick{X: fmt.Sprintf("%.1f", pct(day)), Label: day.Format("Mon 02")})
	}
	for _, r := range rs {
		row := resRow{Reservation: r}
		var ms []string
		for _, dv := range r.Devices {
			if len(ms) == 0 || ms[len(ms)-1] != dv.Machine {
				ms = append(ms, dv.Machine)
			}
		}
		row.Devices = fmt.Sprintf("%s on %s", arbiter.Plural(r.GPUs, "GPU"), strings.Join(ms, ", "))
		if r.WindowStart != nil {
			s, e := *r.WindowStart, *r.WindowEnd
			if r.Active {
				row.When = "open until " + e.UTC().Format("Mon 15:04 UTC")
			} else {
				row.When = s.UTC().Format("Mon 02 Jan 15:04 UTC") + " for " + arbiter.HumanDuration(r.Duration())
			}
			if s.Before(now.Add(timelineSpan)) {
				l, w := pct(s), pct(e)-pct(s)
				row.X, row.W, row.Shown = fmt.Sprintf("%.1f", l), fmt.Sprintf("%.1f", max(w, 3)), true
			}
		}
		d.Rows = append(d.Rows, row)
	}
	return d, true
}

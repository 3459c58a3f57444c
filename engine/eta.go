package engine

import (
	"container/heap"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

// Queue positions and ETAs (docs/guides/fair-share.md). With each Flush
// (once per committed batch, not per decision) every queued request gets
// its place in the queue (position, 1 first) and, for the first etaMax,
// when it is expected to start (eta): the queue is played forward on a copy
// of the holdings, with the placement of the real scheduler (the same find,
// masks and starvation holds, group ranks brought forward with time), from
// now to each moment GPUs free by a known end — a time limit, a
// reservation's window, a preemption. A request that only an allocation
// without an end blocks has no ETA. The ETA also ends why_queued
// ("…; ETA 2026-11-25T18:20:00Z"). Positions and ETAs are shown in the
// read view, not saved: they are derived, and a restart works them out
// again.

// etaMax is how many queued requests get an ETA.
const etaMax = 200

// etaSteps bounds the moments one simulation plays; etaHorizon how far
// ahead it looks.
const (
	etaSteps   = 300
	etaHorizon = 14 * 24 * time.Hour
)

// A simulation that took more than etaHeavy units of work (requests looked
// at, ends played) is not played again within etaEvery of engine time: a
// storm of decisions on a large cluster refreshes its ETAs once a second
// (a deadline brings the last refresh), a small one at every batch.
const (
	etaHeavy = 20000
	etaEvery = time.Second
)

// etaSep starts the ETA part of why_queued.
const etaSep = "; ETA "

// whyBase is why_queued without its ETA part.
func whyBase(s string) string {
	if i := strings.LastIndex(s, etaSep); i >= 0 {
		return s[:i]
	}
	return s
}

// fsFlush refreshes positions and ETAs when the queue or the holdings
// changed since the last Flush.
func (e *Engine) fsFlush() {
	fs := &e.fs
	if fs.qver != fs.shownVer {
		fs.shownVer = fs.qver
		for i, a := range e.queue {
			if p := a.a.Position; p == nil || *p != i+1 {
				n := i + 1
				a.a.Position = &n
				e.p.touchedAllocs[a.a.ID] = struct{}{}
			}
		}
	}
	if !fs.etaDirty {
		return
	}
	if fs.simWork > etaHeavy && fs.lastNow.Sub(fs.lastSim) < etaEvery {
		if fs.etaDL.pos < 0 {
			e.dl.set(&fs.etaDL, fs.lastSim.Add(etaEvery)) // the Flush after that Tick refreshes them
		}
		return
	}
	e.dl.clear(&fs.etaDL)
	fs.etaDirty = false
	e.notifyFree(fs.lastNow) // notify.go
	var etas []time.Time
	// Without ends, reservations or a quota that frees in time, nothing
	// queued can be given a time.
	quotaHeld := slices.ContainsFunc(e.queue, func(a *alloc) bool { return a.fs != nil && a.fs.quota != "" })
	if len(e.queue) > 0 && (fs.limited > 0 || len(fs.res) > 0 || quotaHeld) {
		etas, fs.simWork = e.simulate(fs.lastNow)
		fs.lastSim = fs.lastNow
	}
	for i, a := range e.queue {
		var t time.Time
		if i < len(etas) {
			t = etas[i]
		}
		e.setETA(a, t)
	}
	// The standings and quotas also when nothing waits: what the groups
	// hold changed.
	if fs.none == nil && len(fs.glist) > 1 {
		e.fsShowStandings(fs.lastNow)
	}
	e.quotaShowAll(fs.lastNow)
}

// setETA shows a's ETA (zero: unknown) in its allocation and why_queued.
func (e *Engine) setETA(a *alloc, t time.Time) {
	if t.IsZero() && a.a.ETA == nil {
		return // nothing shown (why_queued has an ETA only with eta), nothing to show
	}
	var why *string
	if a.a.WhyQueued != nil {
		w := whyBase(*a.a.WhyQueued)
		if !t.IsZero() {
			w += etaSep + t.UTC().Format(time.RFC3339)
		}
		why = &w
	}
	same := (a.a.ETA == nil) == t.IsZero() && (t.IsZero() || a.a.ETA.Equal(t))
	if same && (why == nil || *why == *a.a.WhyQueued) {
		return
	}
	if t.IsZero() {
		a.a.ETA = nil
	} else {
		tt := t.UTC()
		a.a.ETA = &tt
	}
	a.a.WhyQueued = why
	e.p.touchedAllocs[a.a.ID] = struct{}{}
	e.explainSlots(a) // a pool's backing: its waiting slots show its ETA too (pools.go)
}

// simEnd is a holder in the simulation, and its end when it has one.
type simEnd struct {
	at    time.Time // zero: no end
	mi    int
	pos   []int
	id    int64
	group *simGroup
	gpus  int
	qs    []*fsQuota
	qn    []int
	// What preemption looks at (preempt.go).
	prio        int
	ready       time.Time
	preemptible bool
	preempting  bool
	forID       int64 // preempting: the request it is preempted for (Preempting.For)
	dead        bool  // replaced in the heap by an earlier end
}

type simEnds []*simEnd

func (h simEnds) Len() int { return len(h) }
func (h simEnds) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].id < h[j].id
}
func (h simEnds) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simEnds) Push(x any)   { *h = append(*h, x.(*simEnd)) }
func (h *simEnds) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// simGroup is a group's usage in the simulation.
type simGroup struct {
	g    *fsGroup
	u    float64
	at   time.Time
	n    int
	rank int
	x    float64
}

// simReq is a queued request in the simulation.
type simReq struct {
	a      *alloc
	i      int // its index in the queue
	group  *simGroup
	quotas []*fsQuota // its max_gpus quotas without a model
	elig   []int      // the machines that could ever hold it (nil: not worked out yet)
	placed bool
	// from: it may not start before (an hours quota frees then); zero
	// with never: it never starts in the simulation.
	from  time.Time
	never bool
}

// simulate plays the queue forward and returns, per queued request (the
// first etaMax), when it starts (zero: not within the simulation), and the
// work it took.
func (e *Engine) simulate(now time.Time) ([]time.Time, int) {
	work := len(e.ms) + len(e.allocs)
	fs := &e.fs
	n := min(len(e.queue), etaMax)
	etas := make([]time.Time, n)
	// The holdings, with releasing GPUs free (the agent frees them within
	// a report) and down or draining machines unusable.
	held := make([][]int64, len(e.ms))
	cl := place.Cluster{Machines: e.cluster.Machines, Held: held, Index: place.NewIndex(len(e.ms))}
	for i, mc := range e.ms {
		h := append([]int64(nil), mc.held...)
		if gm := e.gt.ms[mc.m.Name]; gm != nil {
			for p := range h {
				if h[p] == heldBlocked {
					if gg := gm.gpus[mc.m.GPUs[p].Index]; gg != nil && gg.releasing != nil && gg.unhealthy == nil && gg.drained == nil && len(gg.unmanaged) == 0 {
						h[p] = 0
					}
				}
			}
		}
		held[i] = h
		if e.cluster.Index.Free(i) >= 0 {
			cl.Index.Set(i, freeGPUs(&mc.m, h))
		}
	}
	groups := map[*fsGroup]*simGroup{}
	var glist []*simGroup
	for _, g := range fs.glist {
		sg := &simGroup{g: g, u: g.u, at: g.at, n: g.n, rank: g.rank}
		groups[g] = sg
		glist = append(glist, sg)
	}
	qcount := map[*fsQuota]int{}
	for _, fq := range fs.quotas {
		qcount[fq] = fq.held
	}
	ends := &simEnds{}
	holders := map[int64]*simEnd{}
	victims := map[int64][]*simEnd{} // preemptor → the holders preempted for it (preemptHold)
	for _, id := range sortedKeys(e.allocs) {
		a := e.allocs[id]
		if !accountedGPUs(a) || a.a.State != arbiter.StateReady || a.a.ReadyAt == nil {
			continue
		}
		end := &simEnd{mi: a.mach.pos, id: a.a.ID, gpus: len(a.gpus), prio: a.a.Priority, ready: *a.a.ReadyAt,
			preemptible: a.a.Preemptible && a.fs != nil, preempting: a.a.Preempting != nil}
		if a.a.Preempting != nil && a.a.Preempting.For != 0 {
			end.forID = a.a.Preempting.For
			victims[end.forID] = append(victims[end.forID], end)
		}
		holders[a.a.ID] = end
		if a.a.EndsAt != nil {
			end.at = *a.a.EndsAt
		}
		for _, idx := range a.gpus {
			end.pos = append(end.pos, gpuPos(&a.mach.m, idx))
		}
		if a.fs != nil {
			end.group = groups[a.fs.group]
			if a.fs.counted == 0 {
				end.group = nil
			}
			end.qs = a.fs.quotas
			end.qn = a.fs.qheld
		}
		if !end.at.IsZero() {
			heap.Push(ends, end)
		}
	}
	var marks []time.Time // reservation windows opening or closing
	for _, id := range sortedKeys(fs.res) {
		rv := fs.res[id]
		rv.windows(now, now.Add(maxHorizon), 50, func(s, en time.Time) bool {
			if s.After(now) {
				marks = append(marks, s)
			}
			marks = append(marks, en)
			return true
		})
	}
	sort.Slice(marks, func(i, j int) bool { return marks[i].Before(marks[j]) })
	reqs := make([]*simReq, n)
	for i := 0; i < n; i++ {
		a := e.queue[i]
		sr := &simReq{a: a, i: i}
		if a.fs != nil {
			sr.group = groups[a.fs.group]
			for _, fq := range fs.quotas {
				if fq.q.MaxGPUs != nil && fq.q.Model == "" && quotaApplies(&fq.q, a) {
					sr.quotas = append(sr.quotas, fq)
				}
			}
			if fq := e.quotaBlock(a, now); fq != nil && fq.q.MaxGPUHours != nil && (fq.q.MaxGPUs == nil || fq.held+a.a.Request.GPUs <= *fq.q.MaxGPUs) {
				if sr.from = e.quotaFrees(fq, a, now); sr.from.IsZero() {
					sr.never = true
				}
			}
		}
		reqs[i] = sr
	}
	order := append([]*simReq(nil), reqs...)
	reserve := make([]int64, len(e.ms))
	left := n
	t := now
	pass := true // something changed that may let a request in
	popped := 0
	for step := 0; step < etaSteps && popped < 50*etaSteps && left > 0; {
		if pass {
			step++
			// Rank the groups at t, as schedule does.
			if fs.none == nil && len(glist) > 1 {
				for _, sg := range glist {
					if t.After(sg.at) {
						sg.u = arbiter.DecayedUsage(sg.u, sg.n, t.Sub(sg.at), fs.halfLife())
						sg.at = t
					}
				}
				simRank(glist)
				sort.SliceStable(order, func(i, j int) bool { return simBefore(order[i], order[j]) })
			}
			// One pass, as schedule makes it.
			clear(reserve)
			reserving := false
			skip := func(i int) bool { return reserve[i] != 0 }
			count := func(fq *fsQuota) int { return qcount[fq] }
			for _, sr := range order {
				if sr.placed {
					continue
				}
				work++
				a := sr.a
				r := &a.a.Request
				ok := !sr.never && !t.Before(sr.from) && r.GPUs <= cl.Index.MaxFree() && simQuotaOK(sr, qcount)
				if ok {
					var sk func(int) bool
					if reserving && r.Reservation == "" {
						sk = skip
					}
					masker := e.fsMasker(a, t, held, count)
					var mi int
					var gpus []int
					if r.Machine != "" {
						mi = -1
						if mc := e.byName[r.Machine]; mc != nil {
							if g := cl.OnHeld(mc.pos, r, sk, masker); g != nil {
								mi, gpus = mc.pos, g
							}
						}
					} else {
						mi, gpus = cl.BestHeld(r, sk, masker)
					}
					if mi >= 0 {
						sr.placed = true
						left--
						etas[sr.i] = t
						mc := e.ms[mi]
						for _, p := range gpus {
							held[mi][p] = a.a.ID
						}
						cl.Index.Set(mi, freeGPUs(&mc.m, held[mi]))
						end := &simEnd{mi: mi, pos: gpus, id: a.a.ID, gpus: len(gpus), group: sr.group, prio: a.a.Priority, ready: t}
						if a.fs != nil {
							end.preemptible = e.preemptibleBy(a, a.fs.group, len(gpus), func(g *fsGroup) (float64, int) {
								sg := groups[g]
								return sg.u, sg.n
							})
						}
						holders[a.a.ID] = end
						if a.fs != nil {
							for _, fq := range fs.quotas {
								if quotaApplies(&fq.q, a) {
									c := len(gpus)
									if fq.q.Model != "" {
										c = 0
										for _, p := range gpus {
											if ok, _ := path.Match(fq.q.Model, mc.m.GPUs[p].Model); ok {
												c++
											}
										}
									}
									qcount[fq] += c
									end.qs = append(end.qs, fq)
									end.qn = append(end.qn, c)
								}
							}
						}
						if sr.group != nil {
							sr.group.n += len(gpus)
						}
						if at := simEndOf(e, a, t); !at.IsZero() {
							end.at = at
							heap.Push(ends, end)
						}
						continue
					}
				}
				// The machines of its victims are held for it (preemptHold).
				for _, v := range victims[a.a.ID] {
					if holders[v.id] == v && reserve[v.mi] == 0 {
						reserve[v.mi] = a.a.ID
						reserving = true
					}
				}
				// starving, with the simulation's quotas.
				if e.waitedTooLong(a, t) && !sr.never && !t.Before(sr.from) && simQuotaOK(sr, qcount) {
					if sr.elig == nil {
						sr.elig = []int{}
						for i := range e.ms {
							if cl.Eligible(i, r) {
								sr.elig = append(sr.elig, i)
							}
						}
					}
					for _, i := range sr.elig {
						if reserve[i] == 0 && cl.Index.Free(i) >= 0 {
							reserve[i] = a.a.ID
						}
					}
					reserving = true
				}
			}
			if left == 0 {
				break
			}
			// Preemption after the pass, as schedule does it.
			if young := e.simPreempt(order, holders, victims, held, &cl, qcount, ends, t); !young.IsZero() {
				i := sort.Search(len(marks), func(i int) bool { return !marks[i].Before(young) })
				marks = append(marks, time.Time{})
				copy(marks[i+1:], marks[i:])
				marks[i] = young
			}
		}
		pass = false
		// The next moment something changes.
		var next time.Time
		if ends.Len() > 0 {
			next = (*ends)[0].at
		}
		for len(marks) > 0 && !marks[0].After(t) {
			marks = marks[1:]
		}
		if len(marks) > 0 && (next.IsZero() || marks[0].Before(next)) {
			next = marks[0]
		}
		for _, sr := range reqs {
			if !sr.placed && !sr.never && sr.from.After(t) && (next.IsZero() || sr.from.Before(next)) {
				next = sr.from
			}
		}
		if next.IsZero() || next.Sub(now) > etaHorizon {
			break
		}
		if next.Before(t) {
			next = t
		}
		// Advance group usage to next under the holdings so far.
		for _, sg := range glist {
			if next.After(sg.at) {
				sg.u = arbiter.DecayedUsage(sg.u, sg.n, next.Sub(sg.at), fs.halfLife())
				sg.at = next
			}
		}
		if t.Before(next) {
			pass = true // a mark or a quota's time; the group order may change too
			if ends.Len() > 0 && (*ends)[0].at.Equal(next) {
				pass = len(marks) > 0 && marks[0].Equal(next) || fs.none == nil && len(glist) > 1
				for _, sr := range reqs {
					pass = pass || !sr.placed && !sr.never && sr.from.Equal(next)
				}
			}
		}
		t = next
		need := arbiter.MaxGPUsPerMachine + 1 // the fewest GPUs an unplaced request wants
		for _, sr := range reqs {
			if !sr.placed {
				need = min(need, sr.a.a.Request.GPUs)
			}
		}
		for ends.Len() > 0 && !(*ends)[0].at.After(t) {
			end := heap.Pop(ends).(*simEnd)
			popped++
			if end.dead {
				continue
			}
			delete(holders, end.id)
			mc := e.ms[end.mi]
			for _, p := range end.pos {
				if p >= 0 && held[end.mi][p] == end.id {
					held[end.mi][p] = 0
				}
			}
			if cl.Index.Free(end.mi) >= 0 {
				free := freeGPUs(&mc.m, held[end.mi])
				cl.Index.Set(end.mi, free)
				pass = pass || free >= need
			}
			if end.group != nil {
				end.group.n -= end.gpus
			}
			for i, fq := range end.qs {
				qcount[fq] -= end.qn[i]
				pass = pass || end.qn[i] > 0 // a quota's room: a request on another machine may start
			}
		}
	}
	return etas, work + popped
}

// simPreempt is preemptPass on the simulation: requests left waiting at t
// may preempt, on the same terms; the victims end grace_s later (or at
// their own end, when sooner). It returns
// when the first allocation that only min_runtime_s protects may be
// preempted (zero: none).
func (e *Engine) simPreempt(order []*simReq, holders map[int64]*simEnd, victims map[int64][]*simEnd, held [][]int64, cl *place.Cluster,
	qcount map[*fsQuota]int, ends *simEnds, t time.Time) time.Time {
	low, any := arbiter.MaxPriority+1, false
	for _, h := range holders {
		if h.preemptible {
			any = true
			low = min(low, h.prio)
		}
	}
	if !any {
		return time.Time{}
	}
	byMachine := map[int][]*simEnd{}
	for _, id := range sortedKeys(holders) {
		h := holders[id]
		byMachine[h.mi] = append(byMachine[h.mi], h)
	}
	minRun, grace := secs(e.fs.pol.MinRuntimeS), secs(e.fs.pol.GraceS)
	var young time.Time
	byID := make(map[int64]*simReq, len(order))
	for _, sr := range order {
		byID[sr.a.a.ID] = sr
	}
	// freedFor, in the simulation.
	freedFor := func(x *simEnd, sr *simReq) bool {
		if x.forID == 0 || x.forID == sr.a.a.ID {
			return true
		}
		p := byID[x.forID]
		return p == nil || p.placed || simBefore(sr, p)
	}
	count := func(fq *fsQuota) int { return qcount[fq] }
	for _, sr := range order {
		if sr.placed {
			continue
		}
		q := sr.a
		if q.a.Priority <= low {
			break
		}
		if sr.never || t.Before(sr.from) || !simQuotaOK(sr, qcount) || q.a.Request.Reservation != "" {
			continue
		}
		r := &q.a.Request
		masker := e.fsMasker(q, t, held, count)
		var best []*simEnd
		bestGPUs, wait := 0, false
		for i, mc := range e.ms {
			if cl.Index.Free(i) < 0 || !cl.Eligible(i, r) {
				continue
			}
			base := held[i]
			if masker != nil {
				base = masker(i)
			}
			h := append([]int64(nil), base...)
			free := func(x *simEnd) {
				for _, p := range x.pos {
					if p >= 0 && h[p] == x.id {
						h[p] = 0
					}
				}
			}
			var cands []*simEnd
			for _, x := range byMachine[i] {
				switch {
				case x.preempting:
					if freedFor(x, sr) {
						free(x)
					}
				case x.preemptible && x.prio < q.a.Priority && t.Sub(x.ready) >= minRun:
					cands = append(cands, x)
				case x.preemptible && x.prio < q.a.Priority:
					if at := x.ready.Add(minRun); young.IsZero() || at.Before(young) {
						young = at
					}
				}
			}
			if place.FitGPUs(&mc.m, h, r) != nil {
				wait = true
				break
			}
			sort.SliceStable(cands, func(a, b int) bool {
				if cands[a].prio != cands[b].prio {
					return cands[a].prio < cands[b].prio
				}
				return cands[a].ready.After(cands[b].ready)
			})
			var took []*simEnd
			n := 0
			for _, x := range cands {
				free(x)
				took = append(took, x)
				n += x.gpus
				if place.FitGPUs(&mc.m, h, r) != nil {
					if best == nil || len(took) < len(best) || len(took) == len(best) && n < bestGPUs {
						best, bestGPUs = took, n
					}
					break
				}
			}
		}
		if wait {
			continue
		}
		for _, v := range best {
			nv := *v
			end := t.Add(grace) // or its own end, when sooner (preemptStart)
			if !v.at.IsZero() && v.at.Before(end) {
				end = v.at
			}
			nv.preempting, nv.at, nv.dead, nv.forID = true, end, false, q.a.ID
			v.dead = true
			holders[v.id] = &nv
			victims[q.a.ID] = append(victims[q.a.ID], &nv)
			byMachine[v.mi] = replaceEnd(byMachine[v.mi], v, &nv)
			heap.Push(ends, &nv)
		}
	}
	return young
}

func replaceEnd(list []*simEnd, old, nu *simEnd) []*simEnd {
	for i, x := range list {
		if x == old {
			list[i] = nu
		}
	}
	return list
}

// simEndOf is when an allocation granted at t ends in the simulation (zero:
// never): its time limit, or the one its GPU-hours quota gives it, as
// fsLimitGranted sets them (the quota's room as the real counts say at t,
// not counting what the simulation placed before), or its reservation's
// end.
func simEndOf(e *Engine, a *alloc, t time.Time) time.Time {
	var end time.Time
	limit := 0.0
	if a.fs != nil {
		limit = a.fs.limit
		if left := e.quotaLeft(a, t); left >= 0 && a.a.Request.GPUs > 0 {
			if ql := left / float64(a.a.Request.GPUs); limit == 0 || ql < limit {
				limit = max(ql, 1)
			}
		}
	}
	if limit > 0 {
		end = t.Add(secs(limit))
	}
	if name := a.a.Request.Reservation; name != "" {
		if rv := e.fs.res[name]; rv != nil {
			if _, we, ok := rv.windowAfter(t); ok && (end.IsZero() || we.Before(end)) {
				end = we
			}
		}
	}
	return end
}

// simQuotaOK reports whether sr's max_gpus quotas (without a model) let
// it in, by the simulation's counts.
func simQuotaOK(sr *simReq, count map[*fsQuota]int) bool {
	for _, fq := range sr.quotas {
		if count[fq]+sr.a.a.Request.GPUs > *fq.q.MaxGPUs {
			return false
		}
	}
	return true
}

// simRank ranks the simulation's groups as rankGroups ranks the real ones.
func simRank(gs []*simGroup) {
	fg := make([]*fsGroup, len(gs))
	saved := make([]struct {
		x    float64
		rank int
	}, len(gs))
	byG := map[*fsGroup]*simGroup{}
	for i, sg := range gs {
		fg[i] = sg.g
		saved[i].x, saved[i].rank = sg.g.x, sg.g.rank
		byG[sg.g] = sg
	}
	rankGroups(fg, func(g *fsGroup) float64 { return byG[g].u })
	for i, sg := range gs {
		sg.x, sg.rank = sg.g.x, sg.g.rank
		sg.g.x, sg.g.rank = saved[i].x, saved[i].rank
	}
}

// simBefore is the queue order with the simulation's group ranks.
func simBefore(a, b *simReq) bool {
	if a.a.a.Priority != b.a.a.Priority {
		return a.a.a.Priority > b.a.a.Priority
	}
	ra, rb := 0, 0
	if a.group != nil {
		ra = a.group.rank
	}
	if b.group != nil {
		rb = b.group.rank
	}
	if ra != rb {
		return ra < rb
	}
	return a.a.a.ID < b.a.a.ID
}

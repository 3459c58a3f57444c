package engine

import (
	"fmt"
	"sort"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

// Preemption (docs/guides/fair-share.md). An allocation is preemptible when
// its request says so (preemptible), when its group is preemptible, or,
// with two groups or more, when at its grant its group was over its share:
// its decayed usage above its share of all usage, or the GPUs it holds
// above its share of the cluster's (it borrows what others leave idle).
// That is decided once, at the grant, and shown as `preemptible`.
//
// A queued request that fits nowhere may preempt preemptible allocations
// of lower priority that have run at least min_runtime_s: on the machine
// where it then fits with the fewest of them (lowest priority, newest
// first), each gets allocation.preempting and ends grace_s later with the
// reason "preempted by allocation N (priority P)". Meanwhile the agent
// stops its processes (SIGTERM at once, SIGKILL at the end of the grace:
// its kill orders carry the grace). A request that fits once the
// allocations already being preempted end preempts nothing more. A
// preempted task goes back to pending, its attempt not counted
// (tasks.go).

// preemption is an allocation being preempted.
type preemption struct {
	by string
}

// fsPreemptible decides at its grant whether a is preemptible.
func (e *Engine) fsPreemptible(a *alloc, _ time.Time) bool {
	return e.preemptibleBy(a, a.fs.group, len(a.gpus), func(g *fsGroup) (float64, int) { return g.u, g.n })
}

// preemptibleBy is whether a, granted gpus now, is preemptible when each
// group has used and holds what usage says (the ETA simulation passes its
// own).
func (e *Engine) preemptibleBy(a *alloc, group *fsGroup, gpus int, usage func(*fsGroup) (float64, int)) bool {
	if a.a.Request.Preemptible || group != nil && group.cfg != nil && group.cfg.Preemptible {
		return true
	}
	fs := &e.fs
	if fs.none != nil || len(fs.pol.Groups) < 1 || group == nil {
		return false
	}
	// Over its share of usage, or borrowing GPUs beyond its share.
	var total, shares float64
	for _, g := range fs.glist {
		u, _ := usage(g)
		total += u
		if g == group {
			shares += g.share // its own, though it held nothing before this grant
		} else {
			shares += g.weight()
		}
	}
	frac := group.share / shares
	u, n := usage(group)
	if total > 0 && u/total > frac+1e-9 {
		return true
	}
	all := 0
	for _, mc := range e.ms {
		all += len(mc.m.GPUs)
	}
	return float64(n+gpus) > frac*float64(all)+1e-9
}

// preemptPass lets queued requests that fit nowhere preempt. When only
// min_runtime_s protects the allocations they could preempt, a deadline
// brings it back when the first of them has run long enough.
func (e *Engine) preemptPass(now time.Time) {
	fs := &e.fs
	if fs.preemptible == 0 || len(e.queue) == 0 {
		if fs.preemptDL.pos >= 0 {
			e.dl.clear(&fs.preemptDL)
		}
		return
	}
	e.fsRank(now) // the order of groups now, as a pass would see it
	fs.young = time.Time{}
	defer func() {
		if fs.young.IsZero() {
			e.dl.clear(&fs.preemptDL)
		} else {
			e.dl.set(&fs.preemptDL, fs.young)
		}
	}()
	low := arbiter.MaxPriority + 1
	for p := range fs.prio {
		low = min(low, p)
	}
	for _, q := range e.queue { // preempting changes no queue
		if q.a.Priority <= low {
			break // the queue is in priority order: nobody behind outranks a victim
		}
		if q.a.State != arbiter.StateQueued || q.a.Request.Reservation != "" || e.quotaBlock(q, now) != nil {
			continue // its own quota holds it back, not these GPUs
		}
		e.preemptFor(q, now)
	}
}

// victim is an allocation that may be preempted for a request.
func (e *Engine) victimFor(v *alloc, q *alloc, now time.Time) bool {
	return v.a.Preemptible && v.a.Preempting == nil && v.a.State == arbiter.StateReady && v.a.Priority < q.a.Priority &&
		v.a.ReadyAt != nil && now.Sub(*v.a.ReadyAt) >= secs(e.fs.pol.MinRuntimeS) && v.fs != nil && accountedGPUs(v)
}

// preemptFor preempts for q on the machine where that takes the fewest
// allocations, unless q fits once those already being preempted end.
func (e *Engine) preemptFor(q *alloc, now time.Time) {
	r := &q.a.Request
	held := e.fsMasker(q, now, e.cluster.Held, nil)
	type choice struct {
		mc      *machine
		victims []*alloc
		gpus    int
	}
	var best *choice
	for _, mc := range e.ms {
		if mc.m.Down || mc.m.Draining || !e.cluster.Eligible(mc.pos, r) {
			continue
		}
		base := mc.held
		if held != nil {
			base = held(mc.pos)
		}
		h := append([]int64(nil), base...)
		// GPUs of allocations already being preempted will be free.
		var cands []*alloc
		for _, id := range sortedKeys(mc.allocs) {
			x := mc.allocs[id]
			switch {
			case x.a.Preempting != nil:
				if e.freedFor(x, q) {
					freeOf(h, mc, x)
				}
			case e.victimFor(x, q, now):
				cands = append(cands, x)
			case x.a.Preemptible && x.a.Preempting == nil && x.a.Priority < q.a.Priority && x.a.ReadyAt != nil:
				// Too new yet: look again when it has run min_runtime_s.
				if at := x.a.ReadyAt.Add(secs(e.fs.pol.MinRuntimeS)); e.fs.young.IsZero() || at.Before(e.fs.young) {
					e.fs.young = at
				}
			}
		}
		if place.FitGPUs(&mc.m, h, r) != nil {
			return // it fits once those end: wait for them
		}
		sort.SliceStable(cands, func(i, j int) bool {
			if cands[i].a.Priority != cands[j].a.Priority {
				return cands[i].a.Priority < cands[j].a.Priority
			}
			return cands[i].a.ReadyAt.After(*cands[j].a.ReadyAt)
		})
		var took []*alloc
		n := 0
		for _, x := range cands {
			freeOf(h, mc, x)
			took = append(took, x)
			n += len(x.gpus)
			if place.FitGPUs(&mc.m, h, r) != nil {
				if best == nil || len(took) < len(best.victims) || len(took) == len(best.victims) && n < best.gpus {
					best = &choice{mc: mc, victims: took, gpus: n}
				}
				break
			}
		}
	}
	if best == nil {
		return
	}
	by := fmt.Sprintf("allocation %d (priority %d)", q.a.ID, q.a.Priority)
	for _, v := range best.victims {
		e.preemptStart(v, q, by, now)
	}
}

// freedFor reports whether the GPUs of x, being preempted, may count as
// free for q: x is preempted for q, for a request q goes before, for one
// that is no longer queued, or for a reservation (which keeps its GPUs
// itself). Else they are another request's, which q must not count on.
func (e *Engine) freedFor(x, q *alloc) bool {
	id := x.a.Preempting.For
	if id == 0 || id == q.a.ID {
		return true
	}
	p := e.allocs[id]
	return p == nil || p.a.State != arbiter.StateQueued || before(q, p)
}

func (fs *fairshare) addVictim(v *alloc) {
	if fs.victims == nil {
		fs.victims = make(map[int64][]*alloc)
	}
	fs.victims[v.a.Preempting.For] = append(fs.victims[v.a.Preempting.For], v)
}

// preemptHold holds, in e.reserve, the machines of the allocations being
// preempted for q, so that what they free goes to q and not to a request
// behind it that fits there meanwhile. It reports whether it held any.
func (e *Engine) preemptHold(q *alloc) bool {
	vs, ok := e.fs.victims[q.a.ID]
	if !ok {
		return false
	}
	held := false
	live := vs[:0]
	for _, v := range vs {
		if e.allocs[v.a.ID] != v || v.a.Preempting == nil || v.a.Preempting.For != q.a.ID || v.mach == nil {
			continue // ended, or let off
		}
		live = append(live, v)
		if e.reserve[v.mach.pos] == 0 {
			e.reserve[v.mach.pos] = q.a.ID
			held = true
		}
	}
	if len(live) == 0 {
		delete(e.fs.victims, q.a.ID)
	} else {
		e.fs.victims[q.a.ID] = live
	}
	return held
}

// freeOf marks x's GPUs free in holdings h of mc.
func freeOf(h []int64, mc *machine, x *alloc) {
	for _, idx := range x.gpus {
		if p := gpuPos(&mc.m, idx); p >= 0 && h[p] == x.a.ID {
			h[p] = 0
		}
	}
}

// preemptStart starts preempting v for q: it ends grace_s from now, or at
// its own end when that is sooner (a preemption never makes it last
// longer).
func (e *Engine) preemptStart(v, q *alloc, by string, now time.Time) {
	v.fs.preempt = &preemption{by: by}
	v.a.Preempting = &arbiter.Preempting{By: by, Since: now, For: q.a.ID}
	e.fs.addVictim(v)
	end := now.Add(secs(e.fs.pol.GraceS))
	if v.a.EndsAt != nil && v.a.EndsAt.Before(end) {
		end = *v.a.EndsAt
	}
	e.fsSetEnd(v, end, arbiter.ReasonPreemptedBy+" "+by, endPreempt, now)
}

// preemptOrders has the agent of v's machine stop v's processes: SIGTERM
// now, SIGKILL when the grace is over (gtEvaluate adds the orders).
func (e *Engine) preemptOrders(v *alloc, now time.Time) {
	if v.mach == nil {
		return
	}
	if gm := e.gt.ms[v.mach.m.Name]; gm != nil {
		e.gtEvaluate(gm, now)
	}
}

// preemptKill is the kill order of a process of allocation x, being
// preempted, on GPU idx: SIGTERM now, SIGKILL at its end.
func preemptKill(p arbiter.GPUProcess, x *alloc, idx int, now time.Time) (arbiter.GPUKill, bool) {
	if x == nil || x.a.Preempting == nil || x.a.EndsAt == nil {
		return arbiter.GPUKill{}, false
	}
	grace := x.a.EndsAt.Sub(now).Seconds()
	return arbiter.GPUKill{PID: p.PID, GPU: idx, Allocation: p.Allocation, GraceS: max(grace, 0),
		Reason: fmt.Sprintf("allocation %d is %s", x.a.ID, x.a.EndReason)}, true
}

// preemptEnded forgets what an ending allocation preempted or was being
// preempted for.
func (e *Engine) preemptEnded(a *alloc, _ time.Time) {
	a.fs.preempt = nil
}

package engine

import (
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Accounting and idle reclaim (docs/reference/gpu-truth.md), on the facts of
// gputruth.go.
//
// An allocation holding GPUs accrues GPU time held (its life times its GPU
// count), busy (its GPU's latest reading at or above idle_util_pct) and
// idle (below); time no fresh reading covers is neither. Busy and idle
// accrue, per GPU, from one report to the next under the reading that held
// in between. The allocation's Usage is shown in the read view after every
// report touching it, and saved with the allocation at most once a minute
// (gtFlushEvery) while it lives and at its end. Each save also adds what
// accrued since the last one to the day summaries (arbiter.UsageDay), kept
// for UsageDayRetention. Held time not saved yet (an allocation on a
// declared machine, which no report touches) is computed by readers from
// the allocation (arbiter.UnsavedUsage), so that reports are exact
// without periodic writes.
//
// An allocation whose GPUs all have fresh, idle readings has been idle
// since the latest of them went idle (or since it was granted). After
// idle_after_s of it, allocation.idle is emitted and IdleSince set; with
// idle_action = "release", idle_grace_s later it is ended. Any busy or
// unknown reading makes it active again. Pool backings (judged by their
// slots, which are judged by the backing's GPUs), tasks, services and
// requests an admin marked idle_exempt are never idle-reclaimed.

// gtAlloc is the accounting and idle state of one live allocation.
type gtAlloc struct {
	id int64
	// u is the working copy of the allocation's Usage, as last saved but
	// for busy and idle time, which run ahead; the allocation gets a
	// fresh copy whenever it is shown, so readers never share it.
	u arbiter.AllocationUsage
	// saved is the Usage as last saved with the day summaries, and
	// showing whether the allocation shows more (gtShow): what is saved
	// of the allocation for another reason keeps saved, so that after a
	// restart the allocation and the day summaries agree.
	saved     *arbiter.AllocationUsage
	showing   bool
	counted   bool      // the allocation is counted in a day summary
	heldTo    time.Time // held time is in the day summaries up to here
	lastFlush time.Time
	pending   map[string]*arbiter.UsageDay // busy and idle not yet in the day summaries
	idleFrom  time.Time                    // zero: active
	idle      deadline
}

// gtFlushEvery is how often at most an allocation's usage is saved while
// it lives.
const gtFlushEvery = time.Minute

// gtAllocOf returns the accounting state of a, creating it from the
// allocation's saved usage.
func (e *Engine) gtAllocOf(a *alloc) *gtAlloc {
	g := &e.gt
	if ga := g.allocs[a.a.ID]; ga != nil {
		return ga
	}
	ga := &gtAlloc{id: a.a.ID}
	ga.idle = newDeadline(func(e *Engine, now time.Time) { e.gtIdleFire(ga, now) })
	if a.a.ReadyAt != nil {
		ga.heldTo = *a.a.ReadyAt
	}
	if u := a.a.Usage; u != nil {
		ga.u = *u
		saved := *u
		ga.saved = &saved
		ga.counted = true
		switch n := len(a.gpus); {
		case !u.AccountedAt.IsZero():
			ga.heldTo = u.AccountedAt
		case n > 0 && a.a.ReadyAt != nil: // saved by an older build
			ga.heldTo = a.a.ReadyAt.Add(secs(u.GPUS / float64(n)))
		}
	}
	g.allocs[a.a.ID] = ga
	return ga
}

// accounted reports whether a's GPU time is accounted: it holds GPUs of
// its own (a pool slot's are its backing's, accounted there).
func accounted(a *alloc) bool {
	return a.mach != nil && len(a.gpus) > 0 && a.a.ReadyAt != nil
}

// gtAccrue brings the busy and idle time of GPU gg's holder up to now under
// gg's latest reading, as far as that reading is fresh.
func (e *Engine) gtAccrue(mc *machine, gm *gtMachine, gg *gtGPU, now time.Time) {
	holder := e.holderAlloc(mc, gg.index)
	start := gg.acctTo
	if now.After(gg.acctTo) {
		gg.acctTo = now // forward only: a clock stepped back counts nothing twice
	}
	if holder == nil || !accounted(holder) || gg.cls == clsUnknown || gm == nil || gm.reportedAt.IsZero() {
		return
	}
	if start.Before(*holder.a.ReadyAt) {
		start = *holder.a.ReadyAt
	}
	end := now
	if lim := gm.reportedAt.Add(secs(e.gt.policy.FreshS())); lim.Before(end) {
		end = lim
	}
	if !end.After(start) {
		return
	}
	ga := e.gtAllocOf(holder)
	d := end.Sub(start).Seconds()
	if gg.cls == clsBusy {
		ga.u.BusyGPUS += d
	} else {
		ga.u.IdleGPUS += d
	}
	model := ""
	if p := gpuPos(&mc.m, gg.index); p >= 0 {
		model = mc.m.GPUs[p].Model
	}
	if ga.pending == nil {
		ga.pending = map[string]*arbiter.UsageDay{}
	}
	arbiter.SplitDays(start, end, func(day string, s float64) {
		key := arbiter.UsageDayKey(day, holder.a.Owner, mc.m.Name, model)
		row := ga.pending[key]
		if row == nil {
			row = &arbiter.UsageDay{Day: day, Owner: holder.a.Owner, Machine: mc.m.Name, Model: model}
			ga.pending[key] = row
		}
		if gg.cls == clsBusy {
			row.BusyGPUS += s
		} else {
			row.IdleGPUS += s
		}
	})
}

// gtAccountMachine updates, after a report, the usage and idleness of the
// allocations holding GPUs of mc: saved when their last save is a minute
// old, shown otherwise.
func (e *Engine) gtAccountMachine(mc *machine, now time.Time) {
	gm := e.gt.ms[mc.m.Name]
	for _, id := range sortedKeys(mc.allocs) {
		a := mc.allocs[id]
		if !accounted(a) {
			continue
		}
		ga := e.gtAllocOf(a)
		var mem int64
		for _, idx := range a.gpus {
			if gg := gm.gpus[idx]; gg != nil && gg.usage != nil {
				mem += gg.usage.MemUsedMiB
			}
		}
		ga.u.PeakMemMiB = max(ga.u.PeakMemMiB, mem)
		if now.Sub(ga.lastFlush) >= gtFlushEvery {
			e.gtFlush(a, ga, now)
		} else {
			e.gtShow(a, ga, now)
		}
		e.gtIdleCheck(a, gm, a.gpus, now)
		if b := e.pools.backings[a.a.ID]; b != nil {
			for _, sid := range b.slots {
				if s := e.allocs[sid]; s != nil {
					e.gtIdleCheck(s, gm, a.gpus, now)
				}
			}
		}
	}
}

// gtShow shows a's usage in the read view, up to now, without saving it.
func (e *Engine) gtShow(a *alloc, ga *gtAlloc, now time.Time) {
	u := ga.u
	if now.After(ga.heldTo) {
		u.GPUS += now.Sub(ga.heldTo).Seconds() * float64(len(a.gpus))
	}
	a.a.Usage = &u
	ga.showing = true
	e.p.touchedAllocs[a.a.ID] = struct{}{}
}

// gtSavedUsage is what is saved of allocation id's usage when it is saved
// for another reason while it shows more than was saved (gtShow), and
// whether that is so.
func (e *Engine) gtSavedUsage(id int64) (*arbiter.AllocationUsage, bool) {
	ga := e.gt.allocs[id]
	if ga == nil || !ga.showing {
		return nil, false
	}
	if ga.saved == nil {
		return nil, true
	}
	u := *ga.saved
	return &u, true
}

// gtFlush saves a's usage and adds what accrued since the last save to the
// day summaries.
func (e *Engine) gtFlush(a *alloc, ga *gtAlloc, now time.Time) {
	if !accounted(a) {
		return
	}
	mc := a.mach
	owner, machine := a.a.Owner, mc.m.Name
	model := func(idx int) string {
		if p := gpuPos(&mc.m, idx); p >= 0 {
			return mc.m.GPUs[p].Model
		}
		for _, d := range a.a.Devices {
			if d.Index == idx {
				return d.Model
			}
		}
		return ""
	}
	changed := map[string]bool{}
	row := func(day, mod string) *arbiter.UsageDay {
		key := arbiter.UsageDayKey(day, owner, machine, mod)
		r := e.gt.days[key]
		if r == nil {
			r = &arbiter.UsageDay{Day: day, Owner: owner, Machine: machine, Model: mod}
			e.gt.days[key] = r
		}
		changed[key] = true
		return r
	}
	ready := *a.a.ReadyAt
	if !ga.counted {
		ga.counted = true
		ga.u.WaitS = max(ready.Sub(a.a.CreatedAt).Seconds(), 0)
		r := row(ready.UTC().Format(arbiter.DayLayout), model(a.gpus[0]))
		r.Allocations++
		r.WaitS += ga.u.WaitS
	}
	if now.After(ga.heldTo) { // forward only: a clock stepped back counts nothing twice
		for _, idx := range a.gpus {
			mod := model(idx)
			arbiter.SplitDays(ga.heldTo, now, func(day string, s float64) { row(day, mod).GPUS += s })
		}
		ga.u.GPUS += now.Sub(ga.heldTo).Seconds() * float64(len(a.gpus))
		ga.heldTo = now
	}
	for _, key := range sortedKeys(ga.pending) {
		p := ga.pending[key]
		r := row(p.Day, p.Model)
		r.BusyGPUS += p.BusyGPUS
		r.IdleGPUS += p.IdleGPUS
	}
	ga.pending = nil
	e.gtTrim(now)
	for _, key := range sortedKeys(changed) {
		e.putRecord(arbiter.RecordUsageDay, key, *e.gt.days[key])
	}
	ga.u.AccountedAt = ga.heldTo
	ga.lastFlush = now
	u, saved := ga.u, ga.u
	a.a.Usage, ga.saved, ga.showing = &u, &saved, false
	e.dirty(a)
}

// gtAllocEnding accounts a up to its end, and forgets its state.
func (e *Engine) gtAllocEnding(a *alloc, now time.Time) {
	ga := e.gt.allocs[a.a.ID]
	if accounted(a) {
		gm := e.gt.ms[a.mach.m.Name]
		if gm != nil {
			for _, idx := range a.gpus {
				if gg := gm.gpus[idx]; gg != nil {
					e.gtAccrue(a.mach, gm, gg, now)
				}
			}
		}
		if ga == nil {
			ga = e.gtAllocOf(a)
		}
		e.gtFlush(a, ga, now)
	}
	if ga != nil {
		e.dl.clear(&ga.idle)
		delete(e.gt.allocs, a.a.ID)
	}
}

// gtTrim drops the day summaries past their retention, once per new day
// an allocation is accounted on (no deadline: without new usage nothing
// needs trimming).
func (e *Engine) gtTrim(now time.Time) {
	today := now.UTC().Format(arbiter.DayLayout)
	if today == e.gt.trimmed {
		return
	}
	e.gt.trimmed = today
	oldest := now.Add(-arbiter.UsageDayRetention).UTC().Format(arbiter.DayLayout)
	for _, key := range sortedKeys(e.gt.days) {
		if day, _, _ := strings.Cut(key, "/"); day < oldest {
			delete(e.gt.days, key)
			e.removeRecord(arbiter.RecordUsageDay, key)
		}
	}
}

// idleExempt reports whether a is spared idle reclaim.
func idleExempt(a *alloc) bool {
	o := a.a.Owner
	return a.a.Request.IdleExempt || strings.HasPrefix(o, arbiter.PoolOwnerPrefix) ||
		strings.HasPrefix(o, arbiter.TaskOwnerPrefix) || strings.HasPrefix(o, arbiter.ServiceOwnerPrefix)
}

// gtIdleSince reports since when every GPU of gpus has had a fresh, idle
// reading (not before x was granted), or false.
func (e *Engine) gtIdleSince(x *alloc, gm *gtMachine, gpus []int, now time.Time) (time.Time, bool) {
	if gm == nil || x.a.ReadyAt == nil || len(gpus) == 0 || gm.reportedAt.IsZero() ||
		now.Sub(gm.reportedAt) > secs(e.gt.policy.FreshS()) {
		return time.Time{}, false
	}
	since := *x.a.ReadyAt
	for _, idx := range gpus {
		gg := gm.gpus[idx]
		if gg == nil || gg.cls != clsIdle {
			return time.Time{}, false
		}
		if gg.clsSince.After(since) {
			since = gg.clsSince
		}
	}
	return since, true
}

// gtIdleCheck follows whether x is idle after a report.
func (e *Engine) gtIdleCheck(x *alloc, gm *gtMachine, gpus []int, now time.Time) {
	if idleExempt(x) || x.a.State != arbiter.StateReady {
		return
	}
	since, idle := e.gtIdleSince(x, gm, gpus, now)
	ga := e.gtAllocOf(x)
	switch {
	case !idle:
		e.gtActive(x, ga)
	case ga.idleFrom.IsZero():
		ga.idleFrom = since
		e.gtArmIdle(ga, now)
	}
}

// gtActive marks x active again.
func (e *Engine) gtActive(x *alloc, ga *gtAlloc) {
	ga.idleFrom = time.Time{}
	e.dl.clear(&ga.idle)
	if x.a.IdleSince != nil {
		x.a.IdleSince = nil
		e.dirty(x)
	}
}

// gtArmIdle sets when an idle allocation is warned, or reclaimed.
func (e *Engine) gtArmIdle(ga *gtAlloc, now time.Time) {
	x := e.allocs[ga.id]
	pol := &e.gt.policy
	after := secs(pol.IdleAfterS)
	switch {
	case x == nil:
		e.dl.clear(&ga.idle)
	case x.a.IdleSince == nil:
		e.dl.set(&ga.idle, ga.idleFrom.Add(after))
	case pol.IdleAction == arbiter.IdleRelease:
		e.dl.set(&ga.idle, ga.idleFrom.Add(after+secs(pol.IdleGraceS)))
	default:
		e.dl.clear(&ga.idle)
	}
}

// gtIdleFire warns of an idle allocation, or ends it, if it is still idle
// now: readings that went stale since make it active (unknown is active).
func (e *Engine) gtIdleFire(ga *gtAlloc, now time.Time) {
	x := e.allocs[ga.id]
	if x == nil {
		return
	}
	mc, gpus := e.gtGPUsOf(x)
	var gm *gtMachine
	if mc != nil {
		gm = e.gt.ms[mc.m.Name]
	}
	if _, idle := e.gtIdleSince(x, gm, gpus, now); !idle {
		e.gtActive(x, ga)
		return
	}
	pol := &e.gt.policy
	if x.a.IdleSince == nil {
		t := ga.idleFrom
		x.a.IdleSince = &t
		e.dirty(x)
		e.emitAlloc(now, arbiter.EventAllocationIdle, subject(x), &x.a)
		e.gtArmIdle(ga, now)
		return
	}
	if pol.IdleAction == arbiter.IdleRelease && !now.Before(ga.idleFrom.Add(secs(pol.IdleAfterS+pol.IdleGraceS))) {
		e.destroy(x, arbiter.IdleReason(now.Sub(ga.idleFrom)), now)
	}
}

// gtGPUsOf returns the machine and GPUs whose readings judge x: its own,
// or a slot's backing's.
func (e *Engine) gtGPUsOf(x *alloc) (*machine, []int) {
	if x.a.Backing != nil {
		if b := e.allocs[*x.a.Backing]; b != nil {
			return b.mach, b.gpus
		}
		return nil, nil
	}
	return x.mach, x.gpus
}

package engine

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Time limits and extend (docs/guides/fair-share.md). A ready allocation
// with an end (its time limit, a reservation that needs its GPUs, a
// preemption) has EndsAt and EndReason; notice_s before the end its holder
// gets allocation.time_limit (or, for a preemption, allocation.preempting
// grace_s before), and at the end it is destroyed with EndReason. Ends are
// deadlines; EndsAt is saved with the allocation, so a restart keeps them,
// and what else a restart needs of an end — the reservation that moved it
// earlier, the end before, whether its notice went out — is a
// RecordAllocationEnd (fsSaveEnd).

// end kinds: what an allocation's end is, which says which notice it gets.
const (
	endLimit   = "limit"   // its own time limit (or its reservation's end)
	endResv    = "resv"    // a reservation of another group needs its GPUs
	endPreempt = "preempt" // it is preempted
)

// fsLimitGranted sets a granted allocation's end from its time limit, its
// hours quota and its reservation.
func (e *Engine) fsLimitGranted(a *alloc, now time.Time) {
	fa := a.fs
	limit := fa.limit
	why := ""
	if limit > 0 {
		why = fmt.Sprintf("%s (%s) reached", arbiter.ReasonTimeLimit, arbiter.HumanDuration(secs(limit)))
	}
	if left := e.quotaLeft(a, now); left >= 0 && len(a.gpus) > 0 {
		if ql := left / float64(len(a.gpus)); limit == 0 || ql < limit {
			limit = max(ql, 1)
			why = fmt.Sprintf("%s: the GPU-hours of its quota are spent", arbiter.ReasonTimeLimit)
		}
	}
	var end time.Time
	if limit > 0 {
		end = now.Add(secs(limit))
	}
	if name := a.a.Request.Reservation; name != "" {
		if rv := e.fs.res[name]; rv != nil && rv.active && (end.IsZero() || rv.we.Before(end)) {
			end = rv.we
			why = fmt.Sprintf("%s: reservation %s ended", arbiter.ReasonTimeLimit, name)
		}
	}
	if !end.IsZero() {
		e.fsSetEnd(a, end, why, endLimit, now)
	}
	// A reservation of another group may need these GPUs before the end.
	e.resImposeOn(a, now)
}

// fsSetEnd makes a end at `at` with reason why, arming its notice: a new
// end, whose notice has not gone out.
func (e *Engine) fsSetEnd(a *alloc, at time.Time, why, kind string, now time.Time) {
	if a.fs.noticed {
		a.fs.noticed = false
		e.fsSaveEnd(a)
	}
	e.fsArmEnd(a, at, why, kind, now)
}

// fsArmEnd makes a end at `at` with reason why and arms its notice, sent
// at once when it is due and has not gone out (fsAlloc.noticed).
func (e *Engine) fsArmEnd(a *alloc, at time.Time, why, kind string, now time.Time) {
	fa := a.fs
	if a.a.EndsAt == nil {
		e.fs.limited++
	}
	t := at
	a.a.EndsAt = &t
	a.a.EndReason = why
	fa.endWhy = why
	fa.notKind = kind
	e.dl.set(&fa.end, at)
	var lead time.Duration
	if kind == endPreempt {
		lead = secs(e.fs.pol.GraceS)
		fa.notKind = arbiter.EventAllocationPreempting
	} else {
		lead = secs(e.fs.pol.NoticeS)
		fa.notKind = arbiter.EventAllocationTimeLimit
		if kind == endResv && a.a.Preemptible {
			// A preemptible allocation is preempted by the reservation,
			// with the grace of a preemption.
			lead = secs(e.fs.pol.GraceS)
			fa.notKind = arbiter.EventAllocationPreempting
		}
	}
	if n := at.Add(-lead); n.After(now) {
		e.dl.set(&fa.notice, n)
	} else {
		e.dl.clear(&fa.notice)
		if !fa.noticed {
			e.fsNoticeFire(fa, now)
		}
	}
	e.fs.etaDirty = true
	e.dirty(a)
}

// fsNoticeFire tells the holder its allocation ends soon.
func (e *Engine) fsNoticeFire(fa *fsAlloc, now time.Time) {
	a := fa.a
	if e.allocs[a.a.ID] != a || a.a.EndsAt == nil {
		return
	}
	fa.noticed = true
	e.fsSaveEnd(a)
	if fa.notKind == arbiter.EventAllocationPreempting {
		by := strings.TrimSpace(strings.TrimPrefix(fa.endWhy, arbiter.ReasonPreemptedBy))
		if a.a.Preempting == nil {
			a.a.Preempting = &arbiter.Preempting{By: by, Since: now}
			e.dirty(a)
		}
		e.emitAlloc(now, arbiter.EventAllocationPreempting, subject(a), &a.a)
		e.preemptOrders(a, now) // preempt.go: the agent stops its processes
		return
	}
	e.emitAlloc(now, arbiter.EventAllocationTimeLimit, subject(a), &a.a)
}

// fsEndFire ends an allocation at its EndsAt.
func (e *Engine) fsEndFire(fa *fsAlloc, now time.Time) {
	a := fa.a
	if e.allocs[a.a.ID] != a {
		return
	}
	e.destroy(a, fa.endWhy, now)
}

// fsSaveEnd keeps what a restart needs of a's end (arbiter.AllocationEnd)
// in a record, or removes it when there is nothing to keep.
func (e *Engine) fsSaveEnd(a *alloc) {
	fa := a.fs
	if fa.endRes == "" && !fa.noticed {
		if fa.saved {
			fa.saved = false
			e.fsDropEnd(a.a.ID)
		}
		return
	}
	fa.saved = true
	e.putRecord(arbiter.RecordAllocationEnd, strconv.FormatInt(a.a.ID, 10),
		arbiter.AllocationEnd{Reservation: fa.endRes, OwnEndsAt: fa.ownEnd, OwnReason: fa.ownWhy, Noticed: fa.noticed})
}

// fsDropEnd removes allocation id's RecordAllocationEnd.
func (e *Engine) fsDropEnd(id int64) {
	e.removeRecord(arbiter.RecordAllocationEnd, strconv.FormatInt(id, 10))
}

// fsRestoreLimit re-arms a live allocation's end after a restart, with
// what was kept of it (nil: nothing).
func (e *Engine) fsRestoreLimit(a *alloc, end *arbiter.AllocationEnd, now time.Time) {
	if a.fs == nil {
		e.fsNew(a)
		if a.fs == nil {
			fs := &e.fs
			g := fs.groupOf(a.a.Principal, a.a.Owner)
			a.fs = &fsAlloc{a: a, group: g}
			a.fs.end = newDeadline(func(e *Engine, now time.Time) { e.fsEndFire(a.fs, now) })
			a.fs.notice = newDeadline(func(e *Engine, now time.Time) { e.fsNoticeFire(a.fs, now) })
		}
	}
	if a.a.EndsAt == nil {
		return
	}
	at := *a.a.EndsAt
	kind := endLimit
	if end != nil {
		a.fs.endRes, a.fs.ownEnd, a.fs.ownWhy, a.fs.noticed, a.fs.saved = end.Reservation, end.OwnEndsAt, end.OwnReason, end.Noticed, true
		if end.Reservation != "" {
			kind = endResv // its notice: preempting when preemptible (fsArmEnd)
		}
	}
	if a.a.Preempting != nil {
		kind = endPreempt
	}
	why := a.a.EndReason
	if why == "" {
		why = arbiter.ReasonTimeLimit + " reached"
	}
	a.a.EndsAt = nil
	e.fsArmEnd(a, at, why, kind, now)
}

// fsImposeEnd makes a end by `at`, when reservation rv of another group
// starts and needs its GPUs: a preemptible allocation is preempted by it,
// any other reaches a time limit. Nothing changes when it ends by then
// anyway.
func (e *Engine) fsImposeEnd(a *alloc, at time.Time, rv *resv, now time.Time) {
	if a.fs == nil {
		e.fsNew(a)
		if a.fs == nil {
			return
		}
	}
	if a.a.EndsAt != nil && !a.a.EndsAt.After(at) {
		return
	}
	why := fmt.Sprintf("%s: reservation %s of group %s starts", arbiter.ReasonTimeLimit, rv.r.ID, rv.r.Group)
	if a.a.Preemptible {
		why = fmt.Sprintf("%s reservation %s of group %s", arbiter.ReasonPreemptedBy, rv.r.ID, rv.r.Group)
	}
	fa := a.fs
	if fa.endRes == "" { // its own end, given back if the reservation goes
		fa.ownEnd, fa.ownWhy = nil, a.a.EndReason
		if a.a.EndsAt != nil {
			t := *a.a.EndsAt
			fa.ownEnd = &t
		}
	}
	fa.endRes = rv.r.ID
	e.fsSetEnd(a, at, why, endResv, now)
	e.fsSaveEnd(a)
}

// fsRestoreOwnEnd puts back an allocation's own end after a reservation
// that moved it earlier was deleted.
func (e *Engine) fsRestoreOwnEnd(a *alloc, now time.Time) {
	fa := a.fs
	own, ownWhy := fa.ownEnd, fa.ownWhy
	fa.endRes, fa.ownEnd, fa.ownWhy = "", nil, ""
	e.dl.clear(&fa.end)
	e.dl.clear(&fa.notice)
	if a.a.EndsAt != nil {
		e.fs.limited--
	}
	preempting := a.a.Preempting != nil
	a.a.EndsAt, a.a.EndReason, a.a.Preempting = nil, "", nil
	fa.noticed = false // of the end taken away
	switch {
	case own != nil:
		e.fsSetEnd(a, *own, ownWhy, endLimit, now)
	case fa.limit > 0 && a.a.ReadyAt != nil && !fa.saved:
		// Moved by a version that kept no record of the end before.
		e.fsSetEnd(a, a.a.ReadyAt.Add(secs(fa.limit)),
			fmt.Sprintf("%s (%s) reached", arbiter.ReasonTimeLimit, arbiter.HumanDuration(secs(fa.limit))), endLimit, now)
	}
	e.fsSaveEnd(a)
	e.dirty(a)
	if preempting {
		e.preemptOrders(a, now) // the agent's stops under way are withdrawn
	}
}

// extend moves a ready allocation's end later, when nobody waits for its
// GPUs, its quotas allow it, and no reservation needs its GPUs by then.
func (e *Engine) extend(c arbiter.ExtendAllocation, now time.Time) (any, error) {
	a := e.allocs[c.ID]
	if a == nil {
		if r := e.retired[c.ID]; r != nil {
			return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d was destroyed: %s", c.ID, arbiter.StrOr(r.Reason, ""))
		}
		return nil, arbiter.Errorf(arbiter.ENotFound, "allocation %d does not exist", c.ID)
	}
	if err := arbiter.MayTouch(c.Caller, &a.a, "extend it"); err != nil {
		return nil, err
	}
	if c.ByS != c.ByS || c.ByS < 1 || c.ByS > arbiter.MaxTimeLimitS {
		return nil, arbiter.Errorf(arbiter.EInvalid, "by_s must be 1 to %d seconds", arbiter.MaxTimeLimitS)
	}
	switch {
	case a.a.State != arbiter.StateReady || !accountedGPUs(a):
		return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d is %s: only a ready allocation holding GPUs can be extended", c.ID, a.a.State)
	case a.a.EndsAt == nil:
		return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d has no time limit: there is nothing to extend", c.ID)
	case a.a.Preempting != nil:
		return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d is being preempted (%s): it cannot be extended", c.ID, a.a.EndReason)
	case a.fs.endRes != "" || a.a.Request.Reservation != "" && strings.Contains(a.fs.endWhy, "reservation"):
		return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d ends for another reason than its time limit: %s", c.ID, a.a.EndReason)
	}
	for _, q := range e.queue {
		if q.fs != nil && q.fs.quota != "" {
			continue // held back by its own quota, not by these GPUs
		}
		if q.a.Request.Reservation != "" {
			// It takes only its reservation's GPUs, in its window; an
			// extension into that window is refused below (resBlocksExtend).
			continue
		}
		if e.cluster.Eligible(a.mach.pos, &q.a.Request) {
			return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d (%s, %s) is waiting for GPUs like these (queued %s ago): release them when done instead",
				q.a.ID, arbiter.ShortOwner(q.a.Owner), arbiter.Plural(q.a.Request.GPUs, "GPU"), arbiter.HumanDuration(now.Sub(q.a.CreatedAt)))
		}
	}
	by := secs(c.ByS)
	to := a.a.EndsAt.Add(by)
	if why := e.resBlocksExtend(a, to, now); why != "" {
		return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d cannot run until %s: %s", c.ID, to.UTC().Format(time.RFC3339), why)
	}
	for _, fq := range a.fs.quotas {
		q := &fq.q
		if q.MaxGPUHours == nil {
			continue
		}
		used, committed := e.hoursAt(fq, now)
		extra := float64(len(a.gpus)) * by.Seconds()
		if used+committed+extra > *q.MaxGPUHours*3600+1e-6 {
			return nil, arbiter.Errorf(arbiter.EConflict, "quota %s (max_gpu_hours = %g per %s) has %.1f GPU-hours left and extending by %s needs %.1f",
				fq.key, *q.MaxGPUHours, arbiter.HumanDuration(q.Window()), max(*q.MaxGPUHours*3600-used-committed, 0)/3600, arbiter.HumanDuration(by), extra/3600)
		}
	}
	total := to.Sub(*a.a.ReadyAt)
	e.fsSetEnd(a, to, fmt.Sprintf("%s (%s, extended) reached", arbiter.ReasonTimeLimit, arbiter.HumanDuration(total)), endLimit, now)
	e.emitAlloc(now, arbiter.EventAllocationExtended, subject(a), &a.a)
	return a.a, nil
}

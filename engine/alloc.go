package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

func (e *Engine) allocate(c arbiter.Allocate, now time.Time) (any, error) {
	r := c.Request
	// With tokens, the owner is who asks (docs/guides/security.md, "Owners").
	r.SetPrincipal(c.Caller.Name)
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if r.IdleExempt && c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may exempt a request from idle reclaim (idle_exempt)")
	}
	if strings.HasPrefix(r.Owner, arbiter.PoolOwnerPrefix) {
		return nil, arbiter.Errorf(arbiter.EInvalid, "owner %q: the prefix %q is reserved for pools' backing allocations", r.Owner, arbiter.PoolOwnerPrefix)
	}
	if r.Pool != "" {
		return e.allocateSlot(c, now)
	}
	if r.Grid != nil {
		return e.allocateGrid(c, now)
	}
	if r.Machine != "" && e.byName[r.Machine] == nil {
		return nil, arbiter.Errorf(arbiter.EInvalid, "machine %q is not known; `arbiter status` lists the machines", r.Machine)
	}
	if err := e.fsAllocCheck(c.Caller, r, now); err != nil { // quotas, reservations: fsplace.go
		return nil, err
	}
	a := e.newAlloc(c.Caller, r, now)
	e.admit(a, now)
	return a.a, nil
}

// newAlloc creates a queued allocation for a valid request, with its id and
// keepalive, not yet placed.
func (e *Engine) newAlloc(c arbiter.Caller, r arbiter.Request, now time.Time) *alloc {
	r.Tags = append([]string(nil), r.Tags...)
	if r.KeepaliveS != nil {
		k := *r.KeepaliveS
		r.KeepaliveS = &k
	}
	a := e.pendingAlloc(c, r, now)
	e.nextID++
	e.allocs[a.a.ID] = a
	e.refreshKeepalive(a, now)
	return a
}

// pendingAlloc returns a queued allocation for r with the next id, not yet
// counted, registered or placed.
func (e *Engine) pendingAlloc(c arbiter.Caller, r arbiter.Request, now time.Time) *alloc {
	a := &alloc{a: arbiter.Allocation{
		ID:         e.nextID,
		Owner:      r.Owner,
		Label:      r.Label,
		State:      arbiter.StateQueued,
		Request:    r,
		Priority:   r.Priority,
		KeepaliveS: r.KeepaliveS,
		CreatedAt:  now,
		Devices:    []arbiter.DeviceRef{},
		Principal:  c.Name,
	}}
	a.ka = keepaliveDeadline(a)
	e.fsNew(a) // its group and time limit: fairshare.go
	return a
}

// admit places a new allocation now if it fits, destroys it if it never can,
// and queues it otherwise.
func (e *Engine) admit(a *alloc, now time.Time) {
	e.fsRank(now) // the groups' order now: fairshare.go
	skip := e.reservedAhead(a, now)
	if mi, gpus := e.find(a, skip); mi >= 0 {
		e.grant(a, e.ms[mi], gpus, now)
		return
	}
	// Only a request that does not fit now pays for the full check.
	if why := place.Impossible(e.cluster.Machines, &a.a.Request); why != "" {
		e.destroy(a, "impossible: "+why, now)
		return
	}
	e.enqueue(a)
	e.fsQueued(a)
	e.explain(a, skip)
	a.blocked = skip != nil
	e.dirty(a)
	e.emitAlloc(now, arbiter.EventAllocationQueued, subject(a), &a.a)
	e.preemptPass(now) // it may preempt: preempt.go
}

// find places a on the best machine not skipped: the one its request names,
// or the best-fitting of all.
func (e *Engine) find(a *alloc, skip func(int) bool) (int, []int) {
	if e.fs.on {
		return e.fsFind(a, skip, e.fs.lastNow) // quotas, reservations: fsplace.go
	}
	r := &a.a.Request
	if r.Machine != "" {
		if a.named == nil {
			a.named = e.byName[r.Machine]
		}
		if gpus := e.cluster.On(a.named.pos, r, skip); gpus != nil {
			return a.named.pos, gpus
		}
		return -1, nil
	}
	return e.cluster.Best(r, skip)
}

// grant gives a the GPUs at positions gpus of machine mc.
func (e *Engine) grant(a *alloc, mc *machine, gpus []int, now time.Time) {
	idx := make([]int, len(gpus))
	for i, p := range gpus {
		idx[i] = mc.m.GPUs[p].Index
	}
	e.hold(a, mc, idx)
	a.a.State = arbiter.StateReady
	a.a.WhyQueued = nil
	t := now
	a.a.ReadyAt = &t
	e.fsGranted(a, now) // group, quotas, time limit: fairshare.go
	e.dirty(a)
	e.emitAlloc(now, arbiter.EventAllocationReady, subject(a), &a.a)
	e.poolBackingReady(a, now)
}

// hold records that a holds GPU indices idx of mc, and its device list.
func (e *Engine) hold(a *alloc, mc *machine, idx []int) {
	a.mach, a.gpus = mc, idx
	name := mc.m.Name
	a.a.Machine = &name
	devs := make([]arbiter.DeviceRef, len(idx))
	for i, gi := range idx {
		p := gpuPos(&mc.m, gi)
		g := &mc.m.GPUs[p]
		mc.held[p] = a.a.ID
		devs[i] = arbiter.DeviceRef{Machine: name, Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMGiB: g.VRAMGiB}
	}
	a.a.Devices = devs
	mc.allocs[a.a.ID] = a
	e.updateIndex(mc)
}

func (e *Engine) keepalive(c arbiter.Keepalive, now time.Time) (any, error) {
	a := e.allocs[c.ID]
	if a == nil {
		if r := e.retired[c.ID]; r != nil {
			return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d was destroyed: %s", c.ID, arbiter.StrOr(r.Reason, ""))
		}
		return nil, arbiter.Errorf(arbiter.ENotFound, "allocation %d does not exist", c.ID)
	}
	if err := arbiter.MayTouch(c.Caller, &a.a, "keep it alive"); err != nil {
		return nil, err
	}
	e.refreshKeepalive(a, now)
	e.p.touchedAllocs[a.a.ID] = struct{}{}
	return a.a, nil
}

func (e *Engine) refreshKeepalive(a *alloc, now time.Time) {
	if a.a.KeepaliveS == nil {
		e.dl.clear(&a.ka)
		a.a.ExpiresAt = nil
		return
	}
	at := now.Add(time.Duration(*a.a.KeepaliveS * float64(time.Second)))
	a.a.ExpiresAt = &at
	e.dl.set(&a.ka, at)
}

func (e *Engine) release(c arbiter.Release, now time.Time) (any, error) {
	if err := arbiter.ValidateText("reason", c.Reason, arbiter.MaxReasonBytes); err != nil {
		return nil, err
	}
	a := e.allocs[c.ID]
	if a == nil {
		if r := e.retired[c.ID]; r != nil {
			return *r, nil
		}
		return nil, arbiter.Errorf(arbiter.ENotFound, "allocation %d does not exist", c.ID)
	}
	if c.Caller.Role != arbiter.RoleAdmin && strings.HasPrefix(a.a.Owner, arbiter.PoolOwnerPrefix) {
		return nil, arbiter.Errorf(arbiter.EForbidden, "allocation %d is a backing of %s; only an admin may release it (its slots go with it)", c.ID, a.a.Owner)
	}
	if c.Caller.Role != arbiter.RoleAdmin && strings.HasPrefix(a.a.Owner, arbiter.ServiceOwnerPrefix) {
		return nil, arbiter.Errorf(arbiter.EForbidden, "allocation %d holds the GPUs of %s; only an admin may release it", c.ID, a.a.Owner)
	}
	if err := arbiter.MayTouch(c.Caller, &a.a, "release it"); err != nil {
		return nil, err
	}
	reason := c.Reason
	if reason == "" {
		reason = "released"
	}
	e.swaps.letGo(e, &a.a) // an admin's word: a service's GPUs stay free until its next sync
	e.destroy(a, reason, now)
	e.schedule(now)
	return a.a, nil
}

// destroy ends a live allocation: its GPUs are freed (the caller schedules),
// it leaves the queue and is retired into the bounded history.
func (e *Engine) destroy(a *alloc, reason string, now time.Time) {
	if a.a.State == arbiter.StateDestroyed {
		return // already ended by a cascade (a pool backing taking its slots)
	}
	// Even a queued allocation frees something: the machines held for it
	// while it was starving.
	e.freed = true
	e.fsEnding(a, now)         // fair share: fairshare.go
	e.gtEnding(a, reason, now) // accounting; releasing on an observed machine (gputruth.go)
	if mc := a.mach; mc != nil {
		for _, gi := range a.gpus {
			if p := gpuPos(&mc.m, gi); p >= 0 && mc.held[p] == a.a.ID {
				mc.held[p] = 0
			}
		}
		delete(mc.allocs, a.a.ID)
		e.gtBlock(mc)
		e.updateIndex(mc)
	}
	if a.a.State == arbiter.StateQueued {
		e.dequeue(a)
	}
	e.dl.clear(&a.ka)
	a.a.State = arbiter.StateDestroyed
	a.a.Reason = &reason
	t := now
	a.a.DestroyedAt = &t
	a.a.ExpiresAt = nil
	a.a.WhyQueued, a.a.Position, a.a.ETA = nil, nil, nil
	delete(e.allocs, a.a.ID)
	rec := a.a
	e.retire(&rec)
	e.trimRetired()
	e.p.allocs[rec.ID] = struct{}{}
	e.emitAlloc(now, arbiter.EventAllocationDestroyed, subject(a), &rec)
	e.gtEnded(a, now) // the agent's orders for its processes (gputruth.go)
	e.poolAllocationDestroyed(&rec, now)
	for _, c := range e.caps {
		if w, ok := c.(destroyWatcher); ok {
			w.allocationDestroyed(e, &rec, now)
		}
	}
}

// destroyWatcher is implemented by capabilities that hold allocations for
// their own records (a claimed task, a pool's backing) and must learn when
// one ends, whoever ended it.
type destroyWatcher interface {
	allocationDestroyed(e *Engine, a *arbiter.Allocation, now time.Time)
}

// grantNow allocates r at once for a capability (a claimed task's GPUs),
// never queueing: on r.Machine if named, else wherever placement chooses.
// It returns the ready allocation's id. Errors: invalid for a bad request,
// conflict when the GPUs are not free now (with the reason).
func (e *Engine) grantNow(c arbiter.Caller, r arbiter.Request, now time.Time) (int64, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	if r.Machine != "" && e.byName[r.Machine] == nil {
		return 0, arbiter.Errorf(arbiter.EInvalid, "machine %q is not known", r.Machine)
	}
	a := e.pendingAlloc(c, r, now)
	e.fsRank(now) // the groups' usage brought to now: the grant judges whether it is preemptible
	mi, gpus := e.find(a, e.reservedAhead(a, now))
	if mi < 0 {
		why := place.Impossible(e.cluster.Machines, &r)
		if why == "" {
			why = "the GPUs it needs are not free now"
		}
		return 0, arbiter.Errorf(arbiter.EConflict, "cannot allocate %d GPU(s): %s", r.GPUs, why)
	}
	e.nextID++
	e.allocs[a.a.ID] = a
	e.refreshKeepalive(a, now)
	e.grant(a, e.ms[mi], gpus, now)
	return a.a.ID, nil
}

// end destroys live allocation id with reason and places what that frees;
// an id already destroyed or unknown is ignored.
func (e *Engine) end(id int64, reason string, now time.Time) {
	if a := e.allocs[id]; a != nil {
		e.destroy(a, reason, now)
		e.schedule(now)
	}
}

// retire keeps an ended allocation in the history. A grid allocation's
// place in it is the grids' (max_retired_jobs, grids.retire), so that
// GPU allocations ending cannot push out a spalloc job just destroyed.
func (e *Engine) retire(rec *arbiter.Allocation) {
	e.retired[rec.ID] = rec
	if rec.Request.Grid == nil {
		e.order = append(e.order, rec.ID)
	}
}

// trimRetired forgets the oldest destroyed allocations beyond the history
// bound; the store deletes them too.
func (e *Engine) trimRetired() {
	for len(e.order) > e.cfg.History {
		id := e.order[0]
		e.order = e.order[1:]
		delete(e.retired, id)
		delete(e.p.allocs, id)
		e.p.removedAllocs = append(e.p.removedAllocs, id)
	}
	// Let the backing array go once it has shrunk well below its capacity.
	if cap(e.order) > 4*e.cfg.History && len(e.order) < cap(e.order)/2 {
		e.order = append([]int64(nil), e.order...)
	}
}

func (e *Engine) enqueue(a *alloc) {
	i := sort.Search(len(e.queue), func(i int) bool { return before(a, e.queue[i]) })
	e.queue = append(e.queue, nil)
	copy(e.queue[i+1:], e.queue[i:])
	e.queue[i] = a
	e.countQueued(a, 1)
	e.fs.qver++
}

func (e *Engine) dequeue(a *alloc) {
	for i, q := range e.queue {
		if q == a {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			e.countQueued(a, -1)
			e.fs.qver++ // the ones behind move up
			e.fs.etaDirty = true
			return
		}
	}
}

func (e *Engine) countQueued(a *alloc, d int) {
	n := max(a.a.Request.GPUs, 0)
	for len(e.queuedBySize) <= n {
		e.queuedBySize = append(e.queuedBySize, 0)
	}
	e.queuedBySize[n] += d
}

// mayFit reports whether some queued request wants at most free GPUs: when
// none does, no pass over the queue can place anything.
func (e *Engine) mayFit(free int) bool {
	for n := 0; n <= free && n < len(e.queuedBySize); n++ {
		if e.queuedBySize[n] > 0 {
			return true
		}
	}
	return false
}

// before is the queue order: higher priority first, then the group with
// the higher fair-share factor (fairshare.go), then older (lower id).
func before(a, b *alloc) bool {
	if a.a.Priority != b.a.Priority {
		return a.a.Priority > b.a.Priority
	}
	if ra, rb := rankOf(a), rankOf(b); ra != rb {
		return ra < rb
	}
	return a.a.ID < b.a.ID
}

func (e *Engine) starving(a *alloc, now time.Time) bool {
	// One its own quota holds back waits for the quota: holding others'
	// machines would not bring it sooner.
	return e.waitedTooLong(a, now) && (len(e.fs.quotas) == 0 || e.quotaBlock(a, now) == nil)
}

// waitedTooLong reports whether a has waited past the starvation limit,
// and could be brought sooner by holding machines for it: not a request
// inside a reservation, which waits for its window on GPUs kept for it.
func (e *Engine) waitedTooLong(a *alloc, now time.Time) bool {
	return e.cfg.Starvation > 0 && now.Sub(a.a.CreatedAt) >= e.cfg.Starvation && a.a.Request.Reservation == ""
}

// reservedAhead returns the machines held for starving requests queued ahead
// of a (nil when none), as a skip function for placement.
func (e *Engine) reservedAhead(a *alloc, now time.Time) func(int) bool {
	if (e.cfg.Starvation <= 0 && len(e.fs.victims) == 0) || a.a.Request.Reservation != "" {
		return nil
	}
	any := false
	e.clearReserve()
	for _, q := range e.queue {
		if q == a || !before(q, a) {
			break
		}
		if len(e.fs.victims) > 0 && e.preemptHold(q) {
			any = true
		}
		if e.starving(q, now) {
			e.reserveFor(q)
			any = true
		}
	}
	if !any {
		return nil
	}
	return func(i int) bool { return e.reserve[i] != 0 }
}

func (e *Engine) clearReserve() {
	if len(e.reserve) != len(e.ms) {
		e.reserve = make([]int64, len(e.ms))
	}
	clear(e.reserve)
}

// reserveFor holds, for q, every usable machine that could ever hold it and
// is not already held for a request ahead of it.
func (e *Engine) reserveFor(q *alloc) {
	for i := range e.ms {
		if e.reserve[i] == 0 && e.cluster.Index.Free(i) >= 0 && e.cluster.Eligible(i, &q.a.Request) {
			e.reserve[i] = q.a.ID
		}
	}
}

// schedule places queued requests that fit, in queue order. A request that
// does not fit lets later ones backfill, unless it has waited past the
// starvation limit: then the machines it could use are held for it.
func (e *Engine) schedule(now time.Time) {
	e.freed = false
	e.swaps.holdWaiting(e, now, false) // a configured service's GPUs come first: swaps.go
	e.poolRehome(now)                  // slots waiting for a backing take freed slots: pools.go
	e.fsRank(now)                      // the queue order of groups: fairshare.go
	defer e.preemptPass(now)           // preempt.go
	maxFree := e.cluster.Index.MaxFree()
	if !e.mayFit(maxFree) {
		// Nothing can be placed, so the holds for starving requests and the
		// explanations stay as the last full pass left them.
		return
	}
	e.clearReserve()
	reserving := false
	skip := func(i int) bool { return e.reserve[i] != 0 }
	kept := e.queue[:0] // filtered in place: kept never overtakes the loop
	preempting := len(e.fs.victims) > 0
	for _, a := range e.queue {
		r := &a.a.Request
		if r.GPUs <= maxFree {
			var sk func(int) bool
			if reserving && r.Reservation == "" { // a reservation's GPUs are kept for it anyway
				sk = skip
			}
			if mi, gpus := e.find(a, sk); mi >= 0 {
				e.countQueued(a, -1)
				e.grant(a, e.ms[mi], gpus, now)
				maxFree = e.cluster.Index.MaxFree()
				continue
			}
		}
		kept = append(kept, a)
		if preempting && e.preemptHold(a) { // preempt.go
			reserving = true
		}
		if e.starving(a, now) {
			e.reserveFor(a)
			reserving = true
		}
		if reserving || a.blocked || e.fsExplainNeeded(a) {
			e.explain(a, skip)
			a.blocked = reserving
		}
	}
	clear(e.queue[len(kept):])
	e.queue = kept
}

// explain sets a queued allocation's why_queued, marking it dirty only when
// the text changes.
func (e *Engine) explain(a *alloc, skip func(int) bool) {
	heldFor := func(i int) int64 {
		if skip == nil || !skip(i) || e.reserve[i] == a.a.ID {
			return 0
		}
		return e.reserve[i]
	}
	why := e.cluster.WhyQueued(&a.a.Request, heldFor)
	if a.fs != nil {
		why = e.fsWhy(a, why, e.fs.lastNow) // quotas, reservations: fsplace.go
	}
	if a.a.WhyQueued == nil || whyBase(*a.a.WhyQueued) != why { // without its ETA: eta.go
		a.a.WhyQueued = &why
		e.dirty(a)
		e.explainSlots(a) // a pool's backing: its waiting slots say so too (pools.go)
	}
}

// reviewQueue re-examines every queued request after the set of machines
// changed: those that can no longer ever fit are destroyed, the rest get a
// fresh explanation, and whatever fits now is placed.
func (e *Engine) reviewQueue(now time.Time) {
	for _, a := range append([]*alloc(nil), e.queue...) {
		r := &a.a.Request
		if r.Machine != "" && e.byName[r.Machine] == nil {
			e.destroy(a, fmt.Sprintf("impossible: machine %q is gone", r.Machine), now)
			continue
		}
		if why := place.Impossible(e.cluster.Machines, r); why != "" {
			e.destroy(a, "impossible: "+why, now)
		}
	}
	e.schedule(now)
	e.clearReserve()
	for _, a := range e.queue {
		e.explain(a, nil)
	}
}

// expire acts on every deadline that has passed by now, then places what
// the expiries freed.
func (e *Engine) expire(now time.Time) {
	for d := e.dl.next(); d != nil && !d.at.After(now); d = e.dl.next() {
		e.dl.clear(d)
		d.fire(e, now)
	}
	if e.freed {
		e.schedule(now)
	}
}

func keepaliveDeadline(a *alloc) deadline {
	return newDeadline(func(e *Engine, now time.Time) { e.destroy(a, "keepalive expired", now) })
}

func (e *Engine) dirty(a *alloc) { e.p.allocs[a.a.ID] = struct{}{} }

func subject(a *alloc) string { return fmt.Sprintf("allocation/%d", a.a.ID) }

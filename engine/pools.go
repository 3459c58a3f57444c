package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// pools packs slot requests onto shared backing allocations
// (docs/reference/pools.md). Its state is derived from the allocations — backings are
// owned by "pool:NAME", slots record backing and index — so nothing of it is
// stored apart from them; the status records it publishes are memory-only.
type pools struct {
	e        *Engine
	cfg      map[string]arbiter.Pool
	backings map[int64]*backing
	byPool   map[string][]*backing // in backing id order
	dirty    map[string]bool       // pools whose status changed
	shown    map[string]bool       // pools with a published status
}

// backing is one backing allocation and its slots.
type backing struct {
	id       int64
	pool     string
	slots    []int64 // slot allocation per index; 0 = free
	lastUsed time.Time
	draining bool
	release  deadline // gives the backing back once empty long enough
	drain    deadline // max_age_s
}

func (p *pools) init() {
	if p.backings == nil {
		p.cfg = map[string]arbiter.Pool{}
		p.backings = map[int64]*backing{}
		p.byPool = map[string][]*backing{}
		p.dirty = map[string]bool{}
		p.shown = map[string]bool{}
	}
}

func (p *pools) kinds() []string { return []string{arbiter.RecordPool} }

// load does nothing: pool state is rebuilt from the allocations
// (rebuildPools) before the queue is reviewed, and pool statuses are
// never stored.
func (p *pools) load(*Engine, []arbiter.Record, time.Time) error { return nil }

func (p *pools) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	c, ok := cmd.(arbiter.SyncPools)
	if !ok {
		return nil, nil, false
	}
	return nil, e.syncPools(c.Pools, now), true
}

func (p *pools) records() []arbiter.Record {
	var out []arbiter.Record
	for _, name := range p.names() {
		out = append(out, arbiter.Record{Kind: arbiter.RecordPool, Key: name, Value: p.e.poolStatus(name)})
	}
	return out
}

// names lists every pool that is configured or still has backings.
func (p *pools) names() []string {
	seen := map[string]bool{}
	var out []string
	for n := range p.cfg {
		seen[n] = true
		out = append(out, n)
	}
	for n, bs := range p.byPool {
		if !seen[n] && len(bs) > 0 {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (p *pools) status(name string) arbiter.PoolStatus {
	cfg, configured := p.cfg[name]
	if !configured {
		cfg = arbiter.Pool{Name: name}
	}
	st := arbiter.PoolStatus{Pool: cfg, Configured: configured, Backings: []arbiter.BackingStatus{}}
	return st
}

// rebuildPools derives the pool state from the restored allocations. Slots
// whose backing is gone are destroyed with a reason. Configuration arrives
// later with SyncPools; until then every backing counts as draining.
func (e *Engine) rebuildPools(now time.Time) {
	p := &e.pools
	p.init()
	p.e = e
	for _, a := range sortedAllocs(e.allocs) {
		if name, ok := strings.CutPrefix(a.a.Owner, arbiter.PoolOwnerPrefix); ok && a.a.Backing == nil {
			b := p.add(e, a.a.ID, name, 1, now)
			b.draining = true
		}
	}
	for _, a := range sortedAllocs(e.allocs) {
		if a.a.Backing == nil {
			continue
		}
		b := p.backings[*a.a.Backing]
		idx := 0
		if a.a.Slot != nil {
			idx = *a.a.Slot
		}
		if b == nil || idx < 0 || idx >= arbiter.MaxPoolSlots {
			e.destroy(a, fmt.Sprintf("backing allocation %d of pool %s is gone", *a.a.Backing, a.a.Pool), now)
			continue
		}
		for len(b.slots) <= idx {
			b.slots = append(b.slots, 0)
		}
		if b.slots[idx] != 0 {
			e.destroy(a, fmt.Sprintf("slot %d of backing allocation %d is held twice after a restart", idx, b.id), now)
			continue
		}
		b.slots[idx] = a.a.ID
	}
	// An empty backing's grace runs from when its last slot was freed, not
	// from the restart: a server restarted more often than the grace time
	// would otherwise never give one back.
	// The kept history tells when: its latest ended slot's end, else its
	// grant, else its creation.
	ended := make(map[int64]time.Time)
	for _, r := range e.retired {
		if r.Backing != nil && r.DestroyedAt != nil && r.DestroyedAt.After(ended[*r.Backing]) {
			ended[*r.Backing] = *r.DestroyedAt
		}
	}
	for id, b := range p.backings {
		last, a := ended[id], e.allocs[id]
		if last.IsZero() {
			last = a.a.CreatedAt
			if a.a.ReadyAt != nil {
				last = *a.a.ReadyAt
			}
		}
		if last.Before(now) {
			b.lastUsed = last
		}
	}
}

// add registers backing allocation id of pool name with n slots.
func (p *pools) add(e *Engine, id int64, name string, n int, now time.Time) *backing {
	b := &backing{id: id, pool: name, slots: make([]int64, n), lastUsed: now}
	b.release = newDeadline(func(e *Engine, now time.Time) { e.releaseIfEmpty(b, now) })
	b.drain = newDeadline(func(e *Engine, now time.Time) { e.drainBacking(b, now) })
	p.backings[id] = b
	p.byPool[name] = append(p.byPool[name], b)
	p.dirty[name] = true
	return b
}

func (b *backing) empty() bool {
	for _, id := range b.slots {
		if id != 0 {
			return false
		}
	}
	return true
}

// syncPools installs the configured pools. Backings of pools no longer
// configured drain; others take the new settings (a backing keeps the slots
// it has, growing if the pool now has more).
func (e *Engine) syncPools(ps []arbiter.Pool, now time.Time) error {
	cfg, err := checkConfigPools(ps)
	if err != nil {
		return err
	}
	p := &e.pools
	p.init()
	for n := range p.cfg {
		p.dirty[n] = true
	}
	p.cfg = cfg
	for _, name := range p.names() {
		p.dirty[name] = true
		pool, configured := cfg[name]
		for _, b := range append([]*backing(nil), p.byPool[name]...) {
			b.draining = !configured
			if configured {
				for len(b.slots) < pool.Slots {
					b.slots = append(b.slots, 0)
				}
				b.trimSlots(pool.Slots)
				e.setDrainDeadline(b)
			}
			e.planRelease(b, now)
		}
	}
	// More slots, or a pool configured again, may free slots on granted
	// backings: the slots waiting for a backing of their own take them
	// before any later request.
	e.poolRehome(now)
	return nil
}

// checkConfigPools returns the configured pools ps by name, as the engine keeps
// them. Errors: invalid, for a pool that does not validate or a name
// declared twice.
func checkConfigPools(ps []arbiter.Pool) (map[string]arbiter.Pool, error) {
	cfg := make(map[string]arbiter.Pool, len(ps))
	for _, pool := range ps {
		if err := pool.Validate(); err != nil {
			return nil, err
		}
		if _, dup := cfg[pool.Name]; dup {
			return nil, arbiter.Errorf(arbiter.EInvalid, "pool %q is declared twice", pool.Name)
		}
		pool.Backing.Owner = arbiter.PoolOwnerPrefix + pool.Name
		pool.Backing.KeepaliveS = nil
		cfg[pool.Name] = pool
	}
	return cfg, nil
}

// allocateSlot serves a request for one slot of a pool.
func (e *Engine) allocateSlot(c arbiter.Allocate, now time.Time) (any, error) {
	r := c.Request
	p := &e.pools
	p.init()
	pool, ok := p.cfg[r.Pool]
	if !ok {
		names := make([]string, 0, len(p.cfg))
		for n := range p.cfg {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, arbiter.Errorf(arbiter.EInvalid, "pool %q is not configured (pools: %s)", r.Pool, strings.Join(names, ", "))
	}
	slot := e.newAlloc(c.Caller, r, now)
	slot.a.Pool = r.Pool
	var b *backing
	idx := -1
	for _, cand := range p.byPool[r.Pool] {
		if !e.takesSlots(cand, false) {
			continue
		}
		for i, id := range cand.slots[:min(len(cand.slots), pool.Slots)] {
			if id == 0 {
				b, idx = cand, i
				break
			}
		}
		if b != nil {
			break
		}
	}
	if b == nil {
		br := pool.Backing
		// The configured priority is the backing's floor; a slot asked for
		// at a higher one brings its backing up with it.
		br.Priority = max(br.Priority, r.Priority)
		ba := e.newAlloc(arbiter.Caller{}, br, now)
		b = p.add(e, ba.a.ID, r.Pool, pool.Slots, now)
		e.setDrainDeadline(b)
		idx = 0
		b.slots[0] = slot.a.ID
		e.linkSlot(slot, b, idx)
		e.admit(ba, now) // may grant at once (readying the slot), or destroy it
		if slot.a.State == arbiter.StateQueued && e.allocs[ba.a.ID] != nil {
			e.queueSlot(slot, ba, now)
		}
		return e.current(slot), nil
	}
	b.slots[idx] = slot.a.ID
	e.dl.clear(&b.release)
	e.linkSlot(slot, b, idx)
	ba := e.allocs[b.id]
	if ba.a.State == arbiter.StateReady {
		e.readySlot(slot, ba, now)
	} else {
		if r.Priority > ba.a.Request.Priority {
			// The backing now waits for this slot too: it queues at its
			// priority, as a backing made for it would have.
			e.dequeue(ba)
			ba.a.Request.Priority, ba.a.Priority = r.Priority, r.Priority
			e.enqueue(ba)
			e.dirty(ba)
		}
		e.queueSlot(slot, ba, now)
	}
	return e.current(slot), nil
}

// current returns the latest record of a, live or retired.
func (e *Engine) current(a *alloc) arbiter.Allocation {
	if r := e.record(a.a.ID); r != nil {
		return *r
	}
	return a.a
}

func (e *Engine) linkSlot(slot *alloc, b *backing, idx int) {
	id, i := b.id, idx
	slot.a.Backing, slot.a.Slot = &id, &i
	e.pools.dirty[b.pool] = true
}

func (e *Engine) queueSlot(slot, ba *alloc, now time.Time) {
	e.explainSlot(slot, ba)
	e.emitAlloc(now, arbiter.EventAllocationQueued, subject(slot), &slot.a)
}

// explainSlot sets a queued slot's why_queued from its backing's.
func (e *Engine) explainSlot(slot, ba *alloc) {
	why := fmt.Sprintf("waiting for backing allocation %d of pool %s", ba.a.ID, slot.a.Pool)
	if ba.a.WhyQueued != nil {
		why += ": " + *ba.a.WhyQueued
	}
	if slot.a.WhyQueued == nil || *slot.a.WhyQueued != why {
		slot.a.WhyQueued = &why
		e.dirty(slot)
	}
}

// takesSlots reports whether new slots may land on b: not draining, its
// machine neither down nor drained, and, with granted, its GPUs granted.
func (e *Engine) takesSlots(b *backing, granted bool) bool {
	ba := e.allocs[b.id]
	switch {
	case b.draining || ba == nil:
		return false
	case granted && ba.a.State != arbiter.StateReady:
		return false
	}
	return ba.mach == nil || !ba.mach.m.Down && !ba.mach.m.Draining
}

// poolRehome moves the slots waiting for a backing not granted yet onto
// free slots of a granted one — a slot released, a machine back up or
// undrained — oldest first: a later request must not take a freed slot
// while an earlier one waits. A waiting backing left empty goes back at
// once. schedule calls it, before the queue.
func (e *Engine) poolRehome(now time.Time) {
	p := &e.pools
	if len(p.byPool) == 0 {
		return // every release calls it: without pools it costs nothing
	}
	for _, name := range sortedKeys(p.byPool) {
		bs := p.byPool[name]
		var waiting []*alloc
		for _, b := range bs {
			if ba := e.allocs[b.id]; ba != nil && ba.a.State == arbiter.StateQueued {
				for _, id := range b.slots {
					if s := e.allocs[id]; s != nil && s.a.State == arbiter.StateQueued {
						waiting = append(waiting, s)
					}
				}
			}
		}
		pool, configured := p.cfg[name]
		if len(waiting) == 0 || !configured {
			continue
		}
		sort.Slice(waiting, func(i, j int) bool { return waiting[i].a.ID < waiting[j].a.ID })
		var vacated []*backing
		for _, b := range bs {
			if len(waiting) == 0 {
				break
			}
			if !e.takesSlots(b, true) {
				continue
			}
			for i := range b.slots[:min(len(b.slots), pool.Slots)] {
				if b.slots[i] != 0 || len(waiting) == 0 {
					continue
				}
				s := waiting[0]
				waiting = waiting[1:]
				if old := p.backings[*s.a.Backing]; old != nil {
					old.slots[*s.a.Slot] = 0
					vacated = append(vacated, old)
				}
				b.slots[i] = s.a.ID
				e.dl.clear(&b.release)
				e.linkSlot(s, b, i)
				e.readySlot(s, e.allocs[b.id], now)
			}
		}
		for _, old := range vacated {
			e.planRelease(old, now) // empty and not granted: given back at once
		}
	}
}

// readySlot gives a slot its backing's machine and devices.
func (e *Engine) readySlot(slot, ba *alloc, now time.Time) {
	slot.a.State = arbiter.StateReady
	slot.a.Machine = ba.a.Machine
	slot.a.Devices = ba.a.Devices
	slot.a.WhyQueued = nil
	t := now
	slot.a.ReadyAt = &t
	e.dirty(slot)
	e.emitAlloc(now, arbiter.EventAllocationReady, subject(slot), &slot.a)
}

// poolBackingReady readies the slots waiting for a backing just granted.
func (e *Engine) poolBackingReady(a *alloc, now time.Time) {
	b := e.pools.backings[a.a.ID]
	if b == nil {
		return
	}
	for _, id := range b.slots {
		if s := e.allocs[id]; s != nil && s.a.State == arbiter.StateQueued {
			e.readySlot(s, a, now)
		}
	}
	e.setDrainDeadline(b)
	e.pools.dirty[b.pool] = true
}

// poolAllocationDestroyed keeps the pools right when any allocation ends: a
// backing takes its slots with it; a slot frees its index.
func (e *Engine) poolAllocationDestroyed(rec *arbiter.Allocation, now time.Time) {
	p := &e.pools
	if b := p.backings[rec.ID]; b != nil {
		delete(p.backings, rec.ID)
		bs := p.byPool[b.pool]
		for i, x := range bs {
			if x == b {
				p.byPool[b.pool] = append(bs[:i:i], bs[i+1:]...)
				break
			}
		}
		e.dl.clear(&b.release)
		e.dl.clear(&b.drain)
		p.dirty[b.pool] = true
		for _, id := range b.slots {
			if s := e.allocs[id]; s != nil {
				e.destroy(s, fmt.Sprintf("backing allocation %d of pool %s ended: %s", rec.ID, b.pool, arbiter.StrOr(rec.Reason, "")), now)
			}
		}
		return
	}
	if rec.Backing == nil || rec.Slot == nil {
		return
	}
	b := p.backings[*rec.Backing]
	if b == nil || *rec.Slot >= len(b.slots) || b.slots[*rec.Slot] != rec.ID {
		return
	}
	b.slots[*rec.Slot] = 0
	if pool, ok := p.cfg[b.pool]; ok {
		b.trimSlots(pool.Slots)
	}
	b.lastUsed = now
	p.dirty[b.pool] = true
	e.planRelease(b, now)
}

// trimSlots drops the empty slots past n at the end of b's: after a reload
// lowered the pool's slots, those past the number go once empty (at the
// reload, or as they are freed); allocateSlot hands none of them out.
func (b *backing) trimSlots(n int) {
	for len(b.slots) > n && b.slots[len(b.slots)-1] == 0 {
		b.slots = b.slots[:len(b.slots)-1]
	}
}

// planRelease sets when an empty backing is given back: grace_time_s after
// its last slot was freed, but not before min_retention_s after it was
// granted; at once when draining or still waiting for its GPUs.
func (e *Engine) planRelease(b *backing, now time.Time) {
	if !b.empty() {
		e.dl.clear(&b.release)
		return
	}
	ba := e.allocs[b.id]
	if ba == nil {
		return
	}
	at := now
	if pool, ok := e.pools.cfg[b.pool]; ok && !b.draining && ba.a.State == arbiter.StateReady {
		at = b.lastUsed.Add(seconds(pool.GraceTimeS))
		if ba.a.ReadyAt != nil {
			if keep := ba.a.ReadyAt.Add(seconds(pool.MinRetentionS)); keep.After(at) {
				at = keep
			}
		}
	}
	if !at.After(now) {
		e.releaseIfEmpty(b, now)
		return
	}
	e.dl.set(&b.release, at)
	e.pools.dirty[b.pool] = true
}

func (e *Engine) releaseIfEmpty(b *backing, now time.Time) {
	if !b.empty() || e.pools.backings[b.id] != b {
		return
	}
	reason := fmt.Sprintf("pool %s: no slot in use for its grace time", b.pool)
	if b.draining {
		reason = fmt.Sprintf("pool %s: drained and empty", b.pool)
	}
	e.end(b.id, reason, now)
}

// setDrainDeadline makes a granted backing drain max_age_s after it was
// granted.
func (e *Engine) setDrainDeadline(b *backing) {
	pool, ok := e.pools.cfg[b.pool]
	ba := e.allocs[b.id]
	if !ok || pool.MaxAgeS <= 0 || ba == nil || ba.a.ReadyAt == nil {
		e.dl.clear(&b.drain)
		return
	}
	e.dl.set(&b.drain, ba.a.ReadyAt.Add(seconds(pool.MaxAgeS)))
}

func (e *Engine) drainBacking(b *backing, now time.Time) {
	if e.pools.backings[b.id] != b {
		return
	}
	b.draining = true
	e.pools.dirty[b.pool] = true
	e.planRelease(b, now)
}

// explainSlots gives the slots waiting for ba, when it is a backing, its
// why_queued as it now is (explain and setETA call it when ba's changes).
func (e *Engine) explainSlots(ba *alloc) {
	b := e.pools.backings[ba.a.ID]
	if b == nil {
		return
	}
	for _, id := range b.slots {
		if s := e.allocs[id]; s != nil && s.a.State == arbiter.StateQueued {
			e.explainSlot(s, ba)
		}
	}
}

// flushPoolStatus publishes the status of every pool that changed, for the
// read view (memory-only records).
func (e *Engine) flushPoolStatus() {
	p := &e.pools
	if len(p.dirty) == 0 {
		return
	}
	names := make([]string, 0, len(p.dirty))
	for n := range p.dirty {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		_, configured := p.cfg[n]
		if !configured && len(p.byPool[n]) == 0 {
			if p.shown[n] {
				e.removeRecord(arbiter.RecordPool, n)
				delete(p.shown, n)
			}
			continue
		}
		e.touchRecord(arbiter.RecordPool, n, e.poolStatus(n))
		p.shown[n] = true
	}
	clear(p.dirty)
}

func (e *Engine) poolStatus(name string) arbiter.PoolStatus {
	st := e.pools.status(name)
	for _, b := range e.pools.byPool[name] {
		bs := arbiter.BackingStatus{Allocation: b.id, Draining: b.draining, Slots: make([]*int64, len(b.slots))}
		if ba := e.allocs[b.id]; ba != nil {
			bs.State, bs.Machine = ba.a.State, ba.a.Machine
		}
		for i, id := range b.slots {
			if id != 0 {
				v := id
				bs.Slots[i] = &v
			}
		}
		if b.release.pos >= 0 {
			t := b.release.at
			bs.ReleaseAt = &t
		}
		if b.drain.pos >= 0 {
			t := b.drain.at
			bs.DrainAt = &t
		}
		st.Backings = append(st.Backings, bs)
	}
	return st
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

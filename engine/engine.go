// Package engine is arbiter's state machine: it holds the whole state in
// memory and applies one command at a time, Apply(cmd, now), deciding every
// allocation, expiry and machine change. It does no I/O, starts no goroutine
// and never reads the clock: given the same commands and times it always
// reaches the same state (docs/architecture.md §2.1). The control package runs it and makes
// its changes durable.
package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

// Config holds the engine's policies.
type Config struct {
	// History is how many destroyed allocations are kept for reads: 0 means
	// DefaultHistory, NoHistory (or any negative number) keeps none.
	History int
	// Starvation is how long the queue head may wait before free GPUs on the
	// machines it could use are held for it; 0 never holds (pure backfill).
	Starvation time.Duration
	// HeartbeatTimeout marks an agent's machine down when it has not
	// heartbeated for this long (default 60s).
	HeartbeatTimeout time.Duration
	// EventsKeep is how many events the store keeps (default 100000).
	EventsKeep int64
	// AuditKeep is how many audit entries are kept (default
	// arbiter.DefaultAuditKeep).
	AuditKeep int
	// GridExternalPower: an external power controller switches grid
	// machines' boards (the engine emits intents and waits for reports);
	// otherwise the engine completes each power operation itself after the
	// machine's power delay (engine/grid_power.go).
	GridExternalPower bool
	// Cron parses the cron expression of a recurring reservation
	// (reservations.go); nil refuses recurring reservations. The engine
	// reads no cron itself: the parser's Next is pure.
	Cron func(spec string) (arbiter.CronSchedule, error)
}

// DefaultHistory is Config.History's default; NoHistory keeps no destroyed
// allocation (configuration's allocations.history = 0).
const (
	DefaultHistory = 1200
	NoHistory      = -1
)

func (c *Config) defaults() {
	switch {
	case c.History == 0:
		c.History = DefaultHistory
	case c.History < 0:
		c.History = 0
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 60 * time.Second
	}
	if c.EventsKeep <= 0 {
		c.EventsKeep = 100000
	}
	if c.AuditKeep <= 0 {
		c.AuditKeep = arbiter.DefaultAuditKeep
	}
}

// Engine is the in-memory state. It is not safe for concurrent use: one
// goroutine (control's loop) owns it.
type Engine struct {
	cfg Config

	ms      []*machine // in name order; a machine's pos is its index here
	byName  map[string]*machine
	cluster place.Cluster

	allocs map[int64]*alloc // live: queued or ready
	queue  []*alloc         // queued, by priority (high first) then id
	// queuedBySize counts the queued requests by GPU count, so that a
	// release freeing fewer GPUs than any of them wants skips the queue.
	queuedBySize []int
	retired      map[int64]*arbiter.Allocation
	order        []int64 // retired ids, oldest first

	nextID, nextSeq int64
	trimmed         int64 // events below this seq have been trimmed
	dl              deadlines
	p               pending
	reserve         []int64 // scratch: per machine position, the allocation it is held for
	eventJSON       []byte  // scratch: an event's JSON before it is copied out at its size
	freed           bool    // GPUs were freed since the last scheduling pass
	// loadedGridEnded: the ended grid allocations New read, in the order
	// they ended, for the grids' own history (grids.load takes it).
	loadedGridEnded []int64

	pools pools
	tasks tasks // the work queue (docs/reference/fleet.md): tasks.go
	// coordination (docs/reference/coordination.md): locks.go, swaps.go, webhooks.go, schedules.go
	locks     locks
	swaps     swaps
	webhooks  webhooks
	schedules schedules
	grids     grids // grid machines and spalloc's jobs: grid.go, grid_power.go
	// trust and safety (docs/guides/security.md): sessions.go, audit.go
	sessions sessions
	audit    audit

	// gt is GPU ground truth and accounting: gputruth.go, accounting.go.
	gt gputruth
	// fs is fair share: groups, quotas, time limits, reservations,
	// preemption, ETAs, notifications (fairshare.go and its neighbours).
	fs fairshare

	// caps are the capabilities built on allocations (tasks, locks, pools,
	// grid machines …), each keeping its own state and records.
	caps []capability
}

// capability is a part of the engine that keeps its own state and stores it
// as records of its own kinds (arbiter.Record). Each lives in its own file.
type capability interface {
	// kinds are the record kinds it owns.
	kinds() []string
	// load restores its state from its stored records, at start. now is the
	// time of the load: deadlines start fresh from it.
	load(e *Engine, recs []arbiter.Record, now time.Time) error
	// apply handles the commands it owns; ok is false for any other.
	apply(e *Engine, cmd arbiter.Command, now time.Time) (res any, err error, ok bool)
	// records returns its current records, for the read view at start.
	records() []arbiter.Record
}

type machine struct {
	m      arbiter.Machine
	pos    int
	held   []int64 // per position in m.GPUs
	allocs map[int64]*alloc
	hb     deadline
}

type alloc struct {
	a    arbiter.Allocation
	mach *machine // nil while queued
	gpus []int    // GPU indices (GPU.Index) held on mach
	// named caches the machine a request names; reviewQueue destroys the
	// request before that machine can go away.
	named *machine
	ka    deadline
	// blocked: its why_queued was last written while machines were held
	// for a starving request, so it must be rewritten when that ends.
	blocked bool
	// fs is its fair-share state (fairshare.go); nil while none applies.
	fs *fsAlloc
	// fsWhy: its why_queued was last written by fair share (a quota, a
	// reservation), so it must be rewritten after each pass.
	fsWhy bool
}

// pending is what changed since the last Flush.
type pending struct {
	allocs, touchedAllocs     map[int64]struct{}
	machines, touchedMachines map[string]struct{}
	removedAllocs             []int64
	removedMachines           []string
	events                    []arbiter.Event
	records, touchedRecords   map[arbiter.RecordRef]any
	removedRecords            map[arbiter.RecordRef]struct{}
	blobs                     []arbiter.BlobBytes
}

// New builds an engine from a stored state. Repairs needed to make the state
// consistent (an allocation on a machine that is gone, two allocations on one
// GPU) are made at once and are in the first Flush, as are placements of
// queued requests that now fit. Every live allocation gets a fresh keepalive
// interval from now, every agent machine a fresh heartbeat timeout.
func New(cfg Config, st *arbiter.State, now time.Time) *Engine {
	cfg.defaults()
	now = now.UTC()
	e := &Engine{
		cfg:     cfg,
		byName:  make(map[string]*machine),
		allocs:  make(map[int64]*alloc),
		retired: make(map[int64]*arbiter.Allocation),
		nextID:  max(st.NextAllocationID, 1),
		nextSeq: max(st.NextEventSeq, 1),
	}
	e.fs.lastNow = now
	e.caps = e.capabilities()
	e.p.reset()
	for _, m := range st.Machines {
		mc := &machine{m: m, allocs: make(map[int64]*alloc)}
		mc.m.LastSeen = time.Time{}
		mc.hb = heartbeatDeadline(mc)
		e.byName[m.Name] = mc
		e.ms = append(e.ms, mc)
	}
	e.reindex()
	for _, mc := range e.ms {
		if mc.m.Source == arbiter.SourceAgent {
			e.dl.set(&mc.hb, now.Add(e.cfg.HeartbeatTimeout))
		}
	}
	as := append([]arbiter.Allocation(nil), st.Allocations...)
	// The live ones in the order they came; the ended ones in the order
	// they ended, so that the oldest are forgotten first (trimRetired).
	ended := func(a *arbiter.Allocation) time.Time {
		if a.Live() || a.DestroyedAt == nil {
			return time.Time{}
		}
		return *a.DestroyedAt
	}
	sort.Slice(as, func(i, j int) bool {
		if x, y := ended(&as[i]), ended(&as[j]); !x.Equal(y) {
			return x.Before(y)
		}
		return as[i].ID < as[j].ID
	})
	for i := range as {
		a := as[i]
		if a.ID >= e.nextID {
			e.nextID = a.ID + 1
		}
		if !a.Live() {
			e.retire(&a)
			if a.Request.Grid != nil {
				e.loadedGridEnded = append(e.loadedGridEnded, a.ID)
			}
			continue
		}
		e.restore(&a, now)
	}
	e.gtLoad(st.Records, now) // before the queue is reviewed: gputruth.go
	e.fsLoad(st.Records, now) // likewise: fairshare.go
	e.trimRetired()
	e.rebuildPools(now)
	// The capabilities before the queue: a service waiting for its GPUs
	// (swaps) takes what is free before a queued request does.
	e.loadCaps(st.Records, now)
	e.reviewQueue(now)
	return e
}

// loadCaps hands each capability its stored records. Records of kinds no
// capability owns (written by a newer build) are kept in the store untouched.
func (e *Engine) loadCaps(recs []arbiter.Record, now time.Time) {
	byKind := make(map[string][]arbiter.Record)
	for _, r := range recs {
		byKind[r.Kind] = append(byKind[r.Kind], r)
	}
	for _, c := range e.caps {
		var mine []arbiter.Record
		for _, k := range c.kinds() {
			mine = append(mine, byKind[k]...)
		}
		if err := c.load(e, mine, now); err != nil {
			// A record this build cannot read is a bug or a downgrade; the
			// capability starts without it rather than the server not at all.
			e.emit(now, arbiter.EventEngineLoadError, "engine", map[string]string{"error": err.Error()})
		}
	}
}

// Records returns every capability's current records, for the read view.
func (e *Engine) Records() []arbiter.Record {
	var out []arbiter.Record
	for _, c := range e.caps {
		out = append(out, c.records()...)
	}
	return out
}

// restore puts a stored live allocation back, repairing what no longer holds.
func (e *Engine) restore(rec *arbiter.Allocation, now time.Time) {
	a := &alloc{a: *rec}
	a.ka = keepaliveDeadline(a)
	a.a.ExpiresAt = nil
	e.allocs[a.a.ID] = a
	if a.a.Backing != nil || a.a.Request.Grid != nil {
		// A pool slot holds nothing itself: rebuildPools links it to its
		// backing (or destroys it when the backing is gone). A grid
		// allocation holds boards: the grid capability restores it.
		e.refreshKeepalive(a, now)
		return
	}
	if a.a.State == arbiter.StateQueued {
		e.enqueue(a)
		e.refreshKeepalive(a, now)
		return
	}
	name := ""
	if a.a.Machine != nil {
		name = *a.a.Machine
	}
	mc := e.byName[name]
	if mc == nil {
		e.destroy(a, fmt.Sprintf("machine %q is gone", name), now)
		return
	}
	idx := make([]int, 0, len(a.a.Devices))
	for _, d := range a.a.Devices {
		idx = append(idx, d.Index)
	}
	for _, gi := range idx {
		p := gpuPos(&mc.m, gi)
		if p < 0 || mc.held[p] != 0 {
			e.destroy(a, fmt.Sprintf("GPU %d of %s is gone or held twice after a restart", gi, name), now)
			return
		}
	}
	e.hold(a, mc, idx)
	e.refreshKeepalive(a, now)
}

// reset empties p for the next batch. The sets are reused, as a lone
// caller's batch is flushed per command and seven new maps a batch were a
// tenth of its allocations; one that grew large (a start, a reload) is
// made anew so that its memory goes. The slices went to the batch.
func (p *pending) reset() {
	p.allocs = resetSet(p.allocs)
	p.touchedAllocs = resetSet(p.touchedAllocs)
	p.machines = resetSet(p.machines)
	p.touchedMachines = resetSet(p.touchedMachines)
	p.removedAllocs = nil
	p.removedMachines = nil
	p.events = nil
	p.records = resetSet(p.records)
	p.touchedRecords = resetSet(p.touchedRecords)
	p.removedRecords = resetSet(p.removedRecords)
	p.blobs = nil
}

// resetSet empties m for reuse, or makes a new map in place of a nil or
// large one.
func resetSet[K comparable, V any](m map[K]V) map[K]V {
	if m == nil || len(m) > 256 {
		return make(map[K]V)
	}
	clear(m)
	return m
}

// putRecord saves v as the record (kind, key) with the next batch. v must
// not be changed afterwards: pass a copy.
func (e *Engine) putRecord(kind, key string, v any) {
	ref := arbiter.RecordRef{Kind: kind, Key: key}
	delete(e.p.removedRecords, ref)
	delete(e.p.touchedRecords, ref)
	e.p.records[ref] = v
}

// touchRecord shows v in the read view without saving it: for memory-only
// fields such as a heartbeat time.
func (e *Engine) touchRecord(kind, key string, v any) {
	ref := arbiter.RecordRef{Kind: kind, Key: key}
	if _, dirty := e.p.records[ref]; dirty {
		e.p.records[ref] = v
		return
	}
	e.p.touchedRecords[ref] = v
}

// removeRecord deletes the record (kind, key) with the next batch.
func (e *Engine) removeRecord(kind, key string) {
	ref := arbiter.RecordRef{Kind: kind, Key: key}
	delete(e.p.records, ref)
	delete(e.p.touchedRecords, ref)
	e.p.removedRecords[ref] = struct{}{}
}

// NextDeadline returns when the engine next needs a Tick, or the zero time.
func (e *Engine) NextDeadline() time.Time {
	if d := e.dl.next(); d != nil {
		return d.at
	}
	return time.Time{}
}

// Apply applies one command at time now and returns its result. A command
// that fails changes nothing. Deadlines that have passed by now are acted on
// first, whatever the command, so a late timer never changes an outcome.
func (e *Engine) Apply(cmd arbiter.Command, now time.Time) (any, error) {
	now = now.UTC()
	e.fs.lastNow = now
	e.expire(now)
	switch c := cmd.(type) {
	case arbiter.Allocate:
		return e.allocate(c, now)
	case arbiter.Keepalive:
		return e.keepalive(c, now)
	case arbiter.Release:
		return e.release(c, now)
	case arbiter.RegisterMachine:
		return e.register(c.Machine, now)
	case arbiter.Heartbeat:
		return e.heartbeat(c.Name, now)
	case arbiter.SetDraining:
		return e.setDraining(c, now)
	case arbiter.LeaveMachine:
		return e.leave(c, now) // leave.go
	case arbiter.SyncConfigMachines:
		return nil, e.syncConfig(c.Machines, now)
	case arbiter.Reconfigure:
		return e.reconfigure(c, now) // reconfigure.go
	case arbiter.Tick:
		return nil, nil
	}
	for _, c := range e.caps {
		if res, err, ok := c.apply(e, cmd, now); ok {
			return res, err
		}
	}
	return nil, arbiter.Errorf(arbiter.EInvalid, "unknown command %T", cmd)
}

// Flush returns everything that changed since the last Flush and forgets it.
func (e *Engine) Flush() *arbiter.Changes {
	e.flushPoolStatus()
	e.fsFlush() // queue positions and ETAs: eta.go
	c := &arbiter.Changes{
		Events:             e.p.events,
		RemovedAllocations: e.p.removedAllocs,
		RemovedMachines:    e.p.removedMachines,
		NextAllocationID:   e.nextID,
		NextEventSeq:       e.nextSeq,
		Blobs:              e.p.blobs,
	}
	if n := len(e.p.allocs); n > 0 {
		c.Allocations = make([]arbiter.Allocation, 0, n)
	}
	for _, id := range sortedKeys(e.p.allocs) {
		if a := e.record(id); a != nil {
			rec := *a
			if u, ok := e.gtSavedUsage(id); ok {
				// Saved for another reason while it shows usage not yet
				// in the day summaries: the store keeps what they hold,
				// the view what it shows.
				c.TouchedAllocations = append(c.TouchedAllocations, rec)
				rec.Usage = u
			}
			c.Allocations = append(c.Allocations, rec)
		}
	}
	for _, id := range sortedKeys(e.p.touchedAllocs) {
		if _, dirty := e.p.allocs[id]; !dirty {
			if a := e.record(id); a != nil {
				c.TouchedAllocations = append(c.TouchedAllocations, *a)
			}
		}
	}
	for _, n := range sortedKeys(e.p.machines) {
		if mc := e.byName[n]; mc != nil {
			c.Machines = append(c.Machines, mc.m)
		}
	}
	for _, n := range sortedKeys(e.p.touchedMachines) {
		if _, dirty := e.p.machines[n]; !dirty {
			if mc := e.byName[n]; mc != nil {
				c.TouchedMachines = append(c.TouchedMachines, mc.m)
			}
		}
	}
	for ref, v := range e.p.records {
		c.Records = append(c.Records, arbiter.Record{Kind: ref.Kind, Key: ref.Key, Value: v})
	}
	sortRecords(c.Records)
	for ref := range e.p.removedRecords {
		c.RemovedRecords = append(c.RemovedRecords, ref)
	}
	sort.Slice(c.RemovedRecords, func(i, j int) bool { return refLess(c.RemovedRecords[i], c.RemovedRecords[j]) })
	for ref, v := range e.p.touchedRecords {
		c.TouchedRecords = append(c.TouchedRecords, arbiter.Record{Kind: ref.Kind, Key: ref.Key, Value: v})
	}
	sortRecords(c.TouchedRecords)
	// Trim the event log in steps, not on every batch.
	if keepFrom := e.nextSeq - e.cfg.EventsKeep; keepFrom > e.trimmed+1024 {
		c.TrimEventsBefore = keepFrom
		e.trimmed = keepFrom
	}
	e.p.reset()
	return c
}

// record returns the current record of allocation id, live or retired.
func (e *Engine) record(id int64) *arbiter.Allocation {
	if a := e.allocs[id]; a != nil {
		return &a.a
	}
	return e.retired[id]
}

// Machines returns every machine record, in name order.
func (e *Engine) Machines() []arbiter.Machine {
	out := make([]arbiter.Machine, len(e.ms))
	for i, mc := range e.ms {
		out[i] = mc.m
	}
	return out
}

// Allocations returns every allocation record, live and retired, in id order.
func (e *Engine) Allocations() []arbiter.Allocation {
	out := make([]arbiter.Allocation, 0, len(e.allocs)+len(e.retired))
	for _, a := range e.allocs {
		out = append(out, a.a)
	}
	for _, a := range e.retired {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Allocation returns one allocation record, live or retired.
func (e *Engine) Allocation(id int64) (arbiter.Allocation, bool) {
	if a := e.record(id); a != nil {
		return *a, true
	}
	return arbiter.Allocation{}, false
}

// LastSeq is the sequence number of the last event emitted.
func (e *Engine) LastSeq() int64 { return e.nextSeq - 1 }

// emit records an event with data as its JSON; an allocation's event goes
// through emitAlloc.
func (e *Engine) emit(now time.Time, kind, subject string, data any) {
	raw, err := json.Marshal(data)
	if err != nil {
		// Records are plain structs; this cannot fail short of a bug.
		panic(fmt.Sprintf("engine: marshal %s event: %v", kind, err))
	}
	e.appendEvent(now, kind, subject, raw)
	e.notifyOn(now, kind, subject, data) // notify.go
}

// emitAlloc is emit for an allocation's event, the most frequent kind: its
// JSON is written without reflection into scratch and copied out at its
// size (a third less memory than grown from a guess), and the record is
// not copied to the heap to be passed as any.
func (e *Engine) emitAlloc(now time.Time, kind, subject string, a *arbiter.Allocation) {
	e.eventJSON = a.AppendJSON(e.eventJSON[:0])
	e.appendEvent(now, kind, subject, bytes.Clone(e.eventJSON))
	if len(e.webhooks.subs) > 0 {
		e.notifyOn(now, kind, subject, *a) // notify.go
	}
}

// appendEvent adds an event to the batch, numbered next.
func (e *Engine) appendEvent(now time.Time, kind, subject string, raw []byte) {
	e.p.events = append(e.p.events, arbiter.Event{Seq: e.nextSeq, Time: now, Kind: kind, Subject: subject, Data: raw})
	e.nextSeq++
}

// sortedKeys returns m's keys in order (none allocated for an empty m).
func sortedKeys[K int | int64 | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func gpuPos(m *arbiter.Machine, index int) int {
	for p := range m.GPUs {
		if m.GPUs[p].Index == index {
			return p
		}
	}
	return -1
}

func refLess(a, b arbiter.RecordRef) bool {
	if a.Kind != b.Kind {
		return a.Kind < b.Kind
	}
	return a.Key < b.Key
}

func sortRecords(rs []arbiter.Record) {
	sort.Slice(rs, func(i, j int) bool {
		return refLess(arbiter.RecordRef{Kind: rs[i].Kind, Key: rs[i].Key}, arbiter.RecordRef{Kind: rs[j].Kind, Key: rs[j].Key})
	})
}

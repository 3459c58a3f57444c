package engine

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// grids is the grid capability (docs/reference/spalloc.md): grid machines, each with
// its board allocator and its queue, the grid allocations (spalloc's jobs),
// their power operations and the delayed free of their boards.
//
// A grid allocation is an ordinary allocation (e.allocs, then e.retired)
// whose Request.Grid is set: ids, keepalive, history, events and the read
// view are the engine's. What the capability adds lives in gridJob, one per
// live grid allocation and per ended one whose boards are not free yet.
//
// Durable state: the machines (RecordGridMachine) and the placement of
// every allocation holding boards (RecordGridJob), so that a restart
// rebuilds the allocators before the configuration is read. Queues, power
// operations and deadlines are rebuilt from the allocations at load.
type grids struct {
	ms    map[string]*gridMachine
	order []*gridMachine // priority order: the configuration's
	jobs  map[int64]*gridJob
	// retired lists the ended grid allocations still queryable, oldest
	// first; beyond maxRetired they are forgotten (spalloc's state 0).
	retired    []int64
	maxRetired int
	beforeFree time.Duration
	epoch      int64 // the last power intent's
	// snapshot is the read view's RecordGridMachines value, replaced (never
	// changed) when a machine changes.
	snapshot []*arbiter.GridMachine
	// requeueing: requeue is rebuilding the queues, and schedules once done.
	requeueing bool
}

// gridMachine is one configured grid machine.
type gridMachine struct {
	m        arbiter.GridMachine // replaced, never changed in place
	priority int
	alloc    *grid.Allocator
	// queue holds the queued jobs that may use this machine, in queue
	// order (higher priority first, then older).
	queue []*gridJob
	// dirty: boards were freed, faults changed or the queue lost a job
	// since it was last scheduled.
	dirty bool
	// removed is set while the machine is being removed: its boards are
	// freed at once, not after the settling time.
	removed bool
}

// gridJob is the capability's part of one grid allocation.
type gridJob struct {
	id  int64
	a   *alloc // nil once the allocation ended
	req arbiter.GridRequest
	// mach and place: where its boards are, once it has them.
	mach  *gridMachine
	place *grid.Placement
	op    *gridOp  // the power operation in progress, if any
	free  deadline // once ended: when its boards are free again
	// recorded: a RecordGridJob is stored for it. A live one-board job
	// has none: its placement follows from its board (grid.SinglePlacement).
	recorded bool
}

func newGridJob(id int64, a *alloc, req arbiter.GridRequest) *gridJob {
	return &gridJob{id: id, a: a, req: req, free: newDeadline(nil)}
}

// Defaults of the capability until SyncGridMachines says otherwise.
const (
	gridDefaultMaxRetired = 1200
	gridDefaultBeforeFree = 30 * time.Second
)

func (g *grids) init() {
	if g.ms == nil {
		g.ms = map[string]*gridMachine{}
		g.jobs = map[int64]*gridJob{}
		g.maxRetired = gridDefaultMaxRetired
		g.beforeFree = gridDefaultBeforeFree
		g.snapshot = []*arbiter.GridMachine{}
	}
}

func (g *grids) kinds() []string {
	return []string{arbiter.RecordGridMachine, arbiter.RecordGridJob}
}

func (g *grids) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	g.init()
	switch c := cmd.(type) {
	case arbiter.SyncGridMachines:
		return nil, g.sync(e, c, now), true
	case arbiter.GridTouch:
		return g.touch(e, c.ID, c.Peer, now), nil, true
	case arbiter.GridPower:
		g.power(e, c, now)
		return nil, nil, true
	case arbiter.GridDestroy:
		g.destroyJob(e, c, now)
		return nil, nil, true
	case arbiter.GridPowerDone:
		g.powerDone(e, c, now)
		return nil, nil, true
	case arbiter.GridPowerResend:
		g.resend(e, now)
		return nil, nil, true
	}
	return nil, nil, false
}

func (g *grids) records() []arbiter.Record {
	g.init()
	out := []arbiter.Record{{Kind: arbiter.RecordGridMachines, Value: g.snapshot}}
	for _, gm := range g.order {
		out = append(out, arbiter.Record{Kind: arbiter.RecordGridMachine, Key: gm.m.Name, Value: g.machineRecord(gm)})
	}
	for _, id := range sortedJobIDs(g.jobs) {
		if j := g.jobs[id]; j.place != nil && j.recorded {
			out = append(out, arbiter.Record{Kind: arbiter.RecordGridJob, Key: gridKey(id), Value: g.jobRecord(j)})
		}
	}
	return out
}

func (g *grids) machineRecord(gm *gridMachine) grid.MachineRecord {
	return grid.MachineRecord{Machine: gm.m, Priority: gm.priority}
}

func (g *grids) jobRecord(j *gridJob) grid.JobRecord {
	r := grid.JobRecord{ID: j.id, Machine: j.mach.m.Name, Placement: *j.place}
	if j.a == nil {
		t := j.free.at
		r.FreeAt = &t
	}
	return r
}

func gridKey(id int64) string { return strconv.FormatInt(id, 10) }

func sortedJobIDs(m map[int64]*gridJob) []int64 {
	ids := make([]int64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// gridRequest is the typed request a grid allocation carries, checked.
// Errors are invalid, with the messages spalloc clients know.
func gridRequest(r *arbiter.GridRequest) (arbiter.GridRequest, error) {
	req := *r
	req.Args = slices.Clone(r.Args)
	return req, req.Validate()
}

// allocateGrid creates a grid allocation: placed on the first machine (in
// priority order) that takes it now, else queued on every machine that
// could ever take it, else destroyed at once as impossible.
func (e *Engine) allocateGrid(c arbiter.Allocate, now time.Time) (any, error) {
	g := &e.grids
	g.init()
	req, err := gridRequest(c.Request.Grid)
	if err != nil {
		return nil, err
	}
	r := c.Request
	gr := *r.Grid
	gr.Args = slices.Clone(gr.Args)
	r.Grid = &gr
	a := e.newAlloc(c.Caller, r, now)
	e.dl.clear(&a.ka)
	a.ka = gridKeepaliveDeadline(a)
	e.refreshKeepalive(a, now)
	j := newGridJob(a.a.ID, a, req)
	g.jobs[j.id] = j
	cands := g.candidates(&a.a.Request, &req)
	if len(cands) == 0 {
		e.destroy(a, arbiter.GridReasonImpossible, now)
		return a.a, nil
	}
	for _, gm := range cands {
		gm.enqueue(j)
	}
	g.explain(j, cands)
	// Nothing was freed: of the queue only the new job may fit now.
	for _, gm := range cands {
		if gm.mayTry(e, j, now) {
			if p := gm.alloc.Allocate(j.id, &j.req); p != nil {
				g.place(e, j, gm, p, now)
				g.schedule(e, now) // machines whose head it was
				return a.a, nil
			}
		}
	}
	e.dirty(a)
	e.emitAlloc(now, arbiter.EventAllocationQueued, subject(a), &a.a)
	return a.a, nil
}

func gridKeepaliveDeadline(a *alloc) deadline {
	return newDeadline(func(e *Engine, now time.Time) { e.destroy(a, arbiter.GridReasonTimedOut, now) })
}

// candidates are the machines, in priority order, that r may use and that
// could ever take it: the one it names, or those carrying all its tags (no
// tags: every machine).
func (g *grids) candidates(r *arbiter.Request, req *arbiter.GridRequest) []*gridMachine {
	var out []*gridMachine
	for _, gm := range g.order {
		if r.Machine != "" {
			if gm.m.Name != r.Machine {
				continue
			}
		} else if !hasTags(gm.m.Tags, r.Tags) {
			continue
		}
		if gm.alloc.Possible(req) {
			out = append(out, gm)
		}
	}
	return out
}

func hasTags(have, want []string) bool {
	for _, t := range want {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

// explain sets a queued job's why_queued.
func (g *grids) explain(j *gridJob, cands []*gridMachine) {
	names := make([]string, len(cands))
	for i, gm := range cands {
		names[i] = gm.m.Name
	}
	why := fmt.Sprintf("waiting for free boards on %s", joinNames(names))
	j.a.a.WhyQueued = &why
}

func joinNames(ns []string) string {
	switch len(ns) {
	case 0:
		return "no machine"
	case 1:
		return ns[0]
	}
	out := ns[0]
	for _, n := range ns[1 : len(ns)-1] {
		out += ", " + n
	}
	return out + " or " + ns[len(ns)-1]
}

// enqueue puts j in the machine's queue in queue order.
func (gm *gridMachine) enqueue(j *gridJob) {
	i := len(gm.queue)
	for i > 0 && before(j.a, gm.queue[i-1].a) {
		i--
	}
	gm.queue = slices.Insert(gm.queue, i, j)
}

// mayTry reports whether the machine's policy lets queued job j be tried
// now: with fifo only the head is; with backfill any job is, unless one
// ahead of it has starved (the machine is then held for that one).
func (gm *gridMachine) mayTry(e *Engine, j *gridJob, now time.Time) bool {
	for _, q := range gm.queue {
		if q == j {
			return true
		}
		if gm.m.Queue == arbiter.GridQueueFIFO || e.starving(q.a, now) {
			return false
		}
	}
	return false
}

// dequeue takes j out of every queue. A machine whose queue was held up by
// j — the head of a fifo queue, or a job that has starved — is scheduled
// again: the jobs behind it may fit. Taking out any other job changes
// nothing for the others (no boards were freed).
func (g *grids) dequeue(e *Engine, j *gridJob, now time.Time) {
	starving := j.a != nil && e.starving(j.a, now)
	for _, gm := range g.order {
		if i := slices.Index(gm.queue, j); i >= 0 {
			gm.queue = slices.Delete(gm.queue, i, i+1)
			if starving || (i == 0 && gm.m.Queue == arbiter.GridQueueFIFO) {
				gm.dirty = true
			}
		}
	}
}

// schedule places queued jobs on the machines marked dirty, in priority
// order, until nothing more changes.
func (g *grids) schedule(e *Engine, now time.Time) {
	for changed := true; changed; {
		changed = false
		for _, gm := range g.order {
			if gm.dirty {
				gm.dirty = false
				if g.scheduleMachine(e, gm, now) {
					changed = true
				}
			}
		}
	}
}

// scheduleMachine tries the machine's queue in order: with fifo it stops at
// the first job that does not fit; with backfill it goes on, unless that
// job has starved.
func (g *grids) scheduleMachine(e *Engine, gm *gridMachine, now time.Time) bool {
	placed := false
	for i := 0; i < len(gm.queue); {
		j := gm.queue[i]
		if p := gm.alloc.Allocate(j.id, &j.req); p != nil {
			g.place(e, j, gm, p, now) // takes j out of gm.queue
			placed = true
			continue
		}
		if gm.m.Queue == arbiter.GridQueueFIFO || e.starving(j.a, now) {
			break
		}
		i++
	}
	return placed
}

// place gives queued job j the boards p of machine gm and starts switching
// them on.
func (g *grids) place(e *Engine, j *gridJob, gm *gridMachine, p *grid.Placement, now time.Time) {
	g.dequeue(e, j, now)
	cp := *p
	cp.Boards = slices.Clone(p.Boards)
	cp.Periphery = slices.Clone(p.Periphery)
	j.mach, j.place = gm, &cp
	a := j.a
	name := gm.m.Name
	a.a.Machine = &name
	a.a.Boards = cp.Boards
	a.a.WhyQueued = nil
	if !cp.Single {
		e.putRecord(arbiter.RecordGridJob, gridKey(j.id), g.jobRecord(j))
		j.recorded = true
	}
	g.setPower(e, j, true, now)
}

// setPower puts j's allocation in state power with its boards switching on
// or off, and starts the power operation.
func (g *grids) setPower(e *Engine, j *gridJob, on bool, now time.Time) {
	a := j.a
	a.a.State = arbiter.StatePower
	a.a.Power = &on
	e.dirty(a)
	e.emitAlloc(now, arbiter.EventAllocationPower, subject(a), &a.a)
	g.startPower(e, j, on, true, now)
}

func (g *grids) touch(e *Engine, id int64, peer string, now time.Time) any {
	a := e.allocs[id]
	if a == nil {
		if r := e.retired[id]; r != nil && r.Request.Grid != nil {
			return *r
		}
		return nil
	}
	if a.a.Request.Grid == nil {
		return nil
	}
	e.refreshKeepalive(a, now)
	e.p.touchedAllocs[id] = struct{}{}
	if peer != "" && peer != a.a.Request.Grid.KeepaliveHost {
		// Copy on write: earlier records share the old one.
		gr := *a.a.Request.Grid
		gr.KeepaliveHost = peer
		a.a.Request.Grid = &gr
		e.dirty(a)
	}
	return a.a
}

func (g *grids) power(e *Engine, c arbiter.GridPower, now time.Time) {
	if g.touch(e, c.ID, c.Peer, now) == nil {
		return
	}
	j := g.jobs[c.ID]
	if j == nil || j.a == nil || j.place == nil {
		return
	}
	g.setPower(e, j, c.On, now)
}

func (g *grids) destroyJob(e *Engine, c arbiter.GridDestroy, now time.Time) {
	a := e.allocs[c.ID]
	if a == nil || a.a.Request.Grid == nil {
		return
	}
	reason := arbiter.StrOr(c.Reason, "")
	queued := a.a.State == arbiter.StateQueued
	if queued {
		reason = arbiter.GridCancelledPrefix + reason
	}
	e.destroy(a, reason, now)
	if !queued && c.Reason == nil {
		if r := e.retired[c.ID]; r != nil {
			r.Reason = nil
		}
	}
}

// allocationDestroyed cleans up after any grid allocation that ended,
// whoever ended it: it leaves the queues, its power operation stops, its
// boards are switched off and freed after the settling time.
func (g *grids) allocationDestroyed(e *Engine, rec *arbiter.Allocation, now time.Time) {
	if rec.Request.Grid == nil {
		return
	}
	j := g.jobs[rec.ID]
	if j == nil || j.a == nil {
		return
	}
	g.dequeue(e, j, now)
	j.a = nil
	g.stopPower(e, j)
	switch {
	case j.mach == nil:
		delete(g.jobs, j.id)
		// A queued job left its machines' queues (dequeue marked them): the
		// next may fit, or be the fifo head, or the starving head held for.
		if !g.requeueing {
			g.schedule(e, now)
		}
	case j.mach.removed:
		g.finalPowerOff(e, j, now) // its boards as the machine was
		g.freeBoards(e, j, now)
	case g.beforeFree <= 0:
		g.finalPowerOff(e, j, now)
		g.freeBoards(e, j, now)
		g.schedule(e, now)
	default:
		g.finalPowerOff(e, j, now)
		j.free = newDeadline(func(e *Engine, now time.Time) {
			g.freeBoards(e, j, now)
			g.schedule(e, now)
		})
		e.dl.set(&j.free, now.Add(g.beforeFree))
		e.putRecord(arbiter.RecordGridJob, gridKey(j.id), g.jobRecord(j))
		j.recorded = true
	}
	g.retire(e, rec.ID)
}

// freeBoards gives an ended job's boards back to its machine.
func (g *grids) freeBoards(e *Engine, j *gridJob, now time.Time) {
	e.dl.clear(&j.free)
	if j.mach != nil {
		j.mach.alloc.Free(j.id)
		j.mach.dirty = true
	}
	if j.recorded {
		e.removeRecord(arbiter.RecordGridJob, gridKey(j.id))
		j.recorded = false
	}
	delete(g.jobs, j.id)
}

// retire keeps the ended grid allocation queryable while it is among the
// newest maxRetired; older ones are forgotten at once, whatever the
// engine's own history would keep.
func (g *grids) retire(e *Engine, id int64) {
	g.retired = append(g.retired, id)
	g.trimRetired(e)
}

func (g *grids) trimRetired(e *Engine) {
	n := len(g.retired) - max(g.maxRetired, 0)
	if n <= 0 {
		return
	}
	for _, id := range g.retired[:n] {
		e.forgetRetired(id)
	}
	g.retired = g.retired[n:]
	if cap(g.retired) > 4*max(g.maxRetired, 256) && len(g.retired) < cap(g.retired)/2 {
		g.retired = slices.Clone(g.retired)
	}
}

// forgetRetired drops destroyed allocation id from the history before its
// time; the store deletes it too.
func (e *Engine) forgetRetired(id int64) {
	if _, ok := e.retired[id]; !ok {
		return
	}
	delete(e.retired, id) // never in e.order: retire
	delete(e.p.allocs, id)
	e.p.removedAllocs = append(e.p.removedAllocs, id)
}

// sync applies the configured grid machines (arbiter.SyncGridMachines).
func (g *grids) sync(e *Engine, c arbiter.SyncGridMachines, now time.Time) error {
	ms, err := checkGridMachines(c, func(name string) string {
		if mc := e.byName[name]; mc != nil {
			return mc.m.Source
		}
		return ""
	})
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		seen[m.Name] = true
	}
	g.maxRetired, g.beforeFree = c.MaxRetiredJobs, c.SecondsBeforeFree
	g.trimRetired(e)

	changed := false
	var order []*gridMachine
	for i := range ms {
		m := ms[i]
		gm := g.ms[m.Name]
		switch {
		case gm == nil:
			gm = g.addMachine(e, m, i)
			e.emit(now, arbiter.EventMachineRegistered, "machine/"+m.Name, m)
		case !gm.m.SameLayout(&m):
			g.removeMachine(e, gm, now)
			gm = g.addMachine(e, m, i)
			e.emit(now, arbiter.EventMachineUpdated, "machine/"+m.Name, m)
		case !reflect.DeepEqual(gm.m, m) || gm.priority != i:
			if err := gm.alloc.SetFaults(m.DeadBoards, m.DeadLinks); err != nil {
				// Validate and SameLayout make this impossible.
				panic(fmt.Sprintf("engine: grid machine %s: %v", m.Name, err))
			}
			gm.m, gm.priority, gm.dirty = m, i, true
			e.putRecord(arbiter.RecordGridMachine, m.Name, g.machineRecord(gm))
			e.emit(now, arbiter.EventMachineUpdated, "machine/"+m.Name, m)
		default:
			order = append(order, gm)
			continue
		}
		changed = true
		order = append(order, gm)
	}
	for _, gm := range g.order {
		if !seen[gm.m.Name] {
			g.removeMachine(e, gm, now)
			e.emit(now, arbiter.EventMachineRemoved, "machine/"+gm.m.Name, gm.m)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	g.order = order
	g.publish(e)
	g.requeue(e, now)
	return nil
}

// checkGridMachines returns a deep copy of c's machines, sorted. gpuSource
// tells whether a GPU machine of a name exists, by its source ("" when
// none). Errors: invalid, for a machine that does not validate or is listed
// twice, or negative settings; conflict, for a name a GPU machine has.
func checkGridMachines(c arbiter.SyncGridMachines, gpuSource func(name string) string) ([]arbiter.GridMachine, error) {
	ms := cloneMachines(c.Machines)
	seen := make(map[string]bool, len(ms))
	for i := range ms {
		m := &ms[i]
		if err := m.Validate(); err != nil {
			return nil, err
		}
		if seen[m.Name] {
			return nil, arbiter.Errorf(arbiter.EInvalid, "grid machine %q is listed twice", m.Name)
		}
		if src := gpuSource(m.Name); src != "" {
			return nil, arbiter.Errorf(arbiter.EConflict, "grid machine %q: a GPU machine of that name exists (%s); names are unique across all machines",
				m.Name, src)
		}
		seen[m.Name] = true
		if _, err := grid.MachineAllocator(m); err != nil {
			return nil, arbiter.Errorf(arbiter.EInvalid, "grid machine %q: %v", m.Name, err)
		}
	}
	if c.MaxRetiredJobs < 0 || c.SecondsBeforeFree < 0 {
		return nil, arbiter.Errorf(arbiter.EInvalid, "max_retired_jobs and seconds_before_free must not be negative")
	}
	return ms, nil
}

// cloneMachines copies the machines deep and sorts their lists, so that
// the engine shares nothing with its caller.
func cloneMachines(ms []arbiter.GridMachine) []arbiter.GridMachine {
	out := make([]arbiter.GridMachine, len(ms))
	for i, m := range ms {
		m.Tags = slices.Clone(m.Tags)
		m.DeadBoards = slices.Clone(m.DeadBoards)
		m.DeadLinks = slices.Clone(m.DeadLinks)
		m.Boards = slices.Clone(m.Boards)
		m.Frames = slices.Clone(m.Frames)
		m.Sort()
		out[i] = m
	}
	return out
}

func (g *grids) addMachine(e *Engine, m arbiter.GridMachine, priority int) *gridMachine {
	a, err := grid.MachineAllocator(&m)
	if err != nil {
		panic(fmt.Sprintf("engine: grid machine %s: %v", m.Name, err)) // checked by sync
	}
	gm := &gridMachine{m: m, priority: priority, alloc: a, dirty: true}
	g.ms[m.Name] = gm
	e.putRecord(arbiter.RecordGridMachine, m.Name, g.machineRecord(gm))
	return gm
}

// removeMachine ends the allocations on a machine with "Machine removed.",
// frees its boards at once and forgets it. Its queued jobs are requeued by
// the caller.
func (g *grids) removeMachine(e *Engine, gm *gridMachine, now time.Time) {
	gm.removed = true
	for _, id := range sortedJobIDs(g.jobs) {
		j := g.jobs[id]
		if j == nil || j.mach != gm {
			continue
		}
		if j.a != nil {
			e.destroy(j.a, arbiter.GridReasonRemoved, now)
		} else {
			g.freeBoards(e, j, now)
		}
	}
	gm.queue = nil
	delete(g.ms, gm.m.Name)
	e.removeRecord(arbiter.RecordGridMachine, gm.m.Name)
}

// publish replaces the read view's snapshot of the machines.
func (g *grids) publish(e *Engine) {
	snap := make([]*arbiter.GridMachine, len(g.order))
	for i, gm := range g.order {
		m := gm.m
		snap[i] = &m
	}
	g.snapshot = snap
	e.touchRecord(arbiter.RecordGridMachines, "", snap)
}

// requeue rebuilds every queue from the queued grid jobs, in queue order,
// destroying those no machine could ever take, then schedules every
// machine.
func (g *grids) requeue(e *Engine, now time.Time) {
	g.requeueing = true
	defer func() { g.requeueing = false }()
	for _, gm := range g.order {
		gm.queue = nil
		gm.dirty = true
	}
	var queued []*gridJob
	for _, j := range g.jobs {
		if j.a != nil && j.a.a.State == arbiter.StateQueued {
			queued = append(queued, j)
		}
	}
	slices.SortFunc(queued, func(x, y *gridJob) int {
		switch {
		case before(x.a, y.a):
			return -1
		case before(y.a, x.a):
			return 1
		}
		return 0
	})
	for _, j := range queued {
		cands := g.candidates(&j.a.a.Request, &j.req)
		if len(cands) == 0 {
			e.destroy(j.a, arbiter.GridReasonImpossible, now)
			continue
		}
		for _, gm := range cands {
			gm.queue = append(gm.queue, j)
		}
		old := arbiter.StrOr(j.a.a.WhyQueued, "")
		g.explain(j, cands)
		if *j.a.a.WhyQueued != old {
			e.dirty(j.a)
		}
	}
	g.schedule(e, now)
}

// load restores the machines, the placements and the queues after a
// restart: the engine has put the grid allocations back in e.allocs and
// e.retired without touching them.
func (g *grids) load(e *Engine, recs []arbiter.Record, now time.Time) error {
	g.init()
	// The history of ended grid allocations, oldest first (as New read
	// them); those that end below, restoring, come after.
	g.retired = append(g.retired, e.loadedGridEnded...)
	e.loadedGridEnded = nil
	var errs []string
	var jobRecs []grid.JobRecord
	var machRecs []grid.MachineRecord
	for _, r := range recs {
		raw, ok := r.Value.(json.RawMessage)
		if !ok {
			b, err := json.Marshal(r.Value)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s %s: %v", r.Kind, r.Key, err))
				continue
			}
			raw = b
		}
		switch r.Kind {
		case arbiter.RecordGridMachine:
			var mr grid.MachineRecord
			if err := json.Unmarshal(raw, &mr); err != nil {
				errs = append(errs, fmt.Sprintf("grid machine %s: %v", r.Key, err))
				continue
			}
			machRecs = append(machRecs, mr)
		case arbiter.RecordGridJob:
			var jr grid.JobRecord
			if err := json.Unmarshal(raw, &jr); err != nil {
				errs = append(errs, fmt.Sprintf("grid job %s: %v", r.Key, err))
				continue
			}
			jobRecs = append(jobRecs, jr)
		}
	}
	slices.SortFunc(machRecs, func(x, y grid.MachineRecord) int { return x.Priority - y.Priority })
	for _, mr := range machRecs {
		m := mr.Machine
		m.Sort()
		if err := m.Validate(); err != nil {
			errs = append(errs, err.Error())
			e.removeRecord(arbiter.RecordGridMachine, m.Name)
			continue
		}
		a, err := grid.MachineAllocator(&m)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		gm := &gridMachine{m: m, priority: len(g.order), alloc: a, dirty: true}
		g.ms[m.Name] = gm
		g.order = append(g.order, gm)
	}
	g.publish(e)

	// Live grid allocations: their own keepalive deadline, their form.
	var live []*alloc
	for _, a := range sortedAllocs(e.allocs) {
		if a.a.Request.Grid != nil {
			live = append(live, a)
		}
	}
	for _, a := range live {
		e.dl.clear(&a.ka)
		a.ka = gridKeepaliveDeadline(a)
		e.refreshKeepalive(a, now)
		req, err := gridRequest(a.a.Request.Grid)
		if err != nil {
			e.destroy(a, fmt.Sprintf("its request cannot be read after a restart: %v", arbiter.ErrorMessage(err)), now)
			continue
		}
		g.jobs[a.a.ID] = newGridJob(a.a.ID, a, req)
	}

	// Placements, machine by machine. A live one-board job has no record:
	// its placement follows from its board.
	byID := map[int64]grid.JobRecord{}
	for _, jr := range jobRecs {
		byID[jr.ID] = jr
	}
	derived := map[int64]bool{}
	for _, a := range live {
		j := g.jobs[a.a.ID]
		if _, ok := byID[a.a.ID]; ok || j == nil || a.a.State == arbiter.StateQueued || a.a.Machine == nil ||
			len(a.a.Boards) != 1 || (j.req.Form != arbiter.GridOneBoard && j.req.Form != arbiter.GridBoard) {
			continue
		}
		jr := grid.JobRecord{ID: a.a.ID, Machine: *a.a.Machine, Placement: grid.SinglePlacement(a.a.Boards[0])}
		byID[jr.ID] = jr
		jobRecs = append(jobRecs, jr)
		derived[jr.ID] = true
	}
	held := map[*gridMachine][]grid.Held{}
	var settling []grid.JobRecord
	for _, jr := range jobRecs {
		gm := g.ms[jr.Machine]
		j := g.jobs[jr.ID]
		switch {
		case gm == nil:
			if !derived[jr.ID] {
				e.removeRecord(arbiter.RecordGridJob, gridKey(jr.ID))
			}
			continue
		case j == nil && jr.FreeAt == nil:
			// Ended without its record being updated: free after the
			// settling time from now.
			t := now.Add(g.beforeFree)
			jr.FreeAt = &t
		case j != nil && j.a.a.State == arbiter.StateQueued:
			e.removeRecord(arbiter.RecordGridJob, gridKey(jr.ID))
			continue
		}
		p := jr.Placement
		held[gm] = append(held[gm], grid.Held{ID: jr.ID, Placement: &p})
		if j == nil {
			settling = append(settling, jr)
		}
	}
	broken := map[*gridMachine]bool{}
	for _, gm := range g.order {
		if err := gm.alloc.Restore(held[gm]); err != nil {
			errs = append(errs, fmt.Sprintf("grid machine %s: %v", gm.m.Name, err))
			broken[gm] = true
		}
	}
	for _, jr := range settling {
		gm := g.ms[jr.Machine]
		if broken[gm] {
			e.removeRecord(arbiter.RecordGridJob, gridKey(jr.ID))
			continue
		}
		p := jr.Placement
		j := newGridJob(jr.ID, nil, arbiter.GridRequest{})
		j.mach, j.place, j.recorded = gm, &p, true
		j.free = newDeadline(func(e *Engine, now time.Time) {
			g.freeBoards(e, j, now)
			g.schedule(e, now)
		})
		e.dl.set(&j.free, *jr.FreeAt)
		g.jobs[j.id] = j
	}
	for _, a := range live {
		j := g.jobs[a.a.ID]
		if j == nil || a.a.State == arbiter.StateQueued {
			continue
		}
		jr, ok := byID[j.id]
		gm := g.ms[jr.Machine]
		switch {
		case !ok:
			e.destroy(a, "its boards are not known after a restart", now)
		case gm == nil:
			e.destroy(a, arbiter.GridReasonRemoved, now)
		case broken[gm]:
			if !derived[j.id] {
				e.removeRecord(arbiter.RecordGridJob, gridKey(j.id))
			}
			e.destroy(a, "its boards could not be restored after a restart", now)
		default:
			p := jr.Placement
			j.mach, j.place, j.recorded = gm, &p, !derived[j.id]
			on := a.a.Power == nil || *a.a.Power
			if a.a.State == arbiter.StatePower {
				// Again, from the start; an external controller asks
				// for the intent when it starts (GridPowerResend).
				g.startPower(e, j, on, false, now)
			}
		}
	}

	g.trimRetired(e)
	g.requeue(e, now)
	if len(errs) > 0 {
		return fmt.Errorf("grid: %v", errs)
	}
	return nil
}

package engine

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

// reindex rebuilds positions, the placement view and the free index after
// machines were added or removed (rare; everything else updates in place).
func (e *Engine) reindex() {
	sort.Slice(e.ms, func(i, j int) bool { return e.ms[i].m.Name < e.ms[j].m.Name })
	e.cluster = place.Cluster{
		Machines: make([]*arbiter.Machine, len(e.ms)),
		Held:     make([][]int64, len(e.ms)),
		Index:    place.NewIndex(len(e.ms)),
	}
	for i, mc := range e.ms {
		mc.pos = i
		if len(mc.held) != len(mc.m.GPUs) {
			mc.held = make([]int64, len(mc.m.GPUs))
		}
		e.cluster.Machines[i] = &mc.m
		e.cluster.Held[i] = mc.held
		e.updateIndex(mc)
	}
	e.reserve = nil
}

// updateIndex records mc's free, healthy GPU count, or that nothing may be
// placed on it (down or draining).
func (e *Engine) updateIndex(mc *machine) {
	if mc.m.Down || mc.m.Draining {
		e.cluster.Index.Set(mc.pos, -1)
		return
	}
	e.cluster.Index.Set(mc.pos, freeGPUs(&mc.m, mc.held))
}

// freeGPUs counts the healthy GPUs of m that held says are free.
func freeGPUs(m *arbiter.Machine, held []int64) int {
	free := 0
	for p, id := range held {
		if id == 0 && m.GPUs[p].Healthy {
			free++
		}
	}
	return free
}

// withDefaults fills in what a machine may leave out: its kind (GPU), its
// source, empty lists rather than none.
func withDefaults(m arbiter.Machine, source string) arbiter.Machine {
	if m.Kind == "" {
		m.Kind = arbiter.KindGPU
	}
	if m.Source == "" {
		m.Source = source
	}
	if m.Tags == nil {
		m.Tags = []string{}
	}
	if m.GPUs == nil {
		m.GPUs = []arbiter.GPU{}
	}
	return m
}

func (e *Engine) register(m arbiter.Machine, now time.Time) (any, error) {
	m = withDefaults(m, arbiter.SourceAgent)
	if err := m.Validate(); err != nil {
		return nil, err
	}
	old := e.byName[m.Name]
	// An agent on the server's own host takes the machine the server
	// registered for it (source local) over, allocations and all: the
	// agent sees its GPUs and runs its tasks. A machine declared in the
	// configuration stays the configuration's.
	if old != nil && old.m.Source == arbiter.SourceConfig && m.Source == arbiter.SourceAgent {
		return nil, arbiter.Errorf(arbiter.EConflict,
			"machine %q is declared in the server's configuration ([[machines]]); run the agent with another --name, or remove the machine from the configuration", m.Name)
	}
	if e.grids.ms[m.Name] != nil {
		return nil, arbiter.Errorf(arbiter.EConflict,
			"machine %q is a grid machine of the server's configuration ([[grid_machines]]); run the agent with another --name", m.Name)
	}
	if other, uuid := e.gpuElsewhere(&m); other != nil && m.Source == arbiter.SourceAgent { // leave.go
		return nil, arbiter.Errorf(arbiter.EConflict,
			"GPU %s is already machine %q's: one host registered under two names? Run one agent per host (as %s), or remove %s first",
			uuid, other.Name, other.Name, other.Name)
	}
	mc := e.upsertMachine(m, now)
	if m.Source == arbiter.SourceAgent {
		mc.m.LastSeen = now
		e.dl.set(&mc.hb, now.Add(e.cfg.HeartbeatTimeout))
		e.p.touchedMachines[mc.m.Name] = struct{}{}
	}
	return mc.m, nil
}

// upsertMachine adds m or updates the machine of that name to m, keeping
// draining. Allocations on GPUs that vanished are destroyed; requests that
// can no longer fit are destroyed; queued requests that now fit are placed.
func (e *Engine) upsertMachine(m arbiter.Machine, now time.Time) *machine {
	m.LastSeen = time.Time{}
	m.Down = false
	mc := e.byName[m.Name]
	if mc == nil {
		mc = &machine{m: m, allocs: make(map[int64]*alloc)}
		mc.hb = heartbeatDeadline(mc)
		e.byName[m.Name] = mc
		e.ms = append(e.ms, mc)
		e.reindex()
		e.p.removedMachines = without(e.p.removedMachines, m.Name)
		e.p.machines[m.Name] = struct{}{}
		e.emit(now, arbiter.EventMachineRegistered, "machine/"+m.Name, m)
		e.reviewQueue(now)
		return mc
	}
	m.Draining = mc.m.Draining
	wasDown := mc.m.Down
	prev := mc.m
	prev.LastSeen = time.Time{}
	prev.Down = false
	if reflect.DeepEqual(prev, m) {
		if wasDown {
			e.markUp(mc, now)
		}
		return mc
	}
	mc.m = m
	mc.held = make([]int64, len(m.GPUs))
	e.cluster.Held[mc.pos] = mc.held
	for _, a := range sortedAllocs(mc.allocs) {
		lost := -1
		for _, gi := range a.gpus {
			if gpuPos(&mc.m, gi) < 0 {
				lost = gi
				break
			}
		}
		if lost >= 0 {
			// Ended on the GPUs it still has, so that on an observed
			// machine they go releasing like any ended allocation's: its
			// processes may still run on them. Its time is accounted
			// first, on every GPU it held.
			if accounted(a) {
				e.gtFlush(a, e.gtAllocOf(a), now)
			}
			a.gpus = slices.DeleteFunc(a.gpus, func(gi int) bool { return gpuPos(&mc.m, gi) < 0 })
			e.destroy(a, fmt.Sprintf("GPU %d of machine %s is gone", lost, m.Name), now)
			continue
		}
		for _, gi := range a.gpus {
			mc.held[gpuPos(&mc.m, gi)] = a.a.ID
		}
	}
	e.gtBlock(mc)
	e.updateIndex(mc)
	e.p.machines[m.Name] = struct{}{}
	e.emit(now, arbiter.EventMachineUpdated, "machine/"+m.Name, mc.m)
	if wasDown {
		e.markUp(mc, now) // its registration brings it up, changed or not
	}
	e.reviewQueue(now)
	return mc
}

func (e *Engine) heartbeat(name string, now time.Time) (any, error) {
	mc := e.byName[name]
	if mc == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered; register it first", name)
	}
	mc.m.LastSeen = now
	e.p.touchedMachines[name] = struct{}{}
	if mc.m.Source == arbiter.SourceAgent {
		e.dl.set(&mc.hb, now.Add(e.cfg.HeartbeatTimeout))
	}
	if mc.m.Down {
		e.markUp(mc, now)
	}
	return mc.m, nil
}

func heartbeatDeadline(mc *machine) deadline {
	return newDeadline(func(e *Engine, now time.Time) { e.markDown(mc, now) })
}

func (e *Engine) markDown(mc *machine, now time.Time) {
	if mc.m.Down {
		return
	}
	mc.m.Down = true
	e.updateIndex(mc)
	e.p.machines[mc.m.Name] = struct{}{}
	e.emit(now, arbiter.EventMachineDown, "machine/"+mc.m.Name, mc.m)
	// Its agent stopped answering: what it was running will not be
	// reported. A pending swap waits for it to come back, or its timeout.
	e.swaps.failOn(e, mc.m.Name, true, "the machine "+mc.m.Name+" went down (no heartbeat) during the swap", now)
	e.explainAll()
}

func (e *Engine) markUp(mc *machine, now time.Time) {
	mc.m.Down = false
	e.updateIndex(mc)
	e.p.machines[mc.m.Name] = struct{}{}
	e.emit(now, arbiter.EventMachineUp, "machine/"+mc.m.Name, mc.m)
	e.schedule(now)
	e.explainAll()
}

func (e *Engine) setDraining(c arbiter.SetDraining, now time.Time) (any, error) {
	mc := e.byName[c.Name]
	if mc == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q does not exist", c.Name)
	}
	if mc.m.Draining == c.Draining {
		return mc.m, nil
	}
	mc.m.Draining = c.Draining
	e.updateIndex(mc)
	e.p.machines[c.Name] = struct{}{}
	kind := arbiter.EventMachineDrained
	if !c.Draining {
		kind = arbiter.EventMachineUndrained
	}
	e.emit(now, kind, "machine/"+c.Name, mc.m)
	if !c.Draining {
		e.schedule(now)
	}
	e.explainAll()
	return mc.m, nil
}

// explainAll rewrites every queued request's why_queued after a machine's
// usability changed.
func (e *Engine) explainAll() {
	e.clearReserve()
	for _, a := range e.queue {
		e.explain(a, nil)
	}
}

// syncConfig makes the server-declared machines (configured and local) exactly
// ms: machines the server declared before but no longer does are removed.
func (e *Engine) syncConfig(ms []arbiter.Machine, now time.Time) error {
	ms, err := checkConfigMachines(ms)
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(ms))
	for _, m := range ms {
		want[m.Name] = true
	}
	for _, mc := range append([]*machine(nil), e.ms...) {
		if !want[mc.m.Name] && (mc.m.Source == arbiter.SourceConfig || mc.m.Source == arbiter.SourceLocal) {
			e.removeMachine(mc, fmt.Sprintf("machine %s was removed from the configuration", mc.m.Name), now)
		}
	}
	for _, m := range ms {
		if old := e.byName[m.Name]; old != nil && old.m.Source == arbiter.SourceAgent {
			if m.Source == arbiter.SourceLocal {
				continue // an agent took the server's own host over: it stays the agent's
			}
			e.dl.clear(&old.hb) // the configuration takes over from the agent
		}
		e.upsertMachine(m, now)
	}
	e.reviewQueue(now)
	return nil
}

// checkConfigMachines returns the server-declared machines ms with their
// defaults filled in (a copy). Errors: invalid, for a machine that does not
// validate or a name declared twice.
func checkConfigMachines(ms []arbiter.Machine) ([]arbiter.Machine, error) {
	out := make([]arbiter.Machine, len(ms))
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		m = withDefaults(m, arbiter.SourceConfig)
		if err := m.Validate(); err != nil {
			return nil, err
		}
		if seen[m.Name] {
			return nil, arbiter.Errorf(arbiter.EInvalid, "machine %q is declared twice", m.Name)
		}
		seen[m.Name] = true
		out[i] = m
	}
	return out, nil
}

func (e *Engine) removeMachine(mc *machine, reason string, now time.Time) {
	for _, a := range sortedAllocs(mc.allocs) {
		e.destroy(a, reason, now)
	}
	e.dl.clear(&mc.hb)
	e.gtRemoveMachine(mc.m.Name)
	e.swaps.failOn(e, mc.m.Name, false, "the machine "+mc.m.Name+" was removed", now)
	delete(e.byName, mc.m.Name)
	for i, x := range e.ms {
		if x == mc {
			e.ms = append(e.ms[:i], e.ms[i+1:]...)
			break
		}
	}
	e.reindex()
	delete(e.p.machines, mc.m.Name)
	delete(e.p.touchedMachines, mc.m.Name)
	e.p.removedMachines = append(e.p.removedMachines, mc.m.Name)
	e.emit(now, arbiter.EventMachineRemoved, "machine/"+mc.m.Name, mc.m)
	e.reviewQueue(now)
}

func sortedAllocs(m map[int64]*alloc) []*alloc {
	out := make([]*alloc, 0, len(m))
	for _, a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].a.ID < out[j].a.ID })
	return out
}

func without(names []string, name string) []string {
	out := names[:0]
	for _, n := range names {
		if n != name {
			out = append(out, n)
		}
	}
	return out
}

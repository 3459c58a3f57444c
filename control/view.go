package control

import (
	"sort"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// view is the committed state readers see. It is updated from each change
// set after the store committed it, under a lock held for microseconds.
// Records are values copied out of the change set; nothing here is shared
// with the engine.
type view struct {
	mu        sync.RWMutex
	machines  map[string]arbiter.Machine
	allocs    map[int64]arbiter.Allocation
	byMachine map[string]map[int64]struct{} // allocations holding devices (or boards) per machine
	records   map[string]map[string]any     // kind → key → value
}

func newView() *view { return &view{} }

// reset replaces the view's content, then calls also before readers may
// look again, as apply does.
func (v *view) reset(ms []arbiter.Machine, as []arbiter.Allocation, rs []arbiter.Record, also func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	defer also()
	v.records = make(map[string]map[string]any)
	for _, r := range rs {
		v.putRecord(r)
	}
	v.machines = make(map[string]arbiter.Machine, len(ms))
	v.allocs = make(map[int64]arbiter.Allocation, len(as))
	v.byMachine = make(map[string]map[int64]struct{})
	for _, m := range ms {
		v.machines[m.Name] = m
	}
	for _, a := range as {
		v.putAlloc(a)
	}
}

// apply applies c to the view, then calls also before readers may look
// again: what also changes (the events published) changes with the view.
func (v *view) apply(c *arbiter.Changes, also func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	defer also()
	for _, m := range c.Machines {
		v.machines[m.Name] = m
	}
	for _, m := range c.TouchedMachines {
		if _, ok := v.machines[m.Name]; ok {
			v.machines[m.Name] = m
		}
	}
	for _, n := range c.RemovedMachines {
		delete(v.machines, n)
	}
	for _, a := range c.Allocations {
		v.putAlloc(a)
	}
	for _, a := range c.TouchedAllocations {
		if _, ok := v.allocs[a.ID]; ok {
			v.putAlloc(a)
		}
	}
	for _, id := range c.RemovedAllocations {
		v.dropHolder(id)
		delete(v.allocs, id)
	}
	for _, r := range c.Records {
		v.putRecord(r)
	}
	// Touched records are memory-only (a pool's status, a heartbeat time):
	// the latest value is the record, stored or not.
	for _, r := range c.TouchedRecords {
		v.putRecord(r)
	}
	for _, r := range c.RemovedRecords {
		delete(v.records[r.Kind], r.Key)
	}
}

func (v *view) putRecord(r arbiter.Record) {
	m := v.records[r.Kind]
	if m == nil {
		m = make(map[string]any)
		v.records[r.Kind] = m
	}
	m[r.Key] = r.Value
}

// Records returns the committed records of one kind, in key order.
func (l *Loop) Records(kind string) []arbiter.Record {
	v := l.view
	v.mu.RLock()
	out := make([]arbiter.Record, 0, len(v.records[kind]))
	for k, val := range v.records[kind] {
		out = append(out, arbiter.Record{Kind: kind, Key: k, Value: val})
	}
	v.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Record returns one committed record.
func (l *Loop) Record(kind, key string) (any, bool) {
	v := l.view
	v.mu.RLock()
	defer v.mu.RUnlock()
	val, ok := v.records[kind][key]
	return val, ok
}

func (v *view) putAlloc(a arbiter.Allocation) {
	v.dropHolder(a.ID)
	v.allocs[a.ID] = a
	if a.State != arbiter.StateDestroyed && a.Machine != nil && (len(a.Devices) > 0 || len(a.Boards) > 0) {
		set := v.byMachine[*a.Machine]
		if set == nil {
			set = make(map[int64]struct{})
			v.byMachine[*a.Machine] = set
		}
		set[a.ID] = struct{}{}
	}
}

func (v *view) dropHolder(id int64) {
	if old, ok := v.allocs[id]; ok && old.Machine != nil {
		if set := v.byMachine[*old.Machine]; set != nil {
			delete(set, id)
		}
	}
}

// Machines returns every machine with its devices and their holders, in name order.
func (l *Loop) Machines() []arbiter.MachineStatus {
	v := l.view
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]arbiter.MachineStatus, 0, len(v.machines))
	for _, m := range v.machines {
		out = append(out, v.status(&m))
	}
	out = append(out, v.gridStatuses()...) // grid machines: grid.go
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Machine returns one machine with its devices and their holders.
func (l *Loop) Machine(name string) (arbiter.MachineStatus, bool) {
	v := l.view
	v.mu.RLock()
	defer v.mu.RUnlock()
	m, ok := v.machines[name]
	if !ok {
		return v.gridMachine(name)
	}
	return v.status(&m), true
}

func (v *view) status(m *arbiter.Machine) arbiter.MachineStatus {
	s := arbiter.MachineStatus{
		Name: m.Name, Kind: m.Kind, Source: m.Source, State: m.State(), Tags: m.Tags,
		Cores: m.Cores, RAMGiB: m.RAMGiB, CUDA: m.CUDA, Driver: m.Driver,
		Devices: make([]arbiter.DeviceStatus, len(m.GPUs)),
	}
	if !m.LastSeen.IsZero() {
		t := m.LastSeen
		s.LastSeen = &t
	}
	for i, g := range m.GPUs {
		s.Devices[i] = arbiter.DeviceStatus{Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMGiB: g.VRAMGiB, Compute: g.Compute, Healthy: g.Healthy}
	}
	for id := range v.byMachine[m.Name] {
		a := v.allocs[id]
		for _, d := range a.Devices {
			for i := range s.Devices {
				if s.Devices[i].Index == d.Index {
					id, owner := a.ID, a.Owner
					s.Devices[i].Allocation, s.Devices[i].Owner, s.Devices[i].Since = &id, &owner, a.ReadyAt
				}
			}
		}
	}
	v.gpuTruth(m, &s) // state, usage, health; the free count (gputruth.go)
	return s
}

// Allocations returns the allocations passing f, in id order: the live ones
// and the bounded history of destroyed ones.
func (l *Loop) Allocations(f arbiter.AllocationFilter) []arbiter.Allocation {
	v := l.view
	v.mu.RLock()
	out := make([]arbiter.Allocation, 0, 64)
	for _, a := range v.allocs {
		if f.Match(&a) {
			out = append(out, a)
		}
	}
	v.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Allocation returns one allocation, live or in the history.
func (l *Loop) Allocation(id int64) (arbiter.Allocation, bool) {
	v := l.view
	v.mu.RLock()
	defer v.mu.RUnlock()
	a, ok := v.allocs[id]
	return a, ok
}

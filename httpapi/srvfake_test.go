package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// fakePlane is a small in-memory Plane for the server's tests. It does
// just enough of the engine's job for the HTTP layer to be observable: ids,
// states, ownership on release, events and subscriptions.
type fakePlane struct {
	mu sync.Mutex
	// cmds records every command Do received.
	cmds     []arbiter.Command
	machines map[string]arbiter.Machine
	allocs   map[int64]arbiter.Allocation
	events   []arbiter.Event
	nextID   int64
	// doErr, when set, is what Do returns; doPanic makes Do panic.
	doErr   error
	doPanic bool
	// changed is closed and replaced whenever an event is appended.
	changed chan struct{}
	subs    int // live subscriptions
	// records holds sessions and audit entries, by kind then key; those
	// commands are not in cmds (they go with requests of every kind).
	records map[string]map[string]any
	auditN  int64
}

func newFakePlane() *fakePlane {
	return &fakePlane{
		machines: map[string]arbiter.Machine{},
		allocs:   map[int64]arbiter.Allocation{},
		nextID:   1,
		changed:  make(chan struct{}),
		records:  map[string]map[string]any{},
	}
}

// doTrust applies the commands of sessions and the audit trail.
func (f *fakePlane) doTrust(cmd arbiter.Command) (any, bool) {
	put := func(kind, key string, v any) {
		if f.records[kind] == nil {
			f.records[kind] = map[string]any{}
		}
		f.records[kind][key] = v
	}
	switch c := cmd.(type) {
	case arbiter.StartSession:
		// Real time: the server checks expiry against its clock.
		c.Session.CreatedAt, c.Session.ExpiresAt = time.Now(), time.Now().Add(c.TTL)
		put(arbiter.RecordSession, c.Session.ID, c.Session)
		return c.Session, true
	case arbiter.EndSession:
		delete(f.records[arbiter.RecordSession], c.ID)
		return arbiter.None{}, true
	case arbiter.EndSessions:
		n := 0
		for k, v := range f.records[arbiter.RecordSession] {
			s := v.(arbiter.Session)
			if fp, ok := c.Keep[s.Principal]; !ok || fp != s.TokenFP {
				delete(f.records[arbiter.RecordSession], k)
				n++
			}
		}
		return n, true
	case arbiter.RecordAuditEntries:
		for _, e := range c.Entries {
			f.auditN++
			e.Seq, e.Time = f.auditN, fakeNow
			put(arbiter.RecordAudit, fmt.Sprintf("%020d", e.Seq), e)
		}
		return arbiter.None{}, true
	}
	return nil, false
}

// auditEntries returns the audit trail, oldest first.
func (f *fakePlane) auditEntries() []arbiter.AuditEntry {
	var out []arbiter.AuditEntry
	for _, r := range f.Records(arbiter.RecordAudit) {
		out = append(out, r.Value.(arbiter.AuditEntry))
	}
	return out
}

var fakeNow = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func (f *fakePlane) Do(ctx context.Context, cmd arbiter.Command) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if res, ok := f.doTrust(cmd); ok {
		return res, nil
	}
	f.cmds = append(f.cmds, cmd)
	if f.doPanic {
		panic("fake plane panics")
	}
	if f.doErr != nil {
		return nil, f.doErr
	}
	switch c := cmd.(type) {
	case arbiter.Allocate:
		a := arbiter.Allocation{
			ID: f.nextID, Owner: c.Request.Owner, Label: c.Request.Label, State: arbiter.StateQueued, Request: c.Request,
			Priority: c.Request.Priority, KeepaliveS: c.Request.KeepaliveS, CreatedAt: fakeNow,
			Principal: c.Caller.Name, WhyQueued: arbiter.Str("no machine has 1 free GPU"),
		}
		f.nextID++
		f.allocs[a.ID] = a
		f.emitLocked(arbiter.EventAllocationQueued, a)
		return a, nil
	case arbiter.Keepalive:
		a, ok := f.allocs[c.ID]
		switch {
		case !ok:
			return nil, arbiter.Errorf(arbiter.ENotFound, "allocation %d does not exist", c.ID)
		case !a.Live():
			return nil, arbiter.Errorf(arbiter.EConflict, "allocation %d is destroyed", c.ID)
		}
		return a, nil
	case arbiter.Release:
		a, ok := f.allocs[c.ID]
		switch {
		case !ok:
			return nil, arbiter.Errorf(arbiter.ENotFound, "allocation %d does not exist", c.ID)
		case c.Caller.Role != arbiter.RoleAdmin && c.Caller.Name != a.Principal:
			return nil, arbiter.Errorf(arbiter.EForbidden, "allocation %d belongs to %q", c.ID, a.Principal)
		case !a.Live():
			return a, nil
		}
		a.State, a.Reason = arbiter.StateDestroyed, arbiter.Str(c.Reason)
		f.allocs[a.ID] = a
		f.emitLocked(arbiter.EventAllocationDestroyed, a)
		return a, nil
	case arbiter.RegisterMachine:
		f.machines[c.Machine.Name] = c.Machine
		f.emitLocked(arbiter.EventMachineRegistered, c.Machine)
		return c.Machine, nil
	case arbiter.Heartbeat:
		m, ok := f.machines[c.Name]
		if !ok {
			return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered", c.Name)
		}
		m.LastSeen = fakeNow
		f.machines[c.Name] = m
		return m, nil
	case arbiter.SetDraining:
		m, ok := f.machines[c.Name]
		if !ok {
			return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered", c.Name)
		}
		m.Draining = c.Draining
		f.machines[c.Name] = m
		f.emitLocked(arbiter.EventMachineDrained, m)
		return m, nil
	}
	return nil, fmt.Errorf("fake plane: unexpected command %T", cmd)
}

// emitLocked appends an event about v and wakes subscribers.
func (f *fakePlane) emitLocked(kind string, v any) {
	data, _ := json.Marshal(v)
	subject := ""
	switch x := v.(type) {
	case arbiter.Allocation:
		subject = "allocation/" + strconv.FormatInt(x.ID, 10)
	case arbiter.Machine:
		subject = "machine/" + x.Name
	}
	f.events = append(f.events, arbiter.Event{
		Seq: int64(len(f.events)) + 1, Time: fakeNow, Kind: kind, Subject: subject, Data: data,
	})
	close(f.changed)
	f.changed = make(chan struct{})
}

// emitRaw appends an event of any kind and subject, and wakes subscribers.
func emitRaw(f *fakePlane, kind, subject string, v any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, _ := json.Marshal(v)
	f.events = append(f.events, arbiter.Event{Seq: int64(len(f.events)) + 1, Time: fakeNow, Kind: kind, Subject: subject, Data: data})
	close(f.changed)
	f.changed = make(chan struct{})
}

// setState moves an allocation to state, as the engine would on placement.
func (f *fakePlane) setState(id int64, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.allocs[id]
	a.State = state
	a.WhyQueued = nil
	f.allocs[id] = a
	f.emitLocked("allocation."+state, a)
}

// addMachine registers a machine directly, without an event.
func (f *fakePlane) addMachine(m arbiter.Machine) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.machines[m.Name] = m
}

func (f *fakePlane) commands() []arbiter.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arbiter.Command(nil), f.cmds...)
}

func (f *fakePlane) subscribers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subs
}

func (f *fakePlane) status(m arbiter.Machine) arbiter.MachineStatus {
	st := machineStatus(&m)
	for _, a := range f.allocs {
		if !a.Live() {
			continue
		}
		for _, d := range a.Devices {
			for i := range st.Devices {
				if d.Machine == m.Name && d.Index == st.Devices[i].Index {
					id := a.ID
					st.Devices[i].Allocation = &id
					st.Free--
				}
			}
		}
	}
	return st
}

func (f *fakePlane) Machines() []arbiter.MachineStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]arbiter.MachineStatus, 0, len(f.machines))
	for _, m := range f.machines {
		out = append(out, f.status(m))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (f *fakePlane) Machine(name string) (arbiter.MachineStatus, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.machines[name]
	if !ok {
		return arbiter.MachineStatus{}, false
	}
	return f.status(m), true
}

func (f *fakePlane) Allocations(flt arbiter.AllocationFilter) []arbiter.Allocation {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []arbiter.Allocation
	for _, a := range f.allocs {
		if flt.Match(&a) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (f *fakePlane) Allocation(id int64) (arbiter.Allocation, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.allocs[id]
	return a, ok
}

// Records and Record: the fake holds sessions and audit entries only.
func (f *fakePlane) Records(kind string) []arbiter.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.records[kind]))
	for k := range f.records[kind] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]arbiter.Record, len(keys))
	for i, k := range keys {
		out[i] = arbiter.Record{Kind: kind, Key: k, Value: f.records[kind][k]}
	}
	return out
}

func (f *fakePlane) Record(kind, key string) (any, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.records[kind][key]
	return v, ok
}

func (f *fakePlane) LastSeq() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(len(f.events))
}

// Events returns up to limit of the events after since stored now.
func (f *fakePlane) Events(_ context.Context, since int64, limit int) ([]arbiter.Event, error) {
	if since < 0 {
		return nil, errors.New("fake plane: negative since")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	evs := f.events[min(since, int64(len(f.events))):]
	return append([]arbiter.Event(nil), evs[:min(limit, len(evs))]...), nil
}

// Subscribe sends stored events after since, then live ones, until ctx ends.
func (f *fakePlane) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	if since < 0 {
		return nil, errors.New("fake plane: negative since")
	}
	ch := make(chan arbiter.Event, 4)
	f.mu.Lock()
	f.subs++
	f.mu.Unlock()
	go func() {
		defer func() {
			f.mu.Lock()
			f.subs--
			f.mu.Unlock()
			close(ch)
		}()
		next := since
		for {
			f.mu.Lock()
			pending := append([]arbiter.Event(nil), f.events[min(next, int64(len(f.events))):]...)
			changed := f.changed
			f.mu.Unlock()
			for _, ev := range pending {
				select {
				case ch <- ev:
					next = ev.Seq
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

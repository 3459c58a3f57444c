package engine

import (
	"encoding/json"
	"sort"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// memStore keeps what a store would from each Flush — machines,
// allocations (through their JSON, as a store round-trips them), records
// and events — so that an engine can be rebuilt from it as after a
// restart.
type memStore struct {
	machines map[string]arbiter.Machine
	allocs   map[int64]arbiter.Allocation
	records  map[arbiter.RecordRef]json.RawMessage
	nextID   int64
	nextSeq  int64
	events   []arbiter.Event
	last     *arbiter.Changes // what the last save took
}

func newMemStore() *memStore {
	return &memStore{machines: map[string]arbiter.Machine{}, allocs: map[int64]arbiter.Allocation{},
		records: map[arbiter.RecordRef]json.RawMessage{}}
}

// take flushes e and saves what it returns.
func (s *memStore) take(t testing.TB, e *Engine) *arbiter.Changes {
	t.Helper()
	c := e.Flush()
	s.save(c)
	return c
}

func (s *memStore) save(c *arbiter.Changes) {
	for _, m := range c.Machines {
		s.machines[m.Name] = m
	}
	for _, n := range c.RemovedMachines {
		delete(s.machines, n)
	}
	for _, a := range c.Allocations {
		raw, _ := json.Marshal(a)
		var cp arbiter.Allocation
		if err := json.Unmarshal(raw, &cp); err != nil {
			panic(err)
		}
		s.allocs[a.ID] = cp
	}
	for _, id := range c.RemovedAllocations {
		delete(s.allocs, id)
	}
	for _, r := range c.Records {
		raw, err := json.Marshal(r.Value)
		if err != nil {
			panic(err)
		}
		s.records[arbiter.RecordRef{Kind: r.Kind, Key: r.Key}] = raw
	}
	for _, r := range c.RemovedRecords {
		delete(s.records, r)
	}
	s.events = append(s.events, c.Events...)
	s.nextID, s.nextSeq = c.NextAllocationID, c.NextEventSeq
	s.last = c
}

// state is what a store would load, in a fixed order.
func (s *memStore) state() *arbiter.State {
	st := &arbiter.State{NextAllocationID: s.nextID, NextEventSeq: s.nextSeq}
	for _, n := range sortedKeys(s.machines) {
		st.Machines = append(st.Machines, s.machines[n])
	}
	for _, id := range sortedKeys(s.allocs) {
		st.Allocations = append(st.Allocations, s.allocs[id])
	}
	refs := make([]arbiter.RecordRef, 0, len(s.records))
	for r := range s.records {
		refs = append(refs, r)
	}
	sort.Slice(refs, func(i, j int) bool { return refLess(refs[i], refs[j]) })
	for _, r := range refs {
		st.Records = append(st.Records, arbiter.Record{Kind: r.Kind, Key: r.Key, Value: s.records[r]})
	}
	return st
}

// kinds lists the kinds of the events saved from the from-th on.
func (s *memStore) kinds(from int) []string {
	var out []string
	for _, e := range s.events[from:] {
		out = append(out, e.Kind)
	}
	return out
}

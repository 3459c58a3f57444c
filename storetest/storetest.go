// Package storetest is the conformance suite every arbiter.Store passes
// (docs/architecture.md §2.3, §4). A store package runs it from its own tests:
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) func() arbiter.Store {
//			path := filepath.Join(t.TempDir(), "arbiter.db")
//			return func() arbiter.Store {
//				s, err := sqlite.Open(path, sqlite.Options{})
//				if err != nil {
//					t.Fatal(err)
//				}
//				return s
//			}
//		})
//	}
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Opener prepares a new, empty place for one store (a file, a schema) for the
// test t, removing it when t ends, and returns a function that opens a Store
// on that place. Each call of open returns a new handle on the same data, so
// the suite can close a store and open it again to see what persisted. open
// reports failure through t (t.Fatal). The suite closes every handle it opens.
//
// Subtests run in parallel: places given to different tests must not overlap.
type Opener func(t *testing.T) (open func() arbiter.Store)

// Exercise runs the conformance suite on the stores newStore gives. Run it
// with -race: one case saves while others read.
func Exercise(t *testing.T, newStore Opener) {
	cases := []struct {
		name string
		run  func(t *testing.T, open func() arbiter.Store)
	}{
		{"Empty", testEmpty},
		{"RoundTrip", testRoundTrip},
		{"MemoryOnly", testMemoryOnly},
		{"Upsert", testUpsert},
		{"UpsertTwiceInOneSave", testUpsertTwice},
		{"Delete", testDelete},
		{"NextIDs", testNextIDs},
		{"Events", testEvents},
		{"Trim", testTrim},
		{"Atomic", testAtomic},
		{"CanceledContext", testCanceled},
		{"ConcurrentReaders", testConcurrentReaders},
		{"Large", testLarge},
		{"CloseTwice", testCloseTwice},
		{"Records", testRecords},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			open := newStore(t)
			c.run(t, func() arbiter.Store {
				s := open()
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

var (
	t0 = time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)
	t1 = t0.Add(90 * time.Second)
	t2 = t1.Add(time.Hour + 1)
)

func f64(v float64) *float64            { return &v }
func tp(t time.Time) *time.Time         { return &t }
func raw(s string) json.RawMessage      { return json.RawMessage(s) }
func ctxT(t *testing.T) context.Context { return t.Context() }

// fullMachine has every field set, LastSeen included.
func fullMachine(name string) arbiter.Machine {
	return arbiter.Machine{
		Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceAgent,
		Tags: []string{"a100", "rack-3"}, Cores: 64, RAMGiB: 503.5,
		CUDA: "12.4", Driver: "550.54.15",
		GPUs: []arbiter.GPU{
			{Index: 0, UUID: "GPU-0000", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Compute: "8.0", Healthy: true},
			{Index: 1, UUID: "GPU-0001", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Compute: "8.0", Healthy: false},
		},
		Draining: true, Down: true,
		LastSeen: t2,
	}
}

// bareMachine leaves the optional fields zero and the slices nil.
func bareMachine(name string) arbiter.Machine {
	return arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceConfig}
}

// fullAllocation has every field set, ExpiresAt included.
func fullAllocation(id int64) arbiter.Allocation {
	return arbiter.Allocation{
		ID: id, Owner: "alice", State: arbiter.StateDestroyed,
		Reason: arbiter.Str("released by owner"), Machine: arbiter.Str("gpu1"),
		Devices: []arbiter.DeviceRef{
			{Machine: "gpu1", Index: 0, UUID: "GPU-0000", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80},
			{Machine: "gpu1", Index: 3, UUID: "GPU-0003", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80},
		},
		Request: arbiter.Request{
			Owner: "alice", GPUs: 2, MinVRAMGiB: 40, RequireCUDA: true, MinCompute: "8.0",
			Model: "*A100*", Tags: []string{"rack-3"}, Machine: "gpu1", Priority: -5,
			KeepaliveS: f64(60),
		},
		Priority: -5, KeepaliveS: f64(60),
		CreatedAt: t0, ReadyAt: tp(t1), DestroyedAt: tp(t2), ExpiresAt: tp(t2.Add(time.Minute)),
		WhyQueued: arbiter.Str("no machine has 2 free GPUs"), Principal: "ci-token",
	}
}

// bareAllocation leaves pointers nil and slices nil.
func bareAllocation(id int64) arbiter.Allocation {
	return arbiter.Allocation{
		ID: id, Owner: "bob", State: arbiter.StateQueued,
		Request:   arbiter.Request{Owner: "bob", GPUs: 1},
		CreatedAt: t0,
	}
}

func event(seq int64, data string) arbiter.Event {
	e := arbiter.Event{Seq: seq, Time: t0.Add(time.Duration(seq) * time.Millisecond), Kind: arbiter.EventAllocationQueued,
		Subject: fmt.Sprintf("allocation/%d", seq)}
	if data != "" {
		e.Data = raw(data)
	}
	return e
}

func save(t *testing.T, s arbiter.Store, c *arbiter.Changes) {
	t.Helper()
	if err := s.Save(ctxT(t), c); err != nil {
		t.Fatalf("Save: %v", err)
	}
}

func load(t *testing.T, s arbiter.Store) *arbiter.State {
	t.Helper()
	st, err := s.Load(ctxT(t))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	sort.Slice(st.Machines, func(i, j int) bool { return st.Machines[i].Name < st.Machines[j].Name })
	sort.Slice(st.Allocations, func(i, j int) bool { return st.Allocations[i].ID < st.Allocations[j].ID })
	return st
}

func events(t *testing.T, s arbiter.Store, since int64, limit int) []arbiter.Event {
	t.Helper()
	evs, err := s.Events(ctxT(t), since, limit)
	if err != nil {
		t.Fatalf("Events(%d, %d): %v", since, limit, err)
	}
	return evs
}

func seqs(evs []arbiter.Event) []int64 {
	out := []int64{}
	for _, e := range evs {
		out = append(out, e.Seq)
	}
	return out
}

// reopen closes s and opens the same store again.
func reopen(t *testing.T, s arbiter.Store, open func() arbiter.Store) arbiter.Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return open()
}

func diff(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		gj, _ := json.MarshalIndent(got, "", " ")
		wj, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("%s:\ngot  %s\nwant %s", what, gj, wj)
	}
}

func testEmpty(t *testing.T, open func() arbiter.Store) {
	s := open()
	st := load(t, s)
	if len(st.Machines) != 0 || len(st.Allocations) != 0 {
		t.Errorf("got %d machines, %d allocations, want none", len(st.Machines), len(st.Allocations))
	}
	if st.NextAllocationID != 1 || st.NextEventSeq != 1 {
		t.Errorf("got next ids %d, %d, want 1, 1", st.NextAllocationID, st.NextEventSeq)
	}
	if evs := events(t, s, 0, 100); len(evs) != 0 {
		t.Errorf("got %d events, want none", len(evs))
	}
	save(t, s, &arbiter.Changes{}) // an empty change set is fine
	if st := load(t, s); st.NextAllocationID != 1 || st.NextEventSeq != 1 {
		t.Errorf("after empty Save: got next ids %d, %d, want 1, 1", st.NextAllocationID, st.NextEventSeq)
	}
}

func testRoundTrip(t *testing.T, open func() arbiter.Store) {
	s := open()
	zone := time.FixedZone("UTC+2", 2*3600)
	local := fullAllocation(3)
	local.CreatedAt = t0.In(zone)
	local.ReadyAt = tp(t1.In(zone))
	localEv := event(4, `{"id":3}`)
	localEv.Time = t1.In(zone)

	c := &arbiter.Changes{
		Machines:         []arbiter.Machine{fullMachine("gpu1"), bareMachine("gpu2")},
		Allocations:      []arbiter.Allocation{fullAllocation(1), bareAllocation(2), local},
		Events:           []arbiter.Event{event(1, `{"id": 1, "nested": {"a": [1, 2.5, "x"]}}`), event(2, ""), event(3, `null`), localEv},
		NextAllocationID: 4,
		NextEventSeq:     5,
	}
	save(t, s, c)

	wantM := []arbiter.Machine{fullMachine("gpu1"), bareMachine("gpu2")}
	wantM[0].LastSeen = time.Time{}
	wantA := []arbiter.Allocation{fullAllocation(1), bareAllocation(2), fullAllocation(3)}
	wantA[0].ExpiresAt, wantA[2].ExpiresAt = nil, nil
	wantE := []arbiter.Event{event(1, `{"id": 1, "nested": {"a": [1, 2.5, "x"]}}`), event(2, ""), event(3, `null`), event(4, `{"id":3}`)}
	wantE[3].Time = t1

	for _, phase := range []string{"same handle", "reopened"} {
		st := load(t, s)
		diff(t, phase+": machines", st.Machines, wantM)
		diff(t, phase+": allocations", st.Allocations, wantA)
		if st.NextAllocationID != 4 || st.NextEventSeq != 5 {
			t.Errorf("%s: got next ids %d, %d, want 4, 5", phase, st.NextAllocationID, st.NextEventSeq)
		}
		evs := events(t, s, 0, 10)
		diff(t, phase+": events", evs, wantE)
		for _, e := range evs {
			if e.Time.Location() != time.UTC {
				t.Errorf("%s: event %d: got time in %v, want UTC", phase, e.Seq, e.Time.Location())
			}
		}
		s = reopen(t, s, open)
	}
}

func testMemoryOnly(t *testing.T, open func() arbiter.Store) {
	s := open()
	m := bareMachine("gpu1")
	m.LastSeen = t1
	a := bareAllocation(1)
	a.ExpiresAt = tp(t2)
	save(t, s, &arbiter.Changes{Machines: []arbiter.Machine{m}, Allocations: []arbiter.Allocation{a}})
	if m.LastSeen != t1 || a.ExpiresAt == nil || !a.ExpiresAt.Equal(t2) {
		t.Errorf("Save changed the caller's records")
	}
	// Touched records carry only memory-only changes: nothing to save.
	tm := m
	tm.LastSeen = t2
	tm.Cores = 99
	ta := a
	ta.ExpiresAt = tp(t2.Add(time.Hour))
	ta.Owner = "mallory"
	save(t, s, &arbiter.Changes{TouchedMachines: []arbiter.Machine{tm}, TouchedAllocations: []arbiter.Allocation{ta}})

	s = reopen(t, s, open)
	st := load(t, s)
	if len(st.Machines) != 1 || len(st.Allocations) != 1 {
		t.Fatalf("got %d machines, %d allocations, want 1, 1", len(st.Machines), len(st.Allocations))
	}
	if got := st.Machines[0]; !got.LastSeen.IsZero() || got.Cores != 0 {
		t.Errorf("machine: got LastSeen %v, Cores %d, want zero, 0", got.LastSeen, got.Cores)
	}
	if got := st.Allocations[0]; got.ExpiresAt != nil || got.Owner != "bob" {
		t.Errorf("allocation: got ExpiresAt %v, Owner %q, want nil, bob", got.ExpiresAt, got.Owner)
	}
}

func testUpsert(t *testing.T, open func() arbiter.Store) {
	s := open()
	save(t, s, &arbiter.Changes{
		Machines:    []arbiter.Machine{bareMachine("gpu1"), bareMachine("gpu2")},
		Allocations: []arbiter.Allocation{bareAllocation(1), bareAllocation(2)},
	})
	m := fullMachine("gpu1")
	a := fullAllocation(1)
	save(t, s, &arbiter.Changes{Machines: []arbiter.Machine{m}, Allocations: []arbiter.Allocation{a}})
	m.LastSeen, a.ExpiresAt = time.Time{}, nil
	st := load(t, s)
	diff(t, "machines", st.Machines, []arbiter.Machine{m, bareMachine("gpu2")})
	diff(t, "allocations", st.Allocations, []arbiter.Allocation{a, bareAllocation(2)})
}

func testUpsertTwice(t *testing.T, open func() arbiter.Store) {
	s := open()
	first, last := bareAllocation(1), bareAllocation(1)
	last.State = arbiter.StateReady
	last.Machine = arbiter.Str("gpu1")
	m1, m2 := bareMachine("gpu1"), bareMachine("gpu1")
	m2.Cores = 8
	save(t, s, &arbiter.Changes{Machines: []arbiter.Machine{m1, m2}, Allocations: []arbiter.Allocation{first, last}})
	st := load(t, s)
	diff(t, "machines", st.Machines, []arbiter.Machine{m2})
	diff(t, "allocations", st.Allocations, []arbiter.Allocation{last})
}

func testDelete(t *testing.T, open func() arbiter.Store) {
	s := open()
	save(t, s, &arbiter.Changes{
		Machines:    []arbiter.Machine{bareMachine("gpu1"), bareMachine("gpu2"), bareMachine("gpu3")},
		Allocations: []arbiter.Allocation{bareAllocation(1), bareAllocation(2), bareAllocation(3)},
	})
	save(t, s, &arbiter.Changes{
		RemovedMachines:    []string{"gpu1", "gpu3", "never-existed"},
		RemovedAllocations: []int64{2, 99},
	})
	// Upserted and removed in one change set: removal comes after, and wins.
	save(t, s, &arbiter.Changes{
		Machines: []arbiter.Machine{bareMachine("gpu4")}, RemovedMachines: []string{"gpu4"},
		Allocations: []arbiter.Allocation{bareAllocation(4)}, RemovedAllocations: []int64{4},
	})
	s = reopen(t, s, open)
	st := load(t, s)
	diff(t, "machines", st.Machines, []arbiter.Machine{bareMachine("gpu2")})
	diff(t, "allocations", st.Allocations, []arbiter.Allocation{bareAllocation(1), bareAllocation(3)})
}

func testNextIDs(t *testing.T, open func() arbiter.Store) {
	s := open()
	steps := []struct {
		name          string
		alloc, ev     int64
		wantA, wantEv int64
	}{
		{"both", 10, 20, 10, 20},
		{"alloc only", 11, 0, 11, 20},
		{"event only", 0, 25, 11, 25},
		{"neither", 0, 0, 11, 25},
	}
	for _, st := range steps {
		save(t, s, &arbiter.Changes{NextAllocationID: st.alloc, NextEventSeq: st.ev})
		s = reopen(t, s, open)
		got := load(t, s)
		if got.NextAllocationID != st.wantA || got.NextEventSeq != st.wantEv {
			t.Errorf("%s: got next ids %d, %d, want %d, %d", st.name, got.NextAllocationID, got.NextEventSeq, st.wantA, st.wantEv)
		}
	}
}

func testEvents(t *testing.T, open func() arbiter.Store) {
	s := open()
	// Saved over three change sets, out of order within one.
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(3, "{}"), event(1, "{}"), event(2, "{}")}})
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(4, "{}"), event(5, "{}"), event(6, "{}")}})
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(7, "{}"), event(8, "{}"), event(9, "{}"), event(10, "{}")}})
	cases := []struct {
		name  string
		since int64
		limit int
		want  []int64
	}{
		{"all", 0, 100, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"limit", 0, 3, []int64{1, 2, 3}},
		{"since", 4, 100, []int64{5, 6, 7, 8, 9, 10}},
		{"since and limit", 5, 3, []int64{6, 7, 8}},
		{"negative since", -5, 2, []int64{1, 2}},
		{"at end", 10, 5, []int64{}},
		{"past end", 50, 5, []int64{}},
		{"zero limit", 0, 0, []int64{}},
		{"negative limit", 0, -1, []int64{}},
	}
	for _, c := range cases {
		if got := seqs(events(t, s, c.since, c.limit)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: Events(%d, %d): got seqs %v, want %v", c.name, c.since, c.limit, got, c.want)
		}
	}
}

func testTrim(t *testing.T, open func() arbiter.Store) {
	s := open()
	var evs []arbiter.Event
	for seq := int64(1); seq <= 10; seq++ {
		evs = append(evs, event(seq, "{}"))
	}
	save(t, s, &arbiter.Changes{Events: evs})
	save(t, s, &arbiter.Changes{TrimEventsBefore: 4})
	if got, want := seqs(events(t, s, 0, 100)), []int64{4, 5, 6, 7, 8, 9, 10}; !reflect.DeepEqual(got, want) {
		t.Errorf("after trim before 4: got seqs %v, want %v", got, want)
	}
	// Events are inserted before the trim, so new events below it go too.
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(11, "{}"), event(12, "{}")}, TrimEventsBefore: 12})
	s = reopen(t, s, open)
	if got, want := seqs(events(t, s, 0, 100)), []int64{12}; !reflect.DeepEqual(got, want) {
		t.Errorf("after trim before 12: got seqs %v, want %v", got, want)
	}
	save(t, s, &arbiter.Changes{TrimEventsBefore: 100})
	if got := seqs(events(t, s, 0, 100)); len(got) != 0 {
		t.Errorf("after trim before 100: got seqs %v, want none", got)
	}
}

// baseline saves a small state and returns what Load and Events give for it.
func baseline(t *testing.T, s arbiter.Store) (*arbiter.State, []arbiter.Event) {
	save(t, s, &arbiter.Changes{
		Machines:         []arbiter.Machine{bareMachine("gpu1")},
		Allocations:      []arbiter.Allocation{bareAllocation(1), bareAllocation(2)},
		Events:           []arbiter.Event{event(1, "{}"), event(2, "{}")},
		NextAllocationID: 3, NextEventSeq: 3,
	})
	return load(t, s), events(t, s, 0, 100)
}

func testAtomic(t *testing.T, open func() arbiter.Store) {
	s := open()
	wantSt, wantEv := baseline(t, s)
	m := fullMachine("gpu1")
	a := bareAllocation(1)
	a.State = arbiter.StateReady
	bad := []struct {
		name string
		c    *arbiter.Changes
	}{
		{"repeated seq", &arbiter.Changes{
			Machines: []arbiter.Machine{m, bareMachine("gpu9")}, RemovedMachines: []string{"gpu1"},
			Allocations: []arbiter.Allocation{a, bareAllocation(3)}, RemovedAllocations: []int64{2},
			Events:           []arbiter.Event{event(3, "{}"), event(4, "{}"), event(4, "{}")},
			TrimEventsBefore: 2, NextAllocationID: 4, NextEventSeq: 5,
		}},
		{"stored seq", &arbiter.Changes{
			Machines: []arbiter.Machine{m}, Allocations: []arbiter.Allocation{a},
			Events:           []arbiter.Event{event(3, "{}"), event(2, "{}")},
			TrimEventsBefore: 2, NextAllocationID: 4, NextEventSeq: 4,
		}},
	}
	for _, b := range bad {
		if err := s.Save(ctxT(t), b.c); err == nil {
			t.Fatalf("%s: Save succeeded, want an error", b.name)
		}
		st := load(t, s)
		diff(t, b.name+": state", st, wantSt)
		diff(t, b.name+": events", events(t, s, 0, 100), wantEv)
	}
	// The store still works after a failed Save.
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(3, "{}")}, NextEventSeq: 4})
	s = reopen(t, s, open)
	if got, want := seqs(events(t, s, 0, 100)), []int64{1, 2, 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("after recovery: got seqs %v, want %v", got, want)
	}
	if got := load(t, s).NextEventSeq; got != 4 {
		t.Errorf("after recovery: got NextEventSeq %d, want 4", got)
	}
}

func testCanceled(t *testing.T, open func() arbiter.Store) {
	s := open()
	wantSt, wantEv := baseline(t, s)
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	err := s.Save(ctx, &arbiter.Changes{Machines: []arbiter.Machine{bareMachine("gpu2")},
		Events: []arbiter.Event{event(3, "{}")}, NextEventSeq: 4})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Save with a canceled context: got error %v, want one wrapping context.Canceled", err)
	}
	diff(t, "state", load(t, s), wantSt)
	diff(t, "events", events(t, s, 0, 100), wantEv)
	if _, err := s.Events(ctx, 0, 10); !errors.Is(err, context.Canceled) {
		t.Errorf("Events with a canceled context: got error %v, want one wrapping context.Canceled", err)
	}
}

// testConcurrentReaders reads events while batches are saved: readers must
// see each batch whole or not at all, in order, and never fail.
func testConcurrentReaders(t *testing.T, open func() arbiter.Store) {
	s := open()
	const batches, perBatch, readers = 40, 16, 4
	const last = batches * perBatch
	done := make(chan struct{})
	errc := make(chan error, readers+1)
	var wg sync.WaitGroup
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var since int64
			for since < last {
				// Checked before reading: once done is closed, a read that finds
				// nothing new means saved events went missing.
				var saved bool
				select {
				case <-done:
					saved = true
				default:
				}
				evs, err := s.Events(ctxT(t), since, 50)
				if err != nil {
					errc <- err
					return
				}
				for _, e := range evs {
					if e.Seq != since+1 {
						errc <- fmt.Errorf("reader after seq %d got seq %d", since, e.Seq)
						return
					}
					since = e.Seq
				}
				if len(evs) > 0 && since%perBatch != 0 && len(evs) < 50 {
					errc <- fmt.Errorf("reader saw part of a batch: up to seq %d", since)
					return
				}
				if saved && len(evs) == 0 && since < last {
					errc <- fmt.Errorf("reader stopped at seq %d after all saves, want %d", since, last)
					return
				}
			}
		}()
	}
	go func() {
		defer close(done)
		seq := int64(0)
		for b := 0; b < batches; b++ {
			c := &arbiter.Changes{NextEventSeq: seq + perBatch + 1,
				Allocations: []arbiter.Allocation{bareAllocation(int64(b + 1))}}
			for i := 0; i < perBatch; i++ {
				seq++
				c.Events = append(c.Events, event(seq, `{"batch":true}`))
			}
			if err := s.Save(ctxT(t), c); err != nil {
				errc <- fmt.Errorf("save of batch %d: %w", b, err)
				return
			}
		}
	}()
	wg.Wait()
	<-done
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func testLarge(t *testing.T, open func() arbiter.Store) {
	s := open()
	n := int64(10000)
	if testing.Short() {
		n = 1000
	}
	c := &arbiter.Changes{NextAllocationID: n + 1, NextEventSeq: n + 1}
	for i := int64(1); i <= n; i++ {
		a := fullAllocation(i)
		a.Owner = fmt.Sprintf("user%d", i%37)
		c.Allocations = append(c.Allocations, a)
		c.Events = append(c.Events, event(i, fmt.Sprintf(`{"id":%d}`, i)))
	}
	save(t, s, c)
	st := load(t, s)
	if int64(len(st.Allocations)) != n {
		t.Fatalf("got %d allocations, want %d", len(st.Allocations), n)
	}
	for _, i := range []int64{1, n / 2, n} {
		want := c.Allocations[i-1]
		want.ExpiresAt = nil
		diff(t, fmt.Sprintf("allocation %d", i), st.Allocations[i-1], want)
	}
	if got := events(t, s, n-2, 10); !reflect.DeepEqual(seqs(got), []int64{n - 1, n}) {
		t.Errorf("got last seqs %v, want [%d %d]", seqs(got), n-1, n)
	}
	// Replace all of them in one change set too: the upsert path at scale.
	for i := range c.Allocations {
		c.Allocations[i].State = arbiter.StateReady
	}
	save(t, s, &arbiter.Changes{Allocations: c.Allocations})
	for _, a := range load(t, s).Allocations {
		if a.State != arbiter.StateReady {
			t.Fatalf("allocation %d: got state %q, want %q", a.ID, a.State, arbiter.StateReady)
		}
	}
}

func testCloseTwice(t *testing.T, open func() arbiter.Store) {
	s := open()
	save(t, s, &arbiter.Changes{Events: []arbiter.Event{event(1, "{}")}})
	if err := s.Close(); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	if err := s.Save(ctxT(t), &arbiter.Changes{NextEventSeq: 9}); err == nil {
		t.Errorf("Save after Close: got no error, want one")
	}
	if _, err := s.Events(ctxT(t), 0, 10); err == nil {
		t.Errorf("Events after Close: got no error, want one")
	}
	// Saved data survives, and the store opens again after a double close.
	s = open()
	if got := seqs(events(t, s, 0, 10)); !reflect.DeepEqual(got, []int64{1}) {
		t.Errorf("after reopen: got seqs %v, want [1]", got)
	}
}

// testRecords checks the generic records: upsert by (kind, key), the last of
// two upserts wins, removal, and persistence across a reopen. Values come
// back as the JSON the store holds.
func testRecords(t *testing.T, open func() arbiter.Store) {
	type lock struct {
		Name    string `json:"name"`
		Fencing int64  `json:"fencing"`
	}
	s := open()
	save(t, s, &arbiter.Changes{Records: []arbiter.Record{
		{Kind: "lock", Key: "swap", Value: lock{"swap", 1}},
		{Kind: "lock", Key: "other", Value: lock{"other", 1}},
		{Kind: "task", Key: "swap", Value: map[string]string{"id": "swap"}},
		{Kind: "lock", Key: "swap", Value: lock{"swap", 2}},
	}})
	save(t, s, &arbiter.Changes{RemovedRecords: []arbiter.RecordRef{{Kind: "lock", Key: "other"}, {Kind: "lock", Key: "missing"}}})
	s = reopen(t, s, open)
	st := load(t, s)
	got := map[arbiter.RecordRef]lock{}
	for _, r := range st.Records {
		raw, ok := r.Value.(json.RawMessage)
		if !ok {
			t.Fatalf("record %s/%s: value is %T, want json.RawMessage", r.Kind, r.Key, r.Value)
		}
		var l lock
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatalf("record %s/%s: %v", r.Kind, r.Key, err)
		}
		got[arbiter.RecordRef{Kind: r.Kind, Key: r.Key}] = l
	}
	want := map[arbiter.RecordRef]lock{
		{Kind: "lock", Key: "swap"}: {"swap", 2},
		{Kind: "task", Key: "swap"}: {},
	}
	diff(t, "records", got, want)
}

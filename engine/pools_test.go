package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

func smallPool(slots int, grace, retention, maxAge float64) arbiter.Pool {
	return arbiter.Pool{Name: "small", Backing: arbiter.Request{GPUs: 1, MinVRAMGiB: 40}, Slots: slots,
		GraceTimeS: grace, MinRetentionS: retention, MaxAgeS: maxAge}
}

func poolEngine(t *testing.T, p arbiter.Pool, ms ...arbiter.Machine) *Engine {
	t.Helper()
	e := newEngine(t, Config{}, ms...)
	if _, err := e.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{p}}, t0); err != nil {
		t.Fatal(err)
	}
	return e
}

func slot(t *testing.T, e *Engine, now time.Time) arbiter.Allocation {
	t.Helper()
	return alloc1(t, e, now, arbiter.Request{Owner: "nb", Pool: "small", KeepaliveS: nil})
}

func backingsOf(e *Engine) []int64 {
	var out []int64
	for _, b := range e.pools.byPool["small"] {
		out = append(out, b.id)
	}
	return out
}

func TestPoolSlotsShareABacking(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 2))
	s1, s2 := slot(t, e, t0), slot(t, e, t0)
	if s1.State != arbiter.StateReady || s2.State != arbiter.StateReady {
		t.Fatalf("slots %s, %s: want ready", s1.State, s2.State)
	}
	if *s1.Backing != *s2.Backing || *s1.Slot != 0 || *s2.Slot != 1 {
		t.Fatalf("slots on backings %d/%d indices %d/%d, want one backing, 0 and 1", *s1.Backing, *s2.Backing, *s1.Slot, *s2.Slot)
	}
	b, _ := e.Allocation(*s1.Backing)
	if b.Owner != "pool:small" || b.KeepaliveS != nil || len(s1.Devices) != 1 || s1.Devices[0] != b.Devices[0] {
		t.Fatalf("backing %+v, slot devices %+v: want owner pool:small, no keepalive, same GPU", b, s1.Devices)
	}
	s3 := slot(t, e, t0)
	if *s3.Backing == *s1.Backing || *s3.Slot != 0 {
		t.Fatalf("third slot on backing %d index %d, want a second backing, index 0", *s3.Backing, *s3.Slot)
	}
	e.Apply(arbiter.Release{ID: s2.ID}, t0)
	s4 := slot(t, e, t0)
	if *s4.Backing != *s1.Backing || *s4.Slot != 1 {
		t.Fatalf("after freeing slot 1: got backing %d slot %d, want it reused", *s4.Backing, *s4.Slot)
	}
}

func TestPoolGraceRetentionMaxAge(t *testing.T) {
	t.Run("grace", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
		s := slot(t, e, t0)
		e.Apply(arbiter.Release{ID: s.ID}, t0.Add(10*time.Second))
		e.Apply(arbiter.Tick{}, t0.Add(69*time.Second))
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateReady {
			t.Fatalf("backing %s before the grace time, want ready", b.State)
		}
		e.Apply(arbiter.Tick{}, t0.Add(70*time.Second))
		b, _ := e.Allocation(*s.Backing)
		if b.State != arbiter.StateDestroyed || !strings.Contains(*b.Reason, "grace") {
			t.Fatalf("backing %s (%v) after the grace time, want destroyed", b.State, arbiter.StrOr(b.Reason, ""))
		}
		if len(backingsOf(e)) != 0 {
			t.Fatal("released backing still listed")
		}
	})
	t.Run("reuse cancels release", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
		s := slot(t, e, t0)
		e.Apply(arbiter.Release{ID: s.ID}, t0)
		s2 := slot(t, e, t0.Add(30*time.Second))
		e.Apply(arbiter.Tick{}, t0.Add(90*time.Second))
		if b, _ := e.Allocation(*s2.Backing); b.State != arbiter.StateReady || *s2.Backing != *s.Backing {
			t.Fatalf("backing %s, want the same one still ready", b.State)
		}
	})
	t.Run("retention", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 10, 300, 0), host("a", 1))
		s := slot(t, e, t0)
		e.Apply(arbiter.Release{ID: s.ID}, t0.Add(time.Second))
		e.Apply(arbiter.Tick{}, t0.Add(100*time.Second))
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateReady {
			t.Fatalf("young backing %s, want held by min_retention_s", b.State)
		}
		e.Apply(arbiter.Tick{}, t0.Add(300*time.Second))
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateDestroyed {
			t.Fatalf("backing %s after retention, want destroyed", b.State)
		}
	})
	t.Run("max age", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 600, 0, 100), host("a", 2))
		s := slot(t, e, t0)
		e.Apply(arbiter.Tick{}, t0.Add(100*time.Second))
		// Draining: a new slot gets a new backing.
		s2 := slot(t, e, t0.Add(101*time.Second))
		if *s2.Backing == *s.Backing {
			t.Fatal("a slot was granted on a draining backing")
		}
		// Empty and draining: given back at once, grace ignored.
		e.Apply(arbiter.Release{ID: s.ID}, t0.Add(102*time.Second))
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateDestroyed {
			t.Fatalf("drained empty backing %s, want destroyed", b.State)
		}
	})
}

func TestPoolWaitsForBackingAndFailsWithIt(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
	hog := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	s := slot(t, e, t0)
	if s.State != arbiter.StateQueued || !strings.Contains(*s.WhyQueued, "waiting for backing") {
		t.Fatalf("slot %s (%v), want queued for its backing", s.State, arbiter.StrOr(s.WhyQueued, ""))
	}
	e.Apply(arbiter.Release{ID: hog.ID}, t0)
	if got, _ := e.Allocation(s.ID); got.State != arbiter.StateReady || len(got.Devices) != 1 {
		t.Fatalf("slot %+v after the GPU freed, want ready with the backing's GPU", got)
	}
	// Impossible backing: the slot fails with the allocator's reason.
	e2 := poolEngine(t, arbiter.Pool{Name: "small", Backing: arbiter.Request{GPUs: 1, MinVRAMGiB: 200}, Slots: 2}, host("a", 1))
	f := slot(t, e2, t0)
	if f.State != arbiter.StateDestroyed || !strings.Contains(*f.Reason, "200 GiB") {
		t.Fatalf("slot %s (%v), want destroyed with the backing's reason", f.State, arbiter.StrOr(f.Reason, ""))
	}
	if _, err := e2.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "x", Pool: "nope"}}, t0); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("unknown pool: %v, want invalid", err)
	}
}

func TestPoolBackingVanishes(t *testing.T) {
	t.Run("admin release", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
		s := slot(t, e, t0)
		if _, err := e.Apply(arbiter.Release{Caller: arbiter.Caller{Name: "u", Role: arbiter.RoleUser}, ID: *s.Backing}, t0); arbiter.ErrorCode(err) != arbiter.EForbidden {
			t.Fatalf("user releasing a backing: %v, want forbidden", err)
		}
		e.Apply(arbiter.Release{Caller: arbiter.Caller{Role: arbiter.RoleAdmin}, ID: *s.Backing, Reason: "maintenance"}, t0)
		got, _ := e.Allocation(s.ID)
		if got.State != arbiter.StateDestroyed || !strings.Contains(*got.Reason, "maintenance") {
			t.Fatalf("slot %s (%v), want destroyed naming the backing's reason", got.State, arbiter.StrOr(got.Reason, ""))
		}
	})
	t.Run("machine removed", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
		s := slot(t, e, t0)
		e.Apply(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{host("b", 1)}}, t0)
		got, _ := e.Allocation(s.ID)
		if got.State != arbiter.StateDestroyed || !strings.Contains(*got.Reason, "removed from the configuration") {
			t.Fatalf("slot %s (%v), want destroyed with the machine's reason", got.State, arbiter.StrOr(got.Reason, ""))
		}
	})
	t.Run("pool removed", func(t *testing.T) {
		e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
		s := slot(t, e, t0)
		e.Apply(arbiter.SyncPools{}, t0)
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateReady {
			t.Fatalf("backing of a removed pool with a slot in use: %s, want kept until empty", b.State)
		}
		e.Apply(arbiter.Release{ID: s.ID}, t0)
		if b, _ := e.Allocation(*s.Backing); b.State != arbiter.StateDestroyed || !strings.Contains(*b.Reason, "drained") {
			t.Fatalf("backing %s (%v), want given back once empty", b.State, arbiter.StrOr(b.Reason, ""))
		}
	})
}

func TestPoolRestartRecoversSlots(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 2))
	s1, s2, s3 := slot(t, e, t0), slot(t, e, t0), slot(t, e, t0)
	e.Apply(arbiter.Release{ID: s2.ID}, t0)
	st := &arbiter.State{Machines: e.Machines(), Allocations: e.Allocations(), NextAllocationID: e.nextID, NextEventSeq: e.nextSeq}
	later := t0.Add(time.Hour)
	e2 := New(Config{}, st, later)
	if _, err := e2.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{smallPool(2, 60, 0, 0)}}, later); err != nil {
		t.Fatal(err)
	}
	for _, s := range []arbiter.Allocation{s1, s3} {
		got, _ := e2.Allocation(s.ID)
		b := e2.pools.backings[*s.Backing]
		if got.State != arbiter.StateReady || b == nil || b.slots[*s.Slot] != s.ID {
			t.Fatalf("slot %d after restart: %s, backing %v", s.ID, got.State, b)
		}
	}
	// Slot 1 of the first backing is free again and is reused first.
	s4 := slot(t, e2, later)
	if *s4.Backing != *s1.Backing || *s4.Slot != 1 {
		t.Fatalf("got backing %d slot %d, want %d slot 1", *s4.Backing, *s4.Slot, *s1.Backing)
	}
	// A slot whose backing is gone from the store is destroyed on load.
	var kept []arbiter.Allocation
	for _, a := range st.Allocations {
		if a.ID != *s1.Backing {
			kept = append(kept, a)
		}
	}
	st.Allocations = kept
	e3 := New(Config{}, st, later)
	if got, _ := e3.Allocation(s1.ID); got.State != arbiter.StateDestroyed || !strings.Contains(*got.Reason, "is gone") {
		t.Fatalf("orphan slot: %s (%v), want destroyed", got.State, arbiter.StrOr(got.Reason, ""))
	}
}

func TestPoolStatusRecords(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
	s := slot(t, e, t0)
	e.Apply(arbiter.Release{ID: s.ID}, t0)
	c := e.Flush()
	if len(c.TouchedRecords) != 1 || c.TouchedRecords[0].Kind != arbiter.RecordPool {
		t.Fatalf("touched %+v, want the pool's status", c.TouchedRecords)
	}
	st := c.TouchedRecords[0].Value.(arbiter.PoolStatus)
	if len(st.Backings) != 1 || st.Backings[0].ReleaseAt == nil || !st.Backings[0].ReleaseAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("status %+v, want one backing releasing at t0+60s", st)
	}
	if len(c.Records) != 0 {
		t.Fatal("pool status was stored; it must be memory-only")
	}
}

// TestPoolSlotsLoweredByReload: after a reload lowers a pool's slots, a
// backing hands out no slot past the new number.
func TestPoolSlotsLoweredByReload(t *testing.T) {
	e := poolEngine(t, smallPool(4, 60, 0, 0), host("a", 2))
	s0 := slot(t, e, t0)
	if _, err := e.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{smallPool(2, 60, 0, 0)}}, t0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		s := slot(t, e, t0)
		if *s.Slot >= 2 {
			t.Fatalf("slot request %d after the reload to slots = 2 got slot %d on backing %d (backing of s0: %d)", i, *s.Slot, *s.Backing, *s0.Backing)
		}
	}
}

// TestPoolSlotNotOnDrainedMachine: a new slot does not land on a drained
// machine's backing: another backing is taken.
func TestPoolSlotNotOnDrainedMachine(t *testing.T) {
	e := poolEngine(t, smallPool(4, 60, 0, 0), host("a", 1), host("b", 1))
	s1 := slot(t, e, t0)
	if s1.State != arbiter.StateReady {
		t.Fatalf("first slot: %s", s1.State)
	}
	m := *s1.Machine
	if _, err := e.Apply(arbiter.SetDraining{Name: m, Draining: true}, t0); err != nil {
		t.Fatal(err)
	}
	s2 := slot(t, e, t0.Add(time.Second))
	if s2.State == arbiter.StateReady && *s2.Machine == m {
		t.Fatalf("new slot %d granted on drained machine %s (backing %d)", s2.ID, m, *s2.Backing)
	}
}

// TestPoolSlotNotOnDownMachine: a new slot does not land on a down
// machine's backing.
func TestPoolSlotNotOnDownMachine(t *testing.T) {
	e := newEngine(t, Config{HeartbeatTimeout: 60 * time.Second})
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("a", "GPU-a0")}, t0); err != nil {
		t.Fatal(err)
	}
	p := smallPool(4, 60, 0, 0)
	p.Backing.MinVRAMGiB = 0
	if _, err := e.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{p}}, t0); err != nil {
		t.Fatal(err)
	}
	s1 := slot(t, e, t0)
	if s1.State != arbiter.StateReady {
		t.Fatalf("first slot: %s %v", s1.State, arbiter.StrOr(s1.Reason, ""))
	}
	if _, err := e.Apply(arbiter.LeaveMachine{Name: "a"}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	s2 := slot(t, e, t0.Add(2*time.Second))
	if s2.State == arbiter.StateReady {
		t.Fatalf("new slot %d granted on down machine %s", s2.ID, *s2.Machine)
	}
}

// TestQueuedSlotNotOvertaken: a slot waiting for a new backing takes a slot
// freed on a granted backing before a later request does, and the backing
// it waited for goes back; so does one that waited while the machine was
// down, once the machine is back.
func TestQueuedSlotNotOvertaken(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
	s1, _ := slot(t, e, t0), slot(t, e, t0)
	s3 := slot(t, e, t0) // no free slot, no free GPU: waits for a second backing
	if s3.State != arbiter.StateQueued || *s3.Backing == *s1.Backing {
		t.Fatalf("s3 %s on backing %d, want queued on another", s3.State, *s3.Backing)
	}
	waited := *s3.Backing
	now := t0.Add(time.Minute)
	if _, err := e.Apply(arbiter.Release{ID: s1.ID}, now); err != nil {
		t.Fatal(err)
	}
	got, _ := e.Allocation(s3.ID)
	if got.State != arbiter.StateReady || *got.Backing != *s1.Backing || *got.Slot != *s1.Slot {
		t.Fatalf("s3 after s1's slot freed: %s on backing %d slot %d, want ready in s1's slot", got.State, *got.Backing, *got.Slot)
	}
	if b, _ := e.Allocation(waited); b.State != arbiter.StateDestroyed {
		t.Fatalf("the backing s3 waited for: %s, want given back", b.State)
	}
	if later := slot(t, e, now.Add(time.Second)); later.State != arbiter.StateQueued {
		t.Fatalf("a later request: %s, want queued behind", later.State)
	}

	e2 := newEngine(t, Config{HeartbeatTimeout: 60 * time.Second})
	if _, err := e2.Apply(arbiter.RegisterMachine{Machine: agentHost("a", "GPU-a0")}, t0); err != nil {
		t.Fatal(err)
	}
	p := smallPool(4, 60, 0, 0)
	p.Backing.MinVRAMGiB = 0
	if _, err := e2.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{p}}, t0); err != nil {
		t.Fatal(err)
	}
	slot(t, e2, t0)
	e2.Apply(arbiter.Tick{}, t0.Add(61*time.Second)) // a misses its heartbeats: down
	s2 := slot(t, e2, t0.Add(62*time.Second))        // waits for a new backing
	if _, err := e2.Apply(arbiter.Heartbeat{Name: "a"}, t0.Add(63*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e2.Allocation(s2.ID); got.State != arbiter.StateReady {
		t.Fatalf("machine a up again with free slots: s2 %s (%s), want ready", got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
}

// TestWaitingSlotWhyFollowsItsBacking: a slot waiting for its backing shows
// the backing's why_queued as it is now (here: its machine drained).
func TestWaitingSlotWhyFollowsItsBacking(t *testing.T) {
	e := poolEngine(t, smallPool(1, 60, 0, 0), host("a", 1))
	slot(t, e, t0)
	s2 := slot(t, e, t0)
	if _, err := e.Apply(arbiter.SetDraining{Name: "a", Draining: true}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	e.Flush()
	b, _ := e.Allocation(*s2.Backing)
	got, _ := e.Allocation(s2.ID)
	want := fmt.Sprintf("waiting for backing allocation %d of pool small: %s", b.ID, arbiter.StrOr(b.WhyQueued, ""))
	if arbiter.StrOr(got.WhyQueued, "") != want {
		t.Fatalf("slot why_queued\n %q\nwant its backing's\n %q", arbiter.StrOr(got.WhyQueued, ""), want)
	}
}

// TestReloadRaisingSlotsServesWaitingSlotFirst: a slot waits for a second
// backing (no GPU free); a reload raises the pool's slots, so the granted
// backing has a free slot: the waiting slot takes it, before a later
// request.
func TestReloadRaisingSlotsServesWaitingSlotFirst(t *testing.T) {
	e := poolEngine(t, smallPool(1, 60, 0, 0), host("a", 1))
	s1 := slot(t, e, t0)
	s2 := slot(t, e, t0)
	if s1.State != arbiter.StateReady || s2.State != arbiter.StateQueued {
		t.Fatalf("setup: s1 %s, s2 %s", s1.State, s2.State)
	}
	if _, err := e.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{smallPool(2, 60, 0, 0)}}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	s3 := slot(t, e, t0.Add(2*time.Second))
	got2, _ := e.Allocation(s2.ID)
	if got2.State != arbiter.StateReady {
		t.Fatalf("after reload to slots=2: waiting s2 is %s (%s) while later s3 is %s on backing %d slot %d",
			got2.State, arbiter.StrOr(got2.WhyQueued, ""), s3.State, *s3.Backing, *s3.Slot)
	}
}

// TestBackingKeepsConfiguredPriority: a backing's configured priority
// (docs/reference/pools.md §1) is its floor, whatever its slot asked.
func TestBackingKeepsConfiguredPriority(t *testing.T) {
	p := smallPool(2, 60, 0, 0)
	p.Backing.Priority = 10
	e := poolEngine(t, p, host("a", 1))
	hog := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	other := alloc1(t, e, t0, arbiter.Request{GPUs: 1, Priority: 5})
	s := slot(t, e, t0)
	b, _ := e.Allocation(*s.Backing)
	if b.Priority != 10 {
		t.Errorf("backing priority %d, want the configured 10", b.Priority)
	}
	e.Apply(arbiter.Release{ID: hog.ID}, t0.Add(time.Second))
	if got, _ := e.Allocation(s.ID); got.State != arbiter.StateReady {
		o, _ := e.Allocation(other.ID)
		t.Fatalf("GPU freed: slot %s, priority-5 request %s; the priority-10 backing should have gone first", got.State, o.State)
	}
}

// TestRestartKeepsGraceDeadline: a backing emptied at t0 with a 60 s grace
// time is due back at t0+60s, a restart at t0+30s notwithstanding: a server
// restarted more often than the grace time would otherwise never give an
// empty backing back.
func TestRestartKeepsGraceDeadline(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
	s := slot(t, e, t0)
	e.Apply(arbiter.Release{ID: s.ID}, t0)
	st := &arbiter.State{Machines: e.Machines(), Allocations: e.Allocations(), NextAllocationID: e.nextID, NextEventSeq: e.nextSeq}
	at := t0.Add(30 * time.Second)
	e2 := New(Config{}, st, at)
	if _, err := e2.Apply(arbiter.SyncPools{Pools: []arbiter.Pool{smallPool(2, 60, 0, 0)}}, at); err != nil {
		t.Fatal(err)
	}
	e2.Apply(arbiter.Tick{}, t0.Add(61*time.Second))
	if b, _ := e2.Allocation(*s.Backing); b.State != arbiter.StateDestroyed {
		t.Fatalf("backing empty since t0 with grace 60 s is %s at t0+61s after a restart at t0+30s (release_at %v)",
			b.State, e2.poolStatus("small").Backings[0].ReleaseAt)
	}
}

// A slot asked for at a higher priority than its queued backing's brings
// the backing up with it: the backing waits for that slot too.
func TestSlotRaisesItsQueuedBackingsPriority(t *testing.T) {
	e := poolEngine(t, smallPool(2, 60, 0, 0), host("a", 1))
	hog := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	s1 := slot(t, e, t0)
	other := alloc1(t, e, t0, arbiter.Request{GPUs: 1, Priority: 5})
	s2 := alloc1(t, e, t0, arbiter.Request{Owner: "nb", Pool: "small", Priority: 10})
	if *s2.Backing != *s1.Backing {
		t.Fatalf("s2 on backing %d, s1 on %d", *s2.Backing, *s1.Backing)
	}
	if b, _ := e.Allocation(*s1.Backing); b.Priority != 10 {
		t.Fatalf("backing priority %d, want 10", b.Priority)
	}
	e.Apply(arbiter.Release{ID: hog.ID}, t0.Add(time.Second))
	if got, _ := e.Allocation(s1.ID); got.State != arbiter.StateReady {
		o, _ := e.Allocation(other.ID)
		t.Fatalf("GPU freed: slot %s, priority-5 request %s", got.State, o.State)
	}
}

package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func gpus(n int, model string, vram float64, compute string) []arbiter.GPU {
	out := make([]arbiter.GPU, n)
	for i := range out {
		out[i] = arbiter.GPU{Index: i, UUID: "GPU-" + model + "-" + string(rune('a'+i)), Model: model, VRAMGiB: vram, Compute: compute, Healthy: true}
	}
	return out
}

func host(name string, n int) arbiter.Machine {
	return arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{"default"},
		GPUs: gpus(n, "NVIDIA H100 80GB HBM3", 80, "9.0")}
}

// newEngine returns an engine with the given configured machines.
func newEngine(t *testing.T, cfg Config, ms ...arbiter.Machine) *Engine {
	t.Helper()
	e := New(cfg, &arbiter.State{}, t0)
	if _, err := e.Apply(arbiter.SyncConfigMachines{Machines: ms}, t0); err != nil {
		t.Fatal(err)
	}
	e.Flush()
	return e
}

func ka(s float64) *float64 { return &s }

func alloc1(t *testing.T, e *Engine, now time.Time, r arbiter.Request) arbiter.Allocation {
	t.Helper()
	if r.Owner == "" {
		r.Owner = "alice"
	}
	res, err := e.Apply(arbiter.Allocate{Request: r}, now)
	if err != nil {
		t.Fatalf("allocate %+v: %v", r, err)
	}
	return res.(arbiter.Allocation)
}

func TestAllocateGrantsAndBinPacks(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8), host("b", 8))
	x := alloc1(t, e, t0, arbiter.Request{GPUs: 3})
	if x.State != arbiter.StateReady || *x.Machine != "a" || len(x.Devices) != 3 {
		t.Fatalf("got %+v, want ready on a with 3 GPUs", x)
	}
	// a has 5 free, b has 8: the next 2-GPU request goes to a (least stranded).
	y := alloc1(t, e, t0, arbiter.Request{GPUs: 2})
	if *y.Machine != "a" {
		t.Fatalf("got machine %s, want a", *y.Machine)
	}
	// 6 GPUs no longer fit on a (3 free): b.
	z := alloc1(t, e, t0, arbiter.Request{GPUs: 6})
	if *z.Machine != "b" {
		t.Fatalf("got machine %s, want b", *z.Machine)
	}
	for _, d := range y.Devices {
		for _, d2 := range x.Devices {
			if d.Index == d2.Index {
				t.Fatalf("GPU %d given twice", d.Index)
			}
		}
	}
}

func TestImpossibleIsDestroyedWithReason(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8))
	cases := []struct {
		name string
		r    arbiter.Request
		want string
	}{
		{"count", arbiter.Request{GPUs: 9}, "no machine has 9 GPUs"},
		{"vram", arbiter.Request{GPUs: 1, MinVRAMGiB: 100}, "100 GiB"},
		{"compute", arbiter.Request{GPUs: 1, MinCompute: "10.0"}, "compute capability 10.0"},
		{"model", arbiter.Request{GPUs: 1, Model: "*A100*"}, `"*A100*"`},
		{"tags", arbiter.Request{GPUs: 1, Tags: []string{"fast"}}, "tags [fast]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := alloc1(t, e, t0, c.r)
			if a.State != arbiter.StateDestroyed || a.Reason == nil || !strings.Contains(*a.Reason, c.want) {
				t.Fatalf("got state %s reason %v, want destroyed mentioning %q", a.State, arbiter.StrOr(a.Reason, ""), c.want)
			}
		})
	}
}

func TestUnknownMachineIsInvalid(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8))
	before := e.nextID
	_, err := e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "x", GPUs: 1, Machine: "nope"}}, t0)
	if arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("got %v, want invalid", err)
	}
	if e.nextID != before || len(e.Flush().Events) != 0 {
		t.Fatal("a failed command changed state")
	}
}

func TestQueueOrderAndBackfill(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 4))
	big := alloc1(t, e, t0, arbiter.Request{GPUs: 3})
	head := alloc1(t, e, t0, arbiter.Request{GPUs: 4}) // waits for all 4
	if head.State != arbiter.StateQueued || head.WhyQueued == nil {
		t.Fatalf("got %+v, want queued with why", head)
	}
	// Backfill: one GPU is free and the head cannot use it.
	small := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	if small.State != arbiter.StateReady {
		t.Fatalf("got %s, want backfilled ready", small.State)
	}
	// Priority: a later, higher-priority request goes ahead of the head.
	vip := alloc1(t, e, t0, arbiter.Request{GPUs: 2, Priority: 10})
	if vip.State != arbiter.StateQueued {
		t.Fatalf("vip got %s, want queued", vip.State)
	}
	if _, err := e.Apply(arbiter.Release{ID: big.ID}, t0); err != nil {
		t.Fatal(err)
	}
	v, _ := e.Allocation(vip.ID)
	h, _ := e.Allocation(head.ID)
	if v.State != arbiter.StateReady || h.State != arbiter.StateQueued {
		t.Fatalf("after release: vip %s head %s, want ready, queued", v.State, h.State)
	}
}

func TestStarvationHoldsFreedGPUs(t *testing.T) {
	e := newEngine(t, Config{Starvation: time.Minute}, host("a", 4))
	x := alloc1(t, e, t0, arbiter.Request{GPUs: 2})
	y := alloc1(t, e, t0, arbiter.Request{GPUs: 2})
	head := alloc1(t, e, t0, arbiter.Request{GPUs: 4})
	// Before the limit, a freed GPU pair is backfilled.
	e.Apply(arbiter.Release{ID: x.ID}, t0.Add(time.Second))
	z := alloc1(t, e, t0.Add(2*time.Second), arbiter.Request{GPUs: 2})
	if z.State != arbiter.StateReady {
		t.Fatalf("before the limit: got %s, want ready (backfill)", z.State)
	}
	// After the limit, freed GPUs are held for the head.
	late := t0.Add(2 * time.Minute)
	e.Apply(arbiter.Release{ID: y.ID}, late)
	w := alloc1(t, e, late, arbiter.Request{GPUs: 1})
	if w.State != arbiter.StateQueued || !strings.Contains(*w.WhyQueued, "held for allocation") {
		t.Fatalf("after the limit: got %s (%v), want queued behind the head", w.State, arbiter.StrOr(w.WhyQueued, ""))
	}
	e.Apply(arbiter.Release{ID: z.ID}, late)
	h, _ := e.Allocation(head.ID)
	if h.State != arbiter.StateReady {
		t.Fatalf("head got %s, want ready", h.State)
	}
}

func TestKeepaliveExpiry(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 1))
	a := alloc1(t, e, t0, arbiter.Request{GPUs: 1, KeepaliveS: ka(10)})
	forever := alloc1(t, e, t0, arbiter.Request{GPUs: 1, KeepaliveS: nil})
	if got := e.NextDeadline(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("next deadline %v, want t0+10s", got)
	}
	// A refresh moves the deadline, in memory only.
	e.Flush()
	if _, err := e.Apply(arbiter.Keepalive{ID: a.ID}, t0.Add(8*time.Second)); err != nil {
		t.Fatal(err)
	}
	if c := e.Flush(); c.Durable() || len(c.TouchedAllocations) != 1 {
		t.Fatalf("keepalive: durable=%v touched=%d, want a memory-only change", c.Durable(), len(c.TouchedAllocations))
	}
	e.Apply(arbiter.Tick{}, t0.Add(17*time.Second))
	if got, _ := e.Allocation(a.ID); got.State != arbiter.StateReady {
		t.Fatalf("expired early: %s", got.State)
	}
	e.Apply(arbiter.Tick{}, t0.Add(18*time.Second))
	got, _ := e.Allocation(a.ID)
	if got.State != arbiter.StateDestroyed || *got.Reason != "keepalive expired" {
		t.Fatalf("got %s %v, want destroyed: keepalive expired", got.State, arbiter.StrOr(got.Reason, ""))
	}
	// The queued null-keepalive request gets the freed GPU and never expires.
	f, _ := e.Allocation(forever.ID)
	if f.State != arbiter.StateReady || !e.NextDeadline().IsZero() {
		t.Fatalf("got %s deadline %v, want ready with no deadline", f.State, e.NextDeadline())
	}
	if _, err := e.Apply(arbiter.Keepalive{ID: a.ID}, t0.Add(20*time.Second)); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("keepalive of destroyed: got %v, want conflict", err)
	}
}

func TestHistoryIsBounded(t *testing.T) {
	e := newEngine(t, Config{History: 3}, host("a", 1))
	var removed []int64
	for i := 0; i < 6; i++ {
		a := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
		e.Apply(arbiter.Release{ID: a.ID}, t0)
		removed = append(removed, e.Flush().RemovedAllocations...)
	}
	if len(e.retired) != 3 || len(removed) != 3 || removed[0] != 1 {
		t.Fatalf("retired %d removed %v, want 3 kept and ids 1..3 removed", len(e.retired), removed)
	}
}

func TestReleasePermissions(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 1))
	res, _ := e.Apply(arbiter.Allocate{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, Request: arbiter.Request{Owner: "alice", GPUs: 1}}, t0)
	id := res.(arbiter.Allocation).ID
	_, err := e.Apply(arbiter.Release{Caller: arbiter.Caller{Name: "bob", Role: arbiter.RoleUser}, ID: id}, t0)
	if arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob: got %v, want forbidden", err)
	}
	if _, err := e.Apply(arbiter.Release{Caller: arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}, ID: id}, t0); err != nil {
		t.Fatalf("admin: %v", err)
	}
	if _, err := e.Apply(arbiter.Release{ID: 999}, t0); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("unknown id: got %v, want not_found", err)
	}
}

func TestAgentMachineGoesDownAndUp(t *testing.T) {
	e := newEngine(t, Config{HeartbeatTimeout: 30 * time.Second})
	m := host("w1", 2)
	m.Source = arbiter.SourceAgent
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: m}, t0); err != nil {
		t.Fatal(err)
	}
	a := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	e.Apply(arbiter.Tick{}, t0.Add(31*time.Second))
	if e.byName["w1"].m.State() != arbiter.MachineDown {
		t.Fatalf("got %s, want down", e.byName["w1"].m.State())
	}
	// What it holds stays; nothing new is placed.
	if got, _ := e.Allocation(a.ID); got.State != arbiter.StateReady {
		t.Fatalf("allocation on a down machine: %s, want still ready", got.State)
	}
	q := alloc1(t, e, t0.Add(32*time.Second), arbiter.Request{GPUs: 1})
	if q.State != arbiter.StateQueued || !strings.Contains(*q.WhyQueued, "down or draining") {
		t.Fatalf("got %s %v, want queued: down", q.State, arbiter.StrOr(q.WhyQueued, ""))
	}
	if _, err := e.Apply(arbiter.Heartbeat{Name: "w1"}, t0.Add(33*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Allocation(q.ID); got.State != arbiter.StateReady {
		t.Fatalf("after heartbeat: %s, want ready", got.State)
	}
	if _, err := e.Apply(arbiter.Heartbeat{Name: "ghost"}, t0); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("unknown heartbeat: got %v, want not_found", err)
	}
	cfg := host("w1", 2)
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: func() arbiter.Machine { m := cfg; m.Source = arbiter.SourceAgent; return m }()}, t0); err != nil {
		t.Fatalf("re-register: %v", err)
	}
}

func TestDrain(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 2))
	e.Apply(arbiter.SetDraining{Name: "a", Draining: true}, t0)
	q := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	if q.State != arbiter.StateQueued {
		t.Fatalf("got %s, want queued while draining", q.State)
	}
	e.Apply(arbiter.SetDraining{Name: "a", Draining: false}, t0)
	if got, _ := e.Allocation(q.ID); got.State != arbiter.StateReady {
		t.Fatalf("got %s, want ready after undrain", got.State)
	}
}

func TestRestartRestoresAndRepairs(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 2), host("b", 2))
	x := alloc1(t, e, t0, arbiter.Request{GPUs: 2, KeepaliveS: ka(60)})
	y := alloc1(t, e, t0, arbiter.Request{GPUs: 2, Machine: "b"})
	q := alloc1(t, e, t0, arbiter.Request{GPUs: 2})
	st := &arbiter.State{Machines: e.Machines(), Allocations: e.Allocations(), NextAllocationID: e.nextID, NextEventSeq: e.nextSeq}
	// Machine b is gone after the restart.
	st.Machines = st.Machines[:1]
	later := t0.Add(time.Hour)
	e2 := New(Config{}, st, later)
	gx, _ := e2.Allocation(x.ID)
	if gx.State != arbiter.StateReady || !gx.ExpiresAt.Equal(later.Add(time.Minute)) {
		t.Fatalf("x: %s expires %v, want ready with a fresh keepalive", gx.State, gx.ExpiresAt)
	}
	if gy, _ := e2.Allocation(y.ID); gy.State != arbiter.StateDestroyed {
		t.Fatalf("y on a vanished machine: %s, want destroyed", gy.State)
	}
	if gq, _ := e2.Allocation(q.ID); gq.State != arbiter.StateQueued {
		t.Fatalf("q: %s, want queued", gq.State)
	}
	if c := e2.Flush(); len(c.Allocations) == 0 {
		t.Fatal("repairs are not in the first flush")
	}
	n := alloc1(t, e2, later, arbiter.Request{GPUs: 1, Machine: "a"})
	if n.ID != q.ID+1 {
		t.Fatalf("next id %d, want %d", n.ID, q.ID+1)
	}
}

// TestAgentTakesOverLocalMachine: the server registers its own host (source
// local); an agent on that host registering the same name takes it over,
// allocations and all, and a reload of the configuration leaves it the
// agent's. A machine declared in the configuration is not taken over.
func TestAgentTakesOverLocalMachine(t *testing.T) {
	local := host("box", 2)
	local.Source = arbiter.SourceLocal
	e := newEngine(t, Config{}, local, host("declared", 2))
	held := alloc1(t, e, t0, arbiter.Request{GPUs: 1, Machine: "box"})

	agentM := host("box", 2)
	agentM.Source = arbiter.SourceAgent
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentM}, t0); err != nil {
		t.Fatalf("an agent on the server's own host: %v", err)
	}
	if m := e.byName["box"].m; m.Source != arbiter.SourceAgent {
		t.Fatalf("box is %s after the agent registered, want agent", m.Source)
	}
	if a, _ := e.Allocation(held.ID); a.State != arbiter.StateReady {
		t.Fatalf("the allocation on box is %s after the takeover, want ready", a.State)
	}
	// The next reload declares the local host again: the agent keeps it.
	if _, err := e.Apply(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{local, host("declared", 2)}}, t0); err != nil {
		t.Fatal(err)
	}
	if m := e.byName["box"].m; m.Source != arbiter.SourceAgent {
		t.Fatalf("box is %s after a reload, want still the agent's", m.Source)
	}

	other := host("declared", 2)
	other.Source = arbiter.SourceAgent
	_, err := e.Apply(arbiter.RegisterMachine{Machine: other}, t0)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("an agent naming a configured machine: %v, want a conflict saying to use another --name", err)
	}
}

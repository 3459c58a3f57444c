package engine

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// gtEnv drives an engine with an agent machine "w" (4 GPUs) and a declared
// machine "c" (2 GPUs) over a fake clock, saving each batch to a memStore
// and counting the batches that needed a store write.
type gtEnv struct {
	t      *testing.T
	e      *Engine
	now    time.Time
	st     *memStore
	writes int
	events []arbiter.Event
	cfg    Config
}

func newGTEnv(t *testing.T, mod func(p *arbiter.GPUPolicy)) *gtEnv {
	t.Helper()
	g := &gtEnv{t: t, now: t0, st: newMemStore(), cfg: Config{HeartbeatTimeout: 1000 * time.Hour}}
	g.e = New(g.cfg, &arbiter.State{NextAllocationID: 1, NextEventSeq: 1}, t0)
	w := host("w", 4)
	w.Source = arbiter.SourceAgent
	g.must(g.do(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{host("c", 2)}}))
	g.must(g.do(arbiter.RegisterMachine{Machine: w}))
	p := arbiter.DefaultGPUPolicy()
	if mod != nil {
		mod(&p)
	}
	g.must(g.do(arbiter.SetGPUPolicy{Policy: p}))
	return g
}

func (g *gtEnv) must(_ any, err error) {
	g.t.Helper()
	if err != nil {
		g.t.Fatal(err)
	}
}

func (g *gtEnv) do(cmd arbiter.Command) (any, error) {
	res, err := g.e.Apply(cmd, g.now)
	g.flush()
	return res, err
}

func (g *gtEnv) flush() {
	c := g.e.Flush()
	if c.Durable() {
		g.writes++
	}
	g.events = append(g.events, c.Events...)
	g.st.save(c)
}

func (g *gtEnv) advance(d time.Duration) {
	g.now = g.now.Add(d)
	g.must(g.do(arbiter.Tick{}))
}

// report sends a report sampled after everything the engine said so far.
func (g *gtEnv) report(full bool, rs ...arbiter.GPUReading) arbiter.GPUOrders {
	g.t.Helper()
	return g.reportSeen(g.e.LastSeq(), full, rs...)
}

func (g *gtEnv) reportSeen(seen int64, full bool, rs ...arbiter.GPUReading) arbiter.GPUOrders {
	g.t.Helper()
	res, err := g.do(arbiter.ReportGPUs{Machine: "w", Report: arbiter.GPUReport{SeenSeq: seen, Full: full, SampledAt: g.now, GPUs: rs}})
	if err != nil {
		g.t.Fatalf("report: %v", err)
	}
	return res.(arbiter.GPUOrders)
}

func (g *gtEnv) alloc(r arbiter.Request) arbiter.Allocation {
	g.t.Helper()
	if r.Owner == "" {
		r.Owner = "alice"
	}
	if r.Machine == "" && r.Pool == "" {
		r.Machine = "w"
	}
	res, err := g.do(arbiter.Allocate{Request: r})
	if err != nil {
		g.t.Fatal(err)
	}
	return res.(arbiter.Allocation)
}

func (g *gtEnv) get(id int64) arbiter.Allocation {
	a, ok := g.e.Allocation(id)
	if !ok {
		g.t.Fatalf("allocation %d is not known", id)
	}
	return a
}

// state is GPU idx of w as the read view shows it.
func (g *gtEnv) state(idx int) string {
	gm := g.e.gt.ms["w"]
	mc := g.e.byName["w"]
	var gg *gtGPU
	if gm != nil {
		gg = gm.gpus[idx]
	}
	switch {
	case gg != nil && gg.unhealthy != nil:
		return arbiter.GPUUnhealthy
	case gg != nil && gg.drained != nil:
		return arbiter.GPUDrained
	case gg != nil && gg.releasing != nil:
		return arbiter.GPUReleasing
	case mc.held[gpuPos(&mc.m, idx)] > 0:
		return arbiter.GPUHeld
	case mc.held[gpuPos(&mc.m, idx)] == heldBlocked:
		return "blocked"
	}
	return arbiter.GPUFree
}

func (g *gtEnv) eventsOf(kind string) []arbiter.Event {
	var out []arbiter.Event
	for _, ev := range g.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func pct(v int) *int { return &v }

func reading(idx, util int, procs ...arbiter.GPUProcess) arbiter.GPUReading {
	if procs == nil {
		procs = []arbiter.GPUProcess{}
	}
	return arbiter.GPUReading{Index: idx, UtilPct: pct(util), MemUsedMiB: 1000, MemTotalMiB: 81559, Processes: procs}
}

func proc(pid int, alloc int64) arbiter.GPUProcess {
	p := arbiter.GPUProcess{PID: pid, User: "alice", MemMiB: 900, Command: "python train.py"}
	if alloc != 0 {
		p.Allocation = &alloc
	}
	return p
}

func idle4() []arbiter.GPUReading {
	return []arbiter.GPUReading{reading(0, 0), reading(1, 0), reading(2, 0), reading(3, 0)}
}

func TestCleanHandoff(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 4})
	g.report(false, reading(1, 90, proc(4242, a.ID)))
	g.must(g.do(arbiter.Release{ID: a.ID, Caller: arbiter.Caller{Role: arbiter.RoleAdmin}}))
	for i := 0; i < 4; i++ {
		if s := g.state(i); s != arbiter.GPUReleasing {
			t.Fatalf("GPU %d after release: %s, want releasing", i, s)
		}
	}
	b := g.alloc(arbiter.Request{GPUs: 1})
	if b.State != arbiter.StateQueued {
		t.Fatalf("a request while the GPUs are releasing: %s, want queued", b.State)
	}
	rel := g.eventsOf(arbiter.EventGPUReleasing)
	var re arbiter.GPUReleasingEvent
	if len(rel) != 1 || !strings.HasPrefix(rel[0].Subject, "machine/w") || json.Unmarshal(rel[0].Data, &re) != nil || re.Reason != "released" {
		t.Fatalf("gpu.releasing events: %+v (%+v), want one giving the release's reason", rel, re)
	}
	// The orders: the allocation ended, its process is to be stopped.
	o := g.e.gt.ms["w"].orders
	if len(o.Ended) != 1 || o.Ended[0] != a.ID || len(o.Kill) != 1 || o.Kill[0].PID != 4242 || o.Kill[0].GraceS != 10 {
		t.Fatalf("orders after the release: %+v", o)
	}
	if k := g.eventsOf(arbiter.EventGPUKill); len(k) != 1 {
		t.Fatalf("gpu.kill events: %d, want 1", len(k))
	}
	// A sample taken before the agent learnt of the end frees nothing,
	// even one without the process.
	g.reportSeen(rel[0].Seq-1, true, idle4()...)
	if s := g.state(0); s != arbiter.GPUReleasing {
		t.Fatalf("an old sample freed GPU 0: %s", s)
	}
	// A later sample with the process still there frees the other GPUs only.
	g.report(false, reading(1, 90, proc(4242, a.ID)))
	if s0, s1 := g.state(0), g.state(1); s0 != arbiter.GPUHeld || s1 != arbiter.GPUReleasing {
		t.Fatalf("GPU 0 %s, GPU 1 %s; want held (by the queued request) and releasing", s0, s1)
	}
	if got := g.get(b.ID); got.State != arbiter.StateReady || got.Devices[0].Index != 0 {
		t.Fatalf("b after GPU 0 was freed: %+v", got)
	}
	// The process is gone: GPU 1 is freed, saying it was killed.
	g.report(false, reading(1, 0))
	if s := g.state(1); s != arbiter.GPUFree {
		t.Fatalf("GPU 1 after its process left: %s", s)
	}
	evs := g.eventsOf(arbiter.EventGPUReleased)
	var last arbiter.GPUReleasedEvent
	json.Unmarshal(evs[len(evs)-1].Data, &last)
	if len(evs) != 2 || !last.Killed || last.How != "clean" || last.GPUs[0] != 1 || last.Allocation != a.ID {
		t.Fatalf("gpu.released: %d events, last %+v", len(evs), last)
	}
	if o := g.e.gt.ms["w"].orders; len(o.Ended) != 0 || len(o.Kill) != 0 {
		t.Fatalf("orders once clean: %+v", o)
	}
}

func TestDeclaredMachineFreesAtOnce(t *testing.T) {
	g := newGTEnv(t, nil)
	a := g.alloc(arbiter.Request{GPUs: 2, Machine: "c"})
	b := g.alloc(arbiter.Request{GPUs: 2, Machine: "c"})
	g.must(g.do(arbiter.Release{ID: a.ID}))
	if got := g.get(b.ID); got.State != arbiter.StateReady {
		t.Fatalf("on a machine with no agent the GPUs go at once: %s", got.State)
	}
	if len(g.eventsOf(arbiter.EventGPUReleasing)) != 0 {
		t.Fatal("a declared machine's GPUs went releasing")
	}
	// The agent machine is not observed before its first report either.
	x := g.alloc(arbiter.Request{GPUs: 4})
	g.must(g.do(arbiter.Release{ID: x.ID}))
	if s := g.state(0); s != arbiter.GPUFree {
		t.Fatalf("an agent machine that never reported: %s, want free", s)
	}
}

func TestSilentAgentReleasingTimeout(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.ReleasingTimeoutS = 300 })
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.advance(10 * time.Second)
	g.must(g.do(arbiter.Release{ID: a.ID}))
	g.advance(299 * time.Second)
	if s := g.state(0); s != arbiter.GPUReleasing {
		t.Fatalf("before the timeout: %s", s)
	}
	g.advance(time.Second)
	if s := g.state(0); s != arbiter.GPUFree {
		t.Fatalf("after the timeout: %s", s)
	}
	var ev arbiter.GPUReleasedEvent
	evs := g.eventsOf(arbiter.EventGPUReleased)
	json.Unmarshal(evs[0].Data, &ev)
	if ev.How != "timeout" || ev.AfterS != 300 {
		t.Fatalf("gpu.released: %+v", ev)
	}
}

func TestReleasingWaitsForALiveAgent(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.Enforce = arbiter.EnforceWait; p.ReleasingTimeoutS = 60 })
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.report(false, reading(0, 50, proc(7, a.ID)))
	g.must(g.do(arbiter.Release{ID: a.ID}))
	if o := g.e.gt.ms["w"].orders; len(o.Ended) != 0 || len(o.Kill) != 0 {
		t.Fatalf("enforce=wait gave orders: %+v", o)
	}
	// The agent keeps reporting the process: no timeout while it speaks.
	for i := 0; i < 10; i++ {
		g.advance(30 * time.Second)
		g.report(false)
	}
	if s := g.state(0); s != arbiter.GPUReleasing {
		t.Fatalf("with the process still running: %s", s)
	}
	// An admin frees it.
	g.must(g.do(arbiter.FreeGPU{Machine: "w", Index: 0, By: "root"}))
	if s := g.state(0); s == arbiter.GPUReleasing {
		t.Fatal("the admin's free left it releasing")
	}
	// Still, its leftover process now makes the GPU unmanaged: nothing new.
	if s := g.state(0); s != "blocked" {
		t.Fatalf("a free GPU with a leftover process: %s, want blocked", s)
	}
}

func TestUnmanagedProcess(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.Unmanaged = arbiter.UnmanagedKill; p.UnmanagedGraceS = 60 })
	g.report(true, idle4()...)
	o := g.report(false, reading(2, 99, arbiter.GPUProcess{PID: 99, User: "mallory", MemMiB: 4000, Command: "python mine.py"}))
	if s := g.state(2); s != "blocked" {
		t.Fatalf("a GPU with an unmanaged process: %s, want blocked", s)
	}
	ev := g.eventsOf(arbiter.EventGPUUnmanaged)
	var um arbiter.GPUUnmanagedEvent
	json.Unmarshal(ev[0].Data, &um)
	if len(ev) != 1 || um.PID != 99 || um.User != "mallory" || um.GPU != 2 || um.MemMiB != 4000 || um.Action != "kill" {
		t.Fatalf("gpu.unmanaged: %+v", um)
	}
	if len(o.Kill) != 0 {
		t.Fatalf("killed before the grace: %+v", o.Kill)
	}
	// Nothing new is placed on it: 3 GPUs fit, 4 do not.
	if a := g.alloc(arbiter.Request{GPUs: 4}); a.State != arbiter.StateQueued {
		t.Fatalf("4 GPUs with one unmanaged: %s", a.State)
	}
	g.advance(59 * time.Second)
	if len(g.e.gt.ms["w"].orders.Kill) != 0 {
		t.Fatal("killed before the grace")
	}
	g.advance(time.Second)
	if k := g.e.gt.ms["w"].orders.Kill; len(k) != 1 || k[0].PID != 99 || k[0].Allocation != nil {
		t.Fatalf("kill order after the grace: %+v", k)
	}
	if len(g.eventsOf(arbiter.EventGPUKill)) != 1 || len(g.eventsOf(arbiter.EventGPUUnmanaged)) != 1 {
		t.Fatal("want one gpu.kill and still one gpu.unmanaged")
	}
	// The process is gone: the queued request gets its GPUs.
	g.report(false, reading(2, 0))
	if s := g.state(2); s != arbiter.GPUHeld {
		t.Fatalf("GPU 2 once the process left: %s, want held by the queued request", s)
	}
}

func TestForeignAndLegitimateProcesses(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1}) // GPU 0
	b := g.alloc(arbiter.Request{GPUs: 1}) // GPU 1
	// a's process on its GPU, an unattributed one on a held GPU: fine.
	// b's process on a's GPU: foreign. A made-up allocation: unmanaged.
	g.report(false, reading(0, 50, proc(10, a.ID), proc(11, 0), proc(12, b.ID)), reading(3, 50, proc(13, 999)))
	um := g.eventsOf(arbiter.EventGPUUnmanaged)
	if len(um) != 2 {
		t.Fatalf("unmanaged events: %d, want 2 (pid 12 foreign, 13 made up)", len(um))
	}
	for _, ev := range um {
		var d arbiter.GPUUnmanagedEvent
		json.Unmarshal(ev.Data, &d)
		if d.PID != 12 && d.PID != 13 {
			t.Errorf("pid %d flagged", d.PID)
		}
	}
	if g.state(0) != arbiter.GPUHeld || g.state(3) != "blocked" {
		t.Fatalf("GPU 0 %s (held), GPU 3 %s (blocked)", g.state(0), g.state(3))
	}
}

func TestPoolSlotProcessesBelongToTheBacking(t *testing.T) {
	g := newGTEnv(t, nil)
	g.must(g.do(arbiter.SyncPools{Pools: []arbiter.Pool{{Name: "nb", Backing: arbiter.Request{GPUs: 1, Machine: "w"}, Slots: 2, GraceTimeS: 60}}}))
	g.report(true, idle4()...)
	s := g.alloc(arbiter.Request{Pool: "nb", Owner: "bob"})
	if s.State != arbiter.StateReady {
		t.Fatalf("slot: %s", s.State)
	}
	idx := s.Devices[0].Index
	g.report(false, reading(idx, 50, proc(20, s.ID)))
	if n := len(g.eventsOf(arbiter.EventGPUUnmanaged)); n != 0 {
		t.Fatalf("a slot's process on its backing's GPU was flagged (%d events)", n)
	}
	// The slot ends: its process must go, although the backing lives on.
	g.must(g.do(arbiter.Release{ID: s.ID}))
	if k := g.e.gt.ms["w"].orders.Kill; len(k) != 1 || k[0].PID != 20 {
		t.Fatalf("orders after the slot ended: %+v", k)
	}
}

func TestHealth(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.HealthyAfterS = 600 })
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1}) // GPU 0
	// A non-critical XID is nothing; XID 79 makes GPU 0 unhealthy.
	r := reading(0, 30)
	r.XIDs = []int{13}
	g.report(false, r)
	if g.state(0) != arbiter.GPUHeld {
		t.Fatalf("XID 13 made GPU 0 %s", g.state(0))
	}
	r.XIDs = []int{79}
	g.report(false, r)
	if g.state(0) != arbiter.GPUUnhealthy {
		t.Fatalf("XID 79: GPU 0 %s", g.state(0))
	}
	ev := g.eventsOf(arbiter.EventGPUUnhealthy)
	var h arbiter.GPUHealthEvent
	json.Unmarshal(ev[0].Data, &h)
	if h.Reason != "XID 79: GPU has fallen off the bus" || h.Allocation == nil || *h.Allocation != a.ID {
		t.Fatalf("gpu.unhealthy: %+v", h)
	}
	// Its holder keeps it; once released nothing new goes there.
	g.must(g.do(arbiter.Release{ID: a.ID}))
	g.report(false, reading(0, 0))
	if b := g.alloc(arbiter.Request{GPUs: 4}); b.State != arbiter.StateQueued {
		t.Fatalf("4 GPUs with one unhealthy: %s", b.State)
	}
	// ECC: a rise makes GPU 1 unhealthy; the same count again does not
	// make it so once more.
	ecc := int64(0)
	r1 := reading(1, 0)
	r1.ECCUncorrected = &ecc
	g.report(false, r1)
	ecc2 := int64(2)
	r1.ECCUncorrected = &ecc2
	g.report(false, r1)
	if g.state(1) != arbiter.GPUUnhealthy {
		t.Fatalf("ECC rise: %s", g.state(1))
	}
	// A GPU missing from a full report: GPU 3 vanished.
	g.report(true, reading(0, 0), reading(1, 0), reading(2, 0))
	if g.state(3) != arbiter.GPUUnhealthy || !g.e.gt.ms["w"].gpus[3].missing {
		t.Fatalf("missing GPU 3: %s", g.state(3))
	}
	// 600 s without a new error: GPU 0 comes back. GPU 3, still missing in
	// every report, does not.
	for i := 0; i < 10; i++ {
		g.advance(61 * time.Second)
		g.report(false, arbiter.GPUReading{Index: 3, Missing: true})
	}
	if g.state(0) == arbiter.GPUUnhealthy || g.state(3) != arbiter.GPUUnhealthy {
		t.Fatalf("after 610 s: GPU 0 %s, GPU 3 %s", g.state(0), g.state(3))
	}
	if n := len(g.eventsOf(arbiter.EventGPUHealthy)); n != 2 {
		t.Fatalf("gpu.healthy events: %d, want 2 (GPUs 0 and 1)", n)
	}
	// An admin declares GPU 3 well.
	g.must(g.do(arbiter.FreeGPU{Machine: "w", Index: 3}))
	if g.state(3) == arbiter.GPUUnhealthy {
		t.Fatal("admin free left GPU 3 unhealthy")
	}
	// After a restart the same ECC count is the old error, not a new one.
	e2 := New(g.cfg, g.st.state(), g.now)
	if _, err := e2.Apply(arbiter.SetGPUPolicy{Policy: g.e.gt.policy}, g.now); err != nil {
		t.Fatal(err)
	}
	g.e = e2
	g.flush()
	g.report(true, reading(0, 0), r1, reading(2, 0), reading(3, 0))
	if g.state(1) == arbiter.GPUUnhealthy {
		t.Fatal("after a restart, the ECC count GPU 1 had before made it unhealthy again")
	}
}

func TestDrainOneGPU(t *testing.T) {
	g := newGTEnv(t, nil)
	g.must(g.do(arbiter.SetGPUDrained{Machine: "c", Index: 1, Drained: true, Reason: "fan noise", By: "ops"}))
	if a := g.alloc(arbiter.Request{GPUs: 2, Machine: "c"}); a.State != arbiter.StateQueued {
		t.Fatalf("2 GPUs of c with one drained: %s", a.State)
	}
	if _, err := g.do(arbiter.SetGPUDrained{Machine: "c", Index: 7, Drained: true}); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("drain GPU 7: %v, want not_found", err)
	}
	g.must(g.do(arbiter.SetGPUDrained{Machine: "c", Index: 1, Drained: false}))
	if as := g.e.Allocations(); as[len(as)-1].State != arbiter.StateReady {
		t.Fatalf("after undrain: %s", as[len(as)-1].State)
	}
	if len(g.eventsOf(arbiter.EventGPUDrained)) != 1 || len(g.eventsOf(arbiter.EventGPUUndrained)) != 1 {
		t.Fatal("want one drained and one undrained event")
	}
}

func TestIdleReclaim(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) {
		p.IdleAfterS, p.IdleGraceS, p.IdleAction = 3600, 900, arbiter.IdleRelease
	})
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 2})
	// Busy for ten minutes, then idle.
	g.report(false, reading(0, 80), reading(1, 80))
	g.advance(10 * time.Minute)
	g.report(false, reading(0, 1), reading(1, 2))
	idleAt := g.now
	for i := 0; i < 119; i++ { // an hour minus 30 s of reports every 30 s
		g.advance(30 * time.Second)
		g.report(false)
	}
	if got := g.get(a.ID); got.IdleSince != nil {
		t.Fatalf("idle too early: %v", got.IdleSince)
	}
	g.advance(30 * time.Second)
	g.report(false)
	got := g.get(a.ID)
	if got.IdleSince == nil || !got.IdleSince.Equal(idleAt) || len(g.eventsOf(arbiter.EventAllocationIdle)) != 1 {
		t.Fatalf("after an hour idle: idle_since %v, %d events", got.IdleSince, len(g.eventsOf(arbiter.EventAllocationIdle)))
	}
	// A busy sample makes it active again; an hour of idleness warns again.
	g.report(false, reading(0, 60))
	if got := g.get(a.ID); got.IdleSince != nil {
		t.Fatal("still idle after a busy sample")
	}
	g.report(false, reading(0, 0))
	idleAt = g.now
	for g.get(a.ID).State != arbiter.StateDestroyed && g.now.Sub(idleAt) < 3*time.Hour {
		g.advance(30 * time.Second)
		g.report(false)
	}
	got = g.get(a.ID)
	if got.State != arbiter.StateDestroyed || *got.Reason != "idle: GPUs unused for 1h15m" || g.now.Sub(idleAt) != 75*time.Minute {
		t.Fatalf("reclaimed: %s %q after %s", got.State, arbiter.StrOr(got.Reason, ""), g.now.Sub(idleAt))
	}
}

func TestUnknownIsActive(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.IdleAfterS = 600 })
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.report(false, reading(0, 0))
	// The agent goes silent: its readings go stale, the allocation is not idle.
	g.advance(20 * time.Minute)
	if got := g.get(a.ID); got.IdleSince != nil {
		t.Fatal("idle with no fresh readings")
	}
	// A reading with no utilization ([N/A]) is unknown too.
	r := reading(0, 0)
	r.UtilPct = nil
	g.report(true, r, reading(1, 0), reading(2, 0), reading(3, 0))
	g.advance(20 * time.Minute)
	g.report(false)
	if got := g.get(a.ID); got.IdleSince != nil {
		t.Fatal("idle with an unknown utilization")
	}
	// Declared machines are never idle.
	c := g.alloc(arbiter.Request{GPUs: 1, Machine: "c"})
	g.advance(2 * time.Hour)
	if got := g.get(c.ID); got.IdleSince != nil {
		t.Fatal("a declared machine's allocation went idle")
	}
}

func TestAccounting(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	created := g.now
	blocker := g.alloc(arbiter.Request{GPUs: 4, Owner: "x"})
	a := g.alloc(arbiter.Request{GPUs: 2, Owner: "bob"})
	g.advance(90 * time.Second)
	g.must(g.do(arbiter.Release{ID: blocker.ID}))
	g.report(false) // frees the GPUs: a is granted 90 s after it asked
	if got := g.get(a.ID); got.State != arbiter.StateReady {
		t.Fatalf("a: %s", got.State)
	}
	// 10 minutes busy on both GPUs, 5 minutes idle, reports every 30 s.
	g.report(false, reading(0, 90), reading(1, 90))
	for i := 0; i < 20; i++ {
		g.advance(30 * time.Second)
		g.report(false)
	}
	g.report(false, reading(0, 0), reading(1, 0))
	for i := 0; i < 10; i++ {
		g.advance(30 * time.Second)
		g.report(false)
	}
	g.must(g.do(arbiter.Release{ID: a.ID}))
	got := g.get(a.ID)
	u := got.Usage
	if u == nil || u.GPUS != 2*900 || u.BusyGPUS != 2*600 || u.IdleGPUS != 2*300 || u.WaitS != 90 || u.PeakMemMiB != 2000 {
		t.Fatalf("usage: %+v", u)
	}
	// The day summary agrees; the blocker is counted too.
	day := created.Format(arbiter.DayLayout)
	row := g.e.gt.days[arbiter.UsageDayKey(day, "bob", "w", "NVIDIA H100 80GB HBM3")]
	if row == nil || row.GPUS != 1800 || row.BusyGPUS != 1200 || row.IdleGPUS != 600 || row.Allocations != 1 || row.WaitS != 90 {
		t.Fatalf("bob's day: %+v", row)
	}
	if x := g.e.gt.days[arbiter.UsageDayKey(day, "x", "w", "NVIDIA H100 80GB HBM3")]; x == nil || x.GPUS != 360 {
		t.Fatalf("x's day: %+v", x)
	}
}

func TestAccountingSplitsDays(t *testing.T) {
	g := newGTEnv(t, nil)
	g.now = time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)
	a := g.alloc(arbiter.Request{GPUs: 1, Machine: "c"})
	// Unsaved, the live part is computed by readers.
	live := arbiter.UnsavedUsage(ptr(g.get(a.ID)), g.now.Add(2*time.Hour))
	if len(live) != 2 || live[0].GPUS != 3600 || live[1].GPUS != 3600 || live[0].Allocations != 1 {
		t.Fatalf("unsaved usage: %+v", live)
	}
	g.advance(2 * time.Hour)
	g.must(g.do(arbiter.Release{ID: a.ID}))
	d1 := g.e.gt.days[arbiter.UsageDayKey("2026-03-01", "alice", "c", "NVIDIA H100 80GB HBM3")]
	d2 := g.e.gt.days[arbiter.UsageDayKey("2026-03-02", "alice", "c", "NVIDIA H100 80GB HBM3")]
	if d1 == nil || d2 == nil || d1.GPUS != 3600 || d2.GPUS != 3600 || d1.Allocations != 1 || d2.Allocations != 0 {
		t.Fatalf("days: %+v %+v", d1, d2)
	}
	if arbiter.UnsavedUsage(ptr(g.get(a.ID)), g.now) != nil {
		t.Fatal("an ended allocation has unsaved usage")
	}
	// Retention: a summary 401 days old goes once a new day is accounted.
	old := arbiter.UsageDayKey("2025-01-01", "alice", "c", "m")
	g.e.gt.days[old] = &arbiter.UsageDay{Day: "2025-01-01"}
	g.now = g.now.Add(48 * time.Hour)
	b := g.alloc(arbiter.Request{GPUs: 1, Machine: "c"})
	g.must(g.do(arbiter.Release{ID: b.ID}))
	if g.e.gt.days[old] != nil {
		t.Fatal("a day older than the retention was kept")
	}
}

func ptr[T any](v T) *T { return &v }

// TestReportsWriteNothing proves that a stream of reports changing only
// readings costs no store write but the accounting save, at most once a
// minute per allocation.
func TestReportsWriteNothing(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 2})
	g.report(false, reading(0, 50, proc(1, a.ID)), reading(1, 50, proc(1, a.ID)))
	g.writes = 0
	const reports = 600 // ten minutes of reports every second
	for i := 0; i < reports; i++ {
		g.now = g.now.Add(time.Second)
		util := 40 + i%50
		g.report(false, reading(0, util, proc(1, a.ID)), reading(1, 90-i%50, proc(1, a.ID)), reading(2, i%3), reading(3, 0))
	}
	if g.writes > 10 {
		t.Fatalf("%d reports made %d store writes; want at most one a minute (10)", reports, g.writes)
	}
	t.Logf("%d reports, %d store writes (accounting saves)", reports, g.writes)
	// The read view saw every reading all the same.
	c := g.e.Flush()
	_ = c
	if u := g.e.gt.ms["w"].gpus[0].usage; u == nil || *u.UtilPct != 40+(reports-1)%50 {
		t.Fatalf("latest reading not kept: %+v", u)
	}
}

func TestGPUStateSurvivesRestart(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.must(g.do(arbiter.Release{ID: a.ID}))
	g.must(g.do(arbiter.SetGPUDrained{Machine: "w", Index: 3, Drained: true, Reason: "r"}))
	g.advance(200 * time.Second) // the agent is silent; the server restarts before the timeout
	e2 := New(g.cfg, g.st.state(), g.now)
	if _, err := e2.Apply(arbiter.SetGPUPolicy{Policy: arbiter.DefaultGPUPolicy()}, g.now); err != nil {
		t.Fatal(err)
	}
	g.e = e2
	g.flush()
	if g.state(0) != arbiter.GPUReleasing || g.state(3) != arbiter.GPUDrained {
		t.Fatalf("after a restart: GPU 0 %s, GPU 3 %s", g.state(0), g.state(3))
	}
	// A silent agent's releasing timeout counts from the restart, not
	// from the release before it.
	if d := g.e.gt.ms["w"].release.at.Sub(g.now); d != secs(arbiter.DefaultGPUPolicy().ReleasingTimeoutS) {
		t.Fatalf("releasing timeout %v after the restart, want a full interval", d)
	}
	if b := g.alloc(arbiter.Request{GPUs: 3}); b.State != arbiter.StateQueued {
		t.Fatalf("3 GPUs with one releasing and one drained after a restart: %s", b.State)
	}
	// The server knows no readings: a partial report gets want_full, and
	// frees nothing until the full one.
	if o := g.report(false, reading(1, 0)); !o.WantFull {
		t.Fatal("no want_full after a restart")
	}
	if g.state(0) != arbiter.GPUReleasing {
		t.Fatal("freed with no reading of GPU 0")
	}
	if o := g.report(true, idle4()...); o.WantFull || g.state(0) == arbiter.GPUReleasing {
		t.Fatalf("full report: want_full %v, GPU 0 %s", o.WantFull, g.state(0))
	}
}

func TestBadReports(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	before := g.e.gt.ms["w"].reportedAt
	bad := []struct {
		name string
		r    arbiter.GPUReport
	}{
		{"unknown GPU", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{reading(9, 0)}}},
		{"GPU twice", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{reading(1, 0), reading(1, 0)}}},
		{"bad pid", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{reading(1, 0, proc(-3, 0))}}},
		{"pid twice", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{reading(1, 0, proc(3, 0), proc(3, 0))}}},
		{"util", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{reading(1, 101)}}},
		{"far future", arbiter.GPUReport{SampledAt: g.now.Add(48 * time.Hour), GPUs: []arbiter.GPUReading{reading(1, 0)}}},
		{"no date", arbiter.GPUReport{GPUs: []arbiter.GPUReading{reading(1, 0)}}},
		{"xid", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{{Index: 1, XIDs: []int{0}}}}},
		{"nan power", arbiter.GPUReport{SampledAt: g.now, GPUs: []arbiter.GPUReading{{Index: 1, PowerW: ptr(math.NaN())}}}},
	}
	for _, c := range bad {
		g.now = g.now.Add(time.Second)
		n := len(g.events)
		if _, err := g.do(arbiter.ReportGPUs{Machine: "w", Report: c.r}); arbiter.ErrorCode(err) != arbiter.EInvalid {
			t.Errorf("%s: got %v, want invalid", c.name, err)
		}
		if len(g.events) != n || g.e.gt.ms["w"].reportedAt != before {
			t.Errorf("%s: the bad report changed something", c.name)
		}
	}
	if _, err := g.do(arbiter.ReportGPUs{Machine: "nope", Report: arbiter.GPUReport{SampledAt: g.now}}); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Errorf("unknown machine: %v", err)
	}
	// A small skew ahead is taken, dated now.
	g.report(false)
	g.do(arbiter.ReportGPUs{Machine: "w", Report: arbiter.GPUReport{SeenSeq: g.e.LastSeq(), SampledAt: g.now.Add(time.Hour), GPUs: []arbiter.GPUReading{reading(2, 7)}}})
	if u := g.e.gt.ms["w"].gpus[2].usage; !u.SampledAt.Equal(g.now) {
		t.Fatalf("a sample an hour ahead is dated %v, want now", u.SampledAt)
	}
}

// TestPreemptionCalledOffWithdrawsItsKill: deleting the reservation that
// preempts an allocation takes the order to stop its processes out of the
// machine's orders at once, not at the agent's next report.
func TestPreemptionCalledOffWithdrawsItsKill(t *testing.T) {
	g := newGTEnv(t, nil)
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{{Name: "ops", Members: []string{"olga"}}}
	g.must(g.do(arbiter.SetFairShare{Policy: p}))
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 4, Preemptible: true})
	g.report(false, reading(0, 90, proc(20, a.ID)), reading(1, 90, proc(21, a.ID)))
	start := g.now.Add(2 * time.Hour)
	res, err := g.do(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 4, Machine: "w", Start: start, DurationS: 3600, Group: "ops"}})
	if err != nil {
		t.Fatal(err)
	}
	g.advance(start.Sub(g.now) - 5*time.Minute) // the notice: preempting
	if got := g.get(a.ID); got.Preempting == nil {
		t.Fatalf("not preempting at the notice: %+v", got)
	}
	if k := g.e.gt.ms["w"].orders.Kill; len(k) != 2 {
		t.Fatalf("kill orders while preempting: %+v", k)
	}
	g.must(g.do(arbiter.DeleteReservation{Caller: admin, ID: res.(arbiter.Reservation).ID}))
	if got := g.get(a.ID); got.Preempting != nil {
		t.Fatalf("still preempting after its reservation was deleted: %+v", got.Preempting)
	}
	if k := g.e.gt.ms["w"].orders.Kill; len(k) != 0 {
		t.Fatalf("kill orders after the preemption was called off: %+v", k)
	}
}

// TestMissingGPUStaysUnhealthy: a GPU that vanished stays unhealthy while
// it is missing from the samples — the agent reports it missing once, not
// in every report — and heals healthy_after_s after it is back.
func TestMissingGPUStaysUnhealthy(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	// GPU 3 vanishes.
	g.report(true, reading(0, 0), reading(1, 0), reading(2, 0))
	if g.state(3) != arbiter.GPUUnhealthy {
		t.Fatalf("missing GPU 3: %s", g.state(3))
	}
	// The agent keeps reporting every 30 s; GPU 3's reading (missing) does not change.
	for i := 0; i < 21; i++ {
		g.advance(30 * time.Second)
		g.report(false)
	}
	if !g.e.gt.ms["w"].gpus[3].missing {
		t.Fatal("GPU 3 is no longer missing in the engine's view")
	}
	b := g.alloc(arbiter.Request{GPUs: 4})
	if g.state(3) != arbiter.GPUUnhealthy || b.State == arbiter.StateReady {
		t.Fatalf("GPU 3 is still missing from every sample, yet state %s and a 4-GPU request is %s (devices %v)", g.state(3), b.State, b.Devices)
	}
	// Back in the samples: healthy healthy_after_s (10 minutes) later.
	g.report(false, reading(3, 0))
	g.advance(9 * time.Minute)
	if g.state(3) != arbiter.GPUUnhealthy {
		t.Fatal("GPU 3 healed 9 minutes after it came back")
	}
	g.advance(2 * time.Minute)
	if g.state(3) == arbiter.GPUUnhealthy {
		t.Fatal("GPU 3 is still unhealthy 11 minutes after it came back")
	}
}

// TestReRegisterWithoutAGPUReleasesTheRest: a machine registered again
// without one of its GPUs (fallen off the bus) ends the allocation that
// held it, and that allocation's other GPUs go releasing like any ended
// allocation's: its process still runs there, and nobody gets them until
// a report shows it gone.
func TestReRegisterWithoutAGPUReleasesTheRest(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 2})
	g.alloc(arbiter.Request{GPUs: 2}) // GPUs 2, 3
	g.report(false, reading(0, 90, proc(4242, a.ID)), reading(1, 90, proc(4242, a.ID)))
	waiting := g.alloc(arbiter.Request{GPUs: 1})
	if waiting.State != arbiter.StateQueued {
		t.Fatalf("waiting: %s", waiting.State)
	}
	w := host("w", 4)
	w.Source = arbiter.SourceAgent
	w.GPUs = append(w.GPUs[:1:1], w.GPUs[2:]...) // GPU 1 is gone
	g.must(g.do(arbiter.RegisterMachine{Machine: w}))
	if got := g.get(a.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("a: %s", got.State)
	}
	if n := len(g.eventsOf(arbiter.EventGPUReleasing)); n != 1 || g.state(0) != arbiter.GPUReleasing {
		t.Errorf("gpu.releasing events: %d, GPU 0 (pid 4242 of ended allocation %d still on it): %s; want releasing", n, a.ID, g.state(0))
	}
	if got := g.get(waiting.ID); got.State == arbiter.StateReady {
		t.Fatalf("allocation %d was granted GPU %v while pid 4242 of ended allocation %d still runs on it", got.ID, got.Devices, a.ID)
	}
	g.report(false, reading(0, 0)) // the process is gone
	if got := g.get(waiting.ID); got.State != arbiter.StateReady {
		t.Fatalf("after a clean report the waiting request is %s", got.State)
	}
}

// TestUnknownProcessesFreeNothing: a reading whose processes could not be
// listed (processes_unknown) is not "no processes": the releasing GPU
// waits; a later reading that lists none frees it.
func TestUnknownProcessesFreeNothing(t *testing.T) {
	g := newGTEnv(t, nil)
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.report(false, reading(0, 90, proc(4242, a.ID)))
	g.must(g.do(arbiter.Release{ID: a.ID, Caller: arbiter.Caller{Role: arbiter.RoleAdmin}}))
	unknown := reading(0, 90)
	unknown.ProcessesUnknown = true
	g.report(false, unknown)
	if s := g.state(0); s != arbiter.GPUReleasing {
		t.Fatalf("GPU 0 after a reading with unknown processes: %s, want releasing", s)
	}
	g.report(false, reading(0, 0))
	if s := g.state(0); s != arbiter.GPUFree {
		t.Fatalf("GPU 0 once listed with none: %s, want free", s)
	}
}

// dayGPUS sums the held GPU-seconds of the day summaries of owner.
func dayGPUS(e *Engine, owner string) (held, busy float64, allocs int) {
	for _, d := range e.gt.days {
		if d.Owner == owner {
			held += d.GPUS
			busy += d.BusyGPUS
			allocs += d.Allocations
		}
	}
	return
}

// TestUsageSavedForAnotherReasonSurvivesARestart: an allocation saved for
// another reason (allocation.idle setting idle_since) between two
// accounting saves keeps the usage the day summaries hold, so that after a
// kill -9 and a restart its held time is counted once, whole, in both.
func TestUsageSavedForAnotherReasonSurvivesARestart(t *testing.T) {
	g := newGTEnv(t, func(p *arbiter.GPUPolicy) { p.IdleAfterS = 90 })
	g.report(true, idle4()...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	g.report(false) // first save at t0
	g.advance(30 * time.Second)
	g.report(false) // shown
	g.advance(30 * time.Second)
	g.report(false) // saved at t0+60
	g.advance(25 * time.Second)
	g.report(false)            // shown: gpu_s 85
	g.advance(5 * time.Second) // t0+90: allocation.idle, the allocation is written
	if got := g.get(a.ID); got.IdleSince == nil {
		t.Fatal("no idle_since")
	}
	g.advance(10 * time.Second)
	// kill -9 and restart at t0+100.
	e2 := New(g.cfg, g.st.state(), g.now)
	if _, err := e2.Apply(arbiter.SetGPUPolicy{Policy: g.e.gt.policy}, g.now); err != nil {
		t.Fatal(err)
	}
	g.e = e2
	g.flush()
	g.now = g.now.Add(100 * time.Second) // t0+200
	g.must(g.do(arbiter.Release{ID: a.ID}))
	got := g.get(a.ID)
	held, _, _ := dayGPUS(g.e, "alice")
	if got.Usage == nil || got.Usage.GPUS != 200 || held != 200 {
		t.Fatalf("held 200 s: allocation gpu_s %v, day summaries %v", got.Usage.GPUS, held)
	}
}

// TestUsageOfGPUsThatWentIsCounted: a re-registration that drops a GPU ends
// the allocations on it; their time is counted on every GPU they held, and
// one that lost all its GPUs is counted too.
func TestUsageOfGPUsThatWentIsCounted(t *testing.T) {
	g := newGTEnv(t, nil)
	a := g.alloc(arbiter.Request{GPUs: 2, Machine: "c", Owner: "bob"})
	g.now = g.now.Add(time.Hour)
	// Before: the report shows bob's 2 GPU-hours.
	live := arbiter.UnsavedUsage(ptr(g.get(a.ID)), g.now)
	if len(live) != 1 || live[0].GPUS != 7200 {
		t.Fatalf("unsaved usage: %+v", live)
	}
	m := host("c", 1) // GPU 1 is gone
	g.must(g.do(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{m}}))
	if got := g.get(a.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("a: %s", got.State)
	}
	held, _, n := dayGPUS(g.e, "bob")
	if held != 7200 || n != 1 {
		t.Errorf("2 GPUs held 1 h, ended when one vanished: day summaries %v GPU-s, %d allocations; want 7200, 1", held, n)
	}
	if u := g.get(a.ID).Usage; u == nil || u.GPUS != 7200 {
		t.Errorf("allocation usage %+v; want gpu_s 7200", u)
	}

	// All its GPUs gone: nothing at all is counted.
	b := g.alloc(arbiter.Request{GPUs: 1, Machine: "c", Owner: "carol"})
	g.now = g.now.Add(time.Hour)
	m2 := host("c", 1)
	m2.GPUs[0].Index = 7 // its only GPU is replaced
	g.must(g.do(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{m2}}))
	if got := g.get(b.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("b: %s", got.State)
	}
	held, _, n = dayGPUS(g.e, "carol")
	if held != 3600 || n != 1 {
		t.Errorf("1 GPU held 1 h, ended when it vanished: day summaries %v GPU-s, %d allocations; want 3600, 1", held, n)
	}
}

// TestUsageClockSteppedBackCountsNothingTwice: a wall clock stepped back
// (NTP) makes no interval count twice: busy never exceeds held.
func TestUsageClockSteppedBackCountsNothingTwice(t *testing.T) {
	g := newGTEnv(t, nil)
	busy4 := []arbiter.GPUReading{reading(0, 90), reading(1, 90), reading(2, 90), reading(3, 90)}
	g.report(true, busy4...)
	a := g.alloc(arbiter.Request{GPUs: 1})
	for i := 0; i < 4; i++ {
		g.advance(30 * time.Second)
		g.report(false, busy4...)
	}
	// t0+120; the clock steps back a minute.
	g.now = g.now.Add(-time.Minute)
	g.report(false, busy4...)
	for i := 0; i < 2; i++ {
		g.advance(30 * time.Second)
		g.report(false, busy4...)
	}
	// t0+120 again.
	g.must(g.do(arbiter.Release{ID: a.ID}))
	u := g.get(a.ID).Usage
	held, busy, _ := dayGPUS(g.e, "alice")
	if u.BusyGPUS > u.GPUS+1e-9 || busy > held+1e-9 || math.Abs(busy-120) > 1e-9 {
		t.Fatalf("held %v s (allocation %v), busy %v s (allocation %v): busy counted twice", held, u.GPUS, busy, u.BusyGPUS)
	}
}

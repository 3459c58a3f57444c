package engine

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// gridM is a w×h grid machine located by identity with standard addresses.
func gridM(name string, w, h int, dead ...arbiter.Board) arbiter.GridMachine {
	m := arbiter.GridMachine{Name: name, Tags: []string{"default"}, Width: w, Height: h, DeadBoards: dead,
		Queue: arbiter.GridQueueBackfill, PowerDelay: 200 * time.Millisecond}
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				l := arbiter.BoardLocation{Cabinet: x, Frame: y, Board: z}
				ip, err := grid.StandardBoardIP("10.0.0.0", l)
				if err != nil {
					panic(err)
				}
				m.Boards = append(m.Boards, arbiter.BoardInfo{Board: arbiter.Board{X: x, Y: y, Z: z}, Location: l, IP: ip})
			}
			addr, _ := grid.StandardFrameIP("10.0.0.0", x, y)
			m.Frames = append(m.Frames, arbiter.GridFrame{Cabinet: x, Frame: y, Address: addr})
		}
	}
	m.Sort()
	if err := m.Validate(); err != nil {
		panic(err)
	}
	return m
}

// gridEnv drives an engine over a fake clock and a memStore.
type gridEnv struct {
	t   *testing.T
	e   *Engine
	cfg Config
	now time.Time
	st  *memStore
}

func newGridEnv(t *testing.T, cfg Config, ms ...arbiter.GridMachine) *gridEnv {
	t.Helper()
	g := &gridEnv{t: t, cfg: cfg, now: t0, st: newMemStore()}
	g.e = New(cfg, &arbiter.State{}, t0)
	g.sync(0, 30*time.Second, ms...)
	return g
}

func (g *gridEnv) do(cmd arbiter.Command) any {
	g.t.Helper()
	res, err := g.e.Apply(cmd, g.now)
	g.st.save(g.e.Flush())
	if err != nil {
		g.t.Fatalf("%T: %v", cmd, err)
	}
	return res
}

func (g *gridEnv) sync(maxRetired int, free time.Duration, ms ...arbiter.GridMachine) {
	g.t.Helper()
	if maxRetired == 0 {
		maxRetired = 1200
	}
	g.do(arbiter.SyncGridMachines{Machines: ms, MaxRetiredJobs: maxRetired, SecondsBeforeFree: free})
}

// advance moves the clock and lets deadlines fire.
func (g *gridEnv) advance(d time.Duration) {
	g.now = g.now.Add(d)
	g.do(arbiter.Tick{})
}

func (g *gridEnv) create(args []int, mod ...func(*arbiter.Request)) arbiter.Allocation {
	g.t.Helper()
	gr, err := arbiter.GridRequestOf(args...)
	if err != nil {
		g.t.Fatal(err)
	}
	r := arbiter.Request{Owner: "alice", Tags: []string{"default"}, KeepaliveS: ka(60), Grid: &gr}
	for _, f := range mod {
		f(&r)
	}
	return g.do(arbiter.Allocate{Request: r}).(arbiter.Allocation)
}

func (g *gridEnv) get(id int64) arbiter.Allocation {
	a, ok := g.e.Allocation(id)
	if !ok {
		return arbiter.Allocation{ID: id}
	}
	return a
}

func (g *gridEnv) restart(cfg Config) {
	g.e = New(cfg, g.st.state(), g.now)
	g.st.save(g.e.Flush())
}

func triad(a arbiter.Allocation) string {
	if len(a.Boards) == 0 {
		return "-"
	}
	return fmt.Sprintf("(%d,%d)", a.Boards[0].X, a.Boards[0].Y)
}

func TestGridLifeCycle(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 1, 2))
	a := g.create(nil)
	if a.State != arbiter.StatePower || a.Power == nil || !*a.Power || *a.Machine != "m" || len(a.Boards) != 1 {
		t.Fatalf("created %+v, want power on one board of m", a)
	}
	g.advance(199 * time.Millisecond)
	if s := g.get(a.ID).State; s != arbiter.StatePower {
		t.Fatalf("before the power delay: %s", s)
	}
	g.advance(time.Millisecond)
	if s := g.get(a.ID).State; s != arbiter.StateReady {
		t.Fatalf("after the power delay: %s", s)
	}
	// Power off goes through power again.
	g.do(arbiter.GridPower{ID: a.ID, On: false, Peer: "10.1.1.1"})
	got := g.get(a.ID)
	if got.State != arbiter.StatePower || *got.Power || got.Request.Grid.KeepaliveHost != "10.1.1.1" {
		t.Fatalf("after power off: %+v", got)
	}
	g.advance(time.Second)
	if got := g.get(a.ID); got.State != arbiter.StateReady || *got.Power {
		t.Fatalf("off: %s power %v", got.State, *got.Power)
	}
	// Destroy without a reason: reason null; boards free 30 s later.
	g.do(arbiter.GridDestroy{ID: a.ID})
	if got := g.get(a.ID); got.State != arbiter.StateDestroyed || got.Reason != nil {
		t.Fatalf("destroyed: %s reason %v", got.State, got.Reason)
	}
	gm := g.e.grids.ms["m"]
	if gm.alloc.Holder(a.Boards[0]) != a.ID {
		t.Fatal("board freed before seconds_before_free")
	}
	b := g.create([]int{1, 2})
	if b.State != arbiter.StateQueued {
		t.Fatalf("whole machine while a board settles: %s, want queued", b.State)
	}
	g.advance(29 * time.Second)
	if g.get(b.ID).State != arbiter.StateQueued {
		t.Fatal("placed before the settling time")
	}
	g.advance(time.Second)
	if got := g.get(b.ID); got.State != arbiter.StatePower || len(got.Boards) != 6 {
		t.Fatalf("after the settling time: %+v", got)
	}
}

func TestGridPlacementExamples(t *testing.T) {
	// Spec §4: eight 1×1 blocks fill a 4×2 machine in this order; a ninth queues.
	g := newGridEnv(t, Config{}, gridM("m", 4, 2))
	var got []string
	for i := 0; i < 8; i++ {
		got = append(got, triad(g.create([]int{1, 1})))
	}
	want := []string{"(0,0)", "(0,1)", "(1,0)", "(1,1)", "(2,0)", "(2,1)", "(3,0)", "(3,1)"}
	if !slices.Equal(got, want) {
		t.Fatalf("triads %v, want %v", got, want)
	}
	if s := g.create([]int{1, 1}).State; s != arbiter.StateQueued {
		t.Fatalf("ninth: %s, want queued", s)
	}

	// Five single boards: (0,0,0), (0,0,1), (0,0,2), (0,1,0), (0,1,1).
	g = newGridEnv(t, Config{}, gridM("m", 4, 2))
	var boards []arbiter.Board
	for i := 0; i < 5; i++ {
		boards = append(boards, g.create(nil).Boards[0])
	}
	wantB := []arbiter.Board{{X: 0, Y: 0, Z: 0}, {X: 0, Y: 0, Z: 1}, {X: 0, Y: 0, Z: 2}, {X: 0, Y: 1, Z: 0}, {X: 0, Y: 1, Z: 1}}
	if !slices.Equal(boards, wantB) {
		t.Fatalf("single boards %v, want %v", boards, wantB)
	}

	// Over-allocation makes up for a dead board: 23 boards on a 4×2 machine
	// with (0,0,2) dead take the whole machine; 24 are impossible.
	g = newGridEnv(t, Config{}, gridM("m", 4, 2, arbiter.Board{X: 0, Y: 0, Z: 2}))
	zero := 0
	a := g.create([]int{23}, func(r *arbiter.Request) { r.Grid.MaxDeadBoards = &zero })
	if a.State != arbiter.StatePower || len(a.Boards) != 23 {
		t.Fatalf("23 boards: %s with %d boards", a.State, len(a.Boards))
	}
	b := g.create([]int{24}, func(r *arbiter.Request) { r.Grid.MaxDeadBoards = &zero })
	if b.State != arbiter.StateDestroyed || *b.Reason != arbiter.GridReasonImpossible {
		t.Fatalf("24 boards: %s %v", b.State, b.Reason)
	}
}

func TestGridImpossibleAndInvalid(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 2, 2, arbiter.Board{X: 1, Y: 1, Z: 1}))
	for name, args := range map[string][]int{"too wide": {3, 1}, "dead board": {1, 1, 1}, "off the machine": {5, 0, 0}, "zero boards": {0}} {
		a := g.create(args)
		if a.State != arbiter.StateDestroyed || a.Reason == nil || *a.Reason != arbiter.GridReasonImpossible {
			t.Errorf("%s: %s %v, want destroyed as impossible", name, a.State, a.Reason)
		}
	}
	if a := g.create(nil, func(r *arbiter.Request) { r.Tags = []string{"gpu"} }); a.State != arbiter.StateDestroyed {
		t.Errorf("tag no machine has: %s", a.State)
	}
	if a := g.create(nil, func(r *arbiter.Request) { r.Tags = nil; r.Machine = "nope" }); a.State != arbiter.StateDestroyed {
		t.Errorf("unknown machine: %s", a.State)
	}
	next := g.e.nextID
	_, err := g.e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "a", Grid: &arbiter.GridRequest{Form: arbiter.GridBoard, Board: arbiter.Board{X: 1, Y: 1, Z: 1}, RequireTorus: true}}}, g.now)
	if err == nil || !strings.Contains(err.Error(), arbiter.GridErrTorusBoards) {
		t.Fatalf("torus with a board: %v", err)
	}
	if g.e.nextID != next {
		t.Fatal("a failing create used an id")
	}
}

func TestGridQueuePolicies(t *testing.T) {
	for _, policy := range []string{arbiter.GridQueueFIFO, arbiter.GridQueueBackfill} {
		t.Run(policy, func(t *testing.T) {
			m := gridM("m", 2, 1)
			m.Queue = policy
			g := newGridEnv(t, Config{Starvation: time.Hour}, m)
			g.sync(0, 0, m)
			a := g.create([]int{1, 1}) // half the machine
			big := g.create([]int{2, 1})
			small := g.create(nil)
			if big.State != arbiter.StateQueued {
				t.Fatalf("big: %s", big.State)
			}
			want := arbiter.StateQueued
			if policy == arbiter.GridQueueBackfill {
				want = arbiter.StatePower
			}
			if s := g.get(small.ID).State; s != want {
				t.Fatalf("small behind big: %s, want %s", s, want)
			}
			// Freeing a lets the head in when the small one is not in the way.
			g.do(arbiter.GridDestroy{ID: a.ID})
			g.advance(0)
			if policy == arbiter.GridQueueFIFO {
				if s := g.get(big.ID).State; s != arbiter.StatePower {
					t.Fatalf("fifo head after the free: %s", s)
				}
				if s := g.get(small.ID).State; s != arbiter.StateQueued {
					t.Fatalf("fifo second: %s", s)
				}
			} else if s := g.get(big.ID).State; s != arbiter.StateQueued {
				t.Fatalf("backfill head with the small one running: %s", s)
			}
		})
	}
}

func TestGridStarvationHoldsMachine(t *testing.T) {
	m := gridM("m", 2, 1)
	g := newGridEnv(t, Config{Starvation: time.Minute}, m)
	g.sync(0, 0, m)
	never := func(r *arbiter.Request) { r.KeepaliveS = nil }
	a := g.create([]int{1, 1}, never)
	big := g.create([]int{2, 1}, never)
	g.advance(2 * time.Minute) // big starves
	small := g.create(nil)
	if s := g.get(small.ID).State; s != arbiter.StateQueued {
		t.Fatalf("small behind a starving head: %s, want queued", s)
	}
	g.do(arbiter.GridDestroy{ID: a.ID})
	g.advance(0)
	if s := g.get(big.ID).State; s != arbiter.StatePower {
		t.Fatalf("starving head after the free: %s", s)
	}
}

func TestGridKeepaliveAndReasons(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 1, 1))
	a := g.create(nil, func(r *arbiter.Request) { r.KeepaliveS = ka(5) })
	g.advance(4 * time.Second)
	g.do(arbiter.GridTouch{ID: a.ID, Peer: "1.2.3.4"})
	g.advance(4 * time.Second)
	if s := g.get(a.ID).State; s == arbiter.StateDestroyed {
		t.Fatal("expired although kept alive")
	}
	g.advance(2 * time.Second)
	if got := g.get(a.ID); got.State != arbiter.StateDestroyed || *got.Reason != arbiter.GridReasonTimedOut {
		t.Fatalf("after the keepalive: %s %v", got.State, got.Reason)
	}
	// Queued then cancelled: "Cancelled: " + reason.
	g.create([]int{1, 1})
	q := g.create([]int{1, 1})
	why := "bye"
	g.do(arbiter.GridDestroy{ID: q.ID, Reason: &why})
	if got := g.get(q.ID); *got.Reason != "Cancelled: bye" {
		t.Fatalf("cancelled: %q", *got.Reason)
	}
	// A touch of an unknown or GPU id is nil.
	if res := g.do(arbiter.GridTouch{ID: 999}); res != nil {
		t.Fatalf("unknown: %v", res)
	}
}

func TestGridReload(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 2, 1), gridM("n", 1, 1))
	a := g.create([]int{1, 1}) // on m (first in priority)
	b := g.create([]int{0, 0, 0}, func(r *arbiter.Request) { r.Tags = nil; r.Machine = "n" })
	if *a.Machine != "m" || *b.Machine != "n" {
		t.Fatalf("placed on %s and %s", *a.Machine, *b.Machine)
	}
	big := g.create([]int{3, 1}) // impossible
	if big.State != arbiter.StateDestroyed {
		t.Fatal("3×1 on 2×1")
	}
	q := g.create([]int{2, 1}) // queued on m
	if q.State != arbiter.StateQueued {
		t.Fatalf("q: %s", q.State)
	}
	// Tags and a dead board change: running jobs stay.
	m2 := gridM("m", 2, 1, arbiter.Board{X: 1, Y: 0, Z: 2})
	m2.Tags = []string{"default", "big"}
	g.sync(0, 30*time.Second, m2, gridM("n", 1, 1))
	if s := g.get(a.ID).State; s == arbiter.StateDestroyed {
		t.Fatal("a tag change ended a job")
	}
	if got := g.get(q.ID); got.State != arbiter.StateQueued {
		t.Fatalf("q after a fault change: %s %v", got.State, got.Reason)
	}
	// n grows: removed and added again, its job ends; q (2×1) now fits n.
	g.sync(0, 30*time.Second, m2, gridM("n", 2, 1))
	if got := g.get(b.ID); got.State != arbiter.StateDestroyed || *got.Reason != arbiter.GridReasonRemoved {
		t.Fatalf("b after n changed size: %s %v", got.State, got.Reason)
	}
	if got := g.get(q.ID); got.State != arbiter.StatePower || *got.Machine != "n" {
		t.Fatalf("q after n grew: %s %v", got.State, got.Machine)
	}
	if h := g.e.grids.ms["n"].alloc.Holder(arbiter.Board{}); h != q.ID {
		t.Fatalf("board (0,0,0) of the new n held by %d, want %d (b's board was freed at once)", h, q.ID)
	}
	// m goes away: its job ends.
	g.sync(0, 30*time.Second, gridM("n", 2, 1))
	if got := g.get(a.ID); *got.Reason != arbiter.GridReasonRemoved {
		t.Fatalf("a: %v", got.Reason)
	}
	snap := g.e.grids.snapshot
	if len(snap) != 1 || snap[0].Name != "n" {
		t.Fatalf("snapshot %v", snap)
	}
	// A queued job whose machines all vanish is cancelled as impossible.
	q2 := g.create([]int{2, 1})
	g.sync(0, 30*time.Second)
	if got := g.get(q2.ID); *got.Reason != arbiter.GridReasonImpossible {
		t.Fatalf("q2: %v", got.Reason)
	}
	// A bad machine changes nothing.
	bad := gridM("x", 1, 1)
	bad.Queue = "lifo"
	if _, err := g.e.Apply(arbiter.SyncGridMachines{Machines: []arbiter.GridMachine{bad}}, g.now); err == nil {
		t.Fatal("a bad machine was accepted")
	}
}

func TestGridMaxRetiredJobs(t *testing.T) {
	g := newGridEnv(t, Config{History: 100}, gridM("m", 1, 1))
	g.sync(2, 0, gridM("m", 1, 1))
	var ids []int64
	for i := 0; i < 4; i++ {
		a := g.create([]int{9, 9}) // impossible: destroyed at once
		ids = append(ids, a.ID)
	}
	for i, id := range ids {
		_, ok := g.e.Allocation(id)
		if want := i >= 2; ok != want {
			t.Errorf("job %d queryable: %v, want %v", id, ok, want)
		}
	}
	if _, ok := g.st.allocs[ids[0]]; ok {
		t.Error("the store still has a forgotten job")
	}
}

func TestGridRestart(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 2, 2))
	a := g.create(nil)
	b := g.create([]int{1, 1})
	g.advance(time.Second)
	c := g.create([]int{2, 2}, func(r *arbiter.Request) { r.KeepaliveS = nil }) // queued
	d := g.create(nil)
	g.do(arbiter.GridDestroy{ID: d.ID}) // settling
	g.do(arbiter.GridPower{ID: b.ID, On: false})

	g.now = g.now.Add(10 * time.Second)
	g.restart(Config{})
	if got := g.get(a.ID); got.State != arbiter.StateReady || !got.ExpiresAt.Equal(g.now.Add(time.Minute)) {
		t.Fatalf("a after restart: %s expires %v", got.State, got.ExpiresAt)
	}
	if got := g.get(b.ID); got.State != arbiter.StatePower || *got.Power {
		t.Fatalf("b after restart: %s", got.State)
	}
	if got := g.get(c.ID); got.State != arbiter.StateQueued {
		t.Fatalf("c after restart: %s", got.State)
	}
	gm := g.e.grids.ms["m"]
	for _, x := range []arbiter.Allocation{a, b, d} {
		for _, bd := range x.Boards {
			if h := gm.alloc.Holder(bd); h != x.ID {
				t.Fatalf("board %v held by %d after restart, want %d", bd, h, x.ID)
			}
		}
	}
	g.advance(time.Second)
	if got := g.get(b.ID); got.State != arbiter.StateReady {
		t.Fatalf("b's power off did not complete after restart: %s", got.State)
	}
	// d's boards free at their stored time (destroy + 30 s), then nothing
	// lets c in while a and b run.
	g.advance(30 * time.Second)
	if h := gm.alloc.Holder(d.Boards[0]); h != 0 {
		t.Fatalf("d's board still held by %d", h)
	}
	g.do(arbiter.GridDestroy{ID: a.ID})
	g.do(arbiter.GridDestroy{ID: b.ID})
	g.advance(30 * time.Second)
	if got := g.get(c.ID); got.State != arbiter.StatePower {
		t.Fatalf("c after everything freed: %s %v", got.State, arbiter.StrOr(got.Reason, ""))
	}
	if n := g.create(nil); n.ID != c.ID+2 {
		t.Fatalf("next id %d, want %d", n.ID, c.ID+2)
	}
}

func TestGridExternalPower(t *testing.T) {
	cfg := Config{GridExternalPower: true}
	g := newGridEnv(t, cfg, gridM("m", 3, 1))
	intents := g.intents
	a := g.create([]int{2, 1})
	in := intents()
	if len(in) != 1 || len(in[0].Frames) != 2 || !in[0].On || len(in[0].Frames[0].Boards) != 3 || len(in[0].Frames[0].LinksOff) == 0 {
		t.Fatalf("intents %+v, want one on, two frames of three boards", in)
	}
	ep := in[0].Epoch
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 0})
	if s := g.get(a.ID).State; s != arbiter.StatePower {
		t.Fatalf("one frame of two done: %s", s)
	}
	// Frame 1 fails once: retried alone; then done.
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 1, Err: "timeout"})
	in = intents()
	if len(in) != 1 || len(in[0].Frames) != 1 || in[0].Frames[0].Index != 1 || in[0].Frames[0].Attempt != 2 {
		t.Fatalf("retry %+v", in)
	}
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 1})
	if s := g.get(a.ID).State; s != arbiter.StateReady {
		t.Fatalf("all frames done: %s", s)
	}
	// A stale report changes nothing.
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep - 1, Frame: 0, Err: "x"})
	// Power off: frame 0 fails twice: destroyed naming the controller.
	g.do(arbiter.GridPower{ID: a.ID, On: false})
	in = intents()
	if len(in) != 1 || in[0].On || len(in[0].Frames[0].LinksOff) != 0 {
		t.Fatalf("power off intent %+v", in)
	}
	ep = in[0].Epoch
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 0, Err: "no route"})
	if in := intents(); len(in) != 1 || in[0].Frames[0].Attempt != 2 {
		t.Fatalf("retry of the power off %+v", in)
	}
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 0, Err: "no route"})
	got := g.get(a.ID)
	if got.State != arbiter.StateDestroyed || !strings.Contains(*got.Reason, "10.0.0.0") || !strings.Contains(*got.Reason, "no route") {
		t.Fatalf("after two failures: %s %v", got.State, got.Reason)
	}
	in = intents()
	if len(in) != 1 || !in[0].Final || in[0].On {
		t.Fatalf("final power off %+v", in)
	}
	// A controller that never answers: retried after the timeout, then the
	// job ends.
	b := g.create(nil, func(r *arbiter.Request) { r.KeepaliveS = nil })
	g.st.events = nil
	g.advance(gridPowerTimeout + time.Second)
	if s := g.get(b.ID).State; s == arbiter.StateDestroyed {
		t.Fatal("destroyed after the first timeout")
	}
	if in := intents(); len(in) != 1 || in[0].Frames[0].Attempt != 2 {
		t.Fatalf("retry after timeout %+v", in)
	}
	g.advance(gridPowerTimeout + time.Second)
	if got := g.get(b.ID); got.State != arbiter.StateDestroyed || !strings.Contains(*got.Reason, "no answer") {
		t.Fatalf("after two timeouts: %s %v", got.State, got.Reason)
	}
}

func TestGridNativeRelease(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 1, 1))
	a := g.create(nil)
	res := g.do(arbiter.Release{Caller: arbiter.Caller{Role: arbiter.RoleAdmin}, ID: a.ID}).(arbiter.Allocation)
	if res.State != arbiter.StateDestroyed || *res.Reason != "released" {
		t.Fatalf("release: %s %v", res.State, res.Reason)
	}
	if g.e.grids.ms["m"].alloc.Holder(a.Boards[0]) != a.ID {
		t.Fatal("released board not settling")
	}
	if _, err := g.e.Apply(arbiter.Keepalive{ID: a.ID}, g.now); err == nil {
		t.Fatal("keepalive of a released allocation")
	}
}

// TestGridProperty runs random grid commands over a fake clock, with
// restarts from what a store kept, and checks after every step that no
// board is in two live allocations (nor in one and a settling one), that
// the allocators agree with the allocations, and — over the whole run —
// that power completed no earlier than the power delay after it started
// and that boards were reused no earlier than seconds_before_free after
// the allocation holding them ended.
func TestGridProperty(t *testing.T) {
	for seed := int64(1); seed <= 30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { gridProperty(t, seed) })
	}
}

func gridProperty(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	const bf = 5 * time.Second
	m := gridM("m", 3, 2, arbiter.Board{X: 1, Y: 1, Z: 1})
	m.PowerDelay = 700 * time.Millisecond
	n := gridM("n", 2, 2)
	n.Queue = arbiter.GridQueueFIFO
	n.PowerDelay = 0
	cfg := Config{Starvation: 20 * time.Second, History: 40}
	g := newGridEnv(t, cfg)
	g.sync(30, bf, m, n)
	var ids []int64
	powerAt := map[int64]time.Time{} // when the current power operation started
	delayOf := map[int64]time.Duration{}
	blocked := map[string]time.Time{} // "machine/board" → free no earlier than
	seen := 0
	for step := 0; step < 300; step++ {
		switch k := rng.Intn(20); {
		case k < 7:
			var args []int
			switch rng.Intn(4) {
			case 1:
				args = []int{rng.Intn(8) + 1}
			case 2:
				args = []int{rng.Intn(3) + 1, rng.Intn(2) + 1}
			case 3:
				args = []int{rng.Intn(3), rng.Intn(2), rng.Intn(3)}
			}
			a := g.create(args, func(r *arbiter.Request) {
				if rng.Intn(3) == 0 {
					r.KeepaliveS = ka(float64(rng.Intn(20) + 1))
				} else {
					r.KeepaliveS = nil
				}
				if rng.Intn(4) == 0 {
					r.Tags, r.Machine = nil, []string{"m", "n"}[rng.Intn(2)]
				}
			})
			ids = append(ids, a.ID)
		case k < 10 && len(ids) > 0:
			g.do(arbiter.GridDestroy{ID: ids[rng.Intn(len(ids))]})
		case k < 12 && len(ids) > 0:
			g.do(arbiter.GridPower{ID: ids[rng.Intn(len(ids))], On: rng.Intn(2) == 0})
		case k < 13 && len(ids) > 0:
			g.do(arbiter.GridTouch{ID: ids[rng.Intn(len(ids))], Peer: "h"})
		case k < 14:
			// A reload that only changes faults and tags keeps jobs.
			m2 := m
			if rng.Intn(2) == 0 {
				m2 = gridM("m", 3, 2)
				m2.PowerDelay = m.PowerDelay
			}
			g.sync(30, bf, m2, n)
		case k < 15:
			g.restart(cfg)
		case k < 16:
			// n changes size: removed and added again, its jobs end and
			// its boards are free at once.
			w := 2 + rng.Intn(2)
			n = gridM("n", w, 2)
			n.Queue, n.PowerDelay = arbiter.GridQueueFIFO, 0
			g.sync(30, bf, m, n)
			for k := range blocked {
				if strings.HasPrefix(k, "n/") {
					delete(blocked, k)
				}
			}
		default:
			g.advance(time.Duration(rng.Intn(3000)) * time.Millisecond)
		}
		// Events since the last step, in order.
		for _, ev := range g.st.events[seen:] {
			if !strings.HasPrefix(ev.Kind, "allocation.") {
				continue
			}
			var a arbiter.Allocation
			if err := json.Unmarshal(ev.Data, &a); err != nil {
				t.Fatal(err)
			}
			if a.Request.Grid == nil {
				continue
			}
			switch ev.Kind {
			case arbiter.EventAllocationPower:
				if _, had := powerAt[a.ID]; !had {
					// First power: the boards were just placed.
					for _, b := range a.Boards {
						k := *a.Machine + "/" + b.String()
						if free, ok := blocked[k]; ok && ev.Time.Before(free) {
							t.Fatalf("step %d: board %s given to %d at %v, free only at %v", step, k, a.ID, ev.Time, free)
						}
					}
				}
				powerAt[a.ID] = ev.Time
				delayOf[a.ID] = map[string]time.Duration{"m": m.PowerDelay, "n": n.PowerDelay}[*a.Machine]
			case arbiter.EventAllocationReady:
				if at, ok := powerAt[a.ID]; ok && ev.Time.Sub(at) < delayOf[a.ID] {
					t.Fatalf("step %d: %d ready %v after power started, delay %v", step, a.ID, ev.Time.Sub(at), delayOf[a.ID])
				}
			case arbiter.EventAllocationDestroyed:
				if a.Reason != nil && *a.Reason == arbiter.GridReasonRemoved {
					continue
				}
				for _, b := range a.Boards {
					blocked[*a.Machine+"/"+b.String()] = ev.Time.Add(bf)
				}
			}
		}
		seen = len(g.st.events)
		if err := checkGrid(g.e, g.now); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
}

func checkGrid(e *Engine, now time.Time) error {
	g := &e.grids
	for i, d := range e.dl {
		if d.pos != i {
			return fmt.Errorf("deadline heap: entry %d says it is at %d", i, d.pos)
		}
	}
	held := map[string]int64{}
	hold := func(mach string, b arbiter.Board, id int64) error {
		k := mach + "/" + b.String()
		if o, dup := held[k]; dup {
			return fmt.Errorf("board %s held by %d and %d", k, o, id)
		}
		held[k] = id
		return nil
	}
	for id, a := range e.allocs {
		if a.a.Request.Grid == nil {
			continue
		}
		j := g.jobs[id]
		if j == nil || j.a != a {
			return fmt.Errorf("live grid allocation %d has no job", id)
		}
		if a.a.ExpiresAt != nil && a.a.ExpiresAt.Before(now) {
			return fmt.Errorf("allocation %d expired at %v but lives at %v", id, a.a.ExpiresAt, now)
		}
		if (a.a.KeepaliveS != nil) != (a.ka.pos >= 0) {
			return fmt.Errorf("allocation %d: keepalive %v but deadline in the heap %v", id, a.a.KeepaliveS, a.ka.pos >= 0)
		}
		switch a.a.State {
		case arbiter.StateQueued:
			if len(a.a.Boards) > 0 || j.place != nil {
				return fmt.Errorf("queued %d holds boards", id)
			}
		case arbiter.StatePower, arbiter.StateReady:
			if len(a.a.Boards) == 0 || j.mach == nil {
				return fmt.Errorf("%s %d holds no boards", a.a.State, id)
			}
			for _, b := range a.a.Boards {
				if err := hold(*a.a.Machine, b, id); err != nil {
					return err
				}
				if h := j.mach.alloc.Holder(b); h != id {
					return fmt.Errorf("allocator says board %v of %d is held by %d", b, id, h)
				}
			}
			if (a.a.State == arbiter.StatePower) != (j.op != nil) {
				return fmt.Errorf("%d in %s with power operation %v", id, a.a.State, j.op != nil)
			}
		default:
			return fmt.Errorf("live %d in state %s", id, a.a.State)
		}
	}
	for id, j := range g.jobs {
		if j.a != nil {
			continue
		}
		if j.place == nil || j.mach == nil {
			return fmt.Errorf("ended job %d kept without boards", id)
		}
		for _, b := range j.place.Boards {
			if err := hold(j.mach.m.Name, b, id); err != nil {
				return err
			}
		}
		if j.free.pos < 0 {
			return fmt.Errorf("ended job %d has no free deadline", id)
		}
	}
	for _, gm := range g.order {
		for _, j := range gm.queue {
			if j.a == nil || j.a.a.State != arbiter.StateQueued {
				return fmt.Errorf("machine %s queues job %d that is not queued", gm.m.Name, j.id)
			}
		}
	}
	return nil
}

func TestGridExternalPowerAfterRestart(t *testing.T) {
	cfg := Config{GridExternalPower: true}
	g := newGridEnv(t, cfg, gridM("m", 1, 1))
	a := g.create(nil, func(r *arbiter.Request) { r.KeepaliveS = nil })
	g.restart(cfg)
	g.st.events = nil
	g.advance(time.Second)
	for _, ev := range g.st.events {
		if ev.Kind == arbiter.EventGridPower {
			t.Fatal("an intent before the controller asked for it")
		}
	}
	g.do(arbiter.GridPowerResend{})
	var in grid.PowerIntent
	for _, ev := range g.st.events {
		if ev.Kind == arbiter.EventGridPower {
			json.Unmarshal(ev.Data, &in)
		}
	}
	if in.ID != a.ID || !in.On || len(in.Frames) != 1 || in.Frames[0].Attempt != 1 {
		t.Fatalf("resent intent %+v", in)
	}
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: in.Epoch, Frame: 0})
	if s := g.get(a.ID).State; s != arbiter.StateReady {
		t.Fatalf("after the resent intent was done: %s", s)
	}
}

// TestGridQueuedHeadEndsLetsTheNextIn: a queue head that ends while
// queued — cancelled, timed out, or a starving head the backfill machine
// was held for — lets the job behind it in at once, not at the next free.
func TestGridQueuedHeadEndsLetsTheNextIn(t *testing.T) {
	never := func(r *arbiter.Request) { r.KeepaliveS = nil }
	for _, tc := range []struct {
		name  string
		queue string
		cfg   Config
		end   func(g *gridEnv, head arbiter.Allocation)
	}{
		{"fifo head cancelled", arbiter.GridQueueFIFO, Config{}, func(g *gridEnv, head arbiter.Allocation) {
			g.do(arbiter.GridDestroy{ID: head.ID})
		}},
		{"fifo head timed out", arbiter.GridQueueFIFO, Config{}, func(g *gridEnv, _ arbiter.Allocation) {
			g.advance(10 * time.Second)
			g.advance(10 * time.Second)
		}},
		{"starving backfill head cancelled", arbiter.GridQueueBackfill, Config{Starvation: time.Minute}, func(g *gridEnv, head arbiter.Allocation) {
			g.do(arbiter.GridDestroy{ID: head.ID})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := gridM("m", 2, 1)
			m.Queue = tc.queue
			g := newGridEnv(t, tc.cfg, m)
			g.sync(0, 0, m)
			g.create([]int{1, 1}, never) // half the machine
			var head arbiter.Allocation
			if tc.cfg.Starvation > 0 {
				head = g.create([]int{2, 1}, never)
				g.advance(2 * time.Minute) // it starves: the machine is held for it
			} else {
				head = g.create([]int{2, 1}, func(r *arbiter.Request) { r.KeepaliveS = ka(5) })
			}
			small := g.create(nil, never)
			if s := g.get(small.ID).State; s != arbiter.StateQueued {
				t.Fatalf("behind the head: %s, want queued", s)
			}
			tc.end(g, head)
			if s := g.get(small.ID).State; s == arbiter.StateQueued {
				t.Fatal("still queued after the head ended, with half the machine free")
			}
		})
	}
}

// TestGridRetiredOrderSurvivesRestart: ended jobs are remembered newest
// (most recently ended) last, across a restart too: the next trim forgets
// the one that ended first, not the one with the lowest id.
func TestGridRetiredOrderSurvivesRestart(t *testing.T) {
	m := gridM("m", 2, 1)
	g := newGridEnv(t, Config{History: 100}, m)
	g.sync(2, 0, m)
	never := func(r *arbiter.Request) { r.KeepaliveS = nil }
	old := g.create(nil, never) // job 1: lives long
	x := g.create([]int{9, 9})  // impossible: ended at once
	g.advance(time.Second)
	g.do(arbiter.GridDestroy{ID: old.ID}) // ended last: the newest
	g.restart(Config{History: 100})
	g.sync(2, 0, m)
	g.create([]int{9, 9}) // one more ended: the oldest (x) goes
	if _, ok := g.e.Allocation(old.ID); !ok {
		t.Errorf("job %d, ended after job %d, was forgotten first", old.ID, x.ID)
	}
	if _, ok := g.e.Allocation(x.ID); ok {
		t.Errorf("job %d, ended first, is still remembered", x.ID)
	}
}

// TestAgentNamedLikeGridMachineRefused: an agent may not register a GPU
// machine under a grid machine's name.
func TestAgentNamedLikeGridMachineRefused(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("spin1", 1, 1))
	_, err := g.e.Apply(arbiter.RegisterMachine{Machine: agentHost("spin1", "GPU-s0")}, g.now)
	if err == nil {
		n := 0
		for _, m := range g.e.Machines() {
			if m.Name == "spin1" {
				n++
			}
		}
		t.Fatalf("agent registered GPU machine %q while grid machine %q exists (GPU machines named spin1: %d)", "spin1", "spin1", n)
	}
}

// TestGridMachineNamedLikeAgentRefused: a grid machine may not take the
// name of a GPU machine an agent registered.
func TestGridMachineNamedLikeAgentRefused(t *testing.T) {
	g := newGridEnv(t, Config{})
	g.do(arbiter.RegisterMachine{Machine: agentHost("spin1", "GPU-s0")})
	_, err := g.e.Apply(arbiter.SyncGridMachines{Machines: []arbiter.GridMachine{gridM("spin1", 1, 1)}, MaxRetiredJobs: 10, SecondsBeforeFree: time.Second}, g.now)
	if err == nil {
		t.Fatalf("grid machine spin1 added while GPU machine spin1 (agent) exists")
	}
}

// intents returns the power intents emitted since the last call.
func (g *gridEnv) intents() []grid.PowerIntent {
	var out []grid.PowerIntent
	for _, ev := range g.st.events {
		if ev.Kind == arbiter.EventGridPower {
			var in grid.PowerIntent
			if err := json.Unmarshal(ev.Data, &in); err != nil {
				g.t.Fatal(err)
			}
			out = append(out, in)
		}
	}
	g.st.events = nil
	return out
}

// TestGridLateFirstAttemptFailureIsNotTheRetrys: a frame not reported in
// time is retried (attempt 2); the first attempt's failure arriving late
// does not count as the retry's, which may still succeed.
func TestGridLateFirstAttemptFailureIsNotTheRetrys(t *testing.T) {
	cfg := Config{GridExternalPower: true}
	g := newGridEnv(t, cfg, gridM("m", 1, 1))
	a := g.create(nil, func(r *arbiter.Request) { r.KeepaliveS = nil })
	in := g.intents()
	if len(in) != 1 || in[0].Frames[0].Attempt != 1 {
		t.Fatalf("intents %+v", in)
	}
	ep := in[0].Epoch
	g.advance(gridM("m", 1, 1).PowerDelay + gridPowerTimeout + time.Second)
	in = g.intents()
	if len(in) != 1 || in[0].Frames[0].Attempt != 2 {
		t.Fatalf("no retry after the timeout: %+v", in)
	}
	// The first attempt's late failure arrives while the retry runs.
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 0, Attempt: 1, Err: "first attempt: i/o timeout"})
	if got := g.get(a.ID); got.State == arbiter.StateDestroyed {
		t.Fatalf("destroyed by the first attempt's late report while the retry is in flight: %v", *got.Reason)
	}
	// The retry succeeds.
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: ep, Frame: 0, Attempt: 2})
	if s := g.get(a.ID).State; s != arbiter.StateReady {
		t.Fatalf("after the retry succeeded: %s", s)
	}
}

// TestGridMachineReplacedPowersOffItsJobsBoards: a grid machine whose
// layout changes (here one board's address) is removed and added again; its
// running jobs end with "Machine removed.", and their boards are switched
// off (docs/reference/spalloc.md §6) as the machine was.
func TestGridMachineReplacedPowersOffItsJobsBoards(t *testing.T) {
	cfg := Config{GridExternalPower: true}
	m := gridM("m", 2, 1)
	g := newGridEnv(t, cfg, m)
	a := g.create([]int{1, 1}, func(r *arbiter.Request) { r.KeepaliveS = nil })
	in := g.intents()
	if len(in) != 1 || !in[0].On {
		t.Fatalf("intents %+v", in)
	}
	for _, f := range in[0].Frames {
		g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: in[0].Epoch, Frame: f.Index})
	}
	if s := g.get(a.ID).State; s != arbiter.StateReady {
		t.Fatalf("a: %s", s)
	}
	// One board gets a new address: the machine is removed and re-added.
	m2 := gridM("m", 2, 1)
	m2.Boards[5].IP = "10.9.9.9"
	g.sync(0, 30*time.Second, m2)
	if got := g.get(a.ID); got.State != arbiter.StateDestroyed || *got.Reason != arbiter.GridReasonRemoved {
		t.Fatalf("a after the reload: %s %v", got.State, got.Reason)
	}
	off := false
	for _, in := range g.intents() {
		if in.ID == a.ID && !in.On {
			off = true
		}
	}
	if !off {
		t.Fatal("job ended with \"Machine removed.\" but its boards were never switched off")
	}
}

// TestGridFinalPowerOffResentAfterRestart: a job's final power-off cut
// short by a restart (bmp drops a request cut short by shutdown) is sent
// again when the controller asks for the operations in progress.
func TestGridFinalPowerOffResentAfterRestart(t *testing.T) {
	cfg := Config{GridExternalPower: true}
	g := newGridEnv(t, cfg, gridM("m", 1, 1))
	a := g.create(nil, func(r *arbiter.Request) { r.KeepaliveS = nil })
	in := g.intents()
	g.do(arbiter.GridPowerDone{ID: a.ID, Epoch: in[0].Epoch, Frame: 0})
	g.do(arbiter.GridDestroy{ID: a.ID})
	if in := g.intents(); len(in) != 1 || !in[0].Final {
		t.Fatalf("final power-off %+v", in)
	}
	// Stopped before the controller switched the boards off.
	g.restart(cfg)
	g.st.events = nil
	g.do(arbiter.GridPowerResend{})
	off := false
	for _, in := range g.intents() {
		if in.ID == a.ID && !in.On {
			off = true
		}
	}
	if !off {
		t.Fatal("after a restart the settling job's power-off is never asked again: its boards stay on")
	}
}

// TestGridRevivedBoardServesSingleBoardRequests: on a 1×1 machine with
// boards 1 and 2 dead, a job holds board 0, so its triad has no free live
// board. A reload revives boards 1 and 2: a one-board request is served on
// them at once, not after the job on board 0 ends.
func TestGridRevivedBoardServesSingleBoardRequests(t *testing.T) {
	dead := []arbiter.Board{{X: 0, Y: 0, Z: 1}, {X: 0, Y: 0, Z: 2}}
	g := newGridEnv(t, Config{}, gridM("m", 1, 1, dead...))
	never := func(r *arbiter.Request) { r.KeepaliveS = nil }
	a := g.create(nil, never)
	if a.State != arbiter.StatePower || a.Boards[0] != (arbiter.Board{}) {
		t.Fatalf("a: %s %v", a.State, a.Boards)
	}
	g.sync(0, 30*time.Second, gridM("m", 1, 1)) // boards 1 and 2 repaired
	if s := g.get(a.ID).State; s == arbiter.StateDestroyed {
		t.Fatal("a fault change ended a job")
	}
	b := g.create(nil, never)
	if got := g.get(b.ID); got.State == arbiter.StateQueued {
		t.Fatalf("one-board request queued while boards (0,0,1) and (0,0,2) are live and free: %v", arbiter.StrOr(got.WhyQueued, ""))
	}
}

// TestGridJobsOutliveGPUHistory: destroyed spalloc jobs are kept up to
// max_retired_jobs whatever GPU allocations end meanwhile: get_job_state
// still reports a job just destroyed (4, with its reason), not state 0.
func TestGridJobsOutliveGPUHistory(t *testing.T) {
	g := newGridEnv(t, Config{}, gridM("m", 1, 1))
	g.do(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{host("gpu", 1)}})
	a := g.create(nil)
	why := "done"
	g.do(arbiter.GridDestroy{ID: a.ID, Reason: &why})
	for i := 0; i < DefaultHistory; i++ {
		res := g.do(arbiter.Allocate{Request: arbiter.Request{Owner: "bob", GPUs: 1, KeepaliveS: ka(60)}}).(arbiter.Allocation)
		g.do(arbiter.Release{ID: res.ID})
	}
	if g.e.grids.maxRetired != 1200 {
		t.Fatalf("max_retired_jobs %d", g.e.grids.maxRetired)
	}
	res := g.do(arbiter.GridTouch{ID: a.ID})
	if res == nil {
		t.Fatal("the only destroyed grid job is forgotten (spalloc state 0) after GPU allocations ended, though max_retired_jobs is 1200")
	}
}

package ui

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// fakeNow is the time the fixtures are written around.
var fakeNow = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeReader is a Reader over fixed data, for rendering tests that need no
// server. (httpapi's tests exercise the dashboard through the real server.)
type fakeReader struct {
	machines []arbiter.MachineStatus
	allocs   []arbiter.Allocation
	records  map[string][]arbiter.Record
}

func (f *fakeReader) Machines() []arbiter.MachineStatus { return f.machines }
func (f *fakeReader) Allocations(arbiter.AllocationFilter) []arbiter.Allocation {
	return f.allocs
}
func (f *fakeReader) Allocation(id int64) (arbiter.Allocation, bool) {
	for _, a := range f.allocs {
		if a.ID == id {
			return a, true
		}
	}
	return arbiter.Allocation{}, false
}
func (f *fakeReader) Records(kind string) []arbiter.Record { return f.records[kind] }
func (f *fakeReader) Subscribe(ctx context.Context, _ int64) (<-chan arbiter.Event, error) {
	ch := make(chan arbiter.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}
func (f *fakeReader) Events(context.Context, int64, int) ([]arbiter.Event, error) {
	return nil, nil
}
func (f *fakeReader) LastSeq() int64 { return 0 }

func TestUIRenderHelpers(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		0: "just now", 4 * time.Second: "just now", 5 * time.Second: "5 s ago", 59 * time.Second: "59 s ago", time.Minute: "1 min ago", 59 * time.Minute: "59 min ago",
		time.Hour: "1 h ago", 47 * time.Hour: "47 h ago", 48 * time.Hour: "2 d ago", -20 * time.Second: "in 20 s", -999 * time.Millisecond: "just now", -time.Second: "in 1 s",
	} {
		if got := ago(now, now.Add(-d)); got != want {
			t.Errorf("ago(-%v) = %q, want %q", d, got, want)
		}
	}
	refs := func(m string, idx ...int) []arbiter.DeviceRef {
		var out []arbiter.DeviceRef
		for _, i := range idx {
			out = append(out, arbiter.DeviceRef{Machine: m, Index: i})
		}
		return out
	}
	for _, tt := range []struct {
		ds   []arbiter.DeviceRef
		want string
	}{
		{nil, "—"},
		{refs("gpu1", 3), "gpu1: 3"},
		{refs("gpu1", 1, 0), "gpu1: 0, 1"},
		{refs("gpu1", 0, 1, 2, 3, 6), "gpu1: 0–3, 6"},
		{append(refs("a", 0, 1, 2), refs("b", 5)...), "a: 0–2; b: 5"},
	} {
		if got := arbiter.DevicesText(tt.ds); got != tt.want {
			t.Errorf("devices(%v) = %q, want %q", tt.ds, got, tt.want)
		}
	}
	r := arbiter.Request{GPUs: 4, MinVRAMGiB: 40, Model: "*H100*", Tags: []string{"a", "b"}, Machine: "gpu1", MinCompute: "8.0", RequireCUDA: true}
	if got := wants(r); got != "4 GPUs · ≥ 40 GiB · model *H100* · compute ≥ 8.0 · CUDA · tags a, b · on gpu1" {
		t.Errorf("wants = %q", got)
	}
	ready, end := now, now.Add(90*time.Minute)
	if got := held(arbiter.Allocation{ReadyAt: &ready, DestroyedAt: &end}); got != "1 h 30 min" {
		t.Errorf("held = %q", got)
	}
	if got := held(arbiter.Allocation{DestroyedAt: &end}); got != "never placed" {
		t.Errorf("held of a never placed allocation = %q", got)
	}
	if got := shortModel("NVIDIA GeForce RTX 4090"); got != "RTX 4090" {
		t.Errorf("shortModel = %q", got)
	}
}

func TestUIOwnerColoursDoNotClash(t *testing.T) {
	v := &view{haveA: true}
	for i, o := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"} {
		v.allocs = append(v.allocs, arbiter.Allocation{ID: int64(i + 1), Owner: o, State: arbiter.StateReady})
	}
	seen := map[string]string{}
	for _, a := range v.allocs {
		c := v.OwnerClass(a.Owner)
		if other, ok := seen[c]; ok {
			t.Errorf("%s and %s share colour %s", a.Owner, other, c)
		}
		seen[c] = a.Owner
	}
	if v.OwnerClass("zed") != ownerClass("zed") {
		t.Errorf("an owner not on the page takes its own colour")
	}
}

func TestUIBoardMap(t *testing.T) {
	v := &view{ctx: context.Background(), plane: &fakeReader{}, Admin: true, Now: fakeNow}
	owner := "alice"
	id := int64(4)
	on := true
	live := map[int64]*arbiter.Allocation{4: {ID: 4, Owner: "alice", State: arbiter.StateReady, Power: &on, Boards: []arbiter.Board{{X: 1, Y: 0, Z: 1}}}}
	m := arbiter.MachineStatus{Name: "spin", Kind: arbiter.KindGrid, Grid: &arbiter.GridInfo{Width: 2, Height: 2}}
	for x := 0; x < 2; x++ {
		for y := 0; y < 2; y++ {
			for z := 0; z < 3; z++ {
				d := arbiter.DeviceStatus{Index: (x*2+y)*3 + z, Model: "board", Healthy: true,
					Board: &arbiter.BoardDevice{X: x, Y: y, Z: z, Cabinet: 0, Frame: 0, Slot: (x*2+y)*3 + z, IP: "10.0.0.1"}}
				switch {
				case x == 1 && y == 0 && z == 1:
					d.Allocation, d.Owner = &id, &owner
				case x == 0 && y == 1 && z == 2:
					d.Healthy, d.Board.Dead = false, true
				case x == 1 && y == 1 && z == 0:
					ended := int64(3)
					d.Allocation, d.Board.Settling = &ended, true
				}
				m.Devices = append(m.Devices, d)
			}
		}
	}
	bm := v.boardMap(&m, live)
	if len(bm.Rows) != 2 || bm.Rows[0].Y != 1 || bm.Rows[1].Y != 0 {
		t.Fatalf("rows %+v: want y = 1 on top", bm.Rows)
	}
	if bm.Free != 9 || bm.Held != 2 || bm.Dead != 1 || bm.Settling != 1 {
		t.Errorf("counts free %d held %d dead %d settling %d, want 9 2 1 1", bm.Free, bm.Held, bm.Dead, bm.Settling)
	}
	b := bm.Rows[1].Triads[1].Boards[1]
	if !strings.HasPrefix(b.Class, "gboard held o") || !strings.HasSuffix(b.Class, " pw-on") || b.Label != "#4" ||
		!strings.Contains(b.Title, "board (1,0,1)") || !strings.Contains(b.Title, "held by alice, allocation #4") {
		t.Errorf("held board %+v", b)
	}
	if b := bm.Rows[0].Triads[0].Boards[2]; b.Class != "gboard dead" || b.Label != "✕" {
		t.Errorf("dead board %+v", b)
	}
	if b := bm.Rows[0].Triads[1].Boards[0]; !strings.HasSuffix(b.Class, "pw-settling") || !strings.Contains(b.Title, "freed soon") {
		t.Errorf("settling board %+v", b)
	}
	if len(bm.Holders) != 2 || bm.Holders[0].ID != 3 || bm.Holders[1].Power != "on" || bm.Holders[0].Power != "settling" {
		t.Errorf("holders %+v", bm.Holders)
	}

	for _, tc := range []struct {
		a     *arbiter.Allocation
		power string
	}{
		{&arbiter.Allocation{State: arbiter.StatePower, Power: &on}, "switching on"},
		{&arbiter.Allocation{State: arbiter.StatePower, Power: new(bool)}, "switching off"},
		{&arbiter.Allocation{State: arbiter.StateReady, Power: new(bool)}, "off"},
		{&arbiter.Allocation{State: arbiter.StateReady, Power: &on}, "on"},
		{&arbiter.Allocation{State: arbiter.StateDestroyed}, "settling"},
		{nil, "settling"},
	} {
		if got := power(tc.a, false); got != tc.power {
			t.Errorf("power(%+v) = %q, want %q", tc.a, got, tc.power)
		}
	}
}

func TestUICoordHelpers(t *testing.T) {
	three := 3
	for _, tc := range []struct {
		r    arbiter.Request
		want string
	}{
		{arbiter.Request{Grid: &arbiter.GridRequest{}}, "1 board"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 8}, Machine: "spin5"}, "8 boards · on spin5"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Form: arbiter.GridBlock, Width: 2, Height: 1, RequireTorus: true}}, "2 × 1 triads · torus"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Form: arbiter.GridBoard, Board: arbiter.Board{X: 1, Z: 2}, MaxDeadBoards: &three}}, "board (1,0,2) · ≤ 3 dead boards"},
		{arbiter.Request{Pool: "small"}, "a slot of pool small"},
		{arbiter.Request{GPUs: 2}, "2 GPUs"},
	} {
		if got := wants(tc.r); got != tc.want {
			t.Errorf("wants(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
	spin := "spin5"
	if got := holds(arbiter.Allocation{Machine: &spin, Boards: make([]arbiter.Board, 6)}); got != "spin5: 6 boards" {
		t.Errorf("holds grid = %q", got)
	}
	if got := holds(arbiter.Allocation{Devices: []arbiter.DeviceRef{{Machine: "gpu1", Index: 0}, {Machine: "gpu1", Index: 1}}}); got != "gpu1: 0, 1" {
		t.Errorf("holds GPUs = %q", got)
	}
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond: "850 ms", 42 * time.Second: "42 s", 3 * time.Minute: "3 min",
		185 * time.Second: "3 min 5 s", 130 * time.Minute: "2 h 10 min", -time.Second: "—",
	} {
		if got := duration(d); got != want {
			t.Errorf("duration(%v) = %q, want %q", d, got, want)
		}
	}
	rc := 1
	fin := fakeNow.Add(90 * time.Second)
	s := swap{State: arbiter.SwapFailed, ReturnCode: &rc, Reason: "the swap command exited with status 1", CreatedAt: fakeNow, FinishedAt: &fin, Forced: true}
	if got := s.Result(); got != "exit 1 · the swap command exited with status 1 · forced past the lock" {
		t.Errorf("Result = %q", got)
	}
	if got := s.Took(); got != "1 min 30 s" {
		t.Errorf("Took = %q", got)
	}
	for _, tc := range []struct {
		d    delivery
		want string
	}{
		{delivery{Last: &arbiter.DeliveryAttempt{Status: 200}}, "200 OK"},
		{delivery{Last: &arbiter.DeliveryAttempt{Status: 500, Error: "the receiver answered 500 Internal Server Error"}}, "500 Internal Server Error"},
		{delivery{Last: &arbiter.DeliveryAttempt{Status: 410, Error: "the receiver answered 410 Gone: the subscription is disabled"}}, "410 Gone · the subscription is disabled"},
		{delivery{Last: &arbiter.DeliveryAttempt{Error: "dial tcp 10.0.0.7:80: connection refused"}}, "dial tcp 10.0.0.7:80: connection refused"},
		{delivery{Delivery: arbiter.Delivery{LastError: "subscription deleted"}}, "subscription deleted"},
	} {
		if got := tc.d.Outcome(); got != tc.want {
			t.Errorf("Outcome(%+v) = %q, want %q", tc.d.Last, got, tc.want)
		}
	}
}

// TestTilesShowGroundTruth: a tile shows what the agent saw on its GPU —
// utilisation and memory, the processes (on hover and on tap), an idle
// holder, an unmanaged process, and the releasing, unhealthy and drained
// states each in a style of its own.
func TestTilesShowGroundTruth(t *testing.T) {
	util := 87
	alloc := int64(7)
	idle := fakeNow.Add(-2 * time.Hour)
	since := fakeNow.Add(-time.Minute)
	m := arbiter.MachineStatus{Name: "gpu1", Kind: arbiter.KindGPU, Devices: []arbiter.DeviceStatus{
		{Index: 0, Model: "NVIDIA H100", VRAMGiB: 80, Healthy: true, State: arbiter.GPUHeld, Allocation: &alloc, Owner: arbiter.Str("alice"), Since: &since,
			Usage: &arbiter.GPUUsage{UtilPct: &util, MemUsedMiB: 61230, MemTotalMiB: 81559, SampledAt: fakeNow,
				Processes: []arbiter.GPUProcess{{PID: 4242, User: "alice", MemMiB: 61000, Command: "python train.py", Allocation: &alloc}}}},
		{Index: 1, Model: "NVIDIA H100", VRAMGiB: 80, Healthy: true, State: arbiter.GPUReleasing, StateReason: "allocation 5 ended (released); waiting for its processes to stop"},
		{Index: 2, Model: "NVIDIA H100", VRAMGiB: 80, State: arbiter.GPUUnhealthy, StateReason: "XID 79: GPU has fallen off the bus"},
		{Index: 3, Model: "NVIDIA H100", VRAMGiB: 80, Healthy: true, State: arbiter.GPUDrained, StateReason: "fan"},
		{Index: 4, Model: "NVIDIA H100", VRAMGiB: 80, Healthy: true, State: arbiter.GPUFree, Unmanaged: true,
			Usage: &arbiter.GPUUsage{MemUsedMiB: 2048, SampledAt: fakeNow, Processes: []arbiter.GPUProcess{{PID: 99, User: "mallory", MemMiB: 2048, Command: "miner"}}}},
	}}
	r := &fakeReader{machines: []arbiter.MachineStatus{m},
		allocs: []arbiter.Allocation{{ID: 7, Owner: "alice", State: arbiter.StateReady, IdleSince: &idle}}}
	v := &view{ctx: context.Background(), plane: r, Now: fakeNow}
	d, _ := machinesData(v)
	html := string(d.(machines).List[0].Tiles)
	for _, want := range []string{
		`class="gpu held o`, ` idle"`, `<span class="flag flag-idle">idle</span>`,
		`<span class="bar u8" aria-hidden="true"></span><span class="use-text">87% · 59.8/80 GiB</span>`,
		`<summary title="its processes">1 proc</summary><ul><li>pid 4242 · alice · 59.6 GiB · python train.py · allocation 7</li></ul>`,
		`class="gpu releasing"`, `<span class="gpu-owner gpu-state">releasing</span>`, `waiting for its processes to stop`,
		`class="gpu unhealthy"`, `XID 79: GPU has fallen off the bus`,
		`class="gpu drained"`, `<span class="gpu-line gpu-why">fan</span>`,
		`class="gpu free foreign"`, `<span class="flag flag-foreign">unmanaged</span>`, `pid 99 · mallory · 2.0 GiB · miner · not attributed`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("tiles lack %q:\n%s", want, html)
		}
	}
}

// TestQueueFollowsEnginePositions: the waiting panel shows the engine's
// positions, in their order; requests without one (a pool slot waiting
// for its backing) come after, marked "–"; the group column is there only
// when groups are.
func TestQueueFollowsEnginePositions(t *testing.T) {
	pos := func(n int) *int { return &n }
	at := func(m int) time.Time { return fakeNow.Add(time.Duration(m) * time.Minute) }
	r := &fakeReader{allocs: []arbiter.Allocation{
		{ID: 4, Owner: "alice", State: arbiter.StateQueued, Position: pos(1), CreatedAt: at(1)},
		{ID: 9, Owner: "alice", State: arbiter.StateQueued, CreatedAt: at(2)}, // a slot
		{ID: 14, Owner: "bob", State: arbiter.StateQueued, Position: pos(2), CreatedAt: at(3)},
		{ID: 8, Owner: "bob", State: arbiter.StateQueued, Position: pos(3), CreatedAt: at(0), Request: arbiter.Request{Priority: 9}},
	}}
	v := &view{ctx: context.Background(), plane: r, Now: fakeNow}
	d, _ := queueData(v)
	q := d.(queue)
	var got []string
	for _, row := range q.Rows {
		got = append(got, row.Pos+"→#"+strconv.FormatInt(row.ID, 10))
	}
	if want := "1→#4 2→#14 3→#8 –→#9"; strings.Join(got, " ") != want {
		t.Fatalf("queue %s, want %s", strings.Join(got, " "), want)
	}
	if q.Groups {
		t.Fatal("a group column without groups")
	}
}

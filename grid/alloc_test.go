package grid

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func newAlloc(t testing.TB, w, h int, dead []arbiter.Board, links []arbiter.BoardLink) *Allocator {
	t.Helper()
	a, err := NewAllocator(w, h, dead, links)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func intp(n int) *int { return &n }

// TestSpecExamples runs the examples of docs/reference/spalloc.md §4.
func TestSpecExamples(t *testing.T) {
	t.Run("eight triads then queue", func(t *testing.T) {
		a := newAlloc(t, 4, 2, nil, nil)
		want := [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 0}, {3, 1}}
		r := arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1, Height: 1}
		for i, xy := range want {
			p := a.Allocate(int64(i+1), &r)
			if p == nil || p.X != xy[0] || p.Y != xy[1] || len(p.Boards) != 3 {
				t.Fatalf("request %d: got %+v, want triad %v", i+1, p, xy)
			}
		}
		if p := a.Allocate(9, &r); p != nil {
			t.Fatalf("ninth request placed at %+v on a full machine", p)
		}
		if !a.Possible(&r) {
			t.Errorf("a 1×1 request is possible on the machine (it waits)")
		}
	})
	t.Run("five single boards", func(t *testing.T) {
		a := newAlloc(t, 4, 2, nil, nil)
		want := []arbiter.Board{bd(0, 0, 0), bd(0, 0, 1), bd(0, 0, 2), bd(0, 1, 0), bd(0, 1, 1)}
		for i, b := range want {
			r := arbiter.GridRequest{}
			p := a.Allocate(int64(i+1), &r)
			if p == nil || !reflect.DeepEqual(p.Boards, []arbiter.Board{b}) || !p.Single || p.WidthChips != 8 || len(p.Periphery) != 6 {
				t.Fatalf("single board %d: got %+v, want %v", i+1, p, b)
			}
		}
	})
	t.Run("over-allocation makes up for dead boards", func(t *testing.T) {
		a := newAlloc(t, 4, 2, []arbiter.Board{bd(0, 0, 2)}, nil)
		r23 := arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 23, MaxDeadBoards: intp(0)}
		r24 := arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 24, MaxDeadBoards: intp(0)}
		if a.Possible(&r24) {
			t.Errorf("24 boards with max_dead_boards=0 possible on 23 live boards")
		}
		if !a.Possible(&r23) {
			t.Fatalf("23 boards with max_dead_boards=0 impossible")
		}
		p := a.Allocate(1, &r23)
		if p == nil || len(p.Boards) != 23 || p.Width != 4 || p.Height != 2 || p.Torus != WrapBoth || p.WidthChips != 48 || p.HeightChips != 24 {
			t.Fatalf("23 boards: got %+v, want the whole machine as a torus", p)
		}
	})
	t.Run("torus only for the whole machine", func(t *testing.T) {
		a := newAlloc(t, 4, 2, nil, nil)
		if a.Possible(&arbiter.GridRequest{Form: arbiter.GridBlock, Width: 2, Height: 2, RequireTorus: true}) {
			t.Errorf("a 2×2 torus possible on a 4×2 machine")
		}
		r := arbiter.GridRequest{Form: arbiter.GridBlock, Width: 4, Height: 2, RequireTorus: true}
		if p := a.Allocate(1, &r); p == nil || p.Torus != WrapBoth || len(p.Periphery) != 0 {
			t.Errorf("whole-machine torus: %+v", p)
		}
	})
	t.Run("specific board", func(t *testing.T) {
		a := newAlloc(t, 2, 2, []arbiter.Board{bd(1, 1, 1)}, nil)
		for _, b := range []arbiter.Board{bd(1, 1, 1), bd(2, 0, 0), bd(0, 0, 3), bd(-1, 0, 0)} {
			if a.Possible(&arbiter.GridRequest{Form: arbiter.GridBoard, Board: b}) {
				t.Errorf("board %v possible (dead or off the machine)", b)
			}
		}
		r := arbiter.GridRequest{Form: arbiter.GridBoard, Board: bd(1, 0, 2)}
		p := a.Allocate(1, &r)
		if p == nil || p.Boards[0] != bd(1, 0, 2) {
			t.Fatalf("specific board: %+v", p)
		}
		if a.Allocate(2, &r) != nil {
			t.Errorf("the same board twice")
		}
		// The rest of its triad serves single boards.
		if p := a.Allocate(3, &arbiter.GridRequest{}); p == nil || p.Boards[0] != bd(1, 0, 0) {
			t.Errorf("single board after a specific one: %+v, want (1,0,0)", p)
		}
		// A block cannot take that triad.
		if p := a.Allocate(4, &arbiter.GridRequest{Form: arbiter.GridBlock, Width: 2, Height: 2}); p != nil {
			t.Errorf("2×2 block over a triad serving single boards: %+v", p)
		}
		if a.Holder(bd(1, 0, 2)) != 1 || a.Holder(bd(1, 0, 0)) != 3 || a.Holder(bd(0, 0, 0)) != 0 {
			t.Errorf("holders: %d %d %d", a.Holder(bd(1, 0, 2)), a.Holder(bd(1, 0, 0)), a.Holder(bd(0, 0, 0)))
		}
	})
	t.Run("dead links", func(t *testing.T) {
		// Cut board (0,0,0) off from the rest of its triad in both
		// directions: a 1×1 block then holds only (0,0,0).
		var links []arbiter.BoardLink
		for l := arbiter.Link(0); l < arbiter.NumLinks; l++ {
			links = append(links, arbiter.BoardLink{Board: bd(0, 0, 0), Link: l})
		}
		a := newAlloc(t, 2, 1, nil, links)
		r := arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1, Height: 1}
		p := a.Allocate(1, &r)
		if p == nil || len(p.Boards) != 1 || p.Boards[0] != bd(0, 0, 0) {
			t.Fatalf("block behind dead links: %+v", p)
		}
		strict := arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1, Height: 1, MaxDeadBoards: intp(0)}
		if p := a.Allocate(2, &strict); p == nil || p.X != 1 {
			t.Errorf("max_dead_boards=0 should skip the cut-off triad: %+v", p)
		}
	})
}

func TestGridRequestForms(t *testing.T) {
	tests := []struct {
		args []int
		want arbiter.GridRequest
	}{
		{nil, arbiter.GridRequest{Form: arbiter.GridOneBoard}},
		{[]int{1}, arbiter.GridRequest{Form: arbiter.GridOneBoard}},
		{[]int{4}, arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 4}},
		{[]int{0}, arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 0}},
		{[]int{2, 3}, arbiter.GridRequest{Form: arbiter.GridBlock, Width: 2, Height: 3}},
		{[]int{1, 2, 0}, arbiter.GridRequest{Form: arbiter.GridBoard, Board: bd(1, 2, 0)}},
	}
	for _, tt := range tests {
		var got arbiter.GridRequest
		err := got.ParseGridArgs(tt.args)
		if tt.args == nil {
			tt.args = []int{}
		}
		tt.want.Args = tt.args
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseGridArgs(%v) = %+v, %v; want %+v", tt.args, got, err, tt.want)
		}
		if tt.want.Form != arbiter.GridOneBoard && !slices.Equal(got.FormArgs(), tt.args) {
			t.Errorf("FormArgs() = %v, want %v", got.FormArgs(), tt.args)
		}
		raw, _ := json.Marshal(got)
		var back arbiter.GridRequest
		if err := json.Unmarshal(raw, &back); err != nil || !reflect.DeepEqual(back, got) {
			t.Errorf("%s decodes to %+v, %v; want %+v", raw, back, err, got)
		}
	}
	if err := new(arbiter.GridRequest).ParseGridArgs([]int{1, 2, 3, 4}); err == nil {
		t.Errorf("four arguments accepted")
	}
	if err := json.Unmarshal([]byte(`{"args":[1,2,3,4]}`), new(arbiter.GridRequest)); err == nil {
		t.Errorf("four arguments decoded")
	}
	for _, r := range []arbiter.GridRequest{
		{Form: arbiter.GridOneBoard, RequireTorus: true},
		{Form: arbiter.GridBoard, RequireTorus: true},
	} {
		if err := r.Validate(); err == nil || err.Error() != arbiter.GridErrTorusBoards {
			t.Errorf("%v with require_torus: %v, want %q", r.Form, err, arbiter.GridErrTorusBoards)
		}
	}
	if err := (&arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 3, MinRatio: -1}).Validate(); err == nil {
		t.Errorf("negative min_ratio accepted")
	}
	// Impossible is not malformed.
	for _, r := range []arbiter.GridRequest{{Form: arbiter.GridBoards, Boards: -5}, {Form: arbiter.GridBlock, Width: 0, Height: 9}, {Form: arbiter.GridBoard, Board: bd(-1, 0, 7)}} {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
		a := newAlloc(t, 2, 2, nil, nil)
		if a.Possible(&r) || a.Allocate(1, &r) != nil {
			t.Errorf("%+v is possible", r)
		}
	}
	huge := arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 1 << 62}
	if newAlloc(t, 2, 2, nil, nil).Possible(&huge) {
		t.Errorf("2^62 boards possible")
	}
}

// snapshot is the observable state of an allocator, to check that a
// failing Allocate changes nothing.
func snapshot(a *Allocator) string {
	return fmt.Sprint(a.tree.nodes, a.tree.spare, a.single, a.shared, a.holder, len(a.held))
}

// TestAllocatorProperties drives random requests and frees on random
// machines and checks the invariants after every step: no board is held
// twice, held boards are live, holders match placements, a refused request
// changes nothing, blocks stay inside the machine and do not overlap, and
// freeing everything gives back the empty tree.
func TestAllocatorProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for round := 0; round < 60; round++ {
		w, h := 1+rng.IntN(8), 1+rng.IntN(8)
		var dead []arbiter.Board
		var links []arbiter.BoardLink
		for i := rng.IntN(w * h); i > 0; i-- {
			dead = append(dead, bd(rng.IntN(w), rng.IntN(h), rng.IntN(3)))
			links = append(links, arbiter.BoardLink{Board: bd(rng.IntN(w), rng.IntN(h), rng.IntN(3)), Link: arbiter.Link(rng.IntN(6))})
		}
		a := newAlloc(t, w, h, dead, links)
		isDead := map[arbiter.Board]bool{}
		for _, d := range dead {
			isDead[d] = true
		}
		empty := snapshot(a)
		live := map[int64]bool{}
		for id := int64(1); id <= 300; id++ {
			if len(live) > 0 && rng.IntN(3) == 0 {
				var ids []int64
				for k := range live {
					ids = append(ids, k)
				}
				slices.Sort(ids)
				k := ids[rng.IntN(len(ids))]
				if !a.Free(k) || a.Free(k) {
					t.Fatalf("free %d: not exactly once", k)
				}
				delete(live, k)
			}
			r := randomRequest(rng, w, h)
			before := snapshot(a)
			p := a.Allocate(id, &r)
			if p == nil {
				if snapshot(a) != before {
					t.Fatalf("round %d: refused %+v changed the state", round, r)
				}
				continue
			}
			live[id] = true
			if !a.Possible(&r) && r.Form != arbiter.GridBlock && r.Form != arbiter.GridBoards {
				t.Fatalf("placed %+v that Possible rejects", r)
			}
			checkInvariants(t, a, live, isDead)
		}
		for id := range live {
			a.Free(id)
		}
		if got := snapshot(a); got != empty && !emptyTree(a) {
			t.Fatalf("round %d: after freeing everything the tree is %v", round, a.tree.nodes)
		}
	}
}

func emptyTree(a *Allocator) bool {
	n := a.tree.nodes[root]
	return n.kids[0] < 0 && !n.allocated && len(a.shared) == 0 && a.Len() == 0
}

func randomRequest(rng *rand.Rand, w, h int) arbiter.GridRequest {
	var r arbiter.GridRequest
	switch rng.IntN(4) {
	case 0:
		r.Form = arbiter.GridOneBoard
	case 1:
		r = arbiter.GridRequest{Form: arbiter.GridBoards, Boards: rng.IntN(3*w*h + 3), MinRatio: []float64{0, 0.333, 0.5, 1}[rng.IntN(4)]}
	case 2:
		r = arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1 + rng.IntN(w), Height: 1 + rng.IntN(h)}
	case 3:
		r = arbiter.GridRequest{Form: arbiter.GridBoard, Board: bd(rng.IntN(w), rng.IntN(h), rng.IntN(3))}
	}
	if r.Form == arbiter.GridBoards || r.Form == arbiter.GridBlock {
		if rng.IntN(3) == 0 {
			r.MaxDeadBoards = intp(rng.IntN(4))
		}
		if rng.IntN(3) == 0 {
			r.MaxDeadLinks = intp(rng.IntN(4))
		}
		r.RequireTorus = rng.IntN(8) == 0
	}
	return r
}

func checkInvariants(t *testing.T, a *Allocator, live map[int64]bool, isDead map[arbiter.Board]bool) {
	t.Helper()
	held := map[arbiter.Board]int64{}
	blocks := map[[2]int]int64{}
	for id := range live {
		p := a.Placement(id)
		if p == nil {
			t.Fatalf("allocation %d has no placement", id)
		}
		for _, b := range p.Boards {
			if other, dup := held[b]; dup {
				t.Fatalf("board %v held by %d and %d", b, other, id)
			}
			if isDead[b] {
				t.Fatalf("dead board %v held by %d", b, id)
			}
			if a.Holder(b) != id {
				t.Fatalf("Holder(%v) = %d, want %d", b, a.Holder(b), id)
			}
			held[b] = id
		}
		if p.Single {
			continue
		}
		for x := p.X; x < p.X+p.Width; x++ {
			for y := p.Y; y < p.Y+p.Height; y++ {
				if x < 0 || y < 0 || x >= a.w || y >= a.h {
					t.Fatalf("block of %d off the machine: %+v", id, p)
				}
				if other, dup := blocks[[2]int{x, y}]; dup {
					t.Fatalf("triad (%d,%d) in blocks of %d and %d", x, y, other, id)
				}
				blocks[[2]int{x, y}] = id
			}
		}
	}
	for id := range live {
		if p := a.Placement(id); p.Single {
			if other, dup := blocks[[2]int{p.X, p.Y}]; dup && !a.Placement(other).Single {
				t.Fatalf("single board %d in the block of %d", id, other)
			}
		}
	}
}

// TestRestore rebuilds allocators from stored placements after random
// histories and checks that they hold the same boards and keep allocating
// without overlap.
func TestRestore(t *testing.T) {
	dead := []arbiter.Board{bd(1, 1, 1)}
	isDead := map[arbiter.Board]bool{bd(1, 1, 1): true}
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 6))
		w, h := 2+rng.IntN(6), 2+rng.IntN(6)
		a := newAlloc(t, w, h, dead, nil)
		var live []int64
		for id := int64(1); id <= 80; id++ {
			r := randomRequest(rng, w, h)
			if a.Allocate(id, &r) != nil {
				live = append(live, id)
			}
			if id%3 == 0 && len(live) > 0 {
				k := rng.IntN(len(live))
				a.Free(live[k])
				live = slices.Delete(live, k, k+1)
			}
		}
		var held []Held
		for i := len(live) - 1; i >= 0; i-- { // any order
			held = append(held, Held{ID: live[i], Placement: a.Placement(live[i])})
		}
		b := newAlloc(t, w, h, dead, nil)
		if err := b.Restore(held); err != nil {
			t.Fatalf("seed %d: restore: %v", seed, err)
		}
		if !reflect.DeepEqual(a.holder, b.holder) {
			t.Fatalf("seed %d: restored holders differ", seed)
		}
		if err := b.Restore(held); err == nil {
			t.Fatalf("restoring into a non-empty allocator accepted")
		}
		set := map[int64]bool{}
		for _, id := range live {
			set[id] = true
		}
		checkInvariants(t, b, set, isDead)
		for id := int64(100); id < 160; id++ {
			r := randomRequest(rng, w, h)
			if b.Allocate(id, &r) != nil {
				set[id] = true
			}
			checkInvariants(t, b, set, isDead)
		}
		for id := range set {
			b.Free(id)
		}
		if !emptyTree(b) {
			t.Fatalf("seed %d: freeing everything after a restore left %v", seed, b.tree.nodes[root])
		}
	}

	// Bad input leaves the allocator empty.
	one := func(x, y, w, h int, boards ...arbiter.Board) *Placement {
		return &Placement{X: x, Y: y, Width: w, Height: h, Boards: boards}
	}
	for name, held := range map[string][]Held{
		"overlap":   {{1, one(0, 0, 2, 1, bd(0, 0, 0))}, {2, one(1, 0, 1, 2, bd(1, 1, 0))}},
		"same held": {{1, one(0, 0, 1, 1, bd(0, 0, 0))}, {2, one(1, 0, 1, 1, bd(0, 0, 0))}},
		"off":       {{1, one(5, 0, 1, 1)}},
		"outside":   {{1, one(0, 0, 1, 1, bd(1, 0, 0))}},
		"repeated":  {{1, one(0, 0, 1, 1)}, {1, one(1, 0, 1, 1)}},
		"zero id":   {{0, one(0, 0, 1, 1)}},
		"pinwheel": { // blocks no straight cut separates
			{1, one(0, 0, 2, 1)}, {2, one(2, 0, 1, 2)}, {3, one(1, 2, 2, 1)}, {4, one(0, 1, 1, 2)},
		},
	} {
		c := newAlloc(t, 3, 3, nil, nil)
		if err := c.Restore(held); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if !emptyTree(c) || slices.ContainsFunc(c.holder, func(h int64) bool { return h != 0 }) {
			t.Errorf("%s: a failed restore left state", name)
		}
	}
}

func TestSetFaults(t *testing.T) {
	a := newAlloc(t, 1, 1, nil, nil)
	p := a.Allocate(1, &arbiter.GridRequest{})
	if p == nil || p.Boards[0] != bd(0, 0, 0) {
		t.Fatalf("first board: %+v", p)
	}
	// Board 1 dies while board 0 is held: the next single board is 2.
	if err := a.SetFaults([]arbiter.Board{bd(0, 0, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if p := a.Allocate(2, &arbiter.GridRequest{}); p == nil || p.Boards[0] != bd(0, 0, 2) {
		t.Fatalf("after a board died: %+v, want (0,0,2)", p)
	}
	if p := a.Allocate(3, &arbiter.GridRequest{}); p != nil {
		t.Fatalf("a dead board was handed out: %+v", p)
	}
	a.Free(1)
	a.Free(2)
	if !emptyTree(a) {
		t.Errorf("the triad did not return to the tree once its held boards were freed")
	}
	if err := a.SetFaults([]arbiter.Board{bd(1, 0, 0)}, nil); err == nil {
		t.Errorf("dead board off the machine accepted")
	}
	if _, err := NewAllocator(0, 1, nil, nil); err == nil {
		t.Errorf("0×1 machine accepted")
	}
}

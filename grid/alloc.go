package grid

import (
	"fmt"
	"slices"

	"github.com/arbiter-hq/arbiter"
)

// Placement is what one allocation holds on a grid machine.
type Placement struct {
	// Single is set for the one-board forms: the board came from a triad
	// shared with other single boards.
	Single bool `json:"single,omitempty"`
	// X, Y, Width, Height give the block of triads taken from the machine:
	// for Single, the board's triad (1×1).
	X      int `json:"x"`
	Y      int `json:"y"`
	Width  int `json:"width"`
	Height int `json:"height"`
	// Boards are the boards held, sorted: for a block, the live boards
	// reachable from its bottom-left board over live links inside it.
	Boards []arbiter.Board `json:"boards"`
	// Torus says over which axes the boards connect around the machine.
	Torus Wrap `json:"torus"`
	// Periphery lists, sorted, the links leaving the boards (to boards not
	// held), which are disabled while the allocation runs.
	Periphery []arbiter.BoardLink `json:"periphery"`
	// WidthChips and HeightChips are the size of the held system in chips:
	// 8×8 for one board, else BlockChips of the boards' bounding triads.
	WidthChips  int `json:"width_chips"`
	HeightChips int `json:"height_chips"`
}

// Origin is the placement's first board, to which chip coordinates of the
// allocation are relative.
func (p *Placement) Origin() arbiter.Board {
	if len(p.Boards) == 0 {
		return arbiter.Board{}
	}
	return p.Boards[0]
}

// ChipOf returns the Ethernet chip of board b relative to the placement's
// origin, as a client booting the allocation sees it.
func (p *Placement) ChipOf(b arbiter.Board) (x, y int) {
	o := p.Origin()
	return BoardToChip(arbiter.Board{X: b.X - o.X, Y: b.Y - o.Y, Z: b.Z - o.Z})
}

// Allocator is the board allocation state of one grid machine: which boards
// each allocation holds, the partition tree the reference packs blocks
// with, and the triads shared by single boards. It reproduces the
// reference's placements (docs/reference/spalloc.md §4), so that the same sequence of requests
// and frees lands on the same boards.
//
// The allocator does not queue: the caller decides which request to try
// when (strict order or backfill) and calls Allocate; a request that does
// not fit changes nothing. It is not safe for concurrent use; the engine
// owns one per machine.
type Allocator struct {
	w, h int
	// Per board, indexed by (x*h + y)*3 + z.
	dead      []bool
	deadLinks []uint8 // bit l: link l of the board is dead
	nbr       []int32 // nbr[b*6+l]: the board over link l
	nwrap     []Wrap  // nwrap[b*6+l]: over which axes that link wraps
	bx, by    []int32 // the board's triad coordinates
	holder    []int64 // the allocation holding the board, 0 if none

	tree *tree
	// Per triad, indexed by x*h + y: single-board bookkeeping.
	single []singleTriad
	// shared lists, in the order they became available, the single-board
	// triads that had a free live board when last looked at.
	shared []int32

	held map[int64]*holding

	// Scratch of the candidate test.
	mark  []uint32
	gen   uint32
	queue []int32
	last  struct {
		wrap      Wrap
		periphery int
	}

	// pickZ, when set (by the placement replay test only), chooses the z
	// of a single board taken from a shared triad instead of the lowest
	// free one (lowest): the reference's choice, so that the replay's state
	// stays in step with the reference's after such a choice.
	pickZ func(triad arbiter.Board, lowest int) int
}

type singleTriad struct {
	node   int32 // the triad's tree leaf; -1 when not a single-board triad
	held   uint8 // bit z: board z is held
	listed bool  // in Allocator.shared
}

type holding struct {
	p     Placement
	node  int32 // tree leaf (block) or -1 (single: the triad's leaf is shared)
	board int32 // single: the board's index
}

// NewAllocator returns the empty allocation state of a machine of w×h
// triads with the given dead boards and dead links (one direction each).
// Errors: a size outside 1..MaxSide, a dead board or link off the machine.
func NewAllocator(w, h int, deadBoards []arbiter.Board, deadLinks []arbiter.BoardLink) (*Allocator, error) {
	if err := arbiter.CheckGridSize(w, h); err != nil {
		return nil, err
	}
	n := w * h * 3
	a := &Allocator{
		w: w, h: h,
		dead:      make([]bool, n),
		deadLinks: make([]uint8, n),
		nbr:       make([]int32, n*arbiter.NumLinks),
		nwrap:     make([]Wrap, n*arbiter.NumLinks),
		holder:    make([]int64, n),
		bx:        make([]int32, n),
		by:        make([]int32, n),
		tree:      newTree(w, h),
		single:    make([]singleTriad, w*h),
		held:      map[int64]*holding{},
		mark:      make([]uint32, n),
		queue:     make([]int32, 0, n),
	}
	for i := range a.single {
		a.single[i].node = -1
	}
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				b := arbiter.Board{X: x, Y: y, Z: z}
				i := a.index(b)
				a.bx[i], a.by[i] = int32(x), int32(y)
				for l := arbiter.Link(0); l < arbiter.NumLinks; l++ {
					nb, wrap := Neighbour(w, h, b, l)
					a.nbr[int(i)*arbiter.NumLinks+int(l)] = a.index(nb)
					a.nwrap[int(i)*arbiter.NumLinks+int(l)] = wrap
				}
			}
		}
	}
	if err := a.SetFaults(deadBoards, deadLinks); err != nil {
		return nil, err
	}
	return a, nil
}

// Width is the machine's width in triads.
func (a *Allocator) Width() int { return a.w }

// Height is the machine's height in triads.
func (a *Allocator) Height() int { return a.h }

// SetFaults replaces the dead boards and links, as a configuration reload
// that changes only them does. Allocations keep their boards; later
// requests see the new faults. Errors (and nothing changes): a board or
// link off the machine.
func (a *Allocator) SetFaults(deadBoards []arbiter.Board, deadLinks []arbiter.BoardLink) error {
	for _, b := range deadBoards {
		if !arbiter.GridContains(a.w, a.h, b) {
			return fmt.Errorf("dead board %v is not on the %d×%d machine", b, a.w, a.h)
		}
	}
	for _, l := range deadLinks {
		if !arbiter.GridContains(a.w, a.h, l.Board) || l.Link >= arbiter.NumLinks {
			return fmt.Errorf("dead link %v is not on the %d×%d machine", l, a.w, a.h)
		}
	}
	clear(a.dead)
	clear(a.deadLinks)
	for _, b := range deadBoards {
		a.dead[a.index(b)] = true
	}
	for _, l := range deadLinks {
		a.deadLinks[a.index(l.Board)] |= 1 << l.Link
	}
	// A triad serving single boards is listed while it has a free live
	// board: boards revived or newly dead change which do.
	for t := range a.single {
		st := &a.single[t]
		switch free := a.freeZ(int32(t)) >= 0; {
		case st.held == 0:
		case free && !st.listed:
			st.listed = true
			a.shared = append(a.shared, int32(t))
		case !free && st.listed:
			a.unlist(int32(t))
		}
	}
	return nil
}

func (a *Allocator) index(b arbiter.Board) int32 { return int32((b.X*a.h+b.Y)*3 + b.Z) }

func (a *Allocator) board(i int32) arbiter.Board {
	t := int(i) / 3
	return arbiter.Board{X: t / a.h, Y: t % a.h, Z: int(i) % 3}
}

// Holder returns the allocation holding board b, or 0.
func (a *Allocator) Holder(b arbiter.Board) int64 {
	if !arbiter.GridContains(a.w, a.h, b) {
		return 0
	}
	return a.holder[a.index(b)]
}

// Placement returns what allocation id holds, or nil.
func (a *Allocator) Placement(id int64) *Placement {
	if h := a.held[id]; h != nil {
		return &h.p
	}
	return nil
}

// Len is the number of allocations holding boards.
func (a *Allocator) Len() int { return len(a.held) }

// constraints are a request's limits on a candidate block.
type constraints struct {
	maxDeadBoards, maxDeadLinks *int
	torus                       bool
	expected                    int // boards a block should have; 0: 3 per triad
}

func requestConstraints(r *arbiter.GridRequest) constraints {
	c := constraints{maxDeadBoards: r.MaxDeadBoards, maxDeadLinks: r.MaxDeadLinks, torus: r.RequireTorus}
	if r.Form == arbiter.GridBoards {
		c.expected = r.Boards
	}
	return c
}

// check is the reference's candidate test of the block of w×h triads at
// (x, y): the boards reachable from (x, y, 0) over live links to live boards
// inside the block; at most maxDeadBoards missing from the expected count
// (and at least one); with torus, a link around the machine; at most
// maxDeadLinks dead links between those boards (plus dead wrap-around links
// with torus). On success the boards are in a.queue and marked with a.gen.
func (a *Allocator) check(x, y, w, h int, c *constraints) bool {
	a.gen++
	if a.gen == 0 {
		clear(a.mark)
		a.gen = 1
	}
	gen := a.gen
	q := a.queue[:0]
	start := a.index(arbiter.Board{X: x, Y: y})
	if !a.dead[start] {
		a.mark[start] = gen
		q = append(q, start)
	}
	for i := 0; i < len(q); i++ {
		b := q[i]
		dl := a.deadLinks[b]
		for l := 0; l < arbiter.NumLinks; l++ {
			if dl&(1<<l) != 0 {
				continue
			}
			t := a.nbr[int(b)*arbiter.NumLinks+l]
			if a.mark[t] == gen || a.dead[t] {
				continue
			}
			tx, ty := int(a.bx[t]), int(a.by[t])
			if tx < x || tx >= x+w || ty < y || ty >= y+h {
				continue
			}
			a.mark[t] = gen
			q = append(q, t)
		}
	}
	a.queue = q
	alive := len(q)
	if alive == 0 {
		return false
	}
	if c.maxDeadBoards != nil {
		expected := c.expected
		if expected == 0 {
			expected = 3 * w * h
		}
		if expected-alive > *c.maxDeadBoards {
			return false
		}
	}
	var wrap Wrap
	dead, deadWrap, periphery := 0, 0, 0
	for _, b := range q {
		dl := a.deadLinks[b]
		for l := 0; l < arbiter.NumLinks; l++ {
			k := int(b)*arbiter.NumLinks + l
			if a.mark[a.nbr[k]] != gen {
				periphery++
				continue
			}
			wr := a.nwrap[k]
			wrap |= wr
			if dl&(1<<l) != 0 {
				if wr != 0 {
					deadWrap++
				} else {
					dead++
				}
			}
		}
	}
	if c.torus && wrap == WrapNone {
		return false
	}
	if c.maxDeadLinks != nil {
		if c.torus {
			dead += deadWrap
		}
		if dead > *c.maxDeadLinks {
			return false
		}
	}
	a.last.wrap, a.last.periphery = wrap, periphery
	return true
}

// Possible reports whether r could be satisfied on this machine, following
// the reference: whether it would be placed if the machine were empty. For
// a block, that is a candidate at one of the four corners of the empty
// machine; for n boards, the same with the rectangle chosen for the whole
// machine; for one board, any live board; for a specific board, that it is
// on the machine and alive.
//
// This is the reference's test, chosen over an exact one on purpose: a
// request that only fits at positions the empty machine's first placement
// never tries would queue forever on an idle machine, so it is better
// cancelled at once. (The placement corpus has a few requests this test
// rejects that would fit when other allocations have split the machine.)
// Allocations and the queue do not affect the answer.
func (a *Allocator) Possible(r *arbiter.GridRequest) bool {
	if r.Validate() != nil {
		return false
	}
	c := requestConstraints(r)
	var w, h int
	switch r.Form {
	case arbiter.GridOneBoard:
		for _, d := range a.dead {
			if !d {
				return true
			}
		}
		return false
	case arbiter.GridBoard:
		return arbiter.GridContains(a.w, a.h, r.Board) && !a.dead[a.index(r.Board)]
	case arbiter.GridBlock:
		w, h = r.Width, r.Height
		if w <= 0 || h <= 0 || w > a.w || h > a.h || (r.RequireTorus && (w != a.w || h != a.h)) {
			return false
		}
	case arbiter.GridBoards:
		n := triads(r)
		if n <= 0 || (r.RequireTorus && n != a.w*a.h) {
			return false
		}
		var ok bool
		if w, h, ok = areaToRect(n, a.w, a.h, r.MinRatio); !ok {
			return false
		}
	}
	corners := [4][2]int{{0, 0}, {a.w - w, 0}, {0, a.h - h}, {a.w - w, a.h - h}}
	for i, p := range corners {
		if slices.Contains(corners[:i], p) {
			continue
		}
		if a.check(p[0], p[1], w, h, &c) {
			return true
		}
	}
	return false
}

// Allocate tries to place r now for allocation id (positive, not holding
// boards already) and returns what it holds; nil when r does not fit now
// (or is malformed, or id is taken), with nothing changed.
func (a *Allocator) Allocate(id int64, r *arbiter.GridRequest) *Placement {
	if id <= 0 || a.held[id] != nil || r.Validate() != nil {
		return nil
	}
	switch r.Form {
	case arbiter.GridOneBoard, arbiter.GridBoard:
		return a.allocBoard(id, r)
	}
	c := requestConstraints(r)
	ok := func(x, y, w, h int) bool { return a.check(x, y, w, h, &c) }
	var leaf int32
	switch r.Form {
	case arbiter.GridBlock:
		if r.Width <= 0 || r.Height <= 0 || (r.RequireTorus && (r.Width != a.w || r.Height != a.h)) {
			return nil
		}
		leaf = a.tree.alloc(root, r.Width, r.Height, ok)
	case arbiter.GridBoards:
		n := triads(r)
		if n <= 0 || (r.RequireTorus && n != a.w*a.h) {
			return nil
		}
		leaf = a.tree.allocArea(root, n, r.MinRatio, ok)
	}
	if leaf < 0 {
		return nil
	}
	// The last accepted candidate is the block just allocated: its boards
	// are still marked. Walking the block in index order lists them, and
	// their periphery, already sorted.
	nd := &a.tree.nodes[leaf]
	p := Placement{X: nd.x, Y: nd.y, Width: nd.w, Height: nd.h, Torus: a.last.wrap}
	p.Boards = make([]arbiter.Board, 0, len(a.queue))
	p.Periphery = make([]arbiter.BoardLink, 0, a.last.periphery)
	for x := nd.x; x < nd.x+nd.w; x++ {
		for y := nd.y; y < nd.y+nd.h; y++ {
			for z := 0; z < 3; z++ {
				b := arbiter.Board{X: x, Y: y, Z: z}
				i := a.index(b)
				if a.mark[i] != a.gen {
					continue
				}
				p.Boards = append(p.Boards, b)
				for l := 0; l < arbiter.NumLinks; l++ {
					if a.mark[a.nbr[int(i)*arbiter.NumLinks+l]] != a.gen {
						p.Periphery = append(p.Periphery, arbiter.BoardLink{Board: b, Link: arbiter.Link(l)})
					}
				}
			}
		}
	}
	a.size(&p)
	return a.hold(id, &holding{p: p, node: leaf, board: -1}, a.queue)
}

// size sizes a placement in chips.
func (a *Allocator) size(p *Placement) {
	if len(p.Boards) == 1 {
		p.WidthChips, p.HeightChips = BoardChips, BoardChips
		return
	}
	x0, y0, x1, y1 := p.Boards[0].X, p.Boards[0].Y, p.Boards[0].X, p.Boards[0].Y
	for _, b := range p.Boards {
		x0, x1 = min(x0, b.X), max(x1, b.X)
		y0, y1 = min(y0, b.Y), max(y1, b.Y)
	}
	p.WidthChips, p.HeightChips = BlockChips(x1-x0+1, y1-y0+1, p.Torus)
}

func (a *Allocator) hold(id int64, h *holding, boards []int32) *Placement {
	for _, b := range boards {
		a.holder[b] = id
	}
	a.held[id] = h
	return &h.p
}

// allocBoard places a one-board request: first a free live board of a triad
// already shared by single boards (the oldest such triad, its lowest free
// live z), else a fresh 1×1 triad with a live board from the tree (for a
// specific board, its own triad carved out of the tree).
//
// The reference takes whichever z its Python set pops, which is not always
// the lowest; the triads chosen are the same (docs/reference/spalloc.md §4, corpus note).
func (a *Allocator) allocBoard(id int64, r *arbiter.GridRequest) *Placement {
	specific := r.Form == arbiter.GridBoard
	if specific && (!arbiter.GridContains(a.w, a.h, r.Board) || a.dead[a.index(r.Board)]) {
		return nil
	}
	for round := 0; round < 2; round++ {
		if specific {
			t := r.Board.X*a.h + r.Board.Y
			st := &a.single[t]
			if st.node >= 0 && st.held&(1<<r.Board.Z) == 0 {
				return a.takeBoard(id, int32(t), r.Board.Z)
			}
		} else {
			for _, t := range a.shared {
				if z := a.freeZ(t); z >= 0 {
					if a.pickZ != nil {
						z = a.pickZ(a.board(t*3), z)
					}
					return a.takeBoard(id, t, z)
				}
			}
		}
		if round == 1 {
			break
		}
		// No shared triad has the board: take a triad from the tree.
		var leaf int32
		if specific {
			leaf = a.tree.carve(r.Board.X, r.Board.Y, 1, 1)
		} else {
			leaf = a.tree.alloc(root, 1, 1, func(x, y, _, _ int) bool {
				i := a.index(arbiter.Board{X: x, Y: y})
				return !a.dead[i] || !a.dead[i+1] || !a.dead[i+2]
			})
		}
		if leaf < 0 {
			return nil
		}
		nd := &a.tree.nodes[leaf]
		t := int32(nd.x*a.h + nd.y)
		a.single[t] = singleTriad{node: leaf, listed: true}
		a.shared = append(a.shared, t)
	}
	return nil
}

// freeZ is the lowest live, unheld z of single-board triad t, or -1.
func (a *Allocator) freeZ(t int32) int {
	st := &a.single[t]
	for z := 0; z < 3; z++ {
		if st.held&(1<<z) == 0 && !a.dead[t*3+int32(z)] {
			return z
		}
	}
	return -1
}

func (a *Allocator) takeBoard(id int64, t int32, z int) *Placement {
	st := &a.single[t]
	st.held |= 1 << z
	if st.listed && a.freeZ(t) < 0 {
		a.unlist(t)
	}
	bi := t*3 + int32(z)
	p := SinglePlacement(a.board(bi))
	return a.hold(id, &holding{p: p, node: -1, board: bi}, []int32{bi})
}

// SinglePlacement is the placement of a one-board allocation of board b:
// b's triad as its block, every link of b on the periphery, 8×8 chips. It
// depends on b alone, so a store need not keep it.
func SinglePlacement(b arbiter.Board) Placement {
	p := Placement{Single: true, X: b.X, Y: b.Y, Width: 1, Height: 1, Boards: []arbiter.Board{b},
		WidthChips: BoardChips, HeightChips: BoardChips}
	p.Periphery = make([]arbiter.BoardLink, arbiter.NumLinks)
	for l := range p.Periphery {
		p.Periphery[l] = arbiter.BoardLink{Board: b, Link: arbiter.Link(l)}
	}
	return p
}

func (a *Allocator) unlist(t int32) {
	a.single[t].listed = false
	if i := slices.Index(a.shared, t); i >= 0 {
		a.shared = slices.Delete(a.shared, i, i+1)
	}
}

// Free gives back what allocation id holds, and reports whether it held
// anything. A block's triads return to the tree (merging with free
// neighbours); a single board returns to its triad, which returns to the
// tree when its last board is freed.
func (a *Allocator) Free(id int64) bool {
	h := a.held[id]
	if h == nil {
		return false
	}
	delete(a.held, id)
	for _, b := range h.p.Boards {
		a.holder[a.index(b)] = 0
	}
	if !h.p.Single {
		a.tree.release(h.node)
		return true
	}
	t := h.board / 3
	st := &a.single[t]
	st.held &^= 1 << (h.board % 3)
	switch {
	case st.held == 0:
		if st.listed {
			a.unlist(t)
		}
		a.tree.release(st.node)
		st.node = -1
	case !st.listed:
		st.listed = true
		a.shared = append(a.shared, t)
	}
	return true
}

// Held is one live allocation's placement, as stored.
type Held struct {
	ID        int64
	Placement *Placement
}

// Restore rebuilds the state of a new, empty allocator from the placements
// of the live allocations (after a restart, from what the engine stored;
// boards waiting for their delayed free count as held). Blocks and the
// triads of single boards become leaves of a partition tree cut along
// their edges; single-board triads serve further single boards oldest
// allocation first. The tree may differ from the one the placements were
// made in, so later placements may differ from those of a server that
// never stopped, but never overlap.
//
// Errors (and the allocator stays empty): it already holds allocations; an
// id is not positive or repeated; a placement is off the machine, holds a
// board outside its block or held by another, or overlaps another block;
// the blocks cannot be separated by straight cuts (they do not come from
// one partition of this machine).
func (a *Allocator) Restore(held []Held) error {
	if len(a.held) > 0 || len(a.shared) > 0 || !a.tree.leaf(root) || a.tree.nodes[root].allocated {
		return fmt.Errorf("restore needs an empty allocator")
	}
	err := a.restore(held)
	if err != nil {
		*a.tree = *newTree(a.w, a.h)
		clear(a.holder)
		clear(a.held)
		a.shared = a.shared[:0]
		for i := range a.single {
			a.single[i] = singleTriad{node: -1}
		}
	}
	return err
}

func (a *Allocator) restore(held []Held) error {
	held = slices.Clone(held)
	slices.SortFunc(held, func(x, y Held) int { return cmpInt64(x.ID, y.ID) })
	var rects []rect
	owner := map[rect]int64{} // the block's allocation; 0 for a single-board triad
	for i, h := range held {
		p := h.Placement
		if h.ID <= 0 || (i > 0 && held[i-1].ID == h.ID) || p == nil {
			return fmt.Errorf("allocation %d: not positive, repeated or without a placement", h.ID)
		}
		if p.Width < 1 || p.Height < 1 || p.X < 0 || p.Y < 0 || p.X+p.Width > a.w || p.Y+p.Height > a.h {
			return fmt.Errorf("allocation %d: block %d×%d at (%d,%d) is not on the %d×%d machine", h.ID, p.Width, p.Height, p.X, p.Y, a.w, a.h)
		}
		if p.Single && (len(p.Boards) != 1 || p.Width != 1 || p.Height != 1) {
			return fmt.Errorf("allocation %d: a single-board placement holds one board of a 1×1 block", h.ID)
		}
		for _, b := range p.Boards {
			if b.X < p.X || b.X >= p.X+p.Width || b.Y < p.Y || b.Y >= p.Y+p.Height || b.Z < 0 || b.Z > 2 {
				return fmt.Errorf("allocation %d: board %v is outside its block", h.ID, b)
			}
			if o := a.holder[a.index(b)]; o != 0 {
				return fmt.Errorf("allocation %d: board %v is already held by allocation %d", h.ID, b, o)
			}
			a.holder[a.index(b)] = h.ID
		}
		r := rect{p.X, p.Y, p.Width, p.Height}
		if o, dup := owner[r]; dup && (!p.Single || o != 0) {
			return fmt.Errorf("allocation %d: block %d×%d at (%d,%d) is also held by allocation %d", h.ID, r.w, r.h, r.x, r.y, o)
		}
		if _, dup := owner[r]; !dup {
			rects = append(rects, r)
		}
		if p.Single {
			owner[r] = 0
		} else {
			owner[r] = h.ID
		}
	}
	leaves := map[rect]int32{}
	if err := a.tree.build(root, rects, leaves); err != nil {
		return err
	}
	for _, h := range held {
		p := h.Placement
		cp := *p
		cp.Boards = slices.Clone(p.Boards)
		cp.Periphery = slices.Clone(p.Periphery)
		leaf := leaves[rect{p.X, p.Y, p.Width, p.Height}]
		if !p.Single {
			a.held[h.ID] = &holding{p: cp, node: leaf, board: -1}
			continue
		}
		bi := a.index(p.Boards[0])
		t := bi / 3
		st := &a.single[t]
		if st.node < 0 {
			*st = singleTriad{node: leaf}
		}
		st.held |= 1 << (bi % 3)
		a.held[h.ID] = &holding{p: cp, node: -1, board: bi}
		if !st.listed {
			st.listed = true
			a.shared = append(a.shared, t)
		}
	}
	// Triads whose live boards are all held are full, not shared.
	for _, t := range slices.Clone(a.shared) {
		if a.freeZ(t) < 0 {
			a.unlist(t)
		}
	}
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

package grid

import (
	"fmt"
	"slices"
)

// tree is the binary space-partition tree over a machine's triads that the
// reference allocator packs rectangles with (docs/reference/spalloc.md §4): a node is a free
// leaf, an allocated leaf, or split in two along x or y. Nodes live in an
// arena and are named by index so that an allocation can keep its leaf.
//
// Each node also keeps, over the free leaves below it, the largest width,
// height and area. A descent skips a subtree whose free leaves are all too
// small; such a subtree would fail anyway without calling the candidate
// test, so the pruning changes nothing but time.
type tree struct {
	nodes []node
	spare []int32 // indices of released nodes, reused first
}

type node struct {
	x, y, w, h int
	parent     int32
	kids       [2]int32 // both -1 for a leaf; [0] is the left or bottom part
	allocated  bool
	// freeW, freeH, freeA: the largest width, height and area of a free leaf
	// in the subtree (each maximised separately), 0 when there is none.
	freeW, freeH, freeA int
}

// candidate tests whether the block of w×h triads at (x, y) is acceptable.
type candidate func(x, y, w, h int) bool

const root = 0

func newTree(w, h int) *tree {
	t := &tree{}
	t.add(0, 0, w, h, -1)
	return t
}

func (t *tree) add(x, y, w, h int, parent int32) int32 {
	nd := node{x: x, y: y, w: w, h: h, parent: parent, kids: [2]int32{-1, -1}, freeW: w, freeH: h, freeA: w * h}
	if n := len(t.spare); n > 0 {
		i := t.spare[n-1]
		t.spare = t.spare[:n-1]
		t.nodes[i] = nd
		return i
	}
	t.nodes = append(t.nodes, nd)
	return int32(len(t.nodes) - 1)
}

func (t *tree) leaf(n int32) bool { return t.nodes[n].kids[0] < 0 }

// hsplit splits leaf n into a bottom part below y and a top part from y.
func (t *tree) hsplit(n int32, y int) {
	nd := t.nodes[n]
	a := t.add(nd.x, nd.y, nd.w, y-nd.y, n)
	b := t.add(nd.x, y, nd.w, nd.h-(y-nd.y), n)
	t.nodes[n].kids = [2]int32{a, b}
}

// vsplit splits leaf n into a left part before x and a right part from x.
func (t *tree) vsplit(n int32, x int) {
	nd := t.nodes[n]
	a := t.add(nd.x, nd.y, x-nd.x, nd.h, n)
	b := t.add(x, nd.y, nd.w-(x-nd.x), nd.h, n)
	t.nodes[n].kids = [2]int32{a, b}
}

// order returns the children of n smallest area first; on a tie the left
// or bottom child first.
func (t *tree) order(n int32) (int32, int32) {
	k := t.nodes[n].kids
	a, b := &t.nodes[k[0]], &t.nodes[k[1]]
	if b.w*b.h < a.w*a.h {
		return k[1], k[0]
	}
	return k[0], k[1]
}

// alloc places a w×h block in the subtree of n as the reference does and
// returns its (new, allocated) leaf, or -1 with nothing changed.
func (t *tree) alloc(n int32, w, h int, ok candidate) int32 {
	nd := &t.nodes[n]
	if nd.allocated || w > nd.w || h > nd.h {
		return -1
	}
	if nd.kids[0] >= 0 {
		if w > nd.freeW || h > nd.freeH || w*h > nd.freeA {
			return -1
		}
		a, b := t.order(n)
		if r := t.alloc(a, w, h, ok); r >= 0 {
			return r
		}
		return t.alloc(b, w, h, ok)
	}
	// A free leaf: the first corner the candidate test accepts, in the
	// order bottom-left, top-left, bottom-right, top-right.
	x0, y0 := nd.x, nd.y
	x1, y1 := x0+nd.w-w, y0+nd.h-h
	corners := [4][2]int{{x0, y0}, {x0, y1}, {x1, y0}, {x1, y1}}
	found := -1
	for i, c := range corners {
		dup := false
		for _, d := range corners[:i] {
			dup = dup || d == c
		}
		if !dup && (ok == nil || ok(c[0], c[1], w, h)) {
			found = i
			break
		}
	}
	if found < 0 {
		return -1
	}
	x, y := corners[found][0], corners[found][1]
	if w == nd.w && h == nd.h {
		t.take(n)
		return n
	}
	// Split along the axis that keeps the larger free remainder, then split
	// the allocated part once more if it is still too big.
	var child int32
	if nd.h-h > nd.w-w {
		at := y
		if y == y0 {
			at = y + h
		}
		t.hsplit(n, at)
		child = t.nodes[n].kids[boolIndex(y != y0)]
	} else {
		at := x
		if x == x0 {
			at = x + w
		}
		t.vsplit(n, at)
		child = t.nodes[n].kids[boolIndex(x != x0)]
	}
	c := t.nodes[child]
	switch {
	case c.w != w:
		at := x
		if x == c.x {
			at = c.x + w
		}
		t.vsplit(child, at)
		child = t.nodes[child].kids[boolIndex(x != c.x)]
	case c.h != h:
		at := y
		if y == c.y {
			at = c.y + h
		}
		t.hsplit(child, at)
		child = t.nodes[child].kids[boolIndex(y != c.y)]
	}
	t.take(child)
	return child
}

// allocArea places a block of at least area triads in the subtree of n: at
// each free leaf the rectangle is chosen from the leaf's size (areaToRect).
// It returns the leaf, or -1 with nothing changed.
func (t *tree) allocArea(n int32, area int, minRatio float64, ok candidate) int32 {
	nd := &t.nodes[n]
	if nd.allocated || area > nd.w*nd.h {
		return -1
	}
	if nd.kids[0] >= 0 {
		if area > nd.freeA {
			return -1
		}
		a, b := t.order(n)
		if r := t.allocArea(a, area, minRatio, ok); r >= 0 {
			return r
		}
		return t.allocArea(b, area, minRatio, ok)
	}
	w, h, fits := areaToRect(area, nd.w, nd.h, minRatio)
	if !fits {
		return -1
	}
	return t.alloc(n, w, h, ok)
}

// carve allocates exactly the w×h block at (x, y) by splitting off the
// largest margin around it until a leaf fits it (for w = h = 1 this is the
// reference's request of a specific triad). It returns the leaf, or -1
// with nothing changed when the block is not inside one free leaf.
func (t *tree) carve(x, y, w, h int) int32 {
	n := int32(root)
	// Check first, so that a failing carve leaves the tree as it was.
	for !t.leaf(n) {
		k := t.nodes[n].kids
		if t.inside(k[0], x, y) {
			n = k[0]
		} else {
			n = k[1]
		}
	}
	nd := t.nodes[n]
	if nd.allocated || x < nd.x || y < nd.y || x+w > nd.x+nd.w || y+h > nd.y+nd.h {
		return -1
	}
	for {
		nd := t.nodes[n]
		if nd.w == w && nd.h == h {
			t.take(n)
			return n
		}
		l, r := x-nd.x, nd.x+nd.w-(x+w)
		a, b := nd.y+nd.h-(y+h), y-nd.y
		switch max(l, r, a, b) {
		case l:
			t.vsplit(n, x)
		case r:
			t.vsplit(n, x+w)
		case a:
			t.hsplit(n, y+h)
		default:
			t.hsplit(n, y)
		}
		k := t.nodes[n].kids
		if t.inside(k[0], x, y) {
			n = k[0]
		} else {
			n = k[1]
		}
	}
}

func (t *tree) inside(n int32, x, y int) bool {
	nd := &t.nodes[n]
	return x >= nd.x && x < nd.x+nd.w && y >= nd.y && y < nd.y+nd.h
}

// take marks leaf n allocated.
func (t *tree) take(n int32) {
	nd := &t.nodes[n]
	nd.allocated = true
	nd.freeW, nd.freeH, nd.freeA = 0, 0, 0
	t.resum(nd.parent)
}

// release frees allocated leaf n and merges free siblings upwards.
func (t *tree) release(n int32) {
	nd := &t.nodes[n]
	nd.allocated = false
	nd.freeW, nd.freeH, nd.freeA = nd.w, nd.h, nd.w*nd.h
	for p := nd.parent; p >= 0; p = t.nodes[p].parent {
		k := t.nodes[p].kids
		a, b := &t.nodes[k[0]], &t.nodes[k[1]]
		if a.allocated || b.allocated || !t.leaf(k[0]) || !t.leaf(k[1]) {
			t.resum(p)
			return
		}
		t.spare = append(t.spare, k[0], k[1])
		pn := &t.nodes[p]
		pn.kids = [2]int32{-1, -1}
		pn.freeW, pn.freeH, pn.freeA = pn.w, pn.h, pn.w*pn.h
	}
}

// resum recomputes the free-leaf summaries from n up to the root.
func (t *tree) resum(n int32) {
	for ; n >= 0; n = t.nodes[n].parent {
		nd := &t.nodes[n]
		a, b := &t.nodes[nd.kids[0]], &t.nodes[nd.kids[1]]
		fw, fh, fa := max(a.freeW, b.freeW), max(a.freeH, b.freeH), max(a.freeA, b.freeA)
		if fw == nd.freeW && fh == nd.freeH && fa == nd.freeA {
			return
		}
		nd.freeW, nd.freeH, nd.freeA = fw, fh, fa
	}
}

// rect is a block of triads.
type rect struct{ x, y, w, h int }

// build turns free leaf n into a subtree whose allocated leaves are exactly
// rects (disjoint, inside n), cutting along their edges: at each node the
// first cut, left to right then bottom to top, that crosses no rectangle.
// leaves gets each rectangle's leaf. Errors: a rectangle overlaps another
// or no straight cut separates them.
func (t *tree) build(n int32, rects []rect, leaves map[rect]int32) error {
	nd := t.nodes[n]
	if len(rects) == 0 {
		return nil
	}
	if len(rects) == 1 && rects[0] == (rect{nd.x, nd.y, nd.w, nd.h}) {
		leaves[rects[0]] = n
		t.take(n)
		return nil
	}
	crosses := func(at int, vertical bool) bool {
		for _, r := range rects {
			if vertical && r.x < at && at < r.x+r.w || !vertical && r.y < at && at < r.y+r.h {
				return true
			}
		}
		return false
	}
	for _, vertical := range []bool{true, false} {
		var cuts []int
		for _, r := range rects {
			if vertical {
				cuts = append(cuts, r.x, r.x+r.w)
			} else {
				cuts = append(cuts, r.y, r.y+r.h)
			}
		}
		slices.Sort(cuts)
		lo, hi := nd.x, nd.x+nd.w
		if !vertical {
			lo, hi = nd.y, nd.y+nd.h
		}
		for _, at := range cuts {
			if at <= lo || at >= hi || crosses(at, vertical) {
				continue
			}
			var left, right []rect
			for _, r := range rects {
				if vertical && r.x < at || !vertical && r.y < at {
					left = append(left, r)
				} else {
					right = append(right, r)
				}
			}
			if vertical {
				t.vsplit(n, at)
			} else {
				t.hsplit(n, at)
			}
			k := t.nodes[n].kids
			if err := t.build(k[0], left, leaves); err != nil {
				return err
			}
			return t.build(k[1], right, leaves)
		}
	}
	return fmt.Errorf("blocks %v cannot be separated by a straight cut of (%d,%d) %d×%d: they overlap or do not come from one partition of the machine", rects, nd.x, nd.y, nd.w, nd.h)
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

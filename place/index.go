package place

import (
	"math/bits"

	"github.com/arbiter-hq/arbiter"
)

// Index keeps, for every usable machine, how many of its GPUs are free,
// bucketed by that number, so that a best-fit search visits machines from the
// fewest free GPUs up and skips machines that cannot hold the request without
// looking at them. Machines are identified by their position in the caller's
// (name-ordered) list, which makes the order of equal candidates deterministic.
type Index struct {
	free    []int                                   // per machine; -1 = not usable
	buckets [arbiter.MaxGPUsPerMachine + 1][]uint64 // bitsets over positions
	top     int                                     // highest free count with a set bit (may overestimate)
}

// NewIndex returns an index of n machines, none usable yet.
func NewIndex(n int) *Index {
	x := &Index{free: make([]int, n)}
	words := (n + 63) / 64
	for b := range x.buckets {
		x.buckets[b] = make([]uint64, words)
	}
	for i := range x.free {
		x.free[i] = -1
	}
	return x
}

// Len is the number of machine positions.
func (x *Index) Len() int { return len(x.free) }

// Free returns the free count recorded for machine i, -1 when not usable.
func (x *Index) Free(i int) int { return x.free[i] }

// Set records that machine i has free GPUs free; free < 0 makes it unusable
// (down, draining) so that no search visits it.
func (x *Index) Set(i, free int) {
	if old := x.free[i]; old >= 0 {
		x.buckets[old][i/64] &^= 1 << (i % 64)
	}
	if free > arbiter.MaxGPUsPerMachine {
		free = arbiter.MaxGPUsPerMachine
	}
	x.free[i] = free
	if free >= 0 {
		x.buckets[free][i/64] |= 1 << (i % 64)
		if free > x.top {
			x.top = free
		}
	}
}

// MaxFree returns the largest free count of any usable machine.
func (x *Index) MaxFree() int {
	for x.top > 0 {
		for _, w := range x.buckets[x.top] {
			if w != 0 {
				return x.top
			}
		}
		x.top--
	}
	return 0
}

// Visit calls visit for each usable machine with at least min free GPUs, in
// best-fit order: fewest free first, then by position. It stops when visit
// returns false.
func (x *Index) Visit(min int, visit func(i int) bool) {
	for b := min; b <= x.MaxFree(); b++ {
		for wi, w := range x.buckets[b] {
			for w != 0 {
				bit := bits.TrailingZeros64(w)
				w &^= 1 << bit
				if !visit(wi*64 + bit) {
					return
				}
			}
		}
	}
}

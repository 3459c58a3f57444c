package grid

import "github.com/arbiter-hq/arbiter"

// triads is the number of triads of a GridBoards request: ceil(n/3), or 0
// when n ≤ 0.
func triads(r *arbiter.GridRequest) int {
	if r.Boards <= 0 {
		return 0
	}
	n := r.Boards / 3
	if r.Boards%3 != 0 {
		n++
	}
	return n
}

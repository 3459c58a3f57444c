package engine

import (
	"container/heap"
	"time"
)

// deadline is a moment the engine must act at: an allocation's keepalive
// expiry, a machine's heartbeat timeout, a lock's TTL… Each lives inside its
// owner and sits in the heap at most once, so refreshing a keepalive is one
// O(log n) fix, not a new entry.
type deadline struct {
	at  time.Time
	pos int // position in the heap, -1 when not in it
	// fire acts on the deadline; it is out of the heap by then.
	fire func(e *Engine, now time.Time)
}

// newDeadline returns a deadline, not yet set, that calls fire.
func newDeadline(fire func(e *Engine, now time.Time)) deadline {
	return deadline{pos: -1, fire: fire}
}

type deadlines []*deadline

func (h deadlines) Len() int           { return len(h) }
func (h deadlines) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlines) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}
func (h *deadlines) Push(x any) {
	d := x.(*deadline)
	d.pos = len(*h)
	*h = append(*h, d)
}
func (h *deadlines) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	d.pos = -1
	return d
}

// set moves d to at, adding it to the heap if needed.
func (h *deadlines) set(d *deadline, at time.Time) {
	d.at = at
	if d.pos >= 0 {
		heap.Fix(h, d.pos)
		return
	}
	heap.Push(h, d)
}

// clear takes d out of the heap if it is there.
func (h *deadlines) clear(d *deadline) {
	if d.pos >= 0 {
		heap.Remove(h, d.pos)
	}
}

// next returns the earliest deadline, or nil.
func (h deadlines) next() *deadline {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

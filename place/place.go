package place

import (
	"fmt"

	"github.com/arbiter-hq/arbiter"
)

// Cluster is the read-only view placement works on: machines in name order,
// which allocation holds each of their GPUs, and the index of free counts.
type Cluster struct {
	Machines []*arbiter.Machine
	Held     [][]int64 // Held[i][g]: allocation holding Machines[i].GPUs[g], 0 if free
	Index    *Index
}

// Best finds where r should go: the usable machine (not skipped) where it fits
// and leaves the fewest GPUs free — bin-packing, so that whole machines stay
// free for large requests. Ties go to the machine first in name order. It
// returns the machine's position and the chosen GPU positions, or -1, nil.
//
// skip may be nil; the engine uses it to hold machines for a starving request.
func (c *Cluster) Best(r *arbiter.Request, skip func(i int) bool) (int, []int) {
	return c.BestHeld(r, skip, nil)
}

// BestHeld is Best with machine i's holdings given by held(i) instead of
// Held[i] (nil held: Held). The engine passes holdings in which GPUs the
// request may not take (reserved for others, past a quota) are marked
// held; held(i) may reuse its slice from one call to the next.
func (c *Cluster) BestHeld(r *arbiter.Request, skip func(i int) bool, held func(i int) []int64) (int, []int) {
	best, gpus := -1, []int(nil)
	c.Index.Visit(r.GPUs, func(i int) bool {
		if skip != nil && skip(i) {
			return true
		}
		h := c.Held[i]
		if held != nil {
			h = held(i)
		}
		if g := FitGPUs(c.Machines[i], h, r); g != nil {
			best, gpus = i, g
			return false
		}
		return true
	})
	return best, gpus
}

// On tries to place r on machine i only (a request that names its machine).
func (c *Cluster) On(i int, r *arbiter.Request, skip func(i int) bool) []int {
	if c.Index.Free(i) < r.GPUs || (skip != nil && skip(i)) {
		return nil
	}
	return FitGPUs(c.Machines[i], c.Held[i], r)
}

// OnHeld is On with machine i's holdings given by held(i) (see BestHeld).
func (c *Cluster) OnHeld(i int, r *arbiter.Request, skip func(i int) bool, held func(i int) []int64) []int {
	if c.Index.Free(i) < r.GPUs || (skip != nil && skip(i)) {
		return nil
	}
	if held != nil {
		return FitGPUs(c.Machines[i], held(i), r)
	}
	return FitGPUs(c.Machines[i], c.Held[i], r)
}

// Eligible reports whether machine i could ever hold r: its attributes match
// and it has enough GPUs satisfying r, held or not, healthy or not.
func (c *Cluster) Eligible(i int, r *arbiter.Request) bool {
	m := c.Machines[i]
	if !MachineOK(m, r) {
		return false
	}
	n := 0
	for g := range m.GPUs {
		if GPUOK(&m.GPUs[g], r) {
			n++
		}
	}
	return n >= r.GPUs
}

// WhyQueued explains why r is not placed now. heldFor names the allocation a
// machine is held for (0 if none), so a request blocked by the starvation
// guard says so. The text names no free counts, which change with every
// release, so it only needs rewriting when machines or holds change.
func (c *Cluster) WhyQueued(r *arbiter.Request, heldFor func(i int) int64) string {
	var eligible, usable, held int
	var reservedFor int64
	for i := range c.Machines {
		if !c.Eligible(i, r) {
			continue
		}
		eligible++
		if c.Index.Free(i) < 0 {
			continue
		}
		usable++
		if id := heldFor(i); id != 0 {
			held++
			reservedFor = id
		}
	}
	switch {
	case eligible == 0:
		return "no machine can hold this request"
	case usable == 0:
		if eligible == 1 {
			return "the one machine that could hold it is down or draining"
		}
		return fmt.Sprintf("all %d machines that could hold it are down or draining", eligible)
	case held == usable:
		return fmt.Sprintf("the %s that could hold it %s held for allocation %d, which has waited longer than the starvation limit", arbiter.Plural(usable, "machine"), isAre(usable), reservedFor)
	}
	s := fmt.Sprintf("waiting for %d free %s on %s that could hold it", r.GPUs, gpuWord(r.GPUs), oneOf(usable))
	if held > 0 {
		s += fmt.Sprintf("; %d of them are held for allocation %d, which has waited longer than the starvation limit", held, reservedFor)
	}
	return s
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func gpuWord(n int) string {
	if n == 1 {
		return "GPU"
	}
	return "GPUs"
}

// oneOf is "the machine" or "one of the 3 machines".
func oneOf(n int) string {
	if n == 1 {
		return "the machine"
	}
	return "one of the " + arbiter.Plural(n, "machine")
}

// Package place holds arbiter's placement decisions as pure functions over a
// read-only view of machines: which GPUs of which machine a request should
// get (feasibility, then bin-packing), why a request cannot be placed now, and
// whether it can ever be placed at all.
//
// Nothing here does I/O, reads the clock or starts goroutines; the engine owns
// the state and calls in.
package place

// Package grid models grid machines — SpiNNaker-style machines of boards
// arranged as a hexagonal torus of triads (docs/reference/spalloc.md §3, §4, §7) —
// and allocates their boards.
//
//   - Geometry: the six links of a board and their vectors, neighbours with
//     wrap-around (Neighbour), board ↔ chip coordinates (BoardToChip,
//     ChipToBoard) and the size in chips of a block (BlockChips).
//   - Machine: a machine's description — size in triads, dead boards and
//     links, each board's physical location and address, each frame's
//     controller address, queue policy — with the reference's validation
//     and the standard-address arithmetic.
//   - Allocator: the board allocation state of one machine, reproducing the
//     reference allocator's placements (its partition tree and candidate
//     test) for the four request forms and their constraints, with Possible
//     for "could this ever be placed".
//
// The package is pure: no I/O, no clock, no goroutines. The engine owns one
// Allocator per grid machine and decides when to call it (queue policy,
// delayed frees); package spalloc speaks the protocol over it.
package grid

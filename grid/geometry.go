package grid

import (
	"math"

	"github.com/arbiter-hq/arbiter"
)

// Wrap says over which axes a set of boards is connected around the torus.
type Wrap uint8

// Wrap values; WrapBoth = WrapX | WrapY.
const (
	WrapNone Wrap = 0
	WrapX    Wrap = 1
	WrapY    Wrap = 2
	WrapBoth Wrap = 3
)

// vector is the step over one link: triads in x and y, positions in z.
type vector struct{ dx, dy, dz int }

// vectors[z][l] is the step from a board at position z over link l. The
// forward links (north, north_east, east) are the spec's table; the backward
// links are the negated forward vectors, applied from the board the forward
// link arrives at.
var vectors = func() (v [3][arbiter.NumLinks]vector) {
	fwd := [3][3]struct {
		l arbiter.Link
		v vector
	}{
		{{arbiter.LinkNorth, vector{0, 0, 2}}, {arbiter.LinkNorthEast, vector{0, 0, 1}}, {arbiter.LinkEast, vector{0, -1, 2}}},
		{{arbiter.LinkNorth, vector{1, 1, -1}}, {arbiter.LinkNorthEast, vector{1, 0, 1}}, {arbiter.LinkEast, vector{1, 0, -1}}},
		{{arbiter.LinkNorth, vector{0, 1, -1}}, {arbiter.LinkNorthEast, vector{1, 1, -2}}, {arbiter.LinkEast, vector{0, 0, -1}}},
	}
	for z, links := range fwd {
		for _, f := range links {
			v[z][f.l] = f.v
			v[z+f.v.dz][f.l.Opposite()] = vector{-f.v.dx, -f.v.dy, -f.v.dz}
		}
	}
	return v
}()

// Neighbour returns the board at the far end of link l of board b on a
// machine of w×h triads, and over which axis the link wrapped around the
// torus (WrapNone, WrapX, WrapY or both). b must be on the machine.
func Neighbour(w, h int, b arbiter.Board, l arbiter.Link) (arbiter.Board, Wrap) {
	v := vectors[b.Z][l]
	x, y := b.X+v.dx, b.Y+v.dy
	var wrap Wrap
	if x < 0 || x >= w {
		x, wrap = mod(x, w), wrap|WrapX
	}
	if y < 0 || y >= h {
		y, wrap = mod(y, h), wrap|WrapY
	}
	return arbiter.Board{X: x, Y: y, Z: b.Z + v.dz}, wrap
}

// Chips per board edge and per triad, for the SpiNN-5 boards of a grid.
const (
	TriadChips = 12 // a triad repeats every 12 chips in x and in y
	BoardChips = 8  // a single board is 8×8 chips
	edgeChips  = 4  // what sticks out of a block that does not wrap
)

// ethernet[z] is the position of board z's Ethernet chip within its triad.
var ethernet = [3][2]int{{0, 0}, {8, 4}, {4, 8}}

// BoardToChip returns the chip coordinates of board b's Ethernet chip.
func BoardToChip(b arbiter.Board) (x, y int) {
	return TriadChips*b.X + ethernet[b.Z][0], TriadChips*b.Y + ethernet[b.Z][1]
}

// ChipToBoard returns the board of a machine of w×h triads that holds chip
// (x, y), and the chip's position relative to that board's Ethernet chip.
// Chip coordinates wrap modulo the machine's size in chips (12w × 12h).
//
// A 12×12 tile holds the three boards with Ethernet chips at (0,0), (8,4)
// and (4,8); a chip belongs to the board whose Ethernet chip, offset by
// (3.6, 3.4) to the middle of the board, is nearest under the hexagonal
// distance max(|dx|, |dy|, |dx−dy|), counting boards of neighbouring tiles.
func ChipToBoard(w, h, x, y int) (b arbiter.Board, chipX, chipY int) {
	x, y = mod(x, TriadChips*w), mod(y, TriadChips*h)
	tx, ty := x/TriadChips, y/TriadChips
	lx, ly := x%TriadChips, y%TriadChips
	best := math.Inf(1)
	for dtx := -1; dtx <= 1; dtx++ {
		for dty := -1; dty <= 1; dty++ {
			for z, e := range ethernet {
				rx, ry := TriadChips*dtx+e[0], TriadChips*dty+e[1]
				dx := float64(lx) - (float64(rx) + 3.6)
				dy := float64(ly) - (float64(ry) + 3.4)
				d := max(math.Abs(dx), math.Abs(dy), math.Abs(dx-dy))
				if d < best {
					best = d
					b = arbiter.Board{X: mod(tx+dtx, w), Y: mod(ty+dty, h), Z: z}
					chipX, chipY = lx-rx, ly-ry
				}
			}
		}
	}
	return b, chipX, chipY
}

// BlockChips is the size in chips of a block of w×h triads: 12w+4 by
// 12h+4, without the +4 on an axis where the block wraps around (wrap).
func BlockChips(w, h int, wrap Wrap) (int, int) {
	cw, ch := TriadChips*w, TriadChips*h
	if wrap&WrapX == 0 {
		cw += edgeChips
	}
	if wrap&WrapY == 0 {
		ch += edgeChips
	}
	return cw, ch
}

func mod(a, n int) int {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

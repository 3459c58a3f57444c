package grid

import (
	"fmt"
	"math"
	"strconv"

	"github.com/arbiter-hq/arbiter"
)

// Link is one of a board's six links, numbered as the spalloc protocol
// numbers them (specs/spalloc.md §3).
type Link uint8

// The six links. The opposite of link l is (l+3) % 6.
const (
	East Link = iota
	NorthEast
	North
	West
	SouthWest
	South
)

// NumLinks is how many links a board has.
const NumLinks = 6

var linkNames = [NumLinks]string{"east", "north_east", "north", "west", "south_west", "south"}

// String is the link's protocol name, e.g. "north_east".
func (l Link) String() string {
	if l < NumLinks {
		return linkNames[l]
	}
	return "link(" + strconv.Itoa(int(l)) + ")"
}

// Opposite is the link that arrives back over l.
func (l Link) Opposite() Link { return (l + 3) % NumLinks }

// ParseLink reads a link by its protocol name ("east" … "south") or its
// number ("0" … "5").
func ParseLink(s string) (Link, bool) {
	for i, n := range linkNames {
		if s == n {
			return Link(i), true
		}
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n < NumLinks {
		return Link(n), true
	}
	return 0, false
}

// BoardLink is one direction of a link: the link l leaving board B.
type BoardLink struct {
	Board arbiter.Board `json:"board"`
	Link  Link          `json:"link"`
}

// String spells the link as "(x,y,z):name".
func (bl BoardLink) String() string { return bl.Board.String() + ":" + bl.Link.String() }

// Compare orders board links by board, then link.
func (bl BoardLink) Compare(o BoardLink) int {
	if c := bl.Board.Compare(o.Board); c != 0 {
		return c
	}
	return int(bl.Link) - int(o.Link)
}

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
var vectors = func() (v [3][NumLinks]vector) {
	fwd := [3][3]struct {
		l Link
		v vector
	}{
		{{North, vector{0, 0, 2}}, {NorthEast, vector{0, 0, 1}}, {East, vector{0, -1, 2}}},
		{{North, vector{1, 1, -1}}, {NorthEast, vector{1, 0, 1}}, {East, vector{1, 0, -1}}},
		{{North, vector{0, 1, -1}}, {NorthEast, vector{1, 1, -2}}, {East, vector{0, 0, -1}}},
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
func Neighbour(w, h int, b arbiter.Board, l Link) (arbiter.Board, Wrap) {
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

// Contains reports whether b is on a machine of w×h triads.
func Contains(w, h int, b arbiter.Board) bool {
	return b.X >= 0 && b.X < w && b.Y >= 0 && b.Y < h && b.Z >= 0 && b.Z < 3
}

func mod(a, n int) int {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

// checkSize reports a machine size outside 1..MaxSide triads.
func checkSize(w, h int) error {
	if w < 1 || h < 1 || w > MaxSide || h > MaxSide {
		return fmt.Errorf("a grid machine is 1 to %d triads wide and high, not %d×%d", MaxSide, w, h)
	}
	return nil
}

// MaxSide bounds a grid machine's width and height in triads (the largest
// SpiNNaker machine built is 20×20 triads; the packer is benchmarked at
// 100×100).
const MaxSide = 256

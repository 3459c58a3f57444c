package grid

import (
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func bd(x, y, z int) arbiter.Board { return arbiter.Board{X: x, Y: y, Z: z} }

func TestLinks(t *testing.T) {
	for l := arbiter.Link(0); l < arbiter.NumLinks; l++ {
		got, ok := arbiter.ParseLink(l.String())
		if !ok || got != l {
			t.Errorf("ParseLink(%q) = %v %v", l.String(), got, ok)
		}
		if l.Opposite().Opposite() != l || l.Opposite() == l {
			t.Errorf("opposite of %v is %v", l, l.Opposite())
		}
	}
	for s, want := range map[string]arbiter.Link{"east": arbiter.LinkEast, "north_east": arbiter.LinkNorthEast, "north": arbiter.LinkNorth, "west": arbiter.LinkWest, "south_west": arbiter.LinkSouthWest, "south": arbiter.LinkSouth, "4": arbiter.LinkSouthWest} {
		if got, ok := arbiter.ParseLink(s); !ok || got != want {
			t.Errorf("ParseLink(%q) = %v %v, want %v", s, got, ok, want)
		}
	}
	for _, s := range []string{"", "up", "6", "-1", "North"} {
		if _, ok := arbiter.ParseLink(s); ok {
			t.Errorf("ParseLink(%q) accepted", s)
		}
	}
	if arbiter.LinkEast.Opposite() != arbiter.LinkWest || arbiter.LinkNorthEast.Opposite() != arbiter.LinkSouthWest || arbiter.LinkNorth.Opposite() != arbiter.LinkSouth {
		t.Errorf("opposites do not pair east/west, north_east/south_west, north/south")
	}
}

// TestNeighbourVectors checks the spec's table of forward vectors and that
// the backward links are their negations.
func TestNeighbourVectors(t *testing.T) {
	const w, h = 10, 10
	tests := []struct {
		from arbiter.Board
		link arbiter.Link
		to   arbiter.Board
	}{
		// z=0: north (0,0,+2), north_east (0,0,+1), east (0,-1,+2)
		{bd(5, 5, 0), arbiter.LinkNorth, bd(5, 5, 2)},
		{bd(5, 5, 0), arbiter.LinkNorthEast, bd(5, 5, 1)},
		{bd(5, 5, 0), arbiter.LinkEast, bd(5, 4, 2)},
		// z=1: north (1,1,-1), north_east (1,0,+1), east (1,0,-1)
		{bd(5, 5, 1), arbiter.LinkNorth, bd(6, 6, 0)},
		{bd(5, 5, 1), arbiter.LinkNorthEast, bd(6, 5, 2)},
		{bd(5, 5, 1), arbiter.LinkEast, bd(6, 5, 0)},
		// z=2: north (0,1,-1), north_east (1,1,-2), east (0,0,-1)
		{bd(5, 5, 2), arbiter.LinkNorth, bd(5, 6, 1)},
		{bd(5, 5, 2), arbiter.LinkNorthEast, bd(6, 6, 0)},
		{bd(5, 5, 2), arbiter.LinkEast, bd(5, 5, 1)},
		// backward links undo the forward ones
		{bd(5, 5, 2), arbiter.LinkSouth, bd(5, 5, 0)},
		{bd(5, 5, 1), arbiter.LinkSouthWest, bd(5, 5, 0)},
		{bd(5, 4, 2), arbiter.LinkWest, bd(5, 5, 0)},
		{bd(6, 6, 0), arbiter.LinkSouth, bd(5, 5, 1)},
		{bd(6, 5, 2), arbiter.LinkSouthWest, bd(5, 5, 1)},
		{bd(6, 5, 0), arbiter.LinkWest, bd(5, 5, 1)},
		{bd(5, 6, 1), arbiter.LinkSouth, bd(5, 5, 2)},
		{bd(6, 6, 0), arbiter.LinkSouthWest, bd(5, 5, 2)},
		{bd(5, 5, 1), arbiter.LinkWest, bd(5, 5, 2)},
	}
	for _, tt := range tests {
		got, wrap := Neighbour(w, h, tt.from, tt.link)
		if got != tt.to || wrap != WrapNone {
			t.Errorf("Neighbour(%v, %v) = %v %v, want %v", tt.from, tt.link, got, wrap, tt.to)
		}
	}
}

func TestNeighbourWraps(t *testing.T) {
	const w, h = 4, 2
	tests := []struct {
		from arbiter.Board
		link arbiter.Link
		to   arbiter.Board
		wrap Wrap
	}{
		{bd(0, 0, 0), arbiter.LinkEast, bd(0, 1, 2), WrapY},
		{bd(3, 0, 1), arbiter.LinkEast, bd(0, 0, 0), WrapX},
		{bd(3, 1, 1), arbiter.LinkNorth, bd(0, 0, 0), WrapBoth},
		{bd(0, 0, 0), arbiter.LinkWest, bd(3, 0, 1), WrapX},
		{bd(0, 0, 0), arbiter.LinkSouthWest, bd(3, 1, 2), WrapBoth},
		{bd(2, 1, 2), arbiter.LinkNorth, bd(2, 0, 1), WrapY},
	}
	for _, tt := range tests {
		got, wrap := Neighbour(w, h, tt.from, tt.link)
		if got != tt.to || wrap != tt.wrap {
			t.Errorf("Neighbour(%v, %v) = %v %v, want %v %v", tt.from, tt.link, got, wrap, tt.to, tt.wrap)
		}
	}
	// Every link comes back over its opposite, on every machine shape.
	for _, size := range [][2]int{{1, 1}, {1, 3}, {2, 1}, {3, 4}, {5, 5}} {
		for x := 0; x < size[0]; x++ {
			for y := 0; y < size[1]; y++ {
				for z := 0; z < 3; z++ {
					for l := arbiter.Link(0); l < arbiter.NumLinks; l++ {
						n, wrap := Neighbour(size[0], size[1], bd(x, y, z), l)
						back, wrap2 := Neighbour(size[0], size[1], n, l.Opposite())
						if !arbiter.GridContains(size[0], size[1], n) || back != bd(x, y, z) || wrap != wrap2 {
							t.Fatalf("%v×%v: %v over %v to %v and back to %v (wraps %v, %v)", size[0], size[1], bd(x, y, z), l, n, back, wrap, wrap2)
						}
					}
				}
			}
		}
	}
}

func TestBoardToChip(t *testing.T) {
	tests := []struct {
		b    arbiter.Board
		x, y int
	}{
		{bd(0, 0, 0), 0, 0}, {bd(0, 0, 1), 8, 4}, {bd(0, 0, 2), 4, 8},
		{bd(1, 0, 0), 12, 0}, {bd(2, 3, 1), 32, 40}, {bd(3, 1, 2), 40, 20},
	}
	for _, tt := range tests {
		if x, y := BoardToChip(tt.b); x != tt.x || y != tt.y {
			t.Errorf("BoardToChip(%v) = (%d,%d), want (%d,%d)", tt.b, x, y, tt.x, tt.y)
		}
	}
}

// TestChipToBoard checks that every chip of a machine belongs to exactly one
// board, that every board has the 48 chips of a SpiNN-5 board in their
// hexagonal shape relative to its Ethernet chip, and a few known chips.
func TestChipToBoard(t *testing.T) {
	// The chips of a SpiNN-5 board: row y spans x from lo[y] to hi[y].
	lo := [8]int{0, 0, 0, 0, 1, 2, 3, 4}
	hi := [8]int{4, 5, 6, 7, 7, 7, 7, 7}
	for _, size := range [][2]int{{1, 1}, {2, 3}, {4, 2}} {
		w, h := size[0], size[1]
		chips := map[arbiter.Board]int{}
		for x := 0; x < 12*w; x++ {
			for y := 0; y < 12*h; y++ {
				b, cx, cy := ChipToBoard(w, h, x, y)
				if !arbiter.GridContains(w, h, b) {
					t.Fatalf("%d×%d: chip (%d,%d) on board %v, off the machine", w, h, x, y, b)
				}
				if cy < 0 || cy > 7 || cx < lo[cy] || cx > hi[cy] {
					t.Fatalf("%d×%d: chip (%d,%d) is (%d,%d) of board %v, outside a board's shape", w, h, x, y, cx, cy, b)
				}
				ex, ey := BoardToChip(b)
				if mod(ex+cx, 12*w) != x || mod(ey+cy, 12*h) != y {
					t.Fatalf("%d×%d: chip (%d,%d): board %v's chip (%d,%d) is elsewhere", w, h, x, y, b, cx, cy)
				}
				chips[b]++
			}
		}
		if len(chips) != 3*w*h {
			t.Errorf("%d×%d: %d boards hold chips, want %d", w, h, len(chips), 3*w*h)
		}
		for b, n := range chips {
			if n != 48 {
				t.Errorf("%d×%d: board %v holds %d chips, want 48", w, h, b, n)
			}
		}
	}
	tests := []struct {
		w, h, x, y   int
		b            arbiter.Board
		chipX, chipY int
	}{
		{2, 2, 0, 0, bd(0, 0, 0), 0, 0},
		{2, 2, 8, 4, bd(0, 0, 1), 0, 0},
		{2, 2, 4, 8, bd(0, 0, 2), 0, 0},
		{2, 2, 7, 3, bd(0, 0, 0), 7, 3},
		{2, 2, 5, 0, bd(0, 1, 2), 1, 4},   // board (0,1,2)'s Ethernet chip is (4,20), i.e. (4,-4)
		{2, 2, 23, 23, bd(1, 1, 2), 7, 3}, // (16,20) + (7,3)
		{2, 2, 11, 0, bd(0, 1, 2), 7, 4},  // (4,20) + (7,4) wraps to (11,0)
		{2, 2, 24, 0, bd(0, 0, 0), 0, 0},  // wraps
		{2, 2, -1, 0, bd(1, 1, 2), 7, 4},
	}
	for _, tt := range tests {
		b, cx, cy := ChipToBoard(tt.w, tt.h, tt.x, tt.y)
		ex, ey := BoardToChip(b)
		if b != tt.b || mod(ex+cx, 12*tt.w) != mod(tt.x, 12*tt.w) || mod(ey+cy, 12*tt.h) != mod(tt.y, 12*tt.h) {
			t.Errorf("ChipToBoard(%d×%d, %d, %d) = %v (%d,%d), want %v", tt.w, tt.h, tt.x, tt.y, b, cx, cy, tt.b)
		}
	}
}

func TestBlockChips(t *testing.T) {
	tests := []struct {
		w, h   int
		wrap   Wrap
		cw, ch int
	}{
		{1, 1, WrapNone, 16, 16},
		{1, 1, WrapBoth, 12, 12},
		{2, 3, WrapNone, 28, 40},
		{2, 3, WrapX, 24, 40},
		{2, 3, WrapY, 28, 36},
		{4, 1, WrapY, 52, 12}, // the corpus's first block
	}
	for _, tt := range tests {
		if cw, ch := BlockChips(tt.w, tt.h, tt.wrap); cw != tt.cw || ch != tt.ch {
			t.Errorf("BlockChips(%d, %d, %v) = %d×%d, want %d×%d", tt.w, tt.h, tt.wrap, cw, ch, tt.cw, tt.ch)
		}
	}
}

func TestAreaToRect(t *testing.T) {
	tests := []struct {
		area, bw, bh int
		ratio        float64
		w, h         int
		ok           bool
	}{
		{1, 1, 1, 0, 1, 1, true},
		{12, 10, 10, 0, 4, 3, true},   // squarest, landscape
		{12, 10, 5, 0, 3, 4, true},    // turned upright in a wide region
		{7, 10, 10, 0, 7, 1, true},    // prime: a 7×1 strip is fine with no ratio
		{7, 10, 10, 0.5, 4, 2, true},  // ratio: 4×2 (a little more area)
		{7, 10, 5, 0.5, 2, 4, true},   // … upright in a wide region
		{7, 3, 10, 0.5, 3, 3, true},   // squeezed to the width: 3×3
		{7, 2, 10, 0.5, 2, 4, true},   // squeezed to 2×4: ratio 0.5 is enough
		{10, 2, 10, 0.6, 0, 0, false}, // squeezed 2×5 has ratio 0.4 < 0.6
		{101, 10, 10, 0, 0, 0, false}, // more than the region
		{6, 10, 10, 2.0, 3, 2, true},  // ratio above 1 counts as its inverse
		{50, 100, 100, 0.333, 10, 5, true},
	}
	for _, tt := range tests {
		w, h, ok := areaToRect(tt.area, tt.bw, tt.bh, tt.ratio)
		if w != tt.w || h != tt.h || ok != tt.ok {
			t.Errorf("areaToRect(%d, %d, %d, %v) = %d×%d %v, want %d×%d %v", tt.area, tt.bw, tt.bh, tt.ratio, w, h, ok, tt.w, tt.h, tt.ok)
		}
	}
}

package grid

import (
	"fmt"
	"net/netip"

	"github.com/arbiter-hq/arbiter"
)

// MachineAllocator returns the empty allocation state of machine m.
func MachineAllocator(m *arbiter.GridMachine) (*Allocator, error) {
	return NewAllocator(m.Width, m.Height, m.DeadBoards, m.DeadLinks)
}

// SingleBoard describes a machine of one board, as the reference's
// single-board shorthand: a 1×1 triad whose boards 1 and 2 are dead, board
// (0,0,0) at c:0 f:0 b:0 with address ip, its frame controller at
// controller. Tags nil means ["default"].
func SingleBoard(name string, tags []string, ip, controller string) arbiter.GridMachine {
	if tags == nil {
		tags = []string{"default"}
	}
	return arbiter.GridMachine{
		Name: name, Tags: tags, Width: 1, Height: 1,
		DeadBoards: []arbiter.Board{{X: 0, Y: 0, Z: 1}, {X: 0, Y: 0, Z: 2}},
		DeadLinks:  []arbiter.BoardLink{},
		Boards:     []arbiter.BoardInfo{{Board: arbiter.Board{}, IP: ip}},
		Frames:     []arbiter.GridFrame{{Address: controller}},
		Queue:      arbiter.GridQueueBackfill,
	}
}

// The reference's standard addressing (docs/reference/spalloc.md §7): a frame's range starts at
// base + cabinet×0.0.5.0 + frame×0.0.1.0, where its controller is; a
// board's Ethernet chip is at that + board×0.0.0.8 + 0.0.0.1.
const (
	cabinetStride = 5 << 8
	frameStride   = 1 << 8
	boardStride   = 8
	chipOffset    = 1
)

// StandardFrameIP is the standard address of frame (cabinet, frame)'s
// controller from base, an IPv4 address. Errors: base is not IPv4, a
// negative number, or the address passes 255.255.255.255.
func StandardFrameIP(base string, cabinet, frame int) (string, error) {
	return standardIP(base, cabinet, frame, 0, 0)
}

// StandardBoardIP is the standard address of the board at l from base.
// Errors as StandardFrameIP.
func StandardBoardIP(base string, l arbiter.BoardLocation) (string, error) {
	return standardIP(base, l.Cabinet, l.Frame, l.Board, chipOffset)
}

func standardIP(base string, c, f, b, off int) (string, error) {
	a, err := netip.ParseAddr(base)
	if err != nil || !a.Is4() {
		return "", fmt.Errorf("base address %q is not an IPv4 address such as \"10.11.0.0\"", base)
	}
	if c < 0 || f < 0 || b < 0 {
		return "", fmt.Errorf("location c:%d f:%d b:%d has a negative number", c, f, b)
	}
	v4 := a.As4()
	n := uint64(v4[0])<<24 | uint64(v4[1])<<16 | uint64(v4[2])<<8 | uint64(v4[3])
	n += uint64(c)*cabinetStride + uint64(f)*frameStride + uint64(b)*boardStride + uint64(off)
	if c > 1<<24 || f > 1<<24 || b > 1<<24 || n > 0xFFFFFFFF {
		return "", fmt.Errorf("the standard address of c:%d f:%d b:%d from %s passes 255.255.255.255", c, f, b, base)
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String(), nil
}

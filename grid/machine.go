package grid

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Queue policies of a grid machine.
const (
	// QueueBackfill lets a later request be placed while the head of the
	// queue waits, until the head has waited longer than the starvation
	// limit; then the machine is held for it. The default.
	QueueBackfill = "backfill"
	// QueueFIFO serves the queue strictly in order, as the reference does:
	// only the head is tried.
	QueueFIFO = "fifo"
)

// Location is a board's physical position: cabinet, frame (a rack of boards
// sharing a board-management controller) and slot.
type Location struct {
	Cabinet int `json:"cabinet"`
	Frame   int `json:"frame"`
	Board   int `json:"board"`
}

// String spells the location as "c:0 f:1 b:2".
func (l Location) String() string {
	return fmt.Sprintf("c:%d f:%d b:%d", l.Cabinet, l.Frame, l.Board)
}

// BoardInfo is what the machine knows of one board: its physical location
// and the address of its Ethernet-connected chip.
type BoardInfo struct {
	Board    arbiter.Board `json:"board"`
	Location Location      `json:"location"`
	IP       string        `json:"ip"`
}

// Frame is one frame of boards and the address of the board-management
// controller that powers its boards and sets their links.
type Frame struct {
	Cabinet int    `json:"cabinet"`
	Frame   int    `json:"frame"`
	Address string `json:"address"`
}

// Machine describes a grid machine: Width×Height triads of three boards
// each, connected as a hexagonal torus, some of them dead, each live board
// located and addressed (specs/spalloc.md §3, §7).
type Machine struct {
	Name string `json:"name"`
	// Tags select the machine for requests that do not name it; requests
	// without tags ask for "default".
	Tags []string `json:"tags"`
	// Width and Height are in triads.
	Width  int `json:"width"`
	Height int `json:"height"`
	// DeadBoards and DeadLinks are sorted. A dead link is one direction;
	// links to dead boards are dead whether listed or not.
	DeadBoards []arbiter.Board `json:"dead_boards"`
	DeadLinks  []BoardLink     `json:"dead_links"`
	// Boards are the located boards, sorted by board: every live board and
	// possibly some dead ones.
	Boards []BoardInfo `json:"boards"`
	// Frames are sorted by cabinet and frame: one per frame holding a
	// located board.
	Frames []Frame `json:"frames"`
	// Queue is QueueBackfill or QueueFIFO.
	Queue string `json:"queue"`
	// PowerDelay is how long the built-in power controller takes to switch
	// boards (for machines without a real board-management controller).
	PowerDelay time.Duration `json:"power_delay"`
}

// MaxPowerDelay bounds Machine.PowerDelay.
const MaxPowerDelay = time.Hour

// Sort puts the machine's lists in their canonical order (Validate
// expects it; lookups rely on it).
func (m *Machine) Sort() {
	slices.SortFunc(m.DeadBoards, arbiter.Board.Compare)
	m.DeadBoards = slices.Compact(m.DeadBoards)
	slices.SortFunc(m.DeadLinks, BoardLink.Compare)
	m.DeadLinks = slices.Compact(m.DeadLinks)
	slices.SortFunc(m.Boards, func(a, b BoardInfo) int { return a.Board.Compare(b.Board) })
	slices.SortFunc(m.Frames, compareFrame)
}

func compareFrame(a, b Frame) int {
	if a.Cabinet != b.Cabinet {
		return a.Cabinet - b.Cabinet
	}
	return a.Frame - b.Frame
}

// Validate checks a machine as strictly as the reference does: a usable
// name and tags, a size of 1..MaxSide triads, dead boards and links on the
// machine, located boards on the machine with distinct locations and
// addresses, every live board located and addressed, a controller address
// for every frame holding a live board and none for a frame holding no
// located board, a known queue policy. The lists must be sorted (Sort). Errors are *arbiter.Error with
// code EInvalid naming the machine and the offending entry.
func (m *Machine) Validate() error {
	bad := func(format string, args ...any) error {
		return arbiter.Errorf(arbiter.EInvalid, "grid machine %q: %s", m.Name, fmt.Sprintf(format, args...))
	}
	if err := arbiter.ValidateName("machine name", m.Name); err != nil {
		return err
	}
	for _, t := range m.Tags {
		if t == "" || strings.ContainsAny(t, " \t\r\n,") {
			return bad("tag %q must be non-empty without spaces or commas", t)
		}
	}
	if err := checkSize(m.Width, m.Height); err != nil {
		return bad("%v", err)
	}
	if !slices.IsSortedFunc(m.DeadBoards, arbiter.Board.Compare) || !slices.IsSortedFunc(m.DeadLinks, BoardLink.Compare) ||
		!slices.IsSortedFunc(m.Boards, func(a, b BoardInfo) int { return a.Board.Compare(b.Board) }) ||
		!slices.IsSortedFunc(m.Frames, compareFrame) {
		return bad("lists are not sorted (call Sort)")
	}
	for _, b := range m.DeadBoards {
		if !Contains(m.Width, m.Height, b) {
			return bad("dead board %v is outside the %d×%d machine", b, m.Width, m.Height)
		}
	}
	for _, l := range m.DeadLinks {
		if !Contains(m.Width, m.Height, l.Board) || l.Link >= NumLinks {
			return bad("dead link %v is outside the %d×%d machine", l, m.Width, m.Height)
		}
	}
	locs := map[Location]arbiter.Board{}
	ips := map[string]arbiter.Board{}
	frames := map[[2]int]bool{} // frames holding a located board: true if a live one
	for i, bi := range m.Boards {
		b := bi.Board
		if !Contains(m.Width, m.Height, b) {
			return bad("board %v is outside the %d×%d machine", b, m.Width, m.Height)
		}
		if i > 0 && m.Boards[i-1].Board == b {
			return bad("board %v is described twice", b)
		}
		if l := bi.Location; l.Cabinet < 0 || l.Frame < 0 || l.Board < 0 {
			return bad("board %v: location %v has a negative number", b, l)
		}
		if o, dup := locs[bi.Location]; dup {
			return bad("boards %v and %v are both at %v", o, b, bi.Location)
		}
		locs[bi.Location] = b
		fk := [2]int{bi.Location.Cabinet, bi.Location.Frame}
		frames[fk] = frames[fk] || !m.Dead(b)
		if bi.IP == "" {
			if !m.Dead(b) {
				return bad("board %v has no IP address", b)
			}
		} else {
			if err := CheckAddress(bi.IP); err != nil {
				return bad("board %v: %v", b, err)
			}
			if o, dup := ips[bi.IP]; dup {
				return bad("boards %v and %v both have address %s", o, b, bi.IP)
			}
			ips[bi.IP] = b
		}
	}
	for x := 0; x < m.Width; x++ {
		for y := 0; y < m.Height; y++ {
			for z := 0; z < 3; z++ {
				b := arbiter.Board{X: x, Y: y, Z: z}
				if _, ok := m.Info(b); !ok && !m.Dead(b) {
					return bad("live board %v has no location; give it one or list it as dead", b)
				}
			}
		}
	}
	addrs := map[string][2]int{}
	for i, f := range m.Frames {
		k := [2]int{f.Cabinet, f.Frame}
		if i > 0 && compareFrame(m.Frames[i-1], f) == 0 {
			return bad("frame c:%d f:%d is described twice", f.Cabinet, f.Frame)
		}
		if _, ok := frames[k]; !ok {
			return bad("frame c:%d f:%d holds no board", f.Cabinet, f.Frame)
		}
		if err := CheckAddress(f.Address); err != nil {
			return bad("frame c:%d f:%d: %v", f.Cabinet, f.Frame, err)
		}
		if o, dup := addrs[f.Address]; dup {
			return bad("frames c:%d f:%d and c:%d f:%d both have controller address %s", o[0], o[1], f.Cabinet, f.Frame, f.Address)
		}
		if b, dup := ips[f.Address]; dup {
			return bad("frame c:%d f:%d has the address %s of board %v", f.Cabinet, f.Frame, f.Address, b)
		}
		addrs[f.Address] = k
		delete(frames, k)
	}
	var missing []string
	for k, live := range frames {
		if live {
			missing = append(missing, fmt.Sprintf("c:%d f:%d", k[0], k[1]))
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return bad("no controller address for frame %s, which holds live boards", strings.Join(missing, ", "))
	}
	switch m.Queue {
	case QueueBackfill, QueueFIFO:
	default:
		return bad("queue %q is not %q or %q", m.Queue, QueueBackfill, QueueFIFO)
	}
	if m.PowerDelay < 0 || m.PowerDelay > MaxPowerDelay {
		return bad("power delay %v is not between 0 and %v", m.PowerDelay, MaxPowerDelay)
	}
	return nil
}

// CheckAddress checks the address of a board or controller: an IP address
// or a host name.
func CheckAddress(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	if s == "" || len(s) > 253 {
		return fmt.Errorf("address %q is not an IP address or host name", s)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("address %q is not an IP address or host name", s)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("address %q is not an IP address or host name", s)
			}
		}
	}
	return nil
}

// Dead reports whether board b is listed dead.
func (m *Machine) Dead(b arbiter.Board) bool {
	_, found := slices.BinarySearchFunc(m.DeadBoards, b, arbiter.Board.Compare)
	return found
}

// Info returns what the machine knows of board b: false when b is not
// located.
func (m *Machine) Info(b arbiter.Board) (BoardInfo, bool) {
	i, found := slices.BinarySearchFunc(m.Boards, b, func(e BoardInfo, b arbiter.Board) int { return e.Board.Compare(b) })
	if !found {
		return BoardInfo{}, false
	}
	return m.Boards[i], true
}

// At returns the board at physical location l: false when none is there.
func (m *Machine) At(l Location) (arbiter.Board, bool) {
	for _, bi := range m.Boards {
		if bi.Location == l {
			return bi.Board, true
		}
	}
	return arbiter.Board{}, false
}

// FrameAddress returns the controller address of frame (cabinet, frame).
func (m *Machine) FrameAddress(cabinet, frame int) (string, bool) {
	i, found := slices.BinarySearchFunc(m.Frames, Frame{Cabinet: cabinet, Frame: frame}, compareFrame)
	if !found {
		return "", false
	}
	return m.Frames[i].Address, true
}

// LiveBoards is the number of boards not listed dead.
func (m *Machine) LiveBoards() int { return 3*m.Width*m.Height - len(m.DeadBoards) }

// SameLayout reports whether o has the same size, board locations and
// addresses and frame addresses as m. A configuration reload that changes
// any of them removes the machine and adds it again (its allocations end
// with "Machine removed."); a change of name order, tags, dead boards or
// links, queue or power delay keeps running allocations.
func (m *Machine) SameLayout(o *Machine) bool {
	return m.Width == o.Width && m.Height == o.Height && slices.Equal(m.Boards, o.Boards) && slices.Equal(m.Frames, o.Frames)
}

// NewAllocator returns the empty allocation state of the machine.
func (m *Machine) NewAllocator() (*Allocator, error) {
	return NewAllocator(m.Width, m.Height, m.DeadBoards, m.DeadLinks)
}

// SingleBoard describes a machine of one board, as the reference's
// single-board shorthand: a 1×1 triad whose boards 1 and 2 are dead, board
// (0,0,0) at c:0 f:0 b:0 with address ip, its frame controller at
// controller. Tags nil means ["default"].
func SingleBoard(name string, tags []string, ip, controller string) Machine {
	if tags == nil {
		tags = []string{"default"}
	}
	return Machine{
		Name: name, Tags: tags, Width: 1, Height: 1,
		DeadBoards: []arbiter.Board{{X: 0, Y: 0, Z: 1}, {X: 0, Y: 0, Z: 2}},
		DeadLinks:  []BoardLink{},
		Boards:     []BoardInfo{{Board: arbiter.Board{}, IP: ip}},
		Frames:     []Frame{{Address: controller}},
		Queue:      QueueBackfill,
	}
}

// The reference's standard addressing (spec §7): a frame's range starts at
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
func StandardBoardIP(base string, l Location) (string, error) {
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

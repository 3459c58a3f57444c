package arbiter

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The description of a grid machine (KindGrid): its size in triads, its
// dead boards and links, where each board is and how to reach it. Package
// grid holds the geometry and the allocator that work on it; the
// description lives here so that commands and records can name it.

// Link is one of a board's six links, numbered as the spalloc protocol
// numbers them (docs/reference/spalloc.md §3).
type Link uint8

// The six links. The opposite of link l is (l+3) % 6.
const (
	LinkEast Link = iota
	LinkNorthEast
	LinkNorth
	LinkWest
	LinkSouthWest
	LinkSouth
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
	Board Board `json:"board"`
	Link  Link  `json:"link"`
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

// Queue policies of a grid machine.
const (
	// GridQueueBackfill lets a later request be placed while the head of the
	// queue waits, until the head has waited longer than the starvation
	// limit; then the machine is held for it. The default.
	GridQueueBackfill = "backfill"
	// GridQueueFIFO serves the queue strictly in order, as the reference does:
	// only the head is tried.
	GridQueueFIFO = "fifo"
)

// BoardLocation is a board's physical position: cabinet, frame (a rack of boards
// sharing a board-management controller) and slot.
type BoardLocation struct {
	Cabinet int `json:"cabinet"`
	Frame   int `json:"frame"`
	Board   int `json:"board"`
}

// String spells the location as "c:0 f:1 b:2".
func (l BoardLocation) String() string {
	return fmt.Sprintf("c:%d f:%d b:%d", l.Cabinet, l.Frame, l.Board)
}

// BoardInfo is what the machine knows of one board: its physical location
// and the address of its Ethernet-connected chip.
type BoardInfo struct {
	Board    Board         `json:"board"`
	Location BoardLocation `json:"location"`
	IP       string        `json:"ip"`
}

// GridFrame is one frame of boards and the address of the board-management
// controller that powers its boards and sets their links.
type GridFrame struct {
	Cabinet int    `json:"cabinet"`
	Frame   int    `json:"frame"`
	Address string `json:"address"`
}

// GridMachine describes a grid machine: Width×Height triads of three boards
// each, connected as a hexagonal torus, some of them dead, each live board
// located and addressed (docs/reference/spalloc.md §3, §7).
type GridMachine struct {
	Name string `json:"name"`
	// Tags select the machine for requests that do not name it; requests
	// without tags ask for "default".
	Tags []string `json:"tags"`
	// Width and Height are in triads.
	Width  int `json:"width"`
	Height int `json:"height"`
	// DeadBoards and DeadLinks are sorted. A dead link is one direction;
	// links to dead boards are dead whether listed or not.
	DeadBoards []Board     `json:"dead_boards"`
	DeadLinks  []BoardLink `json:"dead_links"`
	// Boards are the located boards, sorted by board: every live board and
	// possibly some dead ones.
	Boards []BoardInfo `json:"boards"`
	// Frames are sorted by cabinet and frame: one per frame holding a
	// located board.
	Frames []GridFrame `json:"frames"`
	// Queue is GridQueueBackfill or GridQueueFIFO.
	Queue string `json:"queue"`
	// PowerDelay is how long the built-in power controller takes to switch
	// boards (for machines without a real board-management controller).
	PowerDelay time.Duration `json:"power_delay"`
}

// GridMaxPowerDelay bounds GridMachine.PowerDelay.
const GridMaxPowerDelay = time.Hour

// Sort puts the machine's lists in their canonical order (Validate
// expects it; lookups rely on it).
func (m *GridMachine) Sort() {
	slices.SortFunc(m.DeadBoards, Board.Compare)
	m.DeadBoards = slices.Compact(m.DeadBoards)
	slices.SortFunc(m.DeadLinks, BoardLink.Compare)
	m.DeadLinks = slices.Compact(m.DeadLinks)
	slices.SortFunc(m.Boards, func(a, b BoardInfo) int { return a.Board.Compare(b.Board) })
	slices.SortFunc(m.Frames, compareFrame)
}

func compareFrame(a, b GridFrame) int {
	if a.Cabinet != b.Cabinet {
		return a.Cabinet - b.Cabinet
	}
	return a.Frame - b.Frame
}

// Dead reports whether board b is listed dead.
func (m *GridMachine) Dead(b Board) bool {
	_, found := slices.BinarySearchFunc(m.DeadBoards, b, Board.Compare)
	return found
}

// Info returns what the machine knows of board b: false when b is not
// located.
func (m *GridMachine) Info(b Board) (BoardInfo, bool) {
	i, found := slices.BinarySearchFunc(m.Boards, b, func(e BoardInfo, b Board) int { return e.Board.Compare(b) })
	if !found {
		return BoardInfo{}, false
	}
	return m.Boards[i], true
}

// At returns the board at physical location l: false when none is there.
func (m *GridMachine) At(l BoardLocation) (Board, bool) {
	for _, bi := range m.Boards {
		if bi.Location == l {
			return bi.Board, true
		}
	}
	return Board{}, false
}

// FrameAddress returns the controller address of frame (cabinet, frame).
func (m *GridMachine) FrameAddress(cabinet, frame int) (string, bool) {
	i, found := slices.BinarySearchFunc(m.Frames, GridFrame{Cabinet: cabinet, Frame: frame}, compareFrame)
	if !found {
		return "", false
	}
	return m.Frames[i].Address, true
}

// LiveBoards is the number of boards not listed dead.
func (m *GridMachine) LiveBoards() int { return 3*m.Width*m.Height - len(m.DeadBoards) }

// SameLayout reports whether o has the same size, board locations and
// addresses and frame addresses as m. A configuration reload that changes
// any of them removes the machine and adds it again (its allocations end
// with "Machine removed."); a change of name order, tags, dead boards or
// links, queue or power delay keeps running allocations.
func (m *GridMachine) SameLayout(o *GridMachine) bool {
	return m.Width == o.Width && m.Height == o.Height && slices.Equal(m.Boards, o.Boards) && slices.Equal(m.Frames, o.Frames)
}

// Compare orders frames by cabinet, then frame.
func (f GridFrame) Compare(o GridFrame) int { return compareFrame(f, o) }

// GridContains reports whether b is on a machine of w×h triads.
func GridContains(w, h int, b Board) bool {
	return b.X >= 0 && b.X < w && b.Y >= 0 && b.Y < h && b.Z >= 0 && b.Z < 3
}

// CheckGridSize reports a machine size outside 1..GridMaxSide triads.
func CheckGridSize(w, h int) error {
	if w < 1 || h < 1 || w > GridMaxSide || h > GridMaxSide {
		return fmt.Errorf("a grid machine is 1 to %d triads wide and high, not %d×%d", GridMaxSide, w, h)
	}
	return nil
}

// GridMaxSide bounds a grid machine's width and height in triads (the largest
// SpiNNaker machine built is 20×20 triads; the packer is benchmarked at
// 100×100).
const GridMaxSide = 256

// Validate checks a machine as strictly as the reference does: a usable
// name and tags, a size of 1..GridMaxSide triads, dead boards and links on the
// machine, located boards on the machine with distinct locations and
// addresses, every live board located and addressed, a controller address
// for every frame holding a live board and none for a frame holding no
// located board, a known queue policy. The lists must be sorted (m.Sort). Errors are *Error with
// code EInvalid naming the machine and the offending entry.
func (m *GridMachine) Validate() error {
	bad := func(format string, args ...any) error {
		return Errorf(EInvalid, "grid machine %q: %s", m.Name, fmt.Sprintf(format, args...))
	}
	if err := ValidateName("machine name", m.Name); err != nil {
		return err
	}
	for _, t := range m.Tags {
		if t == "" || strings.ContainsAny(t, " \t\r\n,") {
			return bad("tag %q must be non-empty without spaces or commas", t)
		}
	}
	if err := CheckGridSize(m.Width, m.Height); err != nil {
		return bad("%v", err)
	}
	if !slices.IsSortedFunc(m.DeadBoards, Board.Compare) || !slices.IsSortedFunc(m.DeadLinks, BoardLink.Compare) ||
		!slices.IsSortedFunc(m.Boards, func(a, b BoardInfo) int { return a.Board.Compare(b.Board) }) ||
		!slices.IsSortedFunc(m.Frames, GridFrame.Compare) {
		return bad("lists are not sorted (call Sort)")
	}
	for _, b := range m.DeadBoards {
		if !GridContains(m.Width, m.Height, b) {
			return bad("dead board %v is outside the %d×%d machine", b, m.Width, m.Height)
		}
	}
	for _, l := range m.DeadLinks {
		if !GridContains(m.Width, m.Height, l.Board) || l.Link >= NumLinks {
			return bad("dead link %v is outside the %d×%d machine", l, m.Width, m.Height)
		}
	}
	locs := map[BoardLocation]Board{}
	ips := map[string]Board{}
	frames := map[[2]int]bool{} // frames holding a located board: true if a live one
	for i, bi := range m.Boards {
		b := bi.Board
		if !GridContains(m.Width, m.Height, b) {
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
			if err := CheckGridAddress(bi.IP); err != nil {
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
				b := Board{X: x, Y: y, Z: z}
				if _, ok := m.Info(b); !ok && !m.Dead(b) {
					return bad("live board %v has no location; give it one or list it as dead", b)
				}
			}
		}
	}
	addrs := map[string][2]int{}
	for i, f := range m.Frames {
		k := [2]int{f.Cabinet, f.Frame}
		if i > 0 && GridFrame.Compare(m.Frames[i-1], f) == 0 {
			return bad("frame c:%d f:%d is described twice", f.Cabinet, f.Frame)
		}
		if _, ok := frames[k]; !ok {
			return bad("frame c:%d f:%d holds no board", f.Cabinet, f.Frame)
		}
		if err := CheckGridAddress(f.Address); err != nil {
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
	case GridQueueBackfill, GridQueueFIFO:
	default:
		return bad("queue %q is not %q or %q", m.Queue, GridQueueBackfill, GridQueueFIFO)
	}
	if m.PowerDelay < 0 || m.PowerDelay > GridMaxPowerDelay {
		return bad("power delay %v is not between 0 and %v", m.PowerDelay, GridMaxPowerDelay)
	}
	return nil
}

// CheckGridAddress checks the address of a board or controller: an IP address
// or a host name.
func CheckGridAddress(s string) error {
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

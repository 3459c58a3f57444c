package config

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// Spalloc is the [spalloc] section: the spalloc protocol's job history and
// board life cycle (docs/reference/spalloc.md).
type Spalloc struct {
	// MaxRetiredJobs is how many destroyed jobs get_job_state still reports
	// (older ones are state 0, unknown). Default 1200; 0 keeps none.
	MaxRetiredJobs int `toml:"max_retired_jobs" want:"a whole number"`
	// SecondsBeforeFree is how long the boards of a destroyed job stay
	// powered off and unavailable before they can be allocated again, so
	// that they settle. Default 30; 0 to 3600.
	SecondsBeforeFree float64 `toml:"seconds_before_free" want:"a number of seconds"`
	// Allow lists the client addresses the spalloc protocol server
	// (server.spalloc_listen) serves: CIDR prefixes ("10.0.0.0/8") or single
	// addresses. Default loopback only: ["127.0.0.0/8", "::1/128"]. The
	// protocol has no authentication; this list is its only guard.
	Allow []string `toml:"allow" want:"an array of addresses or CIDR prefixes"`
	// MaxConnsPerClient bounds the connections one client address may hold
	// open on the spalloc port (0: no limit). Default 64.
	MaxConnsPerClient int `toml:"max_conns_per_client" want:"a whole number"`
	// AllowPrefixes is Allow parsed.
	AllowPrefixes []netip.Prefix `toml:"-"`
}

// DefaultSpallocAllow is [spalloc] allow when the file says nothing.
var DefaultSpallocAllow = []string{"127.0.0.0/8", "::1/128"}

// Defaults and bounds of grid machines and [spalloc].
const (
	DefaultMaxRetiredJobs    = 1200
	DefaultSecondsBeforeFree = 30
	DefaultPowerDelayS       = 0.2
	maxRetiredJobs           = 1000000
	maxSecondsBeforeFree     = 3600
)

// gridEntry is one [[grid_machines]] entry (docs/reference/native.md, spalloc.md §7).
type gridEntry struct {
	Name string    `toml:"name"`
	Tags *[]string `toml:"tags" want:"an array of strings"`
	// Width and Height are in triads.
	Width      *int    `toml:"width" want:"a whole number of triads"`
	Height     *int    `toml:"height" want:"a whole number of triads"`
	DeadBoards [][]int `toml:"dead_boards" want:"an array of [x, y, z] arrays"`
	DeadLinks  [][]any `toml:"dead_links" want:"an array of [x, y, z, \"link\"] arrays"`
	// Locations is "identity" (board (x,y,z) at cabinet x, frame y, board z)
	// or "" (every live board needs a boards entry).
	Locations string `toml:"locations" want:"\"identity\" or \"\""`
	// BaseIP turns on the standard addresses.
	BaseIP      string            `toml:"base_ip" want:"an IPv4 address such as \"10.11.0.0\""`
	Boards      []gridBoardEntry  `toml:"boards" want:"an array of tables ([[grid_machines.boards]])"`
	Frames      []gridFrameEntry  `toml:"frames" want:"an array of tables ([[grid_machines.frames]])"`
	SingleBoard *singleBoardEntry `toml:"single_board" want:"a table such as { ip = \"192.168.240.1\", controller = \"192.168.240.0\" }"`
	Queue       string            `toml:"queue" want:"\"backfill\" or \"fifo\""`
	PowerDelayS *float64          `toml:"power_delay_s" want:"a number of seconds"`
}

// gridBoardEntry is one [[grid_machines.boards]] entry: a board's location
// (all of cabinet, frame and board, or none to keep the identity location)
// and its address (or none for the standard one).
type gridBoardEntry struct {
	X       *int   `toml:"x" want:"a whole number"`
	Y       *int   `toml:"y" want:"a whole number"`
	Z       *int   `toml:"z" want:"0, 1 or 2"`
	Cabinet *int   `toml:"cabinet" want:"a whole number"`
	Frame   *int   `toml:"frame" want:"a whole number"`
	Board   *int   `toml:"board" want:"a whole number"`
	IP      string `toml:"ip" want:"a string: an IP address or host name"`
}

// gridFrameEntry is one [[grid_machines.frames]] entry: the address of a
// frame's board-management controller.
//
// Decision: docs/reference/native.md describes these entries as "cabinet, frame,
// controller address" — a description, not a key list (the boards line next
// to it lists keys). The key is "address", one spelling, as example.toml,
// the README and the tests write it; "controller" is an unknown key here, and
// the error lists the allowed ones.
type gridFrameEntry struct {
	Cabinet *int   `toml:"cabinet" want:"a whole number"`
	Frame   *int   `toml:"frame" want:"a whole number"`
	Address string `toml:"address" want:"a string: an IP address or host name"`
}

// singleBoardEntry is the single-board shorthand: a 1×1 machine whose only
// live board is (0,0,0) at c:0 f:0 b:0.
type singleBoardEntry struct {
	IP         string `toml:"ip" want:"a string: the board's IP address or host name"`
	Controller string `toml:"controller" want:"a string: the controller's IP address or host name"`
}

// gridAddrs remembers which key each address of the grid machines came
// from, to name it when another entry uses the same address.
type gridAddrs map[string]string

// expandGrid turns the [[grid_machines]] entries into validated machines,
// in order, checking each entry and then, across entries, unique names
// (with [[machines]] too) and unique board and controller addresses.
func (f *file) expandGrid(ps *problems) []arbiter.GridMachine {
	var out []arbiter.GridMachine
	names := map[string]string{}
	for i, e := range f.Machines {
		names[e.Name] = fmt.Sprintf("machines[%d]", i)
	}
	addrs := gridAddrs{}
	for i := range f.GridMachines {
		key := fmt.Sprintf("grid_machines[%d]", i)
		e := &f.GridMachines[i]
		if err := arbiter.ValidateName("machine name", e.Name); err != nil {
			ps.add(key+".name", arbiter.ErrorMessage(err))
		} else if other, dup := names[e.Name]; dup {
			ps.add(key+".name", fmt.Sprintf("machine name %q is already used by %s", e.Name, other))
		} else {
			names[e.Name] = key
		}
		m, origin, ok := e.expand(ps, key)
		if !ok {
			continue
		}
		for _, bi := range m.Boards {
			if bi.IP == "" {
				continue
			}
			k := origin[bi.Board]
			if other, dup := addrs[bi.IP]; dup {
				ps.add(k, fmt.Sprintf("address %s of board %v is already used by %s; every board and controller needs its own address", bi.IP, bi.Board, other))
				ok = false
				continue
			}
			addrs[bi.IP] = fmt.Sprintf("board %v of %s", bi.Board, key)
		}
		for _, fr := range m.Frames {
			k := origin[frameKey(fr.Cabinet, fr.Frame)]
			if other, dup := addrs[fr.Address]; dup {
				ps.add(k, fmt.Sprintf("controller address %s of frame c:%d f:%d is already used by %s; every board and controller needs its own address", fr.Address, fr.Cabinet, fr.Frame, other))
				ok = false
				continue
			}
			addrs[fr.Address] = fmt.Sprintf("frame c:%d f:%d of %s", fr.Cabinet, fr.Frame, key)
		}
		if !ok || ps.has(key) {
			continue
		}
		// The machine's own rules are the last word; the checks above
		// only say more precisely where a problem is.
		if err := m.Validate(); err != nil {
			ps.add(key, arbiter.ErrorMessage(err))
			continue
		}
		out = append(out, m)
	}
	return out
}

// frameKey is the origin map's key of a frame: boards have z ≥ 0.
func frameKey(c, f int) arbiter.Board { return arbiter.Board{X: c, Y: f, Z: -1} }

// expand builds the machine of one entry. origin maps each board (and each
// frame, by frameKey) to the key its address came from. ok is false when
// the entry has problems (recorded in ps).
func (e *gridEntry) expand(ps *problems, key string) (m arbiter.GridMachine, origin map[arbiter.Board]string, ok bool) {
	origin = map[arbiter.Board]string{}
	m = arbiter.GridMachine{Name: e.Name, Tags: []string{"default"}, Queue: arbiter.GridQueueBackfill,
		PowerDelay: time.Duration(DefaultPowerDelayS * float64(time.Second))}
	if e.Tags != nil {
		m.Tags = append([]string{}, (*e.Tags)...)
	}
	for j, t := range m.Tags {
		if t == "" || strings.ContainsAny(t, " \t\r\n,") {
			ps.add(fmt.Sprintf("%s.tags[%d]", key, j), fmt.Sprintf("tag %q must be non-empty without spaces or commas", t))
		}
	}
	switch e.Queue {
	case "":
	case arbiter.GridQueueBackfill, arbiter.GridQueueFIFO:
		m.Queue = e.Queue
	default:
		ps.add(key+".queue", fmt.Sprintf("unknown value %q; want %s or %s", e.Queue, arbiter.GridQueueBackfill, arbiter.GridQueueFIFO))
	}
	if d := e.PowerDelayS; d != nil {
		if !finite(*d) || *d < 0 || *d > arbiter.GridMaxPowerDelay.Seconds() {
			ps.add(key+".power_delay_s", fmt.Sprintf("must be 0 to %v seconds, got %v", arbiter.GridMaxPowerDelay.Seconds(), *d))
		} else {
			m.PowerDelay = time.Duration(math.Round(*d * float64(time.Second)))
		}
	}

	if s := e.SingleBoard; s != nil {
		sk := key + ".single_board"
		for _, k := range []struct {
			name string
			set  bool
		}{
			{"width", e.Width != nil}, {"height", e.Height != nil}, {"dead_boards", e.DeadBoards != nil},
			{"dead_links", e.DeadLinks != nil}, {"locations", e.Locations != ""}, {"base_ip", e.BaseIP != ""},
			{"boards", e.Boards != nil}, {"frames", e.Frames != nil},
		} {
			if k.set {
				ps.add(key+"."+k.name, "not allowed with single_board, which describes the whole machine: one board at (0,0,0), c:0 f:0 b:0")
			}
		}
		if err := arbiter.CheckGridAddress(s.IP); err != nil {
			ps.add(sk+".ip", fmt.Sprintf("%v; give the board's address", err))
		}
		if err := arbiter.CheckGridAddress(s.Controller); err != nil {
			ps.add(sk+".controller", fmt.Sprintf("%v; give the frame controller's address", err))
		}
		if ps.has(key) {
			return m, origin, false
		}
		sb := grid.SingleBoard(e.Name, m.Tags, s.IP, s.Controller)
		sb.Queue, sb.PowerDelay = m.Queue, m.PowerDelay
		origin[arbiter.Board{}] = sk + ".ip"
		origin[frameKey(0, 0)] = sk + ".controller"
		return sb, origin, true
	}

	if e.Width == nil {
		ps.add(key+".width", "missing: give the machine's width in triads, e.g. width = 2 (or use single_board)")
	}
	if e.Height == nil {
		ps.add(key+".height", "missing: give the machine's height in triads, e.g. height = 2 (or use single_board)")
	}
	if e.Width == nil || e.Height == nil {
		return m, origin, false
	}
	m.Width, m.Height = *e.Width, *e.Height
	for _, k := range []string{"width", "height"} {
		v := m.Width
		if k == "height" {
			v = m.Height
		}
		if v < 1 || v > arbiter.GridMaxSide {
			ps.add(key+"."+k, fmt.Sprintf("must be 1 to %d triads, got %d", arbiter.GridMaxSide, v))
		}
	}
	if ps.has(key) {
		return m, origin, false
	}
	on := func(b arbiter.Board) bool { return arbiter.GridContains(m.Width, m.Height, b) }

	for j, d := range e.DeadBoards {
		k := fmt.Sprintf("%s.dead_boards[%d]", key, j)
		if len(d) != 3 {
			ps.add(k, fmt.Sprintf("a dead board is [x, y, z], not %d numbers", len(d)))
			continue
		}
		b := arbiter.Board{X: d[0], Y: d[1], Z: d[2]}
		if !on(b) {
			ps.add(k, fmt.Sprintf("board %v is not on the %d×%d machine (x 0..%d, y 0..%d, z 0..2)", b, m.Width, m.Height, m.Width-1, m.Height-1))
			continue
		}
		m.DeadBoards = append(m.DeadBoards, b)
	}
	for j, d := range e.DeadLinks {
		k := fmt.Sprintf("%s.dead_links[%d]", key, j)
		bl, err := parseDeadLink(d)
		if err != nil {
			ps.add(k, err.Error())
			continue
		}
		if !on(bl.Board) {
			ps.add(k, fmt.Sprintf("board %v is not on the %d×%d machine (x 0..%d, y 0..%d, z 0..2)", bl.Board, m.Width, m.Height, m.Width-1, m.Height-1))
			continue
		}
		m.DeadLinks = append(m.DeadLinks, bl)
	}
	m.Sort()

	// Locations: the identity shorthand, then explicit entries.
	type located struct {
		loc   arbiter.BoardLocation
		ip    string
		where string // the key that located the board
	}
	boards := map[arbiter.Board]*located{}
	switch e.Locations {
	case "":
	case "identity":
		for x := 0; x < m.Width; x++ {
			for y := 0; y < m.Height; y++ {
				for z := 0; z < 3; z++ {
					boards[arbiter.Board{X: x, Y: y, Z: z}] = &located{loc: arbiter.BoardLocation{Cabinet: x, Frame: y, Board: z}, where: key + ".locations"}
				}
			}
		}
	default:
		ps.add(key+".locations", fmt.Sprintf("unknown value %q; want \"identity\" (board (x,y,z) at cabinet x, frame y, board z) or \"\" (a [[grid_machines.boards]] entry per board)", e.Locations))
	}
	explicit := map[arbiter.Board]string{}
	for j, be := range e.Boards {
		k := fmt.Sprintf("%s.boards[%d]", key, j)
		if be.X == nil || be.Y == nil || be.Z == nil {
			ps.add(k, "a board entry needs x, y and z")
			continue
		}
		b := arbiter.Board{X: *be.X, Y: *be.Y, Z: *be.Z}
		if !on(b) {
			ps.add(k, fmt.Sprintf("board %v is not on the %d×%d machine (x 0..%d, y 0..%d, z 0..2)", b, m.Width, m.Height, m.Width-1, m.Height-1))
			continue
		}
		if other, dup := explicit[b]; dup {
			ps.add(k, fmt.Sprintf("board %v is already described by %s", b, other))
			continue
		}
		explicit[b] = k
		l := boards[b]
		switch n := countSet(be.Cabinet, be.Frame, be.Board); {
		case n == 3:
			loc := arbiter.BoardLocation{Cabinet: *be.Cabinet, Frame: *be.Frame, Board: *be.Board}
			if loc.Cabinet < 0 || loc.Frame < 0 || loc.Board < 0 {
				ps.add(k, fmt.Sprintf("location %v has a negative number", loc))
				continue
			}
			l = &located{loc: loc, where: k}
			boards[b] = l
		case n > 0:
			ps.add(k, "give all of cabinet, frame and board, or none of them to keep the identity location")
			continue
		case l == nil:
			ps.add(k, fmt.Sprintf("board %v has no location: give cabinet, frame and board, or set locations = \"identity\"", b))
			continue
		}
		if be.IP != "" {
			if err := arbiter.CheckGridAddress(be.IP); err != nil {
				ps.add(k+".ip", err.Error())
				continue
			}
			l.ip = be.IP
			origin[b] = k + ".ip"
		}
	}
	if e.BaseIP != "" {
		if _, err := grid.StandardFrameIP(e.BaseIP, 0, 0); err != nil {
			ps.add(key+".base_ip", err.Error())
		}
	}
	if ps.has(key) {
		return m, origin, false
	}

	// Every live board located; no two boards at one place; addresses.
	at := map[arbiter.BoardLocation]arbiter.Board{}
	for x := 0; x < m.Width; x++ {
		for y := 0; y < m.Height; y++ {
			for z := 0; z < 3; z++ {
				b := arbiter.Board{X: x, Y: y, Z: z}
				l := boards[b]
				if l == nil {
					if !m.Dead(b) {
						ps.add(key, fmt.Sprintf("live board %v has no location: add a [[grid_machines.boards]] entry for it, set locations = \"identity\", or list it in dead_boards", b))
						return m, origin, false
					}
					continue
				}
				if other, dup := at[l.loc]; dup {
					ps.add(l.where, fmt.Sprintf("boards %v and %v are both at %v", other, b, l.loc))
					return m, origin, false
				}
				at[l.loc] = b
				if l.ip == "" && e.BaseIP != "" {
					ip, err := grid.StandardBoardIP(e.BaseIP, l.loc)
					if err != nil {
						ps.add(key+".base_ip", err.Error())
						return m, origin, false
					}
					l.ip = ip
					origin[b] = key + ".base_ip"
				}
				if l.ip == "" && !m.Dead(b) {
					ps.add(key, fmt.Sprintf("live board %v has no address: set base_ip for the standard addresses, or give it ip in a [[grid_machines.boards]] entry", b))
					return m, origin, false
				}
				m.Boards = append(m.Boards, arbiter.BoardInfo{Board: b, Location: l.loc, IP: l.ip})
			}
		}
	}

	// Frames: explicit entries, else the standard address. A frame holding
	// a live board needs its controller's address.
	holds, live := map[[2]int]bool{}, map[[2]int]bool{}
	var order [][2]int
	for _, bi := range m.Boards {
		c := [2]int{bi.Location.Cabinet, bi.Location.Frame}
		if !holds[c] {
			order = append(order, c)
		}
		holds[c] = true
		live[c] = live[c] || !m.Dead(bi.Board)
	}
	slices.SortFunc(order, func(a, b [2]int) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) })
	frames := map[[2]int]string{}
	for j, fe := range e.Frames {
		k := fmt.Sprintf("%s.frames[%d]", key, j)
		if fe.Cabinet == nil || fe.Frame == nil {
			ps.add(k, "a frame entry needs cabinet, frame and address")
			continue
		}
		c := [2]int{*fe.Cabinet, *fe.Frame}
		if _, dup := frames[c]; dup {
			ps.add(k, fmt.Sprintf("frame c:%d f:%d is already described", c[0], c[1]))
			continue
		}
		if !holds[c] {
			ps.add(k, fmt.Sprintf("frame c:%d f:%d holds none of the machine's boards", c[0], c[1]))
			continue
		}
		if err := arbiter.CheckGridAddress(fe.Address); err != nil {
			ps.add(k+".address", err.Error())
			continue
		}
		frames[c] = fe.Address
		origin[frameKey(c[0], c[1])] = k + ".address"
	}
	for _, c := range order {
		if _, ok := frames[c]; ok {
			continue
		}
		if e.BaseIP == "" {
			if live[c] {
				ps.add(key, fmt.Sprintf("frame c:%d f:%d has no controller address: set base_ip for the standard addresses, or add a [[grid_machines.frames]] entry", c[0], c[1]))
				return m, origin, false
			}
			continue
		}
		addr, err := grid.StandardFrameIP(e.BaseIP, c[0], c[1])
		if err != nil {
			ps.add(key+".base_ip", err.Error())
			return m, origin, false
		}
		frames[c] = addr
		origin[frameKey(c[0], c[1])] = key + ".base_ip"
	}
	for c, addr := range frames {
		m.Frames = append(m.Frames, arbiter.GridFrame{Cabinet: c[0], Frame: c[1], Address: addr})
	}
	m.Sort()
	if ps.has(key) {
		return m, origin, false
	}
	// Addresses unique within the machine (across machines: expandGrid).
	seen := map[string]string{}
	for _, bi := range m.Boards {
		if bi.IP == "" {
			continue
		}
		if other, dup := seen[bi.IP]; dup {
			hint := ""
			if origin[bi.Board] == key+".base_ip" {
				hint = " (the standard addresses leave room for 5 frames per cabinet and 32 boards per frame)"
			}
			ps.add(origin[bi.Board], fmt.Sprintf("address %s of board %v is already used by %s; every board and controller needs its own address%s", bi.IP, bi.Board, other, hint))
			return m, origin, false
		}
		seen[bi.IP] = fmt.Sprintf("board %v", bi.Board)
	}
	for _, fr := range m.Frames {
		if other, dup := seen[fr.Address]; dup {
			ps.add(origin[frameKey(fr.Cabinet, fr.Frame)], fmt.Sprintf("controller address %s of frame c:%d f:%d is already used by %s; every board and controller needs its own address", fr.Address, fr.Cabinet, fr.Frame, other))
			return m, origin, false
		}
		seen[fr.Address] = fmt.Sprintf("frame c:%d f:%d", fr.Cabinet, fr.Frame)
	}
	return m, origin, true
}

// parseDeadLink reads [x, y, z, link] where link is a name ("north") or a
// number 0..5.
func parseDeadLink(d []any) (arbiter.BoardLink, error) {
	if len(d) != 4 {
		return arbiter.BoardLink{}, fmt.Errorf("a dead link is [x, y, z, \"link\"], not %d values", len(d))
	}
	var xyz [3]int
	for i := 0; i < 3; i++ {
		n, ok := d[i].(int64)
		if !ok || n < math.MinInt32 || n > math.MaxInt32 {
			return arbiter.BoardLink{}, fmt.Errorf("a dead link is [x, y, z, \"link\"]: %v is not a whole number", d[i])
		}
		xyz[i] = int(n)
	}
	var l arbiter.Link
	ok := false
	switch v := d[3].(type) {
	case string:
		l, ok = arbiter.ParseLink(v)
	case int64:
		if v >= 0 && v < arbiter.NumLinks {
			l, ok = arbiter.Link(v), true
		}
	}
	if !ok {
		return arbiter.BoardLink{}, fmt.Errorf("link %v is not one of east, north_east, north, west, south_west, south (or 0..5)", d[3])
	}
	return arbiter.BoardLink{Board: arbiter.Board{X: xyz[0], Y: xyz[1], Z: xyz[2]}, Link: l}, nil
}

func countSet(ps ...*int) int {
	n := 0
	for _, p := range ps {
		if p != nil {
			n++
		}
	}
	return n
}

// validateSpalloc checks the [spalloc] section.
func (c *Config) validateSpalloc(ps *problems) {
	if n := c.Spalloc.MaxRetiredJobs; n < 0 || n > maxRetiredJobs {
		ps.add("spalloc.max_retired_jobs", fmt.Sprintf("must be 0 to %d, got %d", maxRetiredJobs, n))
	}
	checkSeconds(ps, "spalloc.seconds_before_free", c.Spalloc.SecondsBeforeFree, 0, maxSecondsBeforeFree)
	c.Spalloc.AllowPrefixes = nil
	for i, a := range c.Spalloc.Allow {
		p, err := parseAllow(a)
		if err != nil {
			ps.add(fmt.Sprintf("spalloc.allow[%d]", i), err.Error())
			continue
		}
		c.Spalloc.AllowPrefixes = append(c.Spalloc.AllowPrefixes, p)
	}
}

func defaultSpalloc() Spalloc {
	s := Spalloc{MaxRetiredJobs: DefaultMaxRetiredJobs, SecondsBeforeFree: DefaultSecondsBeforeFree,
		Allow: slices.Clone(DefaultSpallocAllow), MaxConnsPerClient: DefaultSpallocConnsPerClient}
	for _, a := range s.Allow {
		p, _ := parseAllow(a)
		s.AllowPrefixes = append(s.AllowPrefixes, p)
	}
	return s
}

// parseAllow reads an allow-list entry: a CIDR prefix or one address.
func parseAllow(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR prefix such as \"10.0.0.0/8\"", s)
}

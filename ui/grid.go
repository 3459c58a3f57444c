package ui

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The board map of a grid machine in the machines panel: its triads laid
// out by (x, y), y growing upwards as in the machine's own coordinates,
// each with its three boards; a board is free, dead, or held — coloured by
// its holder, labelled with the allocation id, and styled by the power
// state of the allocation (on, off, switching, or switched off and waiting
// to be freed after the allocation ended).

// compactTriads: a machine wider than this many triads draws its boards
// without labels.
const compactTriads = 8

type boardMap struct {
	W, H    int
	Rows    []triadRow // the highest y first
	XLabels []int      // 0 … W-1, for the axis under the map
	Compact bool
	Holders []gridHolder // by allocation id
	Free    int
	Held    int
	Dead    int
	// Settling counts boards switched off and waiting to be freed after
	// their allocation ended; StaleAt is when the first is freed (no event
	// says so: the page refreshes then).
	Settling int
	StaleAt  *time.Time
}

type triadRow struct {
	Y      int
	Triads []triad
}

type triad struct {
	X, Y   int
	Boards [3]board
}

type board struct {
	Class string // "gboard free", "gboard held o3 pw-on", "gboard dead"
	Title string // every detail, on hover and tap
	Label string // "#12" on a held board, "✕" on a dead one
}

// gridHolder is one allocation holding boards of the machine, for the
// legend under the map.
type gridHolder struct {
	ID     int64
	Owner  string
	Class  string
	Boards int
	Power  string // "on", "off", "switching on", "switching off", "settling"
	PClass string // its CSS class
}

// power says what the boards of allocation a are doing; a is nil when the
// allocation has ended (its boards wait, switched off, to be freed).
func power(a *arbiter.Allocation, settling bool) string {
	switch {
	case a == nil || settling || !a.Live():
		return "settling"
	case a.State == arbiter.StatePower && a.Power != nil && !*a.Power:
		return "switching off"
	case a.State == arbiter.StatePower:
		return "switching on"
	case a.Power != nil && !*a.Power:
		return "off"
	}
	return "on"
}

// powerClass is the CSS class of a power state.
func powerClass(p string) string {
	switch p {
	case "switching on", "switching off":
		return "pw-switching"
	}
	return "pw-" + p
}

func (v *view) boardMap(m *arbiter.MachineStatus, live map[int64]*arbiter.Allocation) *boardMap {
	g := m.Grid
	bm := &boardMap{W: g.Width, H: g.Height, Compact: g.Width > compactTriads}
	if bm.W <= 0 || bm.H <= 0 || bm.W*bm.H*3 > 1<<16 {
		return bm
	}
	for x := 0; x < bm.W; x++ {
		bm.XLabels = append(bm.XLabels, x)
	}
	triads := make([]triad, bm.W*bm.H)
	present := make([]bool, len(triads)*3)
	holders := map[int64]*gridHolder{}
	for _, d := range m.Devices {
		b := d.Board
		if b == nil || b.X < 0 || b.X >= bm.W || b.Y < 0 || b.Y >= bm.H || b.Z < 0 || b.Z > 2 {
			continue
		}
		t := &triads[b.Y*bm.W+b.X]
		t.X, t.Y = b.X, b.Y
		present[(b.Y*bm.W+b.X)*3+b.Z] = true
		var title strings.Builder
		title.WriteString("board (" + itoa(b.X) + "," + itoa(b.Y) + "," + itoa(b.Z) + ") · cabinet " + itoa(b.Cabinet) +
			" frame " + itoa(b.Frame) + " board " + itoa(b.Slot))
		if b.IP != "" {
			title.WriteString(" · " + b.IP)
		}
		ub := &t.Boards[b.Z]
		switch {
		case d.Allocation != nil:
			id := *d.Allocation
			a := live[id]
			owner := ""
			switch {
			case a != nil:
				owner = a.Owner
			case d.Owner != nil:
				owner = *d.Owner
			}
			power := power(a, b.Settling)
			h := holders[id]
			if h == nil {
				h = &gridHolder{ID: id, Owner: arbiter.ShortOwner(owner), Class: v.OwnerClass(owner), Power: power, PClass: powerClass(power)}
				holders[id] = h
			}
			h.Boards++
			ub.Class = "gboard held " + h.Class + " " + powerClass(power)
			ub.Label = "#" + strconv.FormatInt(id, 10)
			if owner != "" {
				title.WriteString(" · held by " + owner + ", allocation #" + strconv.FormatInt(id, 10))
			} else {
				title.WriteString(" · allocation #" + strconv.FormatInt(id, 10))
			}
			if power == "settling" {
				title.WriteString(" · ended: switched off, freed soon")
				bm.Settling++
			} else {
				title.WriteString(" · power " + power)
			}
			if d.Since != nil {
				title.WriteString(" · since " + abs(*d.Since))
			}
			bm.Held++
		case b.Dead || !d.Healthy:
			ub.Class, ub.Label = "gboard dead", "✕"
			title.WriteString(" · dead: never allocated")
			bm.Dead++
		default:
			ub.Class = "gboard free"
			title.WriteString(" · free")
			bm.Free++
		}
		ub.Title = title.String()
	}
	for i := range present {
		if !present[i] {
			t := &triads[i/3]
			t.X, t.Y = (i/3)%bm.W, (i/3)/bm.W
			t.Boards[i%3] = board{Class: "gboard absent", Title: "no board here"}
		}
	}
	for y := bm.H - 1; y >= 0; y-- {
		bm.Rows = append(bm.Rows, triadRow{Y: y, Triads: triads[y*bm.W : (y+1)*bm.W]})
	}
	for _, h := range holders {
		bm.Holders = append(bm.Holders, *h)
	}
	sort.Slice(bm.Holders, func(i, j int) bool { return bm.Holders[i].ID < bm.Holders[j].ID })
	if bm.Settling > 0 {
		bm.StaleAt = v.gridFreeAt(m.Name)
	}
	return bm
}

// gridFreeAt returns when the first boards of machine that wait to be freed
// are freed, from the grid capability's job records (read as JSON: this
// package does not import package grid).
func (v *view) gridFreeAt(machine string) *time.Time {
	var first *time.Time
	for _, r := range v.plane.Records(arbiter.RecordGridJob) {
		var jr struct {
			Machine string     `json:"machine"`
			FreeAt  *time.Time `json:"free_at"`
		}
		raw, ok := r.Value.(json.RawMessage)
		if !ok {
			var err error
			if raw, err = json.Marshal(r.Value); err != nil {
				continue
			}
		}
		if json.Unmarshal(raw, &jr) != nil || jr.Machine != machine || jr.FreeAt == nil {
			continue
		}
		if first == nil || jr.FreeAt.Before(*first) {
			t := *jr.FreeAt
			first = &t
		}
	}
	return first
}

// gridWants says what a grid request asks for: "1 board", "8 boards",
// "2 × 1 triads", "board (1,0,2)".
func gridWants(g *arbiter.GridRequest) string {
	var s string
	switch g.Form {
	case arbiter.GridBoards:
		s = arbiter.Plural(g.Boards, "board")
	case arbiter.GridBlock:
		s = itoa(g.Width) + " × " + itoa(g.Height) + " triads"
	case arbiter.GridBoard:
		s = "board " + g.Board.String()
	default:
		s = "1 board"
	}
	if g.RequireTorus {
		s += " · torus"
	}
	if g.MaxDeadBoards != nil {
		s += " · ≤ " + arbiter.Plural(*g.MaxDeadBoards, "dead board")
	}
	return s
}

// holds says what an allocation holds: "gpu1: 0–3", "spin5: 6 boards",
// "pool small, slot 2", "—" when nothing.
func holds(a arbiter.Allocation) string {
	switch {
	case len(a.Boards) > 0:
		m := ""
		if a.Machine != nil {
			m = *a.Machine + ": "
		}
		return m + arbiter.Plural(len(a.Boards), "board")
	case a.Pool != "" && a.Slot != nil && len(a.Devices) > 0:
		return arbiter.DevicesText(a.Devices) + " · pool " + a.Pool + " slot " + itoa(*a.Slot)
	}
	return arbiter.DevicesText(a.Devices)
}

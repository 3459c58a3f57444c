package spalloc

import (
	"slices"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// location is where_is's answer.
type location struct {
	machine   string
	logical   arbiter.Board
	physical  arbiter.BoardLocation
	chip      [2]int // in the machine booted as one
	boardChip [2]int // relative to the board's Ethernet chip
	jobID     int64  // 0: no job holds the board
	jobChip   *[2]int
}

// whereIs answers the four forms of where_is (whereIsForms): nil when the
// machine or job is unknown or no located board is there.
func whereIs(b Backend, form int, name string, n map[string]int) (*location, error) {
	ms, err := b.Machines()
	if err != nil {
		return nil, err
	}
	var m *arbiter.GridMachine
	var j Job
	var board arbiter.Board
	var bc [2]int
	switch form {
	case 0: // machine, x, y, z
		if m = findMachine(ms, name); m == nil {
			return nil, nil
		}
		board = arbiter.Board{X: n["x"], Y: n["y"], Z: n["z"]}
	case 1: // machine, cabinet, frame, board
		if m = findMachine(ms, name); m == nil {
			return nil, nil
		}
		var ok bool
		if board, ok = m.At(arbiter.BoardLocation{Cabinet: n["cabinet"], Frame: n["frame"], Board: n["board"]}); !ok {
			return nil, nil
		}
	case 2: // machine, chip_x, chip_y
		if m = findMachine(ms, name); m == nil {
			return nil, nil
		}
		board, bc[0], bc[1] = grid.ChipToBoard(m.Width, m.Height, n["chip_x"], n["chip_y"])
	case 3: // job_id, chip_x, chip_y
		if j, err = b.Job(int64(n["job_id"]), false, ""); err != nil {
			return nil, err
		}
		if j.Placement == nil || (j.State != StatePower && j.State != StateReady) {
			return nil, nil
		}
		if m = findMachine(ms, j.Machine); m == nil {
			return nil, nil
		}
		ox, oy := grid.BoardToChip(j.Placement.Origin())
		board, bc[0], bc[1] = grid.ChipToBoard(m.Width, m.Height, ox+n["chip_x"], oy+n["chip_y"])
		if !slices.Contains(j.Placement.Boards, board) {
			return nil, nil
		}
	}
	info, ok := m.Info(board)
	if !ok {
		return nil, nil
	}
	ex, ey := grid.BoardToChip(board)
	cw, ch := grid.TriadChips*m.Width, grid.TriadChips*m.Height
	loc := &location{
		machine:   m.Name,
		logical:   board,
		physical:  info.Location,
		chip:      [2]int{mod(ex+bc[0], cw), mod(ey+bc[1], ch)},
		boardChip: bc,
	}
	if form == 3 {
		loc.jobID = j.ID
	} else {
		if loc.jobID, err = b.BoardJob(m.Name, board); err != nil {
			return nil, err
		}
		if loc.jobID != 0 {
			if j, err = b.Job(loc.jobID, false, ""); err != nil {
				return nil, err
			}
		}
	}
	if loc.jobID != 0 && j.Placement != nil {
		ox, oy := grid.BoardToChip(j.Placement.Origin())
		loc.jobChip = &[2]int{mod(loc.chip[0]-ox, cw), mod(loc.chip[1]-oy, ch)}
	}
	return loc, nil
}

func mod(a, n int) int {
	a %= n
	if a < 0 {
		a += n
	}
	return a
}

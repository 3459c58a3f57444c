package grid

import (
	"fmt"
	"math"

	"github.com/arbiter-hq/arbiter"
)

// Form is the shape of a grid request, chosen by how many positional
// arguments a spalloc create_job carries (spec §4).
type Form uint8

// The four request forms.
const (
	// FormOneBoard: no arguments, or the single argument 1: any one board.
	FormOneBoard Form = iota
	// FormBoards: one argument n ≠ 1: at least n boards, as ceil(n/3)
	// triads arranged as a rectangle. n ≤ 0 can never be satisfied.
	FormBoards
	// FormBlock: two arguments: a block of Width×Height triads.
	FormBlock
	// FormBoard: three arguments: exactly the board (x, y, z).
	FormBoard
)

// String names the form.
func (f Form) String() string {
	switch f {
	case FormOneBoard:
		return "one board"
	case FormBoards:
		return "boards"
	case FormBlock:
		return "block"
	case FormBoard:
		return "board"
	}
	return fmt.Sprintf("form(%d)", uint8(f))
}

// Request is what a grid allocation asks of one machine: a form with its
// numbers and the constraints on the candidate blocks. The zero value asks
// for any one board with no constraints.
type Request struct {
	Form   Form          `json:"form"`
	Boards int           `json:"boards,omitempty"` // FormBoards: at least this many boards
	Width  int           `json:"width,omitempty"`  // FormBlock: triads
	Height int           `json:"height,omitempty"` // FormBlock: triads
	Board  arbiter.Board `json:"board"`            // FormBoard
	// MinRatio is the aspect ratio (short/long) the FormBoards rectangle must
	// at least have; 0 accepts any shape, values above 1 count as their
	// inverse. Other forms ignore it.
	MinRatio float64 `json:"min_ratio"`
	// MaxDeadBoards bounds the dead or unreachable boards of a block (the
	// expected boards minus those reachable); nil means any number, as long
	// as the block's bottom-left board is alive.
	MaxDeadBoards *int `json:"max_dead_boards"`
	// MaxDeadLinks bounds the dead links between boards of the block (each
	// direction counts), plus dead wrap-around links with RequireTorus; nil
	// means any number.
	MaxDeadLinks *int `json:"max_dead_links"`
	// RequireTorus asks for a block that wraps around: only the whole
	// machine can. Not allowed with FormOneBoard or FormBoard.
	RequireTorus bool `json:"require_torus"`
}

// ErrTorusBoards is the message clients know for RequireTorus with a
// one-board form (spec §2).
const ErrTorusBoards = "require_torus must be False when allocating boards."

// RequestFromArgs builds a request from a create_job's positional
// arguments: none or (1) is one board, (n) at least n boards, (w, h) a
// block of triads, (x, y, z) one specific board. More than three arguments
// are an error. The constraints are left at their zero values.
func RequestFromArgs(args []int) (Request, error) {
	switch len(args) {
	case 0:
		return Request{Form: FormOneBoard}, nil
	case 1:
		if args[0] == 1 {
			return Request{Form: FormOneBoard}, nil
		}
		return Request{Form: FormBoards, Boards: args[0]}, nil
	case 2:
		return Request{Form: FormBlock, Width: args[0], Height: args[1]}, nil
	case 3:
		return Request{Form: FormBoard, Board: arbiter.Board{X: args[0], Y: args[1], Z: args[2]}}, nil
	}
	return Request{}, fmt.Errorf("create_job takes 0 to 3 positional arguments (nothing, n boards, width and height in triads, or x, y, z), not %d", len(args))
}

// Args returns the positional arguments that RequestFromArgs turns into r's
// form (the one-board form gives none).
func (r *Request) Args() []int {
	switch r.Form {
	case FormBoards:
		return []int{r.Boards}
	case FormBlock:
		return []int{r.Width, r.Height}
	case FormBoard:
		return []int{r.Board.X, r.Board.Y, r.Board.Z}
	}
	return []int{}
}

// Validate reports a request that is malformed, as opposed to one that no
// machine can satisfy (which is a request like any other, cancelled by its
// caller when Possible says no machine could ever take it). Errors: an
// unknown form, RequireTorus with a one-board form (ErrTorusBoards), a
// negative or non-finite MinRatio.
func (r *Request) Validate() error {
	if r.Form > FormBoard {
		return fmt.Errorf("unknown request form %d", r.Form)
	}
	if r.RequireTorus && (r.Form == FormOneBoard || r.Form == FormBoard) {
		return fmt.Errorf("%s", ErrTorusBoards)
	}
	if math.IsNaN(r.MinRatio) || math.IsInf(r.MinRatio, 0) || r.MinRatio < 0 {
		return fmt.Errorf("min_ratio must be a number from 0 (any shape) to 1 (square), got %v", r.MinRatio)
	}
	return nil
}

// triads is the number of triads of a FormBoards request: ceil(n/3), or 0
// when n ≤ 0.
func (r *Request) triads() int {
	if r.Boards <= 0 {
		return 0
	}
	n := r.Boards / 3
	if r.Boards%3 != 0 {
		n++
	}
	return n
}

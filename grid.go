package arbiter

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
)

// Board is one board of a grid machine (KindGrid) by its logical
// coordinates: triad (X, Y) and position Z (0, 1 or 2) within the triad
// (docs/reference/spalloc.md §3). Package grid holds the geometry, the machine
// description and the allocator; Board lives here so that an Allocation can
// name the boards it holds.
type Board struct {
	X int `json:"x"`
	Y int `json:"y"`
	Z int `json:"z"`
}

// String spells the board as "(x,y,z)".
func (b Board) String() string { return fmt.Sprintf("(%d,%d,%d)", b.X, b.Y, b.Z) }

// Compare orders boards by X, then Y, then Z: -1, 0 or +1.
func (b Board) Compare(o Board) int {
	switch {
	case b.X != o.X:
		return cmp.Compare(b.X, o.X)
	case b.Y != o.Y:
		return cmp.Compare(b.Y, o.Y)
	}
	return cmp.Compare(b.Z, o.Z)
}

// GridForm is the shape of a grid request, chosen by how many positional
// arguments a spalloc create_job carries (docs/reference/spalloc.md §4).
type GridForm uint8

// The four request forms.
const (
	// GridOneBoard: no arguments, or the single argument 1: any one board.
	GridOneBoard GridForm = iota
	// GridBoards: one argument n ≠ 1: at least n boards, as ceil(n/3)
	// triads arranged as a rectangle. n ≤ 0 can never be satisfied.
	GridBoards
	// GridBlock: two arguments: a block of Width×Height triads.
	GridBlock
	// GridBoard: three arguments: exactly the board (x, y, z).
	GridBoard
)

// String names the form.
func (f GridForm) String() string {
	switch f {
	case GridOneBoard:
		return "one board"
	case GridBoards:
		return "boards"
	case GridBlock:
		return "block"
	case GridBoard:
		return "board"
	}
	return fmt.Sprintf("form(%d)", uint8(f))
}

// GridRequest asks for boards of a grid machine instead of GPUs: the spalloc
// job forms (docs/reference/spalloc.md §4), parsed once where the request
// enters (the spalloc protocol, or the JSON of the native API) and carried
// typed to the engine. The request's Tags, Machine, Owner and KeepaliveS
// apply as for GPUs. The zero value asks for any one board with no
// constraints.
//
// In JSON the form is written as the positional numbers that choose it,
// "args", as spalloc clients send them; decoding parses them into the form.
type GridRequest struct {
	Form   GridForm `json:"-"`
	Boards int      `json:"-"` // GridBoards: at least this many boards
	Width  int      `json:"-"` // GridBlock: triads
	Height int      `json:"-"` // GridBlock: triads
	Board  Board    `json:"-"` // GridBoard
	// Args are the positional numbers the client sent, echoed by list_jobs
	// (the one-board form may be sent as none or as [1]); nil when the
	// request was built in code, and then the form's own numbers are shown.
	Args []int `json:"args"`
	// MinRatio is the aspect ratio (short/long) the GridBoards rectangle must
	// at least have; 0 accepts any shape, values above 1 count as their
	// inverse. Other forms ignore it.
	MinRatio float64 `json:"min_ratio,omitempty"`
	// MaxDeadBoards bounds the dead or unreachable boards of a block (the
	// expected boards minus those reachable); nil means any number, as long
	// as the block's bottom-left board is alive.
	MaxDeadBoards *int `json:"max_dead_boards,omitempty"`
	// MaxDeadLinks bounds the dead links between boards of the block (each
	// direction counts), plus dead wrap-around links with RequireTorus; nil
	// means any number.
	MaxDeadLinks *int `json:"max_dead_links,omitempty"`
	// RequireTorus asks for a block that wraps around: only the whole
	// machine can. Not allowed with GridOneBoard or GridBoard.
	RequireTorus bool `json:"require_torus,omitempty"`
	// Kwargs is what a spalloc client sent, echoed by list_jobs.
	Kwargs json.RawMessage `json:"kwargs,omitempty"`
	// KeepaliveHost is the address of the client that last kept it alive.
	KeepaliveHost string `json:"keepalivehost,omitempty"`
}

// GridErrTorusBoards is the message spalloc clients know for RequireTorus
// with a one-board form.
const GridErrTorusBoards = "require_torus must be False when allocating boards."

// ParseGridArgs sets r's form from a create_job's positional arguments:
// none or (1) is one board, (n) at least n boards, (w, h) a block of
// triads, (x, y, z) one specific board; Args keeps them as sent. Errors:
// invalid for more than three arguments.
func (r *GridRequest) ParseGridArgs(args []int) error {
	r.Form, r.Boards, r.Width, r.Height, r.Board = GridOneBoard, 0, 0, 0, Board{}
	switch len(args) {
	case 0:
	case 1:
		if args[0] != 1 {
			r.Form, r.Boards = GridBoards, args[0]
		}
	case 2:
		r.Form, r.Width, r.Height = GridBlock, args[0], args[1]
	case 3:
		r.Form, r.Board = GridBoard, Board{X: args[0], Y: args[1], Z: args[2]}
	default:
		return Errorf(EInvalid, "create_job takes 0 to %d positional arguments (nothing, n boards, width and height in triads, or x, y, z), not %d", MaxGridArgs, len(args))
	}
	r.Args = append([]int{}, args...)
	return nil
}

// GridRequestOf returns the request of a create_job's positional
// arguments, as ParseGridArgs; for code and tests that build requests.
// Errors: as ParseGridArgs.
func GridRequestOf(args ...int) (GridRequest, error) {
	var r GridRequest
	err := r.ParseGridArgs(args)
	return r, err
}

// FormArgs returns the positional arguments that choose r's form (the
// one-board form gives none).
func (r *GridRequest) FormArgs() []int {
	switch r.Form {
	case GridBoards:
		return []int{r.Boards}
	case GridBlock:
		return []int{r.Width, r.Height}
	case GridBoard:
		return []int{r.Board.X, r.Board.Y, r.Board.Z}
	}
	return []int{}
}

// EchoArgs returns the arguments to show for r: as the client sent them,
// else the form's own.
func (r *GridRequest) EchoArgs() []int {
	if r.Args != nil {
		return r.Args
	}
	return r.FormArgs()
}

// Validate reports a request that is malformed, as opposed to one that no
// machine can satisfy (a request like any other, destroyed at once as
// impossible). Errors (invalid): an unknown form, RequireTorus with a
// one-board form (GridErrTorusBoards), a negative or non-finite MinRatio.
func (r *GridRequest) Validate() error {
	if r.Form > GridBoard {
		return Errorf(EInvalid, "unknown grid request form %d", r.Form)
	}
	if r.RequireTorus && (r.Form == GridOneBoard || r.Form == GridBoard) {
		return Errorf(EInvalid, "%s", GridErrTorusBoards)
	}
	if math.IsNaN(r.MinRatio) || math.IsInf(r.MinRatio, 0) || r.MinRatio < 0 {
		return Errorf(EInvalid, "min_ratio must be a number from 0 (any shape) to 1 (square), got %v", r.MinRatio)
	}
	return nil
}

// MarshalJSON writes the request with its form as "args"
// (allocation_json.go).
func (r GridRequest) MarshalJSON() ([]byte, error) {
	return r.appendJSON(make([]byte, 0, 64)), nil
}

// UnmarshalJSON reads a request and parses its "args" into the form.
// Errors: invalid for more than three arguments.
func (r *GridRequest) UnmarshalJSON(b []byte) error {
	type plain GridRequest
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*r = GridRequest(p)
	return r.ParseGridArgs(p.Args)
}

// MaxGridArgs bounds the positional numbers of a grid request.
const MaxGridArgs = 3

// Record kinds of the grid capability (package grid holds their value
// types).
const (
	// RecordGridMachine is a configured grid machine; key: its name; value:
	// grid.MachineRecord.
	RecordGridMachine = "grid.machine"
	// RecordGridJob is a grid allocation that holds boards, or whose boards
	// wait to be freed after it ended; key: the allocation id in decimal;
	// value: grid.JobRecord.
	RecordGridJob = "grid.job"
	// RecordGridMachines is the memory-only snapshot of every grid machine
	// in priority order, for the spalloc server's cheap reads; key "";
	// value: []*GridMachine.
	RecordGridMachines = "grid.machines"
)

// Event kinds of grid allocations and machines. The allocation events
// (EventAllocationQueued, EventAllocationPower, EventAllocationReady,
// EventAllocationDestroyed) carry the Allocation; a grid machine added,
// changed or removed by the configuration gives EventMachineRegistered,
// EventMachineUpdated or EventMachineRemoved with subject "machine/NAME" and
// the GridMachine as data.
const (
	// EventAllocationPower: a grid allocation's boards are being switched
	// on or off (state power).
	EventAllocationPower = "allocation.power"
	// EventGridPower asks an external power controller to switch boards
	// (grid.PowerIntent as data, subject "allocation/ID"). Only emitted
	// when the engine runs with an external controller.
	EventGridPower = "grid.power"
)

// Reasons a grid allocation ends with, as the spalloc protocol reports them
// (docs/reference/spalloc.md §2).
const (
	GridReasonImpossible = "Cancelled: No suitable machines available."
	GridReasonTimedOut   = "Job timed out."
	GridReasonRemoved    = "Machine removed."
	// GridCancelledPrefix starts the reason of a grid allocation destroyed
	// by its holder while still queued.
	GridCancelledPrefix = "Cancelled: "
)

// BoardDevice is one board of a grid machine as readers see it
// (DeviceStatus.Board): its logical and physical position, address and
// whether it is dead.
type BoardDevice struct {
	X       int    `json:"x"`
	Y       int    `json:"y"`
	Z       int    `json:"z"`
	Cabinet int    `json:"cabinet"`
	Frame   int    `json:"frame"`
	Slot    int    `json:"board"`
	IP      string `json:"ip"`
	Dead    bool   `json:"dead"`
	// Settling is set while the board waits, powered off, to be freed after
	// the allocation that held it ended (Allocation names that allocation).
	Settling bool `json:"settling,omitempty"`
}

// GridInfo describes a grid machine in MachineStatus.Grid.
type GridInfo struct {
	// Width and Height are in triads.
	Width  int `json:"width"`
	Height int `json:"height"`
	// Priority is the machine's place in the configuration, 0 first: the
	// order in which requests that do not name a machine try machines.
	Priority   int      `json:"priority"`
	Queue      string   `json:"queue"`
	DeadBoards int      `json:"dead_boards"`
	DeadLinks  []string `json:"dead_links"` // "(x,y,z):link"
	// Queued counts the allocations waiting for boards of this machine.
	Queued int `json:"queued"`
}

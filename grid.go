package arbiter

import (
	"cmp"
	"encoding/json"
	"fmt"
)

// Board is one board of a grid machine (KindGrid) by its logical
// coordinates: triad (X, Y) and position Z (0, 1 or 2) within the triad
// (specs/spalloc.md §3). Package grid holds the geometry, the machine
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

// GridRequest asks for boards of a grid machine instead of GPUs: the spalloc
// job forms (specs/spalloc.md §4). The request's Tags, Machine, Owner and
// KeepaliveS apply as for GPUs; package grid reads the form from Args.
type GridRequest struct {
	// Args are the 0 to 3 positional numbers that choose the form: none (or
	// 1) any one board, n at least n boards, w h a block of triads, x y z one
	// board.
	Args          []int   `json:"args"`
	MinRatio      float64 `json:"min_ratio,omitempty"`
	MaxDeadBoards *int    `json:"max_dead_boards,omitempty"`
	MaxDeadLinks  *int    `json:"max_dead_links,omitempty"`
	RequireTorus  bool    `json:"require_torus,omitempty"`
	// Kwargs is what a spalloc client sent, echoed by list_jobs.
	Kwargs json.RawMessage `json:"kwargs,omitempty"`
	// KeepaliveHost is the address of the client that last kept it alive.
	KeepaliveHost string `json:"keepalivehost,omitempty"`
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
	// value: []*grid.Machine.
	RecordGridMachines = "grid.machines"
)

// Event kinds of grid allocations and machines. The allocation events
// (EventAllocationQueued, EventAllocationPower, EventAllocationReady,
// EventAllocationDestroyed) carry the Allocation; a grid machine added,
// changed or removed by the configuration gives EventMachineRegistered,
// EventMachineUpdated or EventMachineRemoved with subject "machine/NAME" and
// the grid.Machine as data.
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
// (specs/spalloc.md §2).
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

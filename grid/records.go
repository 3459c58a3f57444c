package grid

import (
	"time"

	"github.com/arbiter-hq/arbiter"
)

// MachineRecord is a configured grid machine as the engine stores it
// (record kind arbiter.RecordGridMachine, key: the name), so that after a
// restart the machines and their allocations are back before the
// configuration is read again.
type MachineRecord struct {
	Machine arbiter.GridMachine `json:"machine"`
	// Priority is the machine's place in the configuration, 0 first.
	Priority int `json:"priority"`
}

// JobRecord is a grid allocation holding boards, as the engine stores it
// (record kind arbiter.RecordGridJob, key: the id in decimal): where its
// boards are, so that a restart rebuilds the allocator (Allocator.Restore),
// and, once the allocation ended, when its boards are free again.
type JobRecord struct {
	ID        int64     `json:"id"`
	Machine   string    `json:"machine"`
	Placement Placement `json:"placement"`
	// FreeAt is set once the allocation ended: its boards stay powered off
	// and held until then.
	FreeAt *time.Time `json:"free_at,omitempty"`
}

// PowerIntent asks a power controller to switch the boards of one grid
// allocation on or off (event arbiter.EventGridPower). The boards are
// grouped by the frame whose board-management controller drives them; the
// controller carries out each frame's part, concurrently with the others,
// and reports each with arbiter.GridPowerDone{ID, Epoch, Frame, Err}.
type PowerIntent struct {
	ID      int64  `json:"id"`
	Machine string `json:"machine"`
	// Epoch identifies this intent; a later one for the same allocation
	// supersedes it.
	Epoch int64 `json:"epoch"`
	On    bool  `json:"on"`
	// Final is set for the power-off of an allocation that ended: nobody
	// waits for its report.
	Final  bool         `json:"final,omitempty"`
	Frames []PowerFrame `json:"frames"`
}

// PowerFrame is one frame's part of a PowerIntent.
type PowerFrame struct {
	// Index is the frame's position in PowerIntent.Frames, reported back in
	// GridPowerDone.Frame.
	Index   int    `json:"index"`
	Cabinet int    `json:"cabinet"`
	Frame   int    `json:"frame"`
	Address string `json:"address"` // the controller's address
	// Attempt is 1, or 2 for the retry of a failed or silent first attempt.
	Attempt int `json:"attempt"`
	// Boards are the slot numbers of the frame's boards to switch, in order,
	// and Logical their logical coordinates.
	Boards  []int           `json:"boards"`
	Logical []arbiter.Board `json:"logical"`
	// LinksOff are the links to disable when switching on: those leaving
	// the allocation (its periphery), as (slot, link) of the frame's boards.
	LinksOff []FrameLink `json:"links_off,omitempty"`
}

// FrameLink is one link of a board of a frame, by slot number.
type FrameLink struct {
	Board int          `json:"board"`
	Link  arbiter.Link `json:"link"`
}

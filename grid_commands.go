package arbiter

import "time"

// Commands of the grid capability (docs/reference/spalloc.md). Grid allocations are
// created with Allocate and a Request whose Grid is set; Keepalive and
// Release work on them as on any allocation.

// SyncGridMachines makes the configured grid machines exactly Machines, in
// priority order (first = tried first): new ones are added; one whose size,
// board locations or addresses changed is removed and added again (its
// allocations end with GridReasonRemoved); one whose tags, dead boards or
// links, queue policy or power delay changed is updated in place, its
// running allocations kept; one no longer listed is removed. Queued grid
// allocations are queued again on the machines they may now use, in id
// order; those no machine could ever take end with GridReasonImpossible.
// Result: nil. Errors: invalid when a machine does not validate (nothing
// is changed then).
type SyncGridMachines struct {
	Machines []GridMachine
	// MaxRetiredJobs bounds the destroyed grid allocations kept queryable
	// (spalloc's max_retired_jobs); older ones are forgotten (state 0).
	MaxRetiredJobs int
	// SecondsBeforeFree is how long the boards of an ended grid allocation
	// stay powered off and unavailable before they are free again.
	SecondsBeforeFree time.Duration
}

// GridTouch refreshes the keepalive of grid allocation ID, as spalloc's
// job_keepalive, get_job_state and get_job_machine_info do, and records Peer
// as the host that keeps it alive. Result: the Allocation (a destroyed one
// as it ended, unchanged), or nil when ID is unknown or not a grid
// allocation. Never an error for an unknown id.
type GridTouch struct {
	ID   int64
	Peer string
}

// GridPower switches the boards of grid allocation ID on (or resets them if
// on) or off, after refreshing its keepalive as GridTouch does: the
// allocation goes to state power until the power controller is done, then
// ready. An allocation without boards, destroyed or unknown is left alone.
// Result: nil.
type GridPower struct {
	ID   int64
	On   bool
	Peer string
}

// GridDestroy ends grid allocation ID as spalloc's destroy_job does: a
// queued one with GridCancelledPrefix + Reason, one holding boards with
// Reason verbatim (nil: no reason, reported as null). Its boards are
// switched off and freed SecondsBeforeFree later. An unknown, destroyed or
// non-grid id is ignored. Result: nil.
type GridDestroy struct {
	ID     int64
	Reason *string
}

// GridPowerDone reports that an external power controller finished (Err
// "") or failed one frame's part of a power intent (grid.PowerIntent).
// Reports for an intent that was superseded are ignored; a failure is
// retried once, a second failure ends the allocation with a reason naming
// the controller. Result: nil.
type GridPowerDone struct {
	ID    int64
	Epoch int64
	// Frame is the index of the frame in the intent's Frames.
	Frame int
	// Attempt is the frame's attempt reported (grid.PowerFrame.Attempt):
	// a failure of an earlier attempt than the one under way is ignored.
	// 0 is taken as the one under way.
	Attempt int
	Err     string
}

// GridPowerResend asks the engine to emit again, as new intents, every
// power operation in progress: an external power controller sends it when
// it starts (after a restart the engine resumes operations without
// emitting them) and whenever it may have missed intents. Result: nil.
type GridPowerResend struct{}

func (GridPowerResend) isCommand()    {}
func (GridPowerResend) result() None  { return None{} }
func (SyncGridMachines) isCommand()   {}
func (SyncGridMachines) result() None { return None{} }
func (GridTouch) isCommand()          {}
func (GridTouch) result() Allocation  { return Allocation{} }
func (GridPower) isCommand()          {}
func (GridPower) result() None        { return None{} }
func (GridDestroy) isCommand()        {}
func (GridDestroy) result() None      { return None{} }
func (GridPowerDone) isCommand()      {}
func (GridPowerDone) result() None    { return None{} }

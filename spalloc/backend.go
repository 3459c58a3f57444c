package spalloc

import (
	"encoding/json"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// State is a job's state number in the protocol.
type State int

// Job states (docs/reference/spalloc.md §2).
const (
	StateUnknown   State = 0 // never existed, or retired past max_retired_jobs
	StateQueued    State = 1
	StatePower     State = 2 // boards switching on or off
	StateReady     State = 3
	StateDestroyed State = 4
)

// Version is what the version command returns: every client generation
// accepts it.
const Version = "1.0.0"

// DefaultKeepalive is a job's keepalive when create_job gives none.
const DefaultKeepalive = 60.0

// MaxKeepalive bounds a job's keepalive in seconds (a week, as arbiter's
// allocations).
const MaxKeepalive = float64(arbiter.MaxKeepaliveS)

// CreateJob is a validated create_job. Everything in it has been checked
// against the protocol's rules; whether a machine can ever take the request
// is the backend's to decide (an impossible request still gets an id and is
// destroyed at once with ReasonImpossible).
type CreateJob struct {
	Owner string
	// Keepalive is the keepalive interval in seconds, nil for never.
	Keepalive *float64
	// Machine names the only machine to consider; "" chooses by Tags.
	Machine string
	// Tags, when Machine is "", select the machines that carry all of them,
	// in priority order: ["default"] when the client gave none, and an
	// empty list selects every machine.
	Tags []string
	// Request is the form and constraints, typed, with what the client
	// sent — the positional arguments (Args) and keyword arguments (Kwargs,
	// without owner and keepalive) — echoed by list_jobs, and the client's
	// host as its first keepalivehost.
	Request arbiter.GridRequest
	// Peer is the client's host.
	Peer string
}

// Reasons a job ends with (docs/reference/spalloc.md §2).
const (
	ReasonImpossible = "Cancelled: No suitable machines available."
	ReasonTimedOut   = "Job timed out."
	ReasonRemoved    = "Machine removed."
	// CancelledPrefix starts the reason of a job destroyed while queued:
	// "Cancelled: " + (the caller's reason or "").
	CancelledPrefix = "Cancelled: "
)

// Job is what the backend reports of a job.
type Job struct {
	ID    int64
	State State // StateUnknown for an id the backend does not know
	// Owner, Start, Keepalive, KeepaliveHost, Args, Kwargs: of a live job.
	Owner string
	Start time.Time
	// Keepalive is the interval in seconds, nil for never.
	Keepalive     *float64
	KeepaliveHost string
	Args          []int
	Kwargs        json.RawMessage
	// Power is whether the boards are (being) switched on; meaningful in
	// StatePower and StateReady only.
	Power bool
	// Reason is why a destroyed job ended (nil if no reason was given).
	Reason *string
	// Machine and Placement: where a live job's boards are, once it has
	// them ("" and nil while queued).
	Machine   string
	Placement *grid.Placement
}

// Backend is what a spalloc server needs of arbiter. Every method is safe
// to call from many connections at once. Errors become the command's
// exception (arbiter.ErrorMessage: an *arbiter.Error's message, else
// "internal error"); the connection stays open.
type Backend interface {
	// CreateJob creates a job and returns its id: positive, increasing,
	// never reused. A request no machine could ever satisfy still gets an
	// id and is destroyed at once with ReasonImpossible. An error creates
	// nothing and uses no id.
	CreateJob(c *CreateJob) (int64, error)
	// Job reports job id: live, retired (StateDestroyed, with Reason) or
	// unknown (StateUnknown). With touch, a live job's keepalive is
	// refreshed first and peer becomes its keepalivehost (job_keepalive,
	// get_job_state, get_job_machine_info).
	Job(id int64, touch bool, peer string) (Job, error)
	// PowerJob refreshes job id's keepalive as Job does, then switches its
	// boards on (or resets them if on) or off; a job without boards, or an
	// unknown one, is left alone. Not an error.
	PowerJob(id int64, on bool, peer string) error
	// DestroyJob ends job id with reason (nil: none): a queued job is
	// cancelled ("Cancelled: " + reason), an allocated one freed with the
	// reason verbatim. An unknown or retired id is ignored.
	DestroyJob(id int64, reason *string) error
	// ListJobs returns the live jobs, oldest first.
	ListJobs() ([]Job, error)
	// Machines returns the grid machines in priority order. It is called
	// for many commands and must be cheap (a snapshot); callers do not
	// modify what it returns.
	Machines() ([]*arbiter.GridMachine, error)
	// BoardJob returns the live job holding board b of machine, or 0.
	BoardJob(machine string, b arbiter.Board) (int64, error)
}

package arbiter

import (
	"context"
	"errors"
)

// State is everything a store holds that the engine needs at start.
type State struct {
	Machines    []Machine
	Allocations []Allocation // live and retired, in any order
	// Records are the durable records of every other kind, with Value the
	// json.RawMessage the store holds.
	Records []Record
	// NextAllocationID is the id the next allocation gets; ids are never reused.
	NextAllocationID int64
	// NextEventSeq is the sequence number the next event gets.
	NextEventSeq int64
}

// Changes is the change set of one batch of commands: saved in one
// transaction, then applied to the read view.
type Changes struct {
	Machines           []Machine // upserted by name
	RemovedMachines    []string
	Allocations        []Allocation // upserted by id
	RemovedAllocations []int64      // retired beyond the bounded history
	Events             []Event      // appended; Seq already assigned
	Records            []Record     // upserted by (Kind, Key); Value is marshalled to JSON
	RemovedRecords     []RecordRef
	// TrimEventsBefore, when > 0, deletes stored events with Seq below it.
	TrimEventsBefore int64
	NextAllocationID int64
	NextEventSeq     int64
	// Blobs are artifact bytes whose durability this change set carries
	// (AddArtifact.Data). A store that logs its batches (SQLite) keeps
	// them in its log and hands them back to the artifact store after a
	// crash; other stores ignore them, and the server does not leave
	// blobs' durability to those.
	Blobs []BlobBytes

	// Touched records whose only change is in memory-only fields (keepalive
	// deadline, last heartbeat). Stores ignore them; the read view applies them.
	TouchedAllocations []Allocation
	TouchedMachines    []Machine
	TouchedRecords     []Record
}

// Record is a durable record of a kind other than machines and allocations
// (tasks, locks, schedules, pools, grid machines …): a value stored as JSON
// under its kind and key. Capabilities add kinds without changing the stores.
type Record struct {
	Kind  string `json:"kind"`
	Key   string `json:"key"`
	Value any    `json:"value"`
}

// RecordRef names a record.
type RecordRef struct {
	Kind string `json:"kind"`
	Key  string `json:"key"`
}

// Durable reports whether the change set holds anything a store must save.
func (c *Changes) Durable() bool {
	return len(c.Machines) > 0 || len(c.RemovedMachines) > 0 || len(c.Allocations) > 0 ||
		len(c.RemovedAllocations) > 0 || len(c.Events) > 0 || c.TrimEventsBefore > 0 ||
		len(c.Records) > 0 || len(c.RemovedRecords) > 0 || len(c.Blobs) > 0
}

// BlobBytes is an artifact's bytes under its id (sha256, hex).
type BlobBytes struct {
	ID   string
	Data []byte
}

// Empty reports whether the change set holds nothing at all.
func (c *Changes) Empty() bool {
	return !c.Durable() && len(c.TouchedAllocations) == 0 && len(c.TouchedMachines) == 0 && len(c.TouchedRecords) == 0
}

// ErrSaveUnknown marks a Save error after which the change may have been
// saved after all: a store returns such errors through SaveUnknown, and
// the control loop answers them "may or may not have been saved" rather
// than "nothing was changed, retry", which would make a retry do it twice.
var ErrSaveUnknown = errors.New("the store cannot tell whether the change was saved")

// SaveUnknown marks err as ErrSaveUnknown, keeping its message and chain.
func SaveUnknown(err error) error {
	if err == nil || errors.Is(err, ErrSaveUnknown) {
		return err
	}
	return saveUnknown{err}
}

type saveUnknown struct{ error }

func (e saveUnknown) Unwrap() error        { return e.error }
func (e saveUnknown) Is(target error) bool { return target == ErrSaveUnknown }

// ErrNotApplied marks a refusal that certainly changed nothing because
// this replica does not lead: its lease is over or no longer trusted, or
// the database fenced its term off before anything was written. Another
// replica may be sent the same request (HeaderNotApplied says so to
// clients), whatever its method.
var ErrNotApplied = errors.New("not applied: this replica does not lead")

// HeaderNotApplied on a 503 says the request changed nothing and reached
// no leader, so a client may send it again to another replica.
const HeaderNotApplied = "X-Arbiter-Not-Applied"

// NotApplied marks err as ErrNotApplied, keeping its message and chain.
func NotApplied(err error) error {
	if err == nil || errors.Is(err, ErrNotApplied) {
		return err
	}
	return notApplied{err}
}

type notApplied struct{ error }

func (e notApplied) Unwrap() error        { return e.error }
func (e notApplied) Is(target error) bool { return target == ErrNotApplied }

// Store is the durable mirror of the engine's state (docs/architecture.md §2.3).
//
// Implementations must be safe for concurrent use: Save is called by one
// goroutine at a time, Events by many readers at once.
type Store interface {
	// Load returns the whole saved state. An empty store returns a State with
	// no records, NextAllocationID 1 and NextEventSeq 1.
	Load(ctx context.Context) (*State, error)
	// Save applies c atomically: all of it is durable when Save returns nil,
	// none of it when Save returns an error — unless the error is
	// ErrSaveUnknown (errors.Is): then the store cannot tell, and c may be
	// saved whole (a commit whose answer was lost, a failed sync of a
	// record written whole). Memory-only fields (Machine.LastSeen,
	// Allocation.ExpiresAt) and the Touched lists are not saved. Within one
	// change set a record upserted twice keeps the last; removals apply after
	// upserts, and the trim after the new events are inserted.
	Save(ctx context.Context, c *Changes) error
	// Events returns up to limit events with Seq > since, in Seq order; none
	// when limit <= 0.
	Events(ctx context.Context, since int64, limit int) ([]Event, error)
	// Close releases the store's resources. It is safe to call twice.
	Close() error
}

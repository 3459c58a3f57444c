package httpapi

import (
	"context"

	"github.com/arbiter-hq/arbiter"
)

// Plane is what the HTTP server needs of the running control plane. In the
// binary it is *control.Loop; tests may wire the real loop over a temp store.
type Plane interface {
	// Do applies one command and returns its result once it is durable:
	// arbiter.Allocation for Allocate, Keepalive and Release; arbiter.Machine
	// for RegisterMachine, Heartbeat and SetDraining. Errors are *arbiter.Error
	// for application errors; anything else is internal.
	Do(ctx context.Context, cmd arbiter.Command) (any, error)

	// Reads come from the committed read view; they never block on the store.
	Machines() []arbiter.MachineStatus
	Machine(name string) (arbiter.MachineStatus, bool)
	Allocations(f arbiter.AllocationFilter) []arbiter.Allocation // in id order
	Allocation(id int64) (arbiter.Allocation, bool)
	// Records returns the committed records of one kind (tasks, locks …) in
	// key order; Record returns one. Values are the capability's record type.
	Records(kind string) []arbiter.Record
	Record(kind, key string) (any, bool)

	// Subscribe returns committed events with Seq > since, first from the
	// store, then live, in Seq order without gaps. The channel is closed when
	// ctx ends or when the subscriber falls too far behind (it may then
	// resubscribe from the last Seq it saw).
	Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error)
	// Events returns up to limit of the events already committed with
	// Seq > since, in order without gaps, and none that come later.
	Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error)
	// LastSeq is the Seq of the last committed event (0 if none).
	LastSeq() int64
}

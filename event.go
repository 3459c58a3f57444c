package arbiter

import (
	"encoding/json"
	"time"
)

// Event kinds. The subject names what changed ("allocation/12", "machine/gpu1");
// the data is the record as it is after the change.
const (
	EventAllocationQueued    = "allocation.queued"
	EventAllocationReady     = "allocation.ready"
	EventAllocationDestroyed = "allocation.destroyed"
	EventMachineRegistered   = "machine.registered"
	EventMachineUpdated      = "machine.updated"
	EventMachineDown         = "machine.down"
	EventMachineUp           = "machine.up"
	EventMachineDrained      = "machine.draining"
	EventMachineUndrained    = "machine.undrained"
	EventMachineRemoved      = "machine.removed"
)

// Event is an immutable record of a change. Seq increases by one per event
// across the whole system and is never reused.
type Event struct {
	Seq     int64           `json:"seq"`
	Time    time.Time       `json:"time"`
	Kind    string          `json:"kind"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

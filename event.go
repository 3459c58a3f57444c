package arbiter

import (
	"encoding/json"
	"slices"
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
	// EventEngineLoadError: a stored record could not be read at start
	// (data: {"error"}); the server started without it.
	EventEngineLoadError = "engine.load_error"
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

// eventKinds lists every kind of event the server emits; a test keeps it
// whole against the Event constants.
var eventKinds = []string{
	EventAllocationQueued, EventAllocationReady, EventAllocationDestroyed,
	EventMachineRegistered, EventMachineUpdated, EventMachineDown,
	EventMachineUp, EventMachineDrained, EventMachineUndrained,
	EventMachineRemoved, EventEngineLoadError, EventAllocationPreempting, EventAllocationTimeLimit,
	EventAllocationExtended, EventReservationCreated,
	EventReservationStarted, EventReservationEnded, EventReservationDeleted,
	EventQuotaUpdated, EventQuotaDeleted, EventNotification,
	EventGPUUnmanaged, EventGPUUnhealthy, EventGPUHealthy, EventGPUReleasing,
	EventGPUReleased, EventGPUDrained, EventGPUUndrained, EventGPUKill,
	EventAllocationIdle, EventAllocationPower, EventGridPower,
	EventLockAcquired, EventLockExtended, EventLockReleased,
	EventLockExpired, EventScheduleRegistered, EventScheduleUpdated,
	EventScheduleDeleted, EventServiceUpdated, EventServiceGPUsUnavailable,
	EventServiceRemoved, EventCatalogUpdated, EventCatalogRemoved,
	EventSwapPending, EventSwapRunning, EventSwapLog, EventSwapComplete,
	EventSwapFailed, EventTaskAdded, EventTaskUpdated, EventTaskClaimed,
	EventTaskCompleted, EventTaskRetry, EventTaskFailed, EventTaskCancelled,
	EventTaskRequeued, EventWorkerUpdated, EventArtifactAdded,
	EventWebhookCreated, EventWebhookUpdated, EventWebhookDisabled,
	EventWebhookDeleted,
}

// EventKinds returns every kind of event the server emits.
func EventKinds() []string { return slices.Clone(eventKinds) }

// IsEventKind reports whether k is a kind of event the server emits.
func IsEventKind(k string) bool { return slices.Contains(eventKinds, k) }

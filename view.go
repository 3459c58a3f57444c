package arbiter

import "time"

// MachineStatus is a machine as readers see it: its description, its state,
// and who holds each of its devices.
type MachineStatus struct {
	Name     string         `json:"name"`
	Kind     string         `json:"kind"`
	Source   string         `json:"source"`
	State    string         `json:"state"`
	Tags     []string       `json:"tags"`
	Cores    int            `json:"cores"`
	RAMGiB   float64        `json:"ram_gib"`
	CUDA     string         `json:"cuda"`
	Driver   string         `json:"driver"`
	LastSeen *time.Time     `json:"last_seen"`
	Free     int            `json:"free"` // devices a new allocation could take now
	Devices  []DeviceStatus `json:"devices"`
	// Grid is set for a grid machine (Kind KindGrid), whose devices are
	// boards.
	Grid *GridInfo `json:"grid,omitempty"`
}

// DeviceStatus is one GPU with its holder, if any.
type DeviceStatus struct {
	Index      int        `json:"index"`
	UUID       string     `json:"uuid"`
	Model      string     `json:"model"`
	VRAMGiB    float64    `json:"vram_gib"`
	Compute    string     `json:"compute"`
	Healthy    bool       `json:"healthy"`
	Allocation *int64     `json:"allocation"` // holder's allocation id, null when free
	Owner      *string    `json:"owner"`
	Since      *time.Time `json:"since"` // when the holder got it
	// GPU ground truth (docs/reference/gpu-truth.md): State is free, held,
	// releasing, unhealthy or drained; StateReason and StateSince say why
	// and since when for the last three. Usage is the latest sample (null
	// without one); Unmanaged is set while a process no live allocation
	// accounts for is on it.
	State       string     `json:"state,omitempty"`
	StateReason string     `json:"state_reason,omitempty"`
	StateSince  *time.Time `json:"state_since,omitempty"`
	Usage       *GPUUsage  `json:"usage,omitempty"`
	Health      *GPUHealth `json:"health,omitempty"`
	Unmanaged   bool       `json:"unmanaged,omitempty"`
	// Board is set for a board of a grid machine (Index is then its place
	// in the machine, (x·height + y)·3 + z).
	Board *BoardDevice `json:"board,omitempty"`
}

// AllocationFilter selects allocations for a listing; zero fields match all.
type AllocationFilter struct {
	State   string // one state, or "live" for every state but destroyed
	Owner   string
	Machine string
}

// Match reports whether a passes the filter.
func (f AllocationFilter) Match(a *Allocation) bool {
	switch {
	case f.State == "live" && !a.Live():
		return false
	case f.State != "" && f.State != "live" && a.State != f.State:
		return false
	case f.Owner != "" && a.Owner != f.Owner:
		return false
	case f.Machine != "" && (a.Machine == nil || *a.Machine != f.Machine):
		return false
	}
	return true
}

package arbiter

import (
	"fmt"
	"path"
	"time"
)

// Allocation states. Grid allocations pass through StatePower on their way to
// ready; GPU allocations go straight from queued to ready.
const (
	StateQueued    = "queued"
	StatePower     = "power"
	StateReady     = "ready"
	StateDestroyed = "destroyed"
)

// Request is what a caller asks for. The GPU form: Count GPUs, all on one
// machine, each satisfying every constraint.
type Request struct {
	// Owner is who holds the allocation. With tokens configured it is the
	// caller's token name, whatever the request says (SetPrincipal); the
	// request's own words are kept as its Label.
	Owner string `json:"owner"`
	// Label is free text describing the allocation ("alice's sweep"): shown
	// beside the owner, never taken for it.
	Label       string   `json:"label,omitempty"`
	GPUs        int      `json:"gpus"`
	MinVRAMGiB  float64  `json:"min_vram_gib,omitempty"`
	RequireCUDA bool     `json:"require_cuda,omitempty"`
	MinCompute  string   `json:"min_compute,omitempty"` // "8.0": at least this compute capability
	Model       string   `json:"model,omitempty"`       // shell pattern over the GPU model, e.g. "*H100*"
	Tags        []string `json:"tags,omitempty"`        // the machine must carry all of them
	Machine     string   `json:"machine,omitempty"`     // only this machine
	Priority    int      `json:"priority,omitempty"`    // higher first
	// IdleExempt spares the allocation idle reclaim (docs/reference/gpu-truth.md);
	// only an admin may ask for it.
	IdleExempt bool `json:"idle_exempt,omitempty"`
	// Pool asks for one slot of a pool's shared backing instead of GPUs of
	// its own; the GPU fields must then be empty.
	Pool string `json:"pool,omitempty"`
	// Grid asks for boards of a grid machine instead (spalloc's jobs); the
	// GPU fields must then be empty.
	Grid *GridRequest `json:"grid,omitempty"`
	// KeepaliveS is how often the holder must show signs of life, in seconds;
	// nil means the allocation never expires.
	KeepaliveS *float64 `json:"keepalive_s"`
	// Fair share (fairshare.go): a time limit (nil: the group's default, or
	// none), opt-in preemption, and the reservation to allocate inside.
	TimeLimitS  *float64 `json:"time_limit_s,omitempty"`
	Preemptible bool     `json:"preemptible,omitempty"`
	Reservation string   `json:"reservation,omitempty"`
}

// Limits on what a request may ask for; beyond them it is invalid, not queued.
const (
	MaxKeepaliveS = 7 * 24 * 3600
	MinKeepaliveS = 1
	MaxPriority   = 1000000
)

// Validate checks the request's own fields (not whether it fits anywhere).
func (r *Request) Validate() error {
	if err := r.validateFairShare(); err != nil {
		return err
	}
	if r.Pool != "" {
		return r.validatePool()
	}
	if r.Grid != nil {
		return r.validateGrid()
	}
	if err := r.validateWho(); err != nil {
		return err
	}
	if r.GPUs < 0 {
		return Errorf(EInvalid, "gpus must not be negative (got %d)", r.GPUs)
	}
	if r.GPUs == 0 {
		return Errorf(EInvalid, "gpus must be at least 1")
	}
	if r.GPUs > MaxGPUsPerMachine {
		return Errorf(EInvalid, "gpus %d is more than any machine may have (%d)", r.GPUs, MaxGPUsPerMachine)
	}
	if r.MinVRAMGiB < 0 || r.MinVRAMGiB != r.MinVRAMGiB {
		return Errorf(EInvalid, "min_vram_gib must be a number of GiB, at least 0")
	}
	if r.MinCompute != "" {
		if _, _, ok := ParseCompute(r.MinCompute); !ok {
			return Errorf(EInvalid, "min_compute %q is not a compute capability like \"8.0\"", r.MinCompute)
		}
	}
	if err := ValidateText("model", r.Model, MaxModelBytes); err != nil {
		return err
	}
	if r.Model != "" {
		if _, err := path.Match(r.Model, ""); err != nil {
			return Errorf(EInvalid, "model pattern %q is malformed: %v", r.Model, err)
		}
	}
	if err := r.validateWhere(); err != nil {
		return err
	}
	return r.validateWaiting()
}

// validateWaiting checks the priority and the keepalive of a GPU request
// or a pool slot's.
func (r *Request) validateWaiting() error {
	if r.Priority < -MaxPriority || r.Priority > MaxPriority {
		return Errorf(EInvalid, "priority must be between %d and %d", -MaxPriority, MaxPriority)
	}
	if k := r.KeepaliveS; k != nil {
		if *k != *k || *k < MinKeepaliveS || *k > MaxKeepaliveS {
			return Errorf(EInvalid, "keepalive_s must be between %d and %d seconds, or null for never", MinKeepaliveS, MaxKeepaliveS)
		}
	}
	return nil
}

// validateWhere checks the tags (the text rule) and the machine named (a
// name), of GPU and grid requests alike.
func (r *Request) validateWhere() error {
	for i, t := range r.Tags {
		if t == "" {
			return Errorf(EInvalid, "tags must not contain an empty tag")
		}
		if err := ValidateText(fmt.Sprintf("tags[%d]", i), t, MaxTagBytes); err != nil {
			return err
		}
	}
	if r.Machine != "" {
		if err := ValidateName("machine", r.Machine); err != nil {
			return err
		}
	}
	return nil
}

// validateWho checks the owner and the label (the text rule).
func (r *Request) validateWho() error {
	if r.Owner == "" {
		return Errorf(EInvalid, "owner must not be empty: say who holds the allocation")
	}
	if err := ValidateText("owner", r.Owner, MaxOwnerBytes); err != nil {
		return err
	}
	return ValidateText("label", r.Label, MaxLabelBytes)
}

// SetPrincipal makes the request's owner the caller's token name, when
// there is one: owners cannot be chosen by whoever sends a request. What
// the request called its owner, if anything else, becomes its label
// (unless it has one). Without tokens (name "") the request's owner stays:
// everyone is the anonymous admin, and the owner is only a description.
func (r *Request) SetPrincipal(name string) {
	if name == "" || r.Owner == name {
		return
	}
	if r.Label == "" {
		r.Label = r.Owner
	}
	r.Owner = name
}

func (r *Request) validatePool() error {
	if err := ValidateName("pool", r.Pool); err != nil {
		return err
	}
	if err := r.validateWho(); err != nil {
		return err
	}
	if r.GPUs != 0 || r.MinVRAMGiB != 0 || r.RequireCUDA || r.MinCompute != "" || r.Model != "" || len(r.Tags) > 0 || r.Machine != "" {
		return Errorf(EInvalid, "a request for pool %q takes one slot of the pool's GPUs: leave gpus, min_vram_gib, require_cuda, min_compute, model, tags and machine out", r.Pool)
	}
	return r.validateWaiting()
}

// validateGrid checks what the root package knows of a grid request; the
// form itself is checked by the grid capability.
func (r *Request) validateGrid() error {
	if err := r.validateWho(); err != nil {
		return err
	}
	if r.GPUs != 0 || r.MinVRAMGiB != 0 || r.RequireCUDA || r.MinCompute != "" || r.Model != "" {
		return Errorf(EInvalid, "a grid request asks for boards: leave gpus, min_vram_gib, require_cuda, min_compute and model out")
	}
	if err := r.validateWhere(); err != nil {
		return err
	}
	if err := r.Grid.Validate(); err != nil {
		return err
	}
	if k := r.KeepaliveS; k != nil && (*k != *k || *k <= 0 || *k > MaxKeepaliveS) {
		return Errorf(EInvalid, "keepalive_s must be between 0 and %d seconds, or null for never", MaxKeepaliveS)
	}
	return nil
}

// Allocation is a set of devices held (or waited for) by an owner.
type Allocation struct {
	ID    int64  `json:"id"`
	Owner string `json:"owner"`
	// Label is the request's free-text description (Request.Label).
	Label    string      `json:"label,omitempty"`
	State    string      `json:"state"`
	Reason   *string     `json:"reason"`
	Machine  *string     `json:"machine"`
	Devices  []DeviceRef `json:"devices"`
	Request  Request     `json:"request"`
	Priority int         `json:"priority"`
	// KeepaliveS mirrors Request.KeepaliveS for clients that read it here.
	KeepaliveS  *float64   `json:"keepalive_s"`
	CreatedAt   time.Time  `json:"created_at"`
	ReadyAt     *time.Time `json:"ready_at"`
	DestroyedAt *time.Time `json:"destroyed_at"`
	// ExpiresAt is the keepalive deadline; in memory only (docs/architecture.md §2.2).
	ExpiresAt *time.Time `json:"expires_at"`
	// WhyQueued says why a queued allocation is not placed yet.
	WhyQueued *string `json:"why_queued"`
	// Principal is the name of the token that created the allocation ("" when
	// made without one). Only it, or an admin, may release it (MayTouch).
	Principal string `json:"principal,omitempty"`
	// A pool slot records its backing allocation and slot index; its devices
	// are the backing's.
	Pool    string `json:"pool,omitempty"`
	Backing *int64 `json:"backing,omitempty"`
	Slot    *int   `json:"slot,omitempty"`
	// A grid allocation holds boards of its machine instead of GPUs, and
	// whether they are (being) switched on.
	Boards []Board `json:"boards,omitempty"`
	Power  *bool   `json:"power,omitempty"`
	// Usage is its GPU accounting, brought up to date at most once a
	// minute while it lives and at its end (gputruth.go); null before.
	Usage *AllocationUsage `json:"usage"`
	// IdleSince is when its GPUs went idle, once they have stayed idle for
	// idle_after_s; null while it is active.
	IdleSince *time.Time `json:"idle_since"`
	// Fair share (fairshare.go, docs/guides/fair-share.md): its group (""
	// when no group is configured); when it ends by its time limit, a
	// reservation or preemption (null: never); while queued, its place in
	// the queue (1 first) and when it is expected to start (null: unknown).
	Group  string     `json:"group,omitempty"`
	EndsAt *time.Time `json:"ends_at"`
	// EndReason is the reason it will end with at EndsAt.
	EndReason   string      `json:"end_reason,omitempty"`
	Position    *int        `json:"position"`
	ETA         *time.Time  `json:"eta"`
	Preemptible bool        `json:"preemptible,omitempty"`
	Preempting  *Preempting `json:"preempting,omitempty"`
}

// DeviceRef names one device held by an allocation.
type DeviceRef struct {
	Machine string  `json:"machine"`
	Index   int     `json:"index"`
	UUID    string  `json:"uuid"`
	Model   string  `json:"model"`
	VRAMGiB float64 `json:"vram_gib"`
}

// Live reports whether the allocation still holds or waits for devices.
func (a *Allocation) Live() bool { return a.State != StateDestroyed }

// Str returns a pointer to s, for the optional string fields.
func Str(s string) *string { return &s }

// StrOr returns *p, or def when p is nil: the reader's side of Str.
func StrOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// MayTouch says whether the caller may act on a: an admin may on any, a
// token on what it created. An allocation created without a token (on a
// server without tokens, or through spalloc) is every caller's without a
// token too (the spalloc port, which has its own allow-list), but not a
// token holder's: a user's token does not make it anyone's to release.
// what is the action, with "it" ("release it"). Errors: forbidden,
// naming who may.
func MayTouch(c Caller, a *Allocation, what string) error {
	switch {
	case c.Role == RoleAdmin || a.Principal == c.Name:
		return nil
	case a.Principal == "":
		return Errorf(EForbidden, "allocation %d was made without a token (through spalloc); only an admin or a spalloc client may %s", a.ID, what)
	}
	return Errorf(EForbidden, "allocation %d belongs to %q; only it or an admin may %s", a.ID, a.Principal, what)
}

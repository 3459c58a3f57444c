package arbiter

import (
	"time"
)

// Pool packs small requests as slots onto shared backing allocations
// (docs/reference/pools.md): each backing, an ordinary allocation owned by
// "pool:NAME", serves Slots requests at once, and is given back once it has
// been empty for GraceTimeS.
type Pool struct {
	Name          string  `json:"name"`
	Backing       Request `json:"backing"` // Owner and KeepaliveS are set by the pool
	Slots         int     `json:"slots"`
	GraceTimeS    float64 `json:"grace_time_s"`
	MinRetentionS float64 `json:"min_retention_s"`
	MaxAgeS       float64 `json:"max_age_s"` // 0 = no limit
}

// PoolOwnerPrefix starts the owner of every backing allocation.
const PoolOwnerPrefix = "pool:"

// MaxPoolSlots bounds the slots of one backing.
const MaxPoolSlots = 1024

// Validate checks a pool's own fields; the backing request must be valid
// (owner aside).
func (p *Pool) Validate() error {
	if err := ValidateName("pool name", p.Name); err != nil {
		return err
	}
	if p.Slots < 1 || p.Slots > MaxPoolSlots {
		return Errorf(EInvalid, "pool %q: slots must be between 1 and %d", p.Name, MaxPoolSlots)
	}
	if p.GraceTimeS < 0 || p.MinRetentionS < 0 || p.MaxAgeS < 0 {
		return Errorf(EInvalid, "pool %q: grace_time_s, min_retention_s and max_age_s must not be negative", p.Name)
	}
	b := p.Backing
	b.Owner = PoolOwnerPrefix + p.Name
	b.KeepaliveS = nil
	if b.Pool != "" {
		return Errorf(EInvalid, "pool %q: the backing request cannot itself name a pool", p.Name)
	}
	if err := b.Validate(); err != nil {
		return Errorf(EInvalid, "pool %q: backing: %s", p.Name, ErrorMessage(err))
	}
	return nil
}

// SyncPools makes the configured pools exactly Pools. A pool no longer
// listed drains: its backings take no new slots and are given back once
// empty. Result: nil.
type SyncPools struct {
	Pools []Pool
}

func (SyncPools) isCommand()   {}
func (SyncPools) result() None { return None{} }

// RecordPool is the record kind of a pool's status (memory-only: rebuilt
// from the allocations at start).
const RecordPool = "pool"

// PoolStatus is what readers see of a pool: its configuration and each
// backing with its slot occupancy.
type PoolStatus struct {
	Pool
	Configured bool            `json:"configured"` // false: removed from the configuration, draining
	Backings   []BackingStatus `json:"backings"`
}

// BackingStatus is one backing allocation of a pool.
type BackingStatus struct {
	Allocation int64   `json:"allocation"`
	State      string  `json:"state"`
	Machine    *string `json:"machine"`
	// Slots[i] is the allocation holding slot i, null when free.
	Slots    []*int64 `json:"slots"`
	Draining bool     `json:"draining"`
	// ReleaseAt is when the backing is given back if it stays empty.
	ReleaseAt *time.Time `json:"release_at"`
	// DrainAt is when max_age_s makes it drain.
	DrainAt *time.Time `json:"drain_at"`
}

package arbiter

import (
	"context"
	"time"
)

// High availability (docs/guides/high-availability.md): several server
// replicas share one PostgreSQL database; one lease row in it elects the
// leader, which alone runs the control loop, and a roster of replicas says
// who else is there. These are the words the lease, the roster, the
// leadership and everyone who shows them share.

// Replica roles.
const (
	ReplicaLeader   = "leader"
	ReplicaFollower = "follower"
)

// LeaseHolder is what the lease row says of the server that holds it.
type LeaseHolder struct {
	// Term grows by one every time a server takes the lease; it is never
	// reused, so it names one reign.
	Term int64
	// ID is the holder's node id ([ha] node_id, or "pid N on host H"
	// without HA); URL is where it is reached; Host and PID where it runs.
	ID, URL, Host string
	PID           int
	Acquired      time.Time
	ExpiresAt     time.Time
	// Remaining is how long the lease runs unrenewed, as the database
	// counts it when it was read (0 once it has expired). The database's
	// own clock measures it, so replicas with skewed clocks agree.
	Remaining time.Duration
}

// Lease is the one row that elects a leader. Every call is one autocommit
// statement; times are the database's. Implementations are safe for
// concurrent use.
type Lease interface {
	// AcquireLease takes the lease for id, reached at url, for ttl when it
	// is free or has expired, raising the term. It returns the holder after
	// the attempt, and whether that is now id.
	AcquireLease(ctx context.Context, id, url string, ttl time.Duration) (LeaseHolder, bool, error)
	// RenewLease moves the expiry of term's lease to ttl from now. It
	// reports false, changing nothing, when the lease has another term.
	RenewLease(ctx context.Context, term int64, ttl time.Duration) (bool, error)
	// ReleaseLease ends term's lease now, so another server may take it at
	// once; nothing when the lease has another term.
	ReleaseLease(ctx context.Context, term int64) error
	// LeaseHolder reads the lease. Errors: not_found before anyone took it.
	LeaseHolder(ctx context.Context) (LeaseHolder, error)
}

// Replica is one server of a highly available deployment, as the roster
// has it: a row each replica refreshes every renewal.
type Replica struct {
	ID string `json:"id"`
	// Instance tells two processes with one node id apart (a random value
	// per start); never shown.
	Instance string `json:"-"`
	// URL is the replica's advertised HTTP URL; Spalloc its advertised
	// spalloc address ("" without one).
	URL     string    `json:"url"`
	Spalloc string    `json:"spalloc,omitempty"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	Seen    time.Time `json:"seen"`
	// Role is ReplicaLeader for the replica holding the lease, ReplicaFollower
	// for the others; filled in by whoever lists them.
	Role string `json:"role"`
}

// Roster is the table of replicas. Implementations are safe for
// concurrent use.
type Roster interface {
	// JoinReplicas adds r, or takes over the row of r.ID when it was not
	// refreshed for ttl or belongs to a process of this host that is gone.
	// Errors: conflict, naming the live replica that has r.ID.
	JoinReplicas(ctx context.Context, r Replica, ttl time.Duration) error
	// BeatReplica refreshes r's row and returns every replica seen within
	// ttl, in id order. Errors: conflict when the row of r.ID now belongs
	// to another instance.
	BeatReplica(ctx context.Context, r Replica, ttl time.Duration) ([]Replica, error)
	// LeaveReplicas removes r's row (if it is still r's).
	LeaveReplicas(ctx context.Context, r Replica) error
}

// Cluster is what a replica knows of the deployment: GET /api/v1/health
// reports it, the dashboard and `arbiter status` show it.
type Cluster struct {
	// NodeID is this replica's; Role its role (ReplicaLeader or ReplicaFollower).
	NodeID string `json:"node_id"`
	Role   string `json:"role"`
	// Term is the lease's term as this replica last saw it: its own while
	// it leads.
	Term int64 `json:"term"`
	// LeaderID and Leader (its URL) name the leader, "" while there is
	// none.
	LeaderID string    `json:"leader_id"`
	Leader   string    `json:"leader"`
	Replicas []Replica `json:"replicas"`
	// Failovers counts the terms this replica saw begin after the first.
	Failovers int64 `json:"failovers"`
}

// ReplicaStats are a replica's counters, for its metrics
// (arbiter_ha_*, docs/guides/operations.md).
type ReplicaStats struct {
	// Renewals that succeeded, and the time they took in all (seconds);
	// RenewBuckets counts them by ReplicaRenewBounds (cumulative, as a
	// Prometheus histogram).
	Renewals      uint64
	RenewSeconds  float64
	RenewBuckets  [len(ReplicaRenewBounds)]uint64
	RenewFailures uint64
	// LastRenewTaken is how long the last renewal took.
	LastRenewTaken time.Duration
	// Terms counts the terms this replica led; Term is the term it saw
	// last, Leading whether it leads (and trusts) it now.
	Terms   uint64
	Term    int64
	Leading bool
	// Failovers counts the terms it saw begin after the first; Replicas
	// those in the roster.
	Failovers int64
	Replicas  int
}

// ReplicaRenewBounds are the upper bounds of the lease renewal histogram,
// in seconds.
var ReplicaRenewBounds = [...]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

package httpapi

import (
	"github.com/arbiter-hq/arbiter"
)

// SetReplica adds a replica's metrics (arbiter_ha_*), read from stats at
// scrape time, to m. Call it before m serves.
func (m *Metrics) SetReplica(stats func() arbiter.ReplicaStats) { m.replica = stats }

// ReplicaMetrics is a follower's /metrics: its replica's series and the
// runtime's, as it has no plane of its own.
func ReplicaMetrics(stats func() arbiter.ReplicaStats) *Metrics {
	m := NewMetrics(nil)
	m.SetReplica(stats)
	return m
}

// writeReplica writes the replica's series (docs/guides/operations.md).
func (m *Metrics) writeReplica(w *exposition) {
	s := m.replica()
	w.single("arbiter_ha_term", "gauge", "The lease's term as this replica last saw it (its own while it leads).", float64(s.Term))
	lead := 0.0
	if s.Leading {
		lead = 1
	}
	w.family("arbiter_ha_role", "gauge", "1 for this replica's role (leader or follower), 0 for the other.")
	w.sample("arbiter_ha_role", label("role", arbiter.ReplicaLeader), lead)
	w.sample("arbiter_ha_role", label("role", arbiter.ReplicaFollower), 1-lead)
	w.single("arbiter_ha_failovers_total", "counter", "Terms this replica saw begin after the first: leadership changes.", float64(s.Failovers))
	w.single("arbiter_ha_terms_led_total", "counter", "Terms this replica led.", float64(s.Terms))
	w.single("arbiter_ha_replicas", "gauge", "Replicas seen in the roster within the lease's time to live.", float64(s.Replicas))
	// The elector keeps its renewal buckets cumulative already.
	w.family("arbiter_ha_lease_renew_seconds", "histogram", "Time to renew the lease (one autocommit UPDATE), renewals that succeeded.")
	for i, b := range arbiter.ReplicaRenewBounds {
		w.sample("arbiter_ha_lease_renew_seconds_bucket", `le="`+formatFloat(b)+`"`, float64(s.RenewBuckets[i]))
	}
	w.sample("arbiter_ha_lease_renew_seconds_bucket", `le="+Inf"`, float64(s.Renewals))
	w.sample("arbiter_ha_lease_renew_seconds_sum", "", s.RenewSeconds)
	w.sample("arbiter_ha_lease_renew_seconds_count", "", float64(s.Renewals))
	w.single("arbiter_ha_lease_renew_failures_total", "counter", "Renewals that failed (the database did not answer in time).", float64(s.RenewFailures))
}

package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/leader"
)

// A replica's metrics (docs/guides/operations.md, "Metrics"): its role,
// the term, the lease's renewals, the failovers it saw. The leader serves
// them beside the rest; a follower, which has nothing else, serves them
// with the Go runtime's and the process's.

var (
	descHATerm = prometheus.NewDesc("arbiter_ha_term",
		"The lease's term as this replica last saw it (its own while it leads).", nil, nil)
	descHARole = prometheus.NewDesc("arbiter_ha_role",
		"1 for this replica's role (leader or follower), 0 for the other.", []string{"role"}, nil)
	descHAFailovers = prometheus.NewDesc("arbiter_ha_failovers_total",
		"Terms this replica saw begin after the first: leadership changes.", nil, nil)
	descHATerms = prometheus.NewDesc("arbiter_ha_terms_led_total",
		"Terms this replica led.", nil, nil)
	descHAReplicas = prometheus.NewDesc("arbiter_ha_replicas",
		"Replicas seen in the roster within the lease's time to live.", nil, nil)
	descHARenew = prometheus.NewDesc("arbiter_ha_lease_renew_seconds",
		"Time to renew the lease (one autocommit UPDATE), renewals that succeeded.", nil, nil)
	descHARenewFailures = prometheus.NewDesc("arbiter_ha_lease_renew_failures_total",
		"Renewals that failed (the database did not answer in time).", nil, nil)
)

// haCollector reads the elector's counters at scrape time.
type haCollector struct{ e *leader.Elector }

func (c haCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHATerm, descHARole, descHAFailovers, descHATerms, descHAReplicas, descHARenew, descHARenewFailures} {
		ch <- d
	}
}

func (c haCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	ch <- prometheus.MustNewConstMetric(descHATerm, prometheus.GaugeValue, float64(s.Term))
	lead := 0.0
	if s.Leading {
		lead = 1
	}
	ch <- prometheus.MustNewConstMetric(descHARole, prometheus.GaugeValue, lead, arbiter.ReplicaLeader)
	ch <- prometheus.MustNewConstMetric(descHARole, prometheus.GaugeValue, 1-lead, arbiter.ReplicaFollower)
	ch <- prometheus.MustNewConstMetric(descHAFailovers, prometheus.CounterValue, float64(s.Failovers))
	ch <- prometheus.MustNewConstMetric(descHATerms, prometheus.CounterValue, float64(s.Terms))
	ch <- prometheus.MustNewConstMetric(descHAReplicas, prometheus.GaugeValue, float64(s.Replicas))
	buckets := make(map[float64]uint64, len(leader.RenewBounds))
	for i, b := range leader.RenewBounds {
		buckets[b] = s.RenewBuckets[i]
	}
	ch <- prometheus.MustNewConstHistogram(descHARenew, s.Renewals, s.RenewSeconds, buckets)
	ch <- prometheus.MustNewConstMetric(descHARenewFailures, prometheus.CounterValue, float64(s.RenewFailures))
}

// registerHAMetrics adds a replica's metrics to the leader's registry.
func registerHAMetrics(reg *prometheus.Registry, e *leader.Elector) {
	reg.MustRegister(haCollector{e})
}

// followerMetrics is a follower's /metrics.
func followerMetrics(e *leader.Elector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(haCollector{e}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

package httpapi

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds arbiter's Prometheus metrics in a registry of its own: the
// state of the plane (computed when scraped), the control loop's commits
// (ObserveCommit) and the HTTP server's requests. It is safe for concurrent
// use.
type Metrics struct {
	reg         *prometheus.Registry
	handler     http.Handler
	commitSecs  prometheus.Histogram
	commitBatch prometheus.Histogram
	requests    *prometheus.CounterVec
	requestSecs *prometheus.HistogramVec
}

// NewMetrics returns metrics over p, with the Go and process collectors.
func NewMetrics(p Plane) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		commitSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "arbiter_commit_seconds",
			Help:    "Time to save one batch of commands to the store.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 15), // 0.2ms … 3.3s
		}),
		commitBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "arbiter_commit_batch_size",
			Help:    "Commands applied per group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12), // 1 … 2048
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "arbiter_http_requests_total",
			Help: "HTTP requests answered, by route pattern and status code.",
		}, []string{"route", "code"}),
		requestSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "arbiter_http_request_seconds",
			Help:    "Time to answer an HTTP request, by route pattern (streams and long-polls included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 300},
		}, []string{"route"}),
	}
	m.reg.MustRegister(
		planeCollector{p},
		gpuCollector{p}, // per-GPU gauges (metrics_gpus.go)
		m.commitSecs, m.commitBatch, m.requests, m.requestSecs,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

// ObserveCommit records one group commit of batch commands that took d.
func (m *Metrics) ObserveCommit(batch int, d time.Duration) {
	m.commitSecs.Observe(d.Seconds())
	m.commitBatch.Observe(float64(batch))
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Registry returns the registry, for collectors of other packages.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// routeMetrics are one route's request metrics, with the label lookups
// done once rather than per request.
type routeMetrics struct {
	route   string
	vec     *prometheus.CounterVec
	seconds prometheus.Observer
	mu      sync.RWMutex
	byCode  map[int]prometheus.Counter
}

func (m *Metrics) route(route string) *routeMetrics {
	return &routeMetrics{
		route:   route,
		vec:     m.requests,
		seconds: m.requestSecs.WithLabelValues(route),
		byCode:  make(map[int]prometheus.Counter),
	}
}

func (rm *routeMetrics) observe(status int, d time.Duration) {
	rm.seconds.Observe(d.Seconds())
	rm.mu.RLock()
	c := rm.byCode[status]
	rm.mu.RUnlock()
	if c == nil {
		c = rm.vec.WithLabelValues(rm.route, strconv.Itoa(status))
		rm.mu.Lock()
		rm.byCode[status] = c
		rm.mu.Unlock()
	}
	c.Inc()
}

// planeCollector computes the state gauges from the plane's read view at
// scrape time, so that they can never drift from it.
type planeCollector struct{ p Plane }

var (
	descAllocations = prometheus.NewDesc("arbiter_allocations",
		"Allocations known (live and retained destroyed ones), by state.", []string{"state"}, nil)
	descQueue = prometheus.NewDesc("arbiter_queue_length",
		"Allocations waiting to be placed.", nil, nil)
	descMachines = prometheus.NewDesc("arbiter_machines",
		"Machines, by state.", []string{"state"}, nil)
	descGPUs = prometheus.NewDesc("arbiter_gpus",
		"GPUs of all machines, by whether a live allocation holds them.", []string{"held"}, nil)
)

func (c planeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAllocations
	ch <- descQueue
	ch <- descMachines
	ch <- descGPUs
}

func (c planeCollector) Collect(ch chan<- prometheus.Metric) {
	states := []string{arbiter.StateQueued, arbiter.StatePower, arbiter.StateReady, arbiter.StateDestroyed}
	counts := make(map[string]int, len(states))
	for _, a := range c.p.Allocations(arbiter.AllocationFilter{}) {
		counts[a.State]++
	}
	for _, s := range states {
		ch <- prometheus.MustNewConstMetric(descAllocations, prometheus.GaugeValue, float64(counts[s]), s)
	}
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(counts[arbiter.StateQueued]))

	var up, down, draining, held, free int
	for _, m := range c.p.Machines() {
		switch m.State {
		case arbiter.MachineDown:
			down++
		case arbiter.MachineDraining:
			draining++
		default:
			up++
		}
		for _, d := range m.Devices {
			if d.Allocation != nil {
				held++
			} else {
				free++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descMachines, prometheus.GaugeValue, float64(up), arbiter.MachineUp)
	ch <- prometheus.MustNewConstMetric(descMachines, prometheus.GaugeValue, float64(down), arbiter.MachineDown)
	ch <- prometheus.MustNewConstMetric(descMachines, prometheus.GaugeValue, float64(draining), arbiter.MachineDraining)
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(held), "true")
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(free), "false")
}

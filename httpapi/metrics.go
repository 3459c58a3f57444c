package httpapi

import (
	"bufio"
	"math"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Metrics holds arbiter's metrics and serves them in the Prometheus text
// exposition format (version 0.0.4): the state of the plane (computed when
// scraped), the control loop's commits (ObserveCommit), the HTTP server's
// requests, and the usual go_ and process_ series. It is written here
// rather than with Prometheus's client library, whose package
// initialisers (and protobuf's under them) were the largest part of
// starting any arbiter command, the client commands included. It is safe
// for concurrent use.
type Metrics struct {
	p           Plane
	start       time.Time
	commitSecs  *histogram
	commitBatch *histogram

	mu     sync.Mutex
	routes map[string]*routeMetrics // by route pattern

	replica func() arbiter.ReplicaStats // nil but on a replica (metrics_replica.go)
}

// NewMetrics returns metrics over p; nil p: no plane (a follower's,
// ReplicaMetrics).
func NewMetrics(p Plane) *Metrics {
	return &Metrics{
		p:           p,
		start:       time.Now(),
		commitSecs:  newHistogram(exponential(0.0002, 2, 15)), // 0.2ms … 3.3s
		commitBatch: newHistogram(exponential(1, 2, 12)),      // 1 … 2048
		routes:      map[string]*routeMetrics{},
	}
}

// requestBuckets are the bounds of arbiter_http_request_seconds, in seconds.
var requestBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 300}

// ObserveCommit records one group commit of batch commands that took d.
func (m *Metrics) ObserveCommit(batch int, d time.Duration) {
	m.commitSecs.observe(d.Seconds())
	m.commitBatch.observe(float64(batch))
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler { return http.HandlerFunc(m.serve) }

// routeMetrics are one route's request metrics.
type routeMetrics struct {
	route   string
	seconds *histogram
	mu      sync.RWMutex
	byCode  map[int]*atomic.Uint64
}

// route returns the metrics of one route pattern, made on first use.
func (m *Metrics) route(route string) *routeMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	rm := m.routes[route]
	if rm == nil {
		rm = &routeMetrics{route: route, seconds: newHistogram(requestBuckets), byCode: map[int]*atomic.Uint64{}}
		m.routes[route] = rm
	}
	return rm
}

func (rm *routeMetrics) observe(status int, d time.Duration) {
	rm.seconds.observe(d.Seconds())
	rm.mu.RLock()
	c := rm.byCode[status]
	rm.mu.RUnlock()
	if c == nil {
		rm.mu.Lock()
		if c = rm.byCode[status]; c == nil {
			c = new(atomic.Uint64)
			rm.byCode[status] = c
		}
		rm.mu.Unlock()
	}
	c.Add(1)
}

// histogram is a Prometheus histogram: cumulative counts are worked out
// when it is written.
type histogram struct {
	bounds []float64
	mu     sync.Mutex
	counts []uint64 // per bucket, the last for above every bound
	sum    float64
	count  uint64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func exponential(start, factor float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // the first bound >= v
	h.mu.Lock()
	h.counts[i]++
	h.sum += v
	h.count++
	h.mu.Unlock()
}

// write writes the histogram's series, labels (`k="v"` pairs, or "")
// on each.
func (h *histogram) write(w *exposition, name, labels string) {
	h.mu.Lock()
	counts := append([]uint64(nil), h.counts...)
	sum, count := h.sum, h.count
	h.mu.Unlock()
	var cum uint64
	for i, b := range h.bounds {
		cum += counts[i]
		w.sample(name+"_bucket", join(labels, `le="`+formatFloat(b)+`"`), float64(cum))
	}
	w.sample(name+"_bucket", join(labels, `le="+Inf"`), float64(count))
	w.sample(name+"_sum", labels, sum)
	w.sample(name+"_count", labels, float64(count))
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

// exposition writes the text format.
type exposition struct{ *bufio.Writer }

func (w *exposition) family(name, typ, help string) {
	w.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
}

// single writes a family of one sample without labels.
func (w *exposition) single(name, typ, help string, v float64) {
	w.family(name, typ, help)
	w.sample(name, "", v)
}

func (w *exposition) sample(name, labels string, v float64) {
	w.WriteString(name)
	if labels != "" {
		w.WriteString("{" + labels + "}")
	}
	w.WriteString(" " + formatFloat(v) + "\n")
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// label quotes a label value as the format wants.
func label(k, v string) string {
	v = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
	return k + `="` + v + `"`
}

func (m *Metrics) serve(rw http.ResponseWriter, _ *http.Request) {
	rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w := &exposition{bufio.NewWriter(rw)}
	defer w.Flush()
	if m.p != nil {
		m.writeServed(w)
	}
	if m.replica != nil {
		m.writeReplica(w) // metrics_replica.go
	}
	m.writeRuntime(w)
}

// writeServed writes the plane's series, its commits' and its requests'.
func (m *Metrics) writeServed(w *exposition) {
	m.writePlane(w)
	m.writeGPUs(w) // metrics_gpus.go

	w.family("arbiter_commit_seconds", "histogram", "Time to save one batch of commands to the store.")
	m.commitSecs.write(w, "arbiter_commit_seconds", "")
	w.family("arbiter_commit_batch_size", "histogram", "Commands applied per group commit.")
	m.commitBatch.write(w, "arbiter_commit_batch_size", "")

	m.mu.Lock()
	routes := make([]*routeMetrics, 0, len(m.routes))
	for _, rm := range m.routes {
		routes = append(routes, rm)
	}
	m.mu.Unlock()
	sort.Slice(routes, func(i, j int) bool { return routes[i].route < routes[j].route })
	w.family("arbiter_http_requests_total", "counter", "HTTP requests answered, by route pattern and status code.")
	for _, rm := range routes {
		rm.mu.RLock()
		codes := make([]int, 0, len(rm.byCode))
		for c := range rm.byCode {
			codes = append(codes, c)
		}
		sort.Ints(codes)
		for _, c := range codes {
			w.sample("arbiter_http_requests_total", label("code", strconv.Itoa(c))+","+label("route", rm.route), float64(rm.byCode[c].Load()))
		}
		rm.mu.RUnlock()
	}
	w.family("arbiter_http_request_seconds", "histogram", "Time to answer an HTTP request, by route pattern (streams and long-polls included).")
	for _, rm := range routes {
		rm.seconds.write(w, "arbiter_http_request_seconds", label("route", rm.route))
	}
}

// writePlane writes the state gauges, computed from the plane's read view
// at scrape time so that they can never drift from it.
func (m *Metrics) writePlane(w *exposition) {
	states := []string{arbiter.StateQueued, arbiter.StatePower, arbiter.StateReady, arbiter.StateDestroyed}
	counts := make(map[string]int, len(states))
	for _, a := range m.p.Allocations(arbiter.AllocationFilter{}) {
		counts[a.State]++
	}
	w.family("arbiter_allocations", "gauge", "Allocations known (live and retained destroyed ones), by state.")
	for _, s := range states {
		w.sample("arbiter_allocations", label("state", s), float64(counts[s]))
	}
	w.single("arbiter_queue_length", "gauge", "Allocations waiting to be placed.", float64(counts[arbiter.StateQueued]))

	var up, down, draining, held, free int
	for _, mc := range m.p.Machines() {
		switch mc.State {
		case arbiter.MachineDown:
			down++
		case arbiter.MachineDraining:
			draining++
		default:
			up++
		}
		for _, d := range mc.Devices {
			if d.Allocation != nil {
				held++
			} else {
				free++
			}
		}
	}
	w.family("arbiter_machines", "gauge", "Machines, by state.")
	w.sample("arbiter_machines", label("state", arbiter.MachineUp), float64(up))
	w.sample("arbiter_machines", label("state", arbiter.MachineDown), float64(down))
	w.sample("arbiter_machines", label("state", arbiter.MachineDraining), float64(draining))
	w.family("arbiter_gpus", "gauge", "GPUs of all machines, by whether a live allocation holds them.")
	w.sample("arbiter_gpus", label("held", "true"), float64(held))
	w.sample("arbiter_gpus", label("held", "false"), float64(free))
}

// writeRuntime writes the Go runtime's and the process's usual series.
func (m *Metrics) writeRuntime(w *exposition) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w.single("go_goroutines", "gauge", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	w.single("go_sched_gomaxprocs_threads", "gauge", "The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously.", float64(runtime.GOMAXPROCS(0)))
	w.single("go_memstats_heap_alloc_bytes", "gauge", "Number of heap bytes allocated and still in use.", float64(ms.HeapAlloc))
	w.single("go_memstats_sys_bytes", "gauge", "Number of bytes obtained from system.", float64(ms.Sys))
	w.single("go_gc_cycles_total", "counter", "Number of completed GC cycles.", float64(ms.NumGC))
	w.single("go_gc_pause_seconds_total", "counter", "Total time the world was stopped for garbage collection.", float64(ms.PauseTotalNs)/1e9)

	w.single("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", float64(m.start.UnixNano())/1e9)
	if cpu, rss, ok := procStat(); ok {
		w.single("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", cpu)
		w.single("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss)
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		w.single("process_open_fds", "gauge", "Number of open file descriptors.", float64(len(ents)))
	}
}

// procStat reads the process's CPU time and resident size from
// /proc/self/stat (Linux; ok false elsewhere).
func procStat() (cpu, rss float64, ok bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, false
	}
	// The fields after the command (which may hold spaces), in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 22 {
		return 0, 0, false
	}
	// utime and stime are fields 14 and 15, rss 24 (1-based, counting
	// pid and comm): 11, 12 and 21 after the command.
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	pages, err3 := strconv.ParseFloat(f[21], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	const ticks = 100 // USER_HZ on Linux
	return (ut + st) / ticks, pages * float64(os.Getpagesize()), true
}

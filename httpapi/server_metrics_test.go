package httpapi

import (
	"fmt"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

func TestServerMetrics(t *testing.T) {
	f := newFakePlane()
	m := NewMetrics(f)
	s := NewServer(Options{Plane: f, Tokens: testTokens, Metrics: m})
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, GPUs: []arbiter.GPU{{Index: 0}, {Index: 1}}})
	seed(t, s, 2)
	call(t, s, "GET", "/api/v1/allocations/abc", testUser, nil)
	m.ObserveCommit(3, 2*time.Millisecond)

	a := call(t, s, "GET", "/metrics", "", nil)
	if a.status != 200 {
		t.Fatalf("got %d, want 200", a.status)
	}
	body := string(a.body)
	for _, want := range []string{
		`arbiter_allocations{state="queued"} 2`,
		`arbiter_allocations{state="ready"} 0`,
		`arbiter_queue_length 2`,
		`arbiter_machines{state="up"} 1`,
		`arbiter_machines{state="down"} 0`,
		`arbiter_gpus{held="false"} 2`,
		`arbiter_gpus{held="true"} 0`,
		`arbiter_commit_seconds_count 1`,
		`arbiter_commit_batch_size_sum 3`,
		`arbiter_http_requests_total{code="201",route="POST /api/v1/allocations"} 2`,
		`arbiter_http_requests_total{code="400",route="GET /api/v1/allocations/{id}"} 1`,
		`arbiter_http_request_seconds_count{route="POST /api/v1/allocations"} 2`,
		`go_goroutines`,
		fmt.Sprintf("go_sched_gomaxprocs_threads %d\n", runtime.GOMAXPROCS(0)),
		`process_`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestServerMetricsDisabled(t *testing.T) {
	s, _ := testServer(t, nil)
	if a := call(t, s, "GET", "/metrics", "", nil); a.status != 404 {
		t.Errorf("got %d, want 404 without Metrics", a.status)
	}
}

// TestMetricsFormat checks the exposition is well formed: every sample
// line is NAME{LABELS} VALUE under a TYPE line of its family, histogram
// buckets only grow, and the +Inf bucket is the count.
func TestMetricsFormat(t *testing.T) {
	f := newFakePlane()
	m := NewMetrics(f)
	s := NewServer(Options{Plane: f, Tokens: testTokens, Metrics: m})
	for _, d := range []time.Duration{100 * time.Microsecond, 3 * time.Millisecond, time.Hour} {
		m.ObserveCommit(2, d)
	}
	call(t, s, "GET", "/api/v1/allocations", testUser, nil)
	body := string(call(t, s, "GET", "/metrics", "", nil).body)
	checkExposition(t, body)
	for _, want := range []string{`arbiter_commit_seconds_bucket{le="+Inf"} 3`, `arbiter_commit_seconds_count 3`, `arbiter_commit_seconds_bucket{le="0.0002"} 1`, `arbiter_commit_seconds_bucket{le="0.0032"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// checkExposition checks body is well formed: every sample line is
// NAME{LABELS} VALUE under a TYPE line of its family, and histogram
// buckets only grow.
func checkExposition(t *testing.T, body string) {
	t.Helper()
	leLabel := regexp.MustCompile(`,?le="[^"]*"`)
	sample := regexp.MustCompile(`^([a-z_]+)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? ([-+0-9.eInf]+)$`)
	typed := map[string]bool{}
	last := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(name)[0]] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		mt := sample.FindStringSubmatch(line)
		if mt == nil {
			t.Fatalf("malformed line %q", line)
		}
		family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(mt[1], "_bucket"), "_sum"), "_count")
		if !typed[family] && !typed[mt[1]] {
			t.Errorf("%q has no TYPE line before it", line)
		}
		if strings.HasSuffix(mt[1], "_bucket") {
			series := mt[1] + leLabel.ReplaceAllString(mt[2], "") // one histogram: its labels but le
			v, _ := strconv.ParseFloat(mt[4], 64)
			if v < last[series] {
				t.Errorf("bucket %q falls below the one before", line)
			}
			last[series] = v
		}
	}
}

// TestReplicaMetrics: a follower's metrics are its replica's series and
// the runtime's; a leader's add the replica's to the plane's.
func TestReplicaMetrics(t *testing.T) {
	stats := arbiter.ReplicaStats{Term: 7, Leading: false, Failovers: 2, Terms: 1, Replicas: 3, Renewals: 4, RenewSeconds: 0.01, RenewFailures: 1}
	for i, b := range arbiter.ReplicaRenewBounds {
		if b >= 0.005 {
			stats.RenewBuckets[i] = 4
		} else if b >= 0.001 {
			stats.RenewBuckets[i] = 1
		}
	}
	rec := httptest.NewRecorder()
	ReplicaMetrics(func() arbiter.ReplicaStats { return stats }).Handler().ServeHTTP(rec, testRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	checkExposition(t, body)
	for _, want := range []string{`arbiter_ha_term 7`, `arbiter_ha_role{role="leader"} 0`, `arbiter_ha_role{role="follower"} 1`,
		`arbiter_ha_failovers_total 2`, `arbiter_ha_replicas 3`, `arbiter_ha_lease_renew_seconds_bucket{le="+Inf"} 4`,
		`arbiter_ha_lease_renew_seconds_bucket{le="0.001"} 1`, `arbiter_ha_lease_renew_failures_total 1`, `go_goroutines `} {
		if !strings.Contains(body, want) {
			t.Errorf("a follower's metrics lack %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "arbiter_allocations") {
		t.Error("a follower's metrics have the plane's series")
	}

	f := newFakePlane()
	m := NewMetrics(f)
	stats.Leading = true
	m.SetReplica(func() arbiter.ReplicaStats { return stats })
	body = string(call(t, NewServer(Options{Plane: f, Tokens: testTokens, Metrics: m}), "GET", "/metrics", "", nil).body)
	checkExposition(t, body)
	for _, want := range []string{`arbiter_ha_role{role="leader"} 1`, `arbiter_allocations{state="ready"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("a leader's metrics lack %q", want)
		}
	}
}

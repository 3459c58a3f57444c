package httpapi

import (
	"regexp"
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
		if strings.HasSuffix(mt[1], "_bucket") && mt[1] == "arbiter_commit_seconds_bucket" {
			v, _ := strconv.ParseFloat(mt[4], 64)
			if v < last[mt[1]] {
				t.Errorf("bucket %q falls below the one before", line)
			}
			last[mt[1]] = v
		}
	}
	for _, want := range []string{`arbiter_commit_seconds_bucket{le="+Inf"} 3`, `arbiter_commit_seconds_count 3`, `arbiter_commit_seconds_bucket{le="0.0002"} 1`, `arbiter_commit_seconds_bucket{le="0.0032"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

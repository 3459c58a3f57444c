package httpapi

import (
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

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The look at the leader from outside: a leader answering at its URL as
// itself is fine; one answering as another node, or not at all, is a
// problem that names the URL and what to fix, and it clears once fixed.
func TestLeaderProbe(t *testing.T) {
	as := func(node string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"status":"ok","node_id":%q}`, node)
		}))
	}
	a, b := as("arbiter-1"), as("arbiter-2")
	defer a.Close()
	defer b.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	var logged []string
	p := &leaderProbe{client: http.DefaultClient, log: func(msg string, args ...any) { logged = append(logged, fmt.Sprint(args...)) }}
	// Health says a problem once it has lasted grace: none here, so each
	// shows at once; TestLeaderProbeGrace has one.
	ctx := context.Background()
	for _, tc := range []struct {
		leader, url, want string
		down              bool
	}{
		{"arbiter-1", a.URL, "", false},
		{"arbiter-1", b.URL, `answers as "arbiter-2", not as it: fix its [ha] advertise_url`, false},
		{"arbiter-1", gone.URL, "does not answer at its advertise_url " + gone.URL, true},
		{"", "", "", false}, // none leads: a failover, not this probe's to say
		{"arbiter-1", a.URL, "", false},
	} {
		problem, down := p.check(ctx, arbiter.Cluster{LeaderID: tc.leader, Leader: tc.url})
		p.set(problem)
		if got := p.Problem(); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) || down != tc.down {
			t.Errorf("leader %s at %s: problem %q, down %v; want %q, %v", tc.leader, tc.url, got, down, tc.want, tc.down)
		}
	}
	if len(logged) != 2 {
		t.Errorf("logged %d problems, want each new one once: %q", len(logged), logged)
	}
}

// A problem shows in health only once it has lasted grace: a failover is
// over within the lease's time and is no reason to take every replica out
// of a load balancer.
func TestLeaderProbeGrace(t *testing.T) {
	p := &leaderProbe{grace: time.Hour, log: func(string, ...any) {}}
	p.set("the leader does not answer")
	if got := p.Problem(); got != "" {
		t.Fatalf("a problem just found shows: %q", got)
	}
	p.problem.Store(&probeProblem{"the leader does not answer", time.Now().Add(-2 * time.Hour)})
	p.set("the leader does not answer (again)")
	if got := p.Problem(); got != "the leader does not answer (again)" {
		t.Fatalf("a problem of two hours: %q", got)
	}
	p.set("")
	if got := p.Problem(); got != "" {
		t.Fatalf("cleared: %q", got)
	}
}

package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/postgres"
	"github.com/jackc/pgx/v5"
)

var testCluster = arbiter.Cluster{NodeID: "a", Role: arbiter.ReplicaLeader, Term: 3, LeaderID: "a", Leader: "http://a:7070",
	Replicas: []arbiter.Replica{{ID: "a", Role: arbiter.ReplicaLeader, URL: "http://a:7070"}, {ID: "b", Role: arbiter.ReplicaFollower, URL: "http://b:7070"}}}

// TestHealthOfAReplica: under HA, health says the role, the term, the
// leader and the replicas; without it, none of that.
func TestHealthOfAReplica(t *testing.T) {
	s, _ := testServer(t, func(o *Options) { o.Cluster = func() arbiter.Cluster { return testCluster } })
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, testRequest("GET", "/api/v1/health", nil))
	var h struct {
		Status   string            `json:"status"`
		Role     string            `json:"role"`
		Term     int64             `json:"term"`
		Leader   string            `json:"leader"`
		Replicas []arbiter.Replica `json:"replicas"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &h); err != nil {
		t.Fatal(err)
	}
	if h.Status != "ok" || h.Role != "leader" || h.Term != 3 || h.Leader != "http://a:7070" || len(h.Replicas) != 2 {
		t.Fatalf("health: %s", w.Body)
	}
	plain, _ := testServer(t, nil)
	w = httptest.NewRecorder()
	plain.Handler().ServeHTTP(w, testRequest("GET", "/api/v1/health", nil))
	if strings.Contains(w.Body.String(), "role") || !strings.Contains(w.Body.String(), `"last_seq"`) {
		t.Fatalf("health without HA: %s", w.Body)
	}
}

// TestDashboardShowsReplicas: the page's footer names the leader, the term
// and the replicas.
func TestDashboardShowsReplicas(t *testing.T) {
	s, _ := testServer(t, func(o *Options) {
		o.Tokens = nil
		o.Cluster = func() arbiter.Cluster { return testCluster }
	})
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, testRequest("GET", "/", nil))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "a leads (term 3) · replicas: a ★, b") {
		t.Fatalf("%d: %s", w.Code, w.Body)
	}
}

// TestNotLeadingRefusalGoesToTheLeader: a leader whose trust window
// closes while requests wait in its loop (the database is slow or cut off)
// refuses their writes before sending them, and answers 503 marked
// X-Arbiter-Not-Applied, so that the multi-URL client (and the CLI and the
// agent over it) sends the POST on to the replica that leads now.
func TestNotLeadingRefusalGoesToTheLeader(t *testing.T) {
	url := os.Getenv("ARBITER_TEST_POSTGRES")
	if url == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set")
	}
	ctx := context.Background()
	var b [6]byte
	rand.Read(b[:])
	schema := "arbiter_httpapi_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			conn.Close(ctx)
		}
	})
	pg, err := postgres.Open(ctx, url, postgres.Options{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	h, won, err := pg.AcquireLease(ctx, "a", "", time.Minute)
	if err != nil || !won {
		t.Fatal(won, err)
	}
	var trusted atomic.Bool
	trusted.Store(true)
	term := pg.Fenced(postgres.Fence{Term: h.Term, Trusted: func() error {
		if trusted.Load() {
			return nil
		}
		// leader.Elector.Trusted's refusal once the term is no longer led.
		return arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "this replica no longer leads (term %d is over): nothing was done; retry, the client finds the leader", h.Term))
	}})
	loop, err := control.Open(ctx, control.Options{Store: term})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Close()
	old := httptest.NewServer(NewServer(Options{Plane: loop, Tokens: testTokens, Version: "test"}).Handler())
	defer old.Close()
	next, _ := testServer(t, nil) // the replica that leads now
	nextSrv := httptest.NewServer(next.Handler())
	defer nextSrv.Close()

	cl := client.New(old.URL+","+nextSrv.URL, testUser)
	ka := 60.0
	if _, err := cl.Allocations(ctx, arbiter.AllocationFilter{}); err != nil || cl.URL() != old.URL {
		t.Fatal(err)
	}
	if cl.URL() != old.URL {
		t.Fatalf("the client uses %s, want the old leader", cl.URL())
	}
	trusted.Store(false) // the window closed: the loop's writes are refused before they are sent
	if _, err := cl.Allocate(ctx, arbiter.Request{GPUs: 1, KeepaliveS: &ka}); err != nil {
		t.Fatalf("a write the deposed leader refused before sending it (nothing done) was not sent on to the replica that leads: %v", err)
	}
}

// Health says a server whose store is failing is degraded, with why, and
// answers 503 so that monitors notice.
func TestHealthDegraded(t *testing.T) {
	w := httptest.NewRecorder()
	WriteHealth(w, Health{Version: "test", Problem: "since then, a save failed"})
	var h Health
	if err := json.Unmarshal(w.Body.Bytes(), &h); err != nil || w.Code != 503 || h.Status != "degraded" || h.Problem != "since then, a save failed" {
		t.Fatalf("%d %s (%v)", w.Code, w.Body, err)
	}
}

// A server with a problem (Options.Problem: the store failing, the leader
// unreachable) says so in its health.
func TestHealthSaysTheProblem(t *testing.T) {
	s, _ := testServer(t, func(o *Options) { o.Problem = func() string { return "the store is failing" } })
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, testRequest("GET", "/api/v1/health", nil))
	if w.Code != 503 || !strings.Contains(w.Body.String(), `"problem":"the store is failing"`) {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
}

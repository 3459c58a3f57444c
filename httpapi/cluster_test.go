package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
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

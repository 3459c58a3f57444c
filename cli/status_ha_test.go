package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestPrintCluster: status shows who leads and every replica; with no
// leader it says a failover is under way.
func TestPrintCluster(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := &arbiter.Cluster{NodeID: "b", Role: arbiter.ReplicaFollower, Term: 7, LeaderID: "a", Leader: "http://a:7070", Failovers: 2,
		Replicas: []arbiter.Replica{
			{ID: "a", Role: arbiter.ReplicaLeader, URL: "http://a:7070", Host: "ha", PID: 10, Version: "v1", Seen: now.Add(-time.Second)},
			{ID: "b", Role: arbiter.ReplicaFollower, URL: "http://b:7070", Host: "hb", PID: 11, Version: "v1", Seen: now},
		}}
	var b bytes.Buffer
	if err := printCluster(&b, c, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"a leads (term 7", "a     leader    http://a:7070", "b     follower  http://b:7070"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	c.LeaderID = ""
	b.Reset()
	printCluster(&b, c, now)
	if !strings.Contains(b.String(), "no leader right now") {
		t.Errorf("without a leader:\n%s", b.String())
	}
}

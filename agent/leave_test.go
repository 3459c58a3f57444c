package agent

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
)

// leavingServer is the fake server that also hears an agent leave.
type leavingServer struct {
	*fakeServer
	mu   sync.Mutex
	left []string
}

func (s *leavingServer) LeaveMachine(_ context.Context, name string) (arbiter.MachineStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left = append(s.left, name)
	return arbiter.MachineStatus{Name: name, State: arbiter.MachineDown}, nil
}

// TestStoppedAgentLeaves is issue 12's finding 8 from the agent's side: an
// agent stopped (SIGTERM cancels its context) tells the server its machine
// is leaving, so it is down at once rather than at the heartbeat timeout.
func TestStoppedAgentLeaves(t *testing.T) {
	fakeNvidiaSMI(t, "mixed")
	s := &leavingServer{fakeServer: newFakeServer()}
	cfg := fast(s)
	cfg.Name = "gpu7"
	stop := start(t, cfg)
	poll.Until(t, 10*time.Second, "a heartbeat", func() bool { _, hb, _ := s.snapshot(); return hb >= 1 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.left) != 1 || s.left[0] != "gpu7" {
		t.Fatalf("left %v, want [gpu7]", s.left)
	}
}

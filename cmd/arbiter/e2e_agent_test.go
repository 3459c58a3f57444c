package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

// TestEndToEndAgent runs the real `arbiter agent` binary, with a fake
// nvidia-smi on PATH, against the real server: the machine registers with
// its GPUs, serves an allocation, goes down when the agent stops (driven by
// the server's fake clock), keeps what it holds, and comes back up with the
// agent.
func TestEndToEndAgent(t *testing.T) {
	bin := buildBinary(t)
	clk := clock.NewFake(time.Now().UTC())
	m, url := startServer(t, "[agents]\nheartbeat_timeout_s = 30\n", clk, "--no-local")

	pathDir := fakeSMIDir(t)
	workDir := t.TempDir()
	startAgent := func() *exec.Cmd {
		cmd := exec.Command(bin, "agent", "--url", url, "--name", "worker1", "--tag", "lab", "--heartbeat", "50ms", "--no-nvml", "--work-dir", workDir)
		cmd.Env = append(os.Environ(), "PATH="+pathDir+":"+os.Getenv("PATH"), "FAKE_NVIDIA_SMI=h100x8")
		runProcess(t, cmd, "agent", 0)
		return cmd
	}
	c := client.New(url, "")
	ctx := context.Background()
	agent := startAgent()
	var ms arbiter.MachineStatus
	var err error
	poll.Until(t, 30*time.Second, "the agent to register worker1", func() bool { ms, err = c.Machine(ctx, "worker1"); return err == nil })
	if ms.State != arbiter.MachineUp || len(ms.Devices) != 8 || ms.Source != arbiter.SourceAgent || ms.Tags[0] != "lab" || ms.Devices[0].Model != "NVIDIA H100 80GB HBM3" {
		t.Fatalf("registered machine %+v: want up, agent, tag lab, 8 H100", ms)
	}
	a, err := c.Allocate(ctx, arbiter.Request{Owner: "u", GPUs: 2, RequireCUDA: true})
	if err != nil || a.State != arbiter.StateReady || *a.Machine != "worker1" {
		t.Fatalf("allocate: %+v %v, want ready on worker1", a, err)
	}

	// SIGTERM: the agent exits cleanly.
	agent.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- agent.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent on SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
	// Silence past the timeout: down, holdings kept, nothing new placed.
	clk.Advance(31 * time.Second)
	m.loop.Wake()
	poll.Until(t, 30*time.Second, "worker1 to be down", func() bool { ms, _ = c.Machine(ctx, "worker1"); return ms.State == arbiter.MachineDown })
	if g, _ := c.Allocation(ctx, a.ID); g.State != arbiter.StateReady {
		t.Fatalf("allocation on the down machine: %s, want still ready", g.State)
	}
	q, _ := c.Allocate(ctx, arbiter.Request{Owner: "u", GPUs: 1})
	if q.State != arbiter.StateQueued || !strings.Contains(arbiter.StrOr(q.WhyQueued, ""), "down") {
		t.Fatalf("allocation while down: %s (%v), want queued: down", q.State, arbiter.StrOr(q.WhyQueued, ""))
	}
	// The agent comes back: up again, and the queued request is placed.
	startAgent()
	poll.Until(t, 30*time.Second, "the queued allocation to be placed", func() bool { g, _ := c.Allocation(ctx, q.ID); return g.State == arbiter.StateReady })
}

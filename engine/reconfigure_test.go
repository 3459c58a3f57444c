package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// reconfig is a Reconfigure of the given GPU and grid machines, with the
// default policies and no pools.
func reconfig(ms []arbiter.Machine, grid ...arbiter.GridMachine) arbiter.Reconfigure {
	if grid == nil {
		grid = []arbiter.GridMachine{}
	}
	return arbiter.Reconfigure{
		Machines:  arbiter.SyncConfigMachines{Machines: ms},
		GPUPolicy: arbiter.SetGPUPolicy{Policy: arbiter.DefaultGPUPolicy()},
		FairShare: arbiter.SetFairShare{Policy: arbiter.DefaultFairSharePolicy()},
		Grid:      arbiter.SyncGridMachines{Machines: grid, MaxRetiredJobs: 100},
	}
}

// TestReconfigureRefusedChangesNothing: a configuration with a part the
// engine refuses (a grid machine named like an agent's GPU machine) takes
// nothing into force, not even the parts before it: the configured machine
// it leaves out keeps its allocation.
func TestReconfigureRefusedChangesNothing(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 2))
	agent := host("node7", 1)
	agent.Source = arbiter.SourceAgent
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agent}, t0); err != nil {
		t.Fatal(err)
	}
	a := alloc1(t, e, t0, arbiter.Request{GPUs: 2, Machine: "a"})
	e.Flush()

	now := t0 // before the agent's heartbeat is due: nothing else changes
	_, err := e.Apply(reconfig([]arbiter.Machine{host("b", 4)}, gridM("node7", 1, 1)), now)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "node7") {
		t.Fatalf("reconfigure with a grid machine named like an agent's: %v, want a conflict naming node7", err)
	}
	c := e.Flush()
	if len(c.Events) != 0 || len(c.Machines) != 0 || len(c.RemovedMachines) != 0 || len(c.Allocations) != 0 || len(c.Records) != 0 {
		t.Fatalf("a refused reconfigure changed something: %d events, machines %v, removed %v, %d allocations, %d records",
			len(c.Events), c.Machines, c.RemovedMachines, len(c.Allocations), len(c.Records))
	}
	if got, _ := e.Allocation(a.ID); got.State != arbiter.StateReady {
		t.Fatalf("allocation on the configured machine: %s, want still ready", got.State)
	}
	if e.byName["b"] != nil {
		t.Fatal("machine b of the refused configuration was added")
	}

	// The same configuration without the clash: everything at once.
	if _, err := e.Apply(reconfig([]arbiter.Machine{host("b", 4)}, gridM("spin", 1, 1)), now); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Allocation(a.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("allocation on the removed machine: %s, want destroyed", got.State)
	}
	if e.byName["b"] == nil || e.byName["a"] != nil {
		t.Fatal("machine b not added in a's place")
	}
	if e.grids.ms["spin"] == nil {
		t.Fatal("grid machine spin not added")
	}
}

// TestReconfigureChecksNamesAgainstTheNewMachines: a grid machine may take
// the name of a configured GPU machine the same configuration removes, and
// may not take one it declares (the server's own host included).
func TestReconfigureChecksNamesAgainstTheNewMachines(t *testing.T) {
	e := newEngine(t, Config{}, host("x", 1))
	if _, err := e.Apply(reconfig(nil, gridM("x", 1, 1)), t0); err != nil {
		t.Fatalf("grid machine taking a removed GPU machine's name: %v", err)
	}
	local := host("y", 1)
	local.Source = arbiter.SourceLocal
	_, err := e.Apply(reconfig([]arbiter.Machine{local}, gridM("y", 1, 1)), t0)
	if arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("grid machine named like the declared local machine: %v, want conflict", err)
	}
}

// TestReconfigureEndsSessionsOfOtherTokens: the sessions part ends the
// sessions of tokens not kept, and the result counts them.
func TestReconfigureEndsSessionsOfOtherTokens(t *testing.T) {
	e := newEngine(t, Config{})
	for _, s := range []arbiter.StartSession{sessionFor("a", "alice", time.Hour), sessionFor("b", "bob", time.Hour)} {
		if _, err := e.Apply(s, t0); err != nil {
			t.Fatal(err)
		}
	}
	c := reconfig(nil)
	c.Sessions.Keep = map[string]string{"alice": strings.Repeat("f", 64)}
	res, err := e.Apply(c, t0)
	if err != nil || res.(int) != 1 {
		t.Fatalf("reconfigure ended %v sessions (%v), want 1", res, err)
	}
}

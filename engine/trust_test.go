package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Issue 12's engine findings: owners that cannot be forged (3), text that
// cannot reach a terminal (4), allocations.history = 0 (6).

var (
	alice = arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}
	bob   = arbiter.Caller{Name: "bob", Role: arbiter.RoleUser}
	ops   = arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}
)

// TestOwnerIsThePrincipal is finding 3: with tokens, the owner is the
// token's name whatever the request says; the request's words are a label.
func TestOwnerIsThePrincipal(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8))
	res, err := e.Apply(arbiter.Allocate{Caller: bob, Request: arbiter.Request{Owner: "alice", GPUs: 1}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	a := res.(arbiter.Allocation)
	if a.Owner != "bob" || a.Label != "alice" || a.Principal != "bob" {
		t.Fatalf("bob asking as alice: owner %q label %q principal %q, want bob, label alice", a.Owner, a.Label, a.Principal)
	}
	// An explicit label stays; an owner equal to the principal is no label.
	res, _ = e.Apply(arbiter.Allocate{Caller: bob, Request: arbiter.Request{Owner: "bob", Label: "sweep 3", GPUs: 1}}, t0)
	if b := res.(arbiter.Allocation); b.Owner != "bob" || b.Label != "sweep 3" {
		t.Fatalf("label: %+v", b)
	}
	// Without tokens (no caller name) the owner is what the request says.
	res, _ = e.Apply(arbiter.Allocate{Caller: arbiter.Caller{Role: arbiter.RoleAdmin}, Request: arbiter.Request{Owner: "carol@h1", GPUs: 1}}, t0)
	if c := res.(arbiter.Allocation); c.Owner != "carol@h1" || c.Label != "" || c.Principal != "" {
		t.Fatalf("open server: %+v", c)
	}
	// The label survives a restart, as the owner does.
	st := &arbiter.State{Machines: e.Machines(), Allocations: e.Allocations(), NextAllocationID: 10}
	e2 := New(Config{}, st, t0)
	if got, _ := e2.Allocation(a.ID); got.Owner != "bob" || got.Label != "alice" {
		t.Fatalf("after restart: %+v", got)
	}
}

// TestKeepaliveOfAnothersAllocation is finding 3: a user token may not keep
// another's allocation alive; its own and an admin may. An allocation made
// without a token is a tokenless caller's (spalloc) or an admin's only.
func TestKeepaliveOfAnothersAllocation(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8))
	res, err := e.Apply(arbiter.Allocate{Caller: alice, Request: arbiter.Request{Owner: "alice", GPUs: 1, KeepaliveS: ka(30)}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	a := res.(arbiter.Allocation)
	if _, err := e.Apply(arbiter.Keepalive{Caller: bob, ID: a.ID}, t0.Add(time.Second)); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob keeping alice's allocation alive: %v, want forbidden", err)
	} else if !strings.Contains(arbiter.ErrorMessage(err), `"alice"`) {
		t.Fatalf("message %q does not say whose it is", arbiter.ErrorMessage(err))
	}
	for _, c := range []arbiter.Caller{alice, ops} {
		if _, err := e.Apply(arbiter.Keepalive{Caller: c, ID: a.ID}, t0.Add(time.Second)); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
	}
	if _, err := e.Apply(arbiter.Release{Caller: bob, ID: a.ID}, t0.Add(time.Second)); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob releasing alice's allocation: %v, want forbidden", err)
	}
	// Made without a token (through spalloc): a caller without one (the
	// spalloc port) or an admin may; a user's token may not.
	res, _ = e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "spalloc-user", GPUs: 1, KeepaliveS: ka(30)}}, t0)
	id := res.(arbiter.Allocation).ID
	for _, c := range []arbiter.Caller{{Role: arbiter.RoleUser}, ops} {
		if _, err := e.Apply(arbiter.Keepalive{Caller: c, ID: id}, t0.Add(time.Second)); err != nil {
			t.Fatalf("keepalive of a tokenless allocation by %+v: %v", c, err)
		}
	}
	for _, cmd := range []arbiter.Command{arbiter.Keepalive{Caller: bob, ID: id}, arbiter.Release{Caller: bob, ID: id},
		arbiter.ExtendAllocation{Caller: bob, ID: id, ByS: 60}} {
		if _, err := e.Apply(cmd, t0.Add(time.Second)); arbiter.ErrorCode(err) != arbiter.EForbidden {
			t.Fatalf("%T of a tokenless allocation by a user's token: %v, want forbidden", cmd, err)
		}
	}
}

// TestScheduleOwnedByItsPrincipal is finding 3: only the token that
// registered a schedule, or an admin, may overwrite or delete it.
func TestScheduleOwnedByItsPrincipal(t *testing.T) {
	e := newEngine(t, Config{})
	reg := func(c arbiter.Caller, name string) (any, error) {
		return e.Apply(arbiter.RegisterSchedule{Caller: c, Schedule: arbiter.Schedule{ID: "nightly", Name: name}}, t0)
	}
	res, err := reg(alice, "nightly eval")
	if err != nil || res.(arbiter.Schedule).Principal != "alice" {
		t.Fatalf("register: %+v %v", res, err)
	}
	if _, err := reg(bob, "hijacked"); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob overwriting alice's schedule: %v, want forbidden", err)
	}
	if _, err := e.Apply(arbiter.DeleteSchedule{Caller: bob, ID: "nightly"}, t0); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob deleting alice's schedule: %v, want forbidden", err)
	}
	if res, err := reg(alice, "nightly eval v2"); err != nil || res.(arbiter.Schedule).Name != "nightly eval v2" {
		t.Fatalf("alice updating: %+v %v", res, err)
	}
	// An admin may; the schedule stays alice's.
	if res, err := reg(ops, "fixed by ops"); err != nil || res.(arbiter.Schedule).Principal != "alice" {
		t.Fatalf("admin updating: %+v %v", res, err)
	}
	if _, err := e.Apply(arbiter.DeleteSchedule{Caller: ops, ID: "nightly"}, t0); err != nil {
		t.Fatalf("admin deleting: %v", err)
	}
}

// TestStoredTextFollowsTheRule is finding 4: every free text a command
// stores is held to the one text rule, and a refused command changes
// nothing.
func TestStoredTextFollowsTheRule(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 8))
	evil := "bob\x1b[2J\x1b[31mFAKE\nroot gpu0 ready"
	before := e.LastSeq()
	for name, cmd := range map[string]arbiter.Command{
		"owner":   arbiter.Allocate{Request: arbiter.Request{Owner: evil, GPUs: 1}},
		"label":   arbiter.Allocate{Caller: bob, Request: arbiter.Request{Owner: "bob", Label: "x\u202eevil", GPUs: 1}},
		"model":   arbiter.Allocate{Request: arbiter.Request{Owner: "a", GPUs: 1, Model: "H100\x1b]0;x\x07"}},
		"cuda":    arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "h", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, CUDA: strings.Repeat("9", 100<<10)}},
		"driver":  arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "h", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, Driver: "550\r\n"}},
		"gpu":     arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "h", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, GPUs: []arbiter.GPU{{Index: 0, Model: "H100\x1b[2J", VRAMGiB: 80}}}},
		"lock":    arbiter.AcquireLock{Name: "l", Holder: "ci\x1b[2J", TTL: time.Minute},
		"release": arbiter.Release{ID: 1, Reason: "done\x1b[2J"},
		"sched":   arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "s", Name: "n", Owner: "o\u2066"}},
	} {
		if _, err := e.Apply(cmd, t0); arbiter.ErrorCode(err) != arbiter.EInvalid {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	if c := e.Flush(); c.Durable() || e.LastSeq() != before {
		t.Fatalf("refused commands changed something: %+v", c)
	}
}

// TestHistoryZeroKeepsNone is finding 6: NoHistory (the configuration's
// allocations.history = 0) keeps no destroyed allocation; 0 in Config is
// the default, 1200.
func TestHistoryZeroKeepsNone(t *testing.T) {
	e := newEngine(t, Config{History: NoHistory}, host("a", 8))
	a := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	if _, err := e.Apply(arbiter.Release{ID: a.ID}, t0); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Allocation(a.ID); ok {
		t.Fatal("a destroyed allocation is kept with NoHistory")
	}
	c := e.Flush()
	if len(c.RemovedAllocations) != 1 || c.RemovedAllocations[0] != a.ID {
		t.Fatalf("store not told to remove it: %+v", c.RemovedAllocations)
	}
	got := Config{}
	got.defaults()
	if got.History != DefaultHistory {
		t.Fatalf("Config{}.History = %d, want %d", got.History, DefaultHistory)
	}
}

func sessionFor(id, principal string, ttl time.Duration) arbiter.StartSession {
	return arbiter.StartSession{Session: arbiter.Session{ID: strings.Repeat(id, 64/len(id)), Principal: principal, Role: arbiter.RoleUser,
		TokenFP: strings.Repeat("f", 64)}, TTL: ttl}
}

// TestSessions is finding 7 in the engine: sessions are records that end
// at their expiry, on log out, and when their token is removed or changed;
// they survive a restart.
func TestSessions(t *testing.T) {
	e := newEngine(t, Config{})
	for _, s := range []arbiter.StartSession{
		sessionFor("a", "alice", time.Hour),
		sessionFor("b", "alice", 2*time.Hour),
		sessionFor("c", "bob", 3*time.Hour),
	} {
		if _, err := e.Apply(s, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Apply(sessionFor("d", "alice", arbiter.SessionTTL+time.Hour), t0); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("a session past SessionTTL: %v", err)
	}
	c := e.Flush()
	if len(c.Records) != 3 || c.Records[0].Kind != arbiter.RecordSession || len(c.Events) != 0 {
		t.Fatalf("changes: %d records, %d events; want 3 session records and no event", len(c.Records), len(c.Events))
	}
	// A restart keeps them.
	e2 := New(Config{}, &arbiter.State{Records: c.Records}, t0)
	e2.Flush()
	if n := len(e2.Records()); n < 3 {
		t.Fatalf("after a restart: %d records", n)
	}
	// Expiry.
	e2.Apply(arbiter.Tick{}, t0.Add(time.Hour+time.Second))
	if c := e2.Flush(); len(c.RemovedRecords) != 1 || c.RemovedRecords[0].Key != strings.Repeat("a", 64) {
		t.Fatalf("expiry removed %+v", c.RemovedRecords)
	}
	// Log out.
	e2.Apply(arbiter.EndSession{ID: strings.Repeat("b", 64)}, t0.Add(2*time.Hour-time.Minute))
	if c := e2.Flush(); len(c.RemovedRecords) != 1 {
		t.Fatalf("log out removed %+v", c.RemovedRecords)
	}
	// bob's token changed (another fingerprint): his session ends.
	res, _ := e2.Apply(arbiter.EndSessions{Keep: map[string]string{"alice": strings.Repeat("f", 64), "bob": strings.Repeat("0", 64)}}, t0.Add(2*time.Hour))
	if res.(int) != 1 {
		t.Fatalf("EndSessions ended %v, want 1", res)
	}
}

// TestAuditKeepsTheNewest: audit entries get the engine's sequence and
// time, hostile text is escaped rather than refused, and only the newest
// AuditKeep stay.
func TestAuditKeepsTheNewest(t *testing.T) {
	e := newEngine(t, Config{AuditKeep: 3})
	for i := 0; i < 5; i++ {
		if _, err := e.Apply(arbiter.RecordAuditEntries{Entries: []arbiter.AuditEntry{{Kind: arbiter.AuditRefused,
			Principal: "x\x1b[2J", Address: "10.0.0.1", Action: "POST /api/v1/allocations"}}}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	recs := e.Records()
	var kept []arbiter.AuditEntry
	for _, r := range recs {
		if r.Kind == arbiter.RecordAudit {
			kept = append(kept, r.Value.(arbiter.AuditEntry))
		}
	}
	if len(kept) != 3 || kept[0].Seq != 3 || kept[2].Seq != 5 || !kept[2].Time.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("kept %+v, want seq 3..5", kept)
	}
	if kept[0].Principal != `x\x1b[2J` {
		t.Fatalf("principal %q, want it escaped", kept[0].Principal)
	}
	c := e.Flush()
	if len(c.RemovedRecords) != 2 {
		t.Fatalf("removed %+v, want the 2 oldest", c.RemovedRecords)
	}
}

func agentHost(name string, uuids ...string) arbiter.Machine {
	m := arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, Tags: []string{}}
	for i, u := range uuids {
		m.GPUs = append(m.GPUs, arbiter.GPU{Index: i, UUID: u, Model: "H100", VRAMGiB: 80, Healthy: true})
	}
	return m
}

// TestAgentLeaving is finding 8: an agent that says it leaves takes its
// machine down at once — nothing new is placed there — and its next
// heartbeat brings it back.
func TestAgentLeaving(t *testing.T) {
	e := newEngine(t, Config{}, host("cfg", 1))
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("a", "GPU-a0", "GPU-a1")}, t0); err != nil {
		t.Fatal(err)
	}
	res, err := e.Apply(arbiter.LeaveMachine{Name: "a"}, t0.Add(time.Second))
	if err != nil || !res.(arbiter.Machine).Down {
		t.Fatalf("leave: %+v %v", res, err)
	}
	q := alloc1(t, e, t0.Add(2*time.Second), arbiter.Request{GPUs: 2})
	if q.State != arbiter.StateQueued {
		t.Fatalf("a request for 2 GPUs after a left: %s on %v, want queued", q.State, q.Machine)
	}
	if _, err := e.Apply(arbiter.Heartbeat{Name: "a"}, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Allocation(q.ID); got.State != arbiter.StateReady {
		t.Fatalf("after a came back: %s, want ready", got.State)
	}
	if _, err := e.Apply(arbiter.LeaveMachine{Name: "cfg"}, t0); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("leave of a configured machine: %v", err)
	}
	if _, err := e.Apply(arbiter.LeaveMachine{Name: "nope"}, t0); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("leave of an unknown machine: %v", err)
	}
}

// TestOneHostTwoNamesRefused is finding 8: a second machine with a GPU
// UUID another machine has is the same host under another name: refused.
func TestOneHostTwoNamesRefused(t *testing.T) {
	e := newEngine(t, Config{})
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("node7", "GPU-x", "GPU-y")}, t0); err != nil {
		t.Fatal(err)
	}
	before := len(e.Machines())
	_, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("node7.lab.example", "GPU-y")}, t0)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(arbiter.ErrorMessage(err), `"node7"`) {
		t.Fatalf("the same GPU under another name: %v, want a conflict naming node7", err)
	}
	if len(e.Machines()) != before {
		t.Fatal("the refused machine was added")
	}
	// The same machine registering again is fine; two GPUs of one machine
	// with one UUID are not.
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("node7", "GPU-x", "GPU-y")}, t0); err != nil {
		t.Fatalf("re-register: %v", err)
	}
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("n8", "GPU-z", "GPU-z")}, t0); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("one UUID twice in a machine: %v", err)
	}
}

// TestDownMachineRegisteredChangedComesUp: a down agent machine that
// registers again with another description comes up with machine.up.
func TestDownMachineRegisteredChangedComesUp(t *testing.T) {
	e := newEngine(t, Config{HeartbeatTimeout: 60 * time.Second})
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("a", "GPU-a0")}, t0); err != nil {
		t.Fatal(err)
	}
	e.Flush()
	now := t0.Add(61 * time.Second)
	e.Apply(arbiter.Tick{}, now)
	ms := e.Machines()
	if !ms[0].Down {
		t.Fatalf("not down after timeout")
	}
	e.Flush()
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("a", "GPU-a0", "GPU-a1")}, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	c := e.Flush()
	kinds := []string{}
	for _, ev := range c.Events {
		kinds = append(kinds, ev.Kind)
	}
	up := false
	for _, k := range kinds {
		if k == arbiter.EventMachineUp {
			up = true
		}
	}
	if !up {
		t.Errorf("events after a down machine registered again (changed): %v, want machine.up among them", kinds)
	}
}

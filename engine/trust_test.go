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
// another's allocation alive; its own, an admin, and allocations made
// without a token may be.
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
	// Made without a token: anyone's.
	res, _ = e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "spalloc-user", GPUs: 1, KeepaliveS: ka(30)}}, t0)
	if _, err := e.Apply(arbiter.Keepalive{Caller: bob, ID: res.(arbiter.Allocation).ID}, t0.Add(time.Second)); err != nil {
		t.Fatalf("keepalive of a tokenless allocation: %v", err)
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

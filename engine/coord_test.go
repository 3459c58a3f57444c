package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

var (
	user  = arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}
	admin = arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}
	agent = arbiter.Caller{Name: "agents", Role: arbiter.RoleAgent}
)

func tok(i int) string { return fmt.Sprintf("%032x", i+1) }

func acquire(t *testing.T, e *Engine, now time.Time, name, holder string, ttl time.Duration, token, newToken string) (arbiter.LockGrant, error) {
	t.Helper()
	res, err := e.Apply(arbiter.AcquireLock{Caller: user, Name: name, Holder: holder, TTL: ttl, Token: token, NewToken: newToken}, now)
	if err != nil {
		return arbiter.LockGrant{}, err
	}
	return res.(arbiter.LockGrant), nil
}

func TestLockLifecycle(t *testing.T) {
	e := newEngine(t, Config{})
	st := newMemStore()
	g, err := acquire(t, e, t0, "swap", "sched-a", 60*time.Second, "", tok(1))
	if err != nil {
		t.Fatal(err)
	}
	if !g.Held || g.Token != tok(1) || g.Fence != 1 || g.Holder != "sched-a" || *g.SecondsRemaining != 60 {
		t.Fatalf("acquire: got %+v", g)
	}
	// The same holder name without the token is refused with the public state.
	_, err = acquire(t, e, t0.Add(time.Second), "swap", "sched-a", time.Minute, "", tok(2))
	var held *arbiter.LockHeldError
	if !errors.As(err, &held) || arbiter.ErrorCode(err) != arbiter.EConflict || held.Lock.Holder != "sched-a" || held.Lock.Fence != 1 {
		t.Fatalf("second acquire: got %v, want conflict with the public state", err)
	}
	// A wrong token too.
	if _, err := acquire(t, e, t0.Add(time.Second), "swap", "sched-a", time.Minute, tok(9), tok(2)); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("wrong token: got %v, want conflict", err)
	}
	// With the token: extended, same token and fence, new holder and note.
	res, err := e.Apply(arbiter.AcquireLock{Caller: user, Name: "swap", Holder: "sched-a2", TTL: 2 * time.Minute, Note: "nightly", Token: tok(1), NewToken: tok(3)}, t0.Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g = res.(arbiter.LockGrant)
	if g.Token != tok(1) || g.Fence != 1 || g.Holder != "sched-a2" || *g.Note != "nightly" || !g.ExpiresAt.Equal(t0.Add(130*time.Second)) {
		t.Fatalf("extend by acquire: got %+v", g)
	}
	// Native extend: wrong token forbidden, right token moves the expiry.
	if _, err := e.Apply(arbiter.ExtendLock{Name: "swap", Token: tok(5), TTL: time.Hour}, t0.Add(20*time.Second)); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("extend wrong token: got %v, want forbidden", err)
	}
	if res, err = e.Apply(arbiter.ExtendLock{Name: "swap", Token: tok(1), TTL: time.Hour}, t0.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if g := res.(arbiter.LockGrant); g.Token != "" || !g.ExpiresAt.Equal(t0.Add(20*time.Second+time.Hour)) {
		t.Fatalf("extend: got %+v, want no token and expiry in an hour", g)
	}
	// Release: a wrong token is refused, the right one frees it.
	if _, err := e.Apply(arbiter.ReleaseLock{Caller: user, Name: "swap", Token: tok(2)}, t0.Add(30*time.Second)); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("release wrong token: got %v, want forbidden", err)
	}
	res, err = e.Apply(arbiter.ReleaseLock{Caller: user, Name: "swap", Token: tok(1)}, t0.Add(30*time.Second))
	if err != nil || !res.(arbiter.LockRelease).Released {
		t.Fatalf("release: got %+v, %v", res, err)
	}
	// Releasing nothing reports it.
	res, err = e.Apply(arbiter.ReleaseLock{Caller: user, Name: "swap", Token: tok(1)}, t0.Add(31*time.Second))
	if err != nil || res.(arbiter.LockRelease).Released {
		t.Fatalf("release again: got %+v, %v, want released false", res, err)
	}
	// The next acquisition gets the next fence.
	g, err = acquire(t, e, t0.Add(40*time.Second), "swap", "dashboard", 0, "", tok(4))
	if err != nil || g.Fence != 2 || !g.ExpiresAt.Equal(t0.Add(40*time.Second+arbiter.LockTTLDefault)) {
		t.Fatalf("reacquire: got %+v, %v, want fence 2 with the default TTL", g, err)
	}
	st.take(t, e)
	want := []string{"lock.acquired", "lock.extended", "lock.extended", "lock.released", "lock.acquired"}
	if got := st.kinds(0); !reflect.DeepEqual(got, want) {
		t.Fatalf("events: got %v, want %v", got, want)
	}
	// No token ever leaves the engine: not in records, not in events.
	for ref, b := range st.records {
		for i := 0; i < 6; i++ {
			if strings.Contains(string(b), tok(i)) {
				t.Fatalf("record %v holds a token: %s", ref, b)
			}
		}
	}
	for _, ev := range st.events {
		for i := 0; i < 6; i++ {
			if strings.Contains(string(ev.Data), tok(i)) {
				t.Fatalf("event %s holds a token: %s", ev.Kind, ev.Data)
			}
		}
	}
}

func TestLockForceRelease(t *testing.T) {
	e := newEngine(t, Config{})
	if _, err := acquire(t, e, t0, "gpu-maint", "cron", time.Hour, "", tok(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(arbiter.ReleaseLock{Caller: user, Name: "gpu-maint", Force: true}, t0); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("force by a user: got %v, want forbidden", err)
	}
	res, err := e.Apply(arbiter.ReleaseLock{Caller: admin, Name: "gpu-maint", Force: true}, t0)
	if err != nil || !res.(arbiter.LockRelease).Released {
		t.Fatalf("force by an admin: %+v %v", res, err)
	}
	c := e.Flush()
	last := c.Events[len(c.Events)-1]
	var ev arbiter.LockEvent
	json.Unmarshal(last.Data, &ev)
	if last.Kind != arbiter.EventLockReleased || !ev.Forced || ev.By != "ops" || ev.Holder != "cron" {
		t.Fatalf("event: %s %s", last.Kind, last.Data)
	}
}

func TestLockTTLClamped(t *testing.T) {
	cases := []struct {
		ttl, want time.Duration
	}{
		{0, 15 * time.Minute},
		{-5 * time.Second, time.Second},
		{500 * time.Millisecond, time.Second},
		{time.Second, time.Second},
		{90 * time.Second, 90 * time.Second},
		{48 * time.Hour, 24 * time.Hour},
	}
	for i, c := range cases {
		e := newEngine(t, Config{})
		g, err := acquire(t, e, t0, "l", "h", c.ttl, "", tok(i))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.ExpiresAt.Sub(t0); got != c.want {
			t.Errorf("ttl %v: got %v, want %v", c.ttl, got, c.want)
		}
	}
}

func TestLockBadInputChangesNothing(t *testing.T) {
	cases := []struct {
		name string
		cmd  arbiter.Command
		code string
	}{
		{"blank holder", arbiter.AcquireLock{Name: "swap", Holder: "", NewToken: tok(1)}, arbiter.EInvalid},
		{"space holder", arbiter.AcquireLock{Name: "swap", Holder: "   ", NewToken: tok(1)}, arbiter.EInvalid},
		{"newline holder", arbiter.AcquireLock{Name: "swap", Holder: "a\nb", NewToken: tok(1)}, arbiter.EInvalid},
		{"long holder", arbiter.AcquireLock{Name: "swap", Holder: strings.Repeat("h", 200), NewToken: tok(1)}, arbiter.EInvalid},
		{"long note", arbiter.AcquireLock{Name: "swap", Holder: "h", Note: strings.Repeat("n", 2000), NewToken: tok(1)}, arbiter.EInvalid},
		{"bad name", arbiter.AcquireLock{Name: "../etc", Holder: "h", NewToken: tok(1)}, arbiter.EInvalid},
		{"empty name", arbiter.AcquireLock{Name: "", Holder: "h", NewToken: tok(1)}, arbiter.EInvalid},
		{"no token drawn", arbiter.AcquireLock{Name: "swap", Holder: "h"}, arbiter.EInvalid},
		{"huge token", arbiter.AcquireLock{Name: "swap", Holder: "h", Token: strings.Repeat("t", 300), NewToken: tok(1)}, arbiter.EInvalid},
		{"extend free lock", arbiter.ExtendLock{Name: "swap", Token: tok(1)}, arbiter.EConflict},
		{"release bad name", arbiter.ReleaseLock{Name: "a b"}, arbiter.EInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, Config{})
			_, err := e.Apply(c.cmd, t0)
			if got := arbiter.ErrorCode(err); got != c.code {
				t.Fatalf("got %v (%s), want %s", err, got, c.code)
			}
			if ch := e.Flush(); ch.Durable() {
				t.Fatalf("a refused command changed something: %+v", ch)
			}
		})
	}
}

func TestLockExpiryIsADeadline(t *testing.T) {
	e := newEngine(t, Config{})
	st := newMemStore()
	if _, err := acquire(t, e, t0, "swap", "sched", 10*time.Second, "", tok(1)); err != nil {
		t.Fatal(err)
	}
	if got := e.NextDeadline(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("next deadline %v, want the lock's expiry", got)
	}
	st.take(t, e)
	e.Apply(arbiter.Tick{}, t0.Add(10*time.Second-time.Nanosecond))
	if l, _ := e.locks.gate("swap", ""); l == nil {
		t.Fatal("lock gone before its expiry")
	}
	e.Apply(arbiter.Tick{}, t0.Add(10*time.Second))
	if l, _ := e.locks.gate("swap", ""); l != nil {
		t.Fatal("lock still held at its expiry")
	}
	c := st.take(t, e)
	if len(c.Events) != 1 || c.Events[0].Kind != arbiter.EventLockExpired || len(c.RemovedRecords) != 1 {
		t.Fatalf("expiry: events %v removed %v", st.kinds(1), c.RemovedRecords)
	}
	// Anyone may take it now, with the next fence.
	g, err := acquire(t, e, t0.Add(11*time.Second), "swap", "dashboard", time.Minute, "", tok(2))
	if err != nil || g.Fence != 2 {
		t.Fatalf("after expiry: %+v %v", g, err)
	}
}

func TestLockPersistsAcrossRestart(t *testing.T) {
	e := newEngine(t, Config{})
	st := newMemStore()
	acquire(t, e, t0, "a", "x", time.Hour, "", tok(1))
	acquire(t, e, t0, "b", "y", 5*time.Second, "", tok(2))
	acquire(t, e, t0, "c", "z", time.Hour, "", tok(3))
	e.Apply(arbiter.ReleaseLock{Name: "c", Token: tok(3)}, t0)
	st.take(t, e)

	// Restart a minute later: a is still held with its token, b expired
	// while the server was down, and fences continue after 3.
	e2 := New(Config{}, st.state(), t0.Add(time.Minute))
	c := st.take(t, e2)
	if len(c.Events) != 1 || c.Events[0].Kind != arbiter.EventLockExpired || c.Events[0].Subject != "lock/b" {
		t.Fatalf("load: events %v, want b expired", st.kinds(len(st.events)-len(c.Events)))
	}
	if _, err := acquire(t, e2, t0.Add(time.Minute), "a", "thief", time.Hour, "", tok(9)); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("a after restart: got %v, want still held", err)
	}
	if res, err := e2.Apply(arbiter.ReleaseLock{Name: "a", Token: tok(1)}, t0.Add(time.Minute)); err != nil || !res.(arbiter.LockRelease).Released {
		t.Fatalf("a's token after restart: %+v %v", res, err)
	}
	g, err := acquire(t, e2, t0.Add(time.Minute), "c", "w", time.Hour, "", tok(4))
	if err != nil || g.Fence != 4 {
		t.Fatalf("fence after restart: %+v %v, want 4", g, err)
	}
}

// TestLockProperty applies random lock commands at random times and checks,
// after each, that a lock has at most one holder, that fences only grow
// and are never reused, that a rebuilt engine (as after a restart) holds
// exactly the same records, and that tokens never reach records or events.
func TestLockProperty(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := newEngine(t, Config{})
		st := newMemStore()
		now := t0
		names := []string{"swap", "swap:vllm", "maint"}
		tokens := map[string]string{} // name → the token its holder knows
		seen := map[int64]bool{}
		var lastFence int64
		for i := 0; i < 400; i++ {
			now = now.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
			name := names[rng.IntN(len(names))]
			var cmd arbiter.Command
			switch rng.IntN(5) {
			case 0, 1:
				tk := ""
				if rng.IntN(2) == 0 {
					tk = tokens[name]
				}
				cmd = arbiter.AcquireLock{Caller: user, Name: name, Holder: "h", TTL: time.Duration(rng.IntN(8)) * time.Second, Token: tk, NewToken: tok(1000*int(seed) + i)}
			case 2:
				cmd = arbiter.ExtendLock{Name: name, Token: tokens[name], TTL: time.Duration(rng.IntN(8)) * time.Second}
			case 3:
				cmd = arbiter.ReleaseLock{Caller: admin, Name: name, Token: tokens[name], Force: rng.IntN(4) == 0}
			default:
				cmd = arbiter.Tick{}
			}
			res, err := e.Apply(cmd, now)
			if g, ok := res.(arbiter.LockGrant); ok && err == nil && g.Token != "" {
				if g.Fence > lastFence {
					if seen[g.Fence] {
						t.Fatalf("seed %d: fence %d reused", seed, g.Fence)
					}
					seen[g.Fence] = true
					lastFence = g.Fence
				} else if g.Token != tokens[name] {
					t.Fatalf("seed %d: a new token with an old fence %d", seed, g.Fence)
				}
				tokens[name] = g.Token
			}
			for n, h := range e.locks.held {
				if !h.l.ExpiresAt.After(now) {
					t.Fatalf("seed %d: lock %s held past its expiry", seed, n)
				}
			}
			st.take(t, e)
			if i%50 == 49 {
				e2 := New(Config{}, st.state(), now)
				if !reflect.DeepEqual(coordJSON(t, e.locks.records()), coordJSON(t, e2.locks.records())) {
					t.Fatalf("seed %d: rebuilt engine differs", seed)
				}
				e2.Flush()
			}
		}
		for _, ev := range st.events {
			for _, tk := range tokens {
				if tk != "" && strings.Contains(string(ev.Data), tk) {
					t.Fatalf("seed %d: event %s holds a token", seed, ev.Kind)
				}
			}
		}
	}
}

func coordJSON(t *testing.T, rs []arbiter.Record) string {
	t.Helper()
	b, err := json.Marshal(rs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Services and swaps.

func vllmService() arbiter.Service {
	return arbiter.Service{Name: "vllm", Machine: "gpu1", Kind: arbiter.ServiceVLLM, Endpoint: "http://127.0.0.1:8000",
		SwapCommand: []string{"/opt/vllm/launch.sh", "{model}", "{args}"}, LocalPathRoots: []string{"/models"},
		ReadyTimeoutS: 60, SwapTimeoutS: 600}
}

func catalog() []arbiter.CatalogEntry {
	return []arbiter.CatalogEntry{
		{Service: "vllm", Key: "gemma", Repo: "google/gemma-3-27b-it", Args: []string{"--max-model-len", "8192"}},
		{Service: "vllm", Key: "ten31", LocalPath: "/models/ten31-v2"},
	}
}

func swapEngine(t *testing.T) (*Engine, *memStore) {
	t.Helper()
	e := newEngine(t, Config{}, host("gpu1", 2))
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{vllmService()}, Catalog: catalog()}, t0); err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	st.take(t, e)
	return e, st
}

func requestSwap(e *Engine, now time.Time, c arbiter.RequestSwap) (arbiter.Swap, error) {
	res, err := e.Apply(c, now)
	if err != nil {
		return arbiter.Swap{}, err
	}
	return res.(arbiter.Swap), nil
}

func TestSwapLifecycle(t *testing.T) {
	e, st := swapEngine(t)
	from := len(st.events)
	// Dry run: complete at once with the command, nothing reaches the agent.
	d, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.State != arbiter.SwapComplete || !d.DryRun || *d.ReturnCode != 0 || !strings.Contains(d.Log[0], "/opt/vllm/launch.sh google/gemma-3-27b-it --max-model-len 8192") {
		t.Fatalf("dry run: %+v", d)
	}
	s, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "ten31"})
	if err != nil {
		t.Fatal(err)
	}
	if s.State != arbiter.SwapPending || s.Machine != "gpu1" || !reflect.DeepEqual(s.Command, []string{"/opt/vllm/launch.sh", "/models/ten31-v2"}) {
		t.Fatalf("swap: %+v", s)
	}
	if _, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, Service: "vllm", ModelKey: "gemma"}); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("second swap: got %v, want conflict", err)
	}
	// Another machine's agent gets nothing; this machine's gets the swap.
	if res, err := e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu2"}, t0); res != nil || err != nil {
		t.Fatalf("claim on gpu2: %v %v", res, err)
	}
	res, err := e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1"}, t0.Add(time.Second))
	if err != nil || res.(*arbiter.Swap).ID != s.ID || res.(*arbiter.Swap).State != arbiter.SwapRunning {
		t.Fatalf("claim: %+v %v", res, err)
	}
	st.take(t, e)
	if err := coordErr(e.Apply(arbiter.AppendSwapLog{ID: s.ID, Machine: "gpu1", Lines: []string{"loading", "ready"}}, t0.Add(2*time.Second))); err != nil {
		t.Fatal(err)
	}
	if err := coordErr(e.Apply(arbiter.AppendSwapLog{ID: s.ID, Machine: "gpu2", Lines: []string{"x"}}, t0)); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("log from another machine: %v", err)
	}
	c := st.take(t, e)
	// The log lines are durable in events; the record follows in memory.
	var lg arbiter.SwapLog
	last := c.Events[len(c.Events)-1]
	json.Unmarshal(last.Data, &lg)
	if last.Kind != arbiter.EventSwapLog || lg.Offset != 0 || !reflect.DeepEqual(lg.Lines, []string{"loading", "ready"}) {
		t.Fatalf("log event: %s %s", last.Kind, last.Data)
	}
	if len(c.TouchedRecords) != 1 || len(c.TouchedRecords[0].Value.(arbiter.Swap).Log) != 2 {
		t.Fatalf("touched: %+v", c.TouchedRecords)
	}
	rc := 0
	res, err = e.Apply(arbiter.FinishSwap{ID: s.ID, Machine: "gpu1", ReturnCode: &rc, OK: true}, t0.Add(3*time.Second))
	if err != nil || res.(arbiter.Swap).State != arbiter.SwapComplete {
		t.Fatalf("finish: %+v %v", res, err)
	}
	st.take(t, e)
	if svc := e.swaps.services["vllm"]; svc.Model != "ten31" || svc.Swap != "" {
		t.Fatalf("service after swap: %+v", svc)
	}
	want := []string{"swap.complete", "swap.pending", "swap.running", "swap.log", "swap.complete"}
	if got := st.kinds(from); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// The whole log is saved with the record at the end, and survives a restart.
	state := st.state()
	state.Machines = []arbiter.Machine{host("gpu1", 2)}
	e2 := New(Config{}, state, t0.Add(time.Hour))
	if got := e2.swaps.all[s.ID].s; got.State != arbiter.SwapComplete || len(got.Log) != 2 || e2.swaps.services["vllm"].Model != "ten31" {
		t.Fatalf("after restart: %+v", got)
	}
	if s3, err := requestSwap(e2, t0.Add(time.Hour), arbiter.RequestSwap{Caller: user, ModelKey: "gemma"}); err != nil || s3.ID != "3" {
		t.Fatalf("next swap after restart: %+v %v, want id 3", s3, err)
	}
}

func coordErr(_ any, err error) error { return err }

func TestSwapTimeoutAndOrphan(t *testing.T) {
	e, st := swapEngine(t)
	s, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	if err != nil {
		t.Fatal(err)
	}
	e.Apply(arbiter.Tick{}, t0.Add(600*time.Second))
	if got := e.swaps.all[s.ID].s; got.State != arbiter.SwapFailed || !strings.Contains(got.Reason, "no agent on machine gpu1 claimed it") {
		t.Fatalf("timeout: %+v", got)
	}
	// A running swap whose agent claims again (it restarted) fails.
	s2, _ := requestSwap(e, t0.Add(601*time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	e.Apply(arbiter.ClaimSwap{Machine: "gpu1"}, t0.Add(602*time.Second))
	res, _ := e.Apply(arbiter.ClaimSwap{Machine: "gpu1"}, t0.Add(603*time.Second))
	if res != nil {
		t.Fatalf("claim after restart: %v, want none", res)
	}
	if got := e.swaps.all[s2.ID].s; got.State != arbiter.SwapFailed || !strings.Contains(got.Reason, "restarted") {
		t.Fatalf("orphan: %+v", got)
	}
	if e.swaps.services["vllm"].Swap != "" || e.swaps.services["vllm"].Model != "" {
		t.Fatalf("service: %+v", e.swaps.services["vllm"])
	}
	st.take(t, e)
}

func TestSwapGate(t *testing.T) {
	e, _ := swapEngine(t)
	// The compatible API's lock "swap" guards the default service.
	g, err := acquire(t, e, t0, "swap", "sched", 10*time.Second, "", tok(1))
	if err != nil {
		t.Fatal(err)
	}
	_, err = requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	var held *arbiter.LockHeldError
	if !errors.As(err, &held) || arbiter.ErrorCode(err) != arbiter.ELocked || held.Lock.Holder != "sched" {
		t.Fatalf("manual swap: got %v, want locked with the lock's state", err)
	}
	if _, err := requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "gemma", Force: true}); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("force by a user: %v", err)
	}
	// A dry run is not guarded.
	if _, err := requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "gemma", DryRun: true}); err != nil {
		t.Fatalf("dry run under the lock: %v", err)
	}
	s, err := requestSwap(e, t0.Add(2*time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "gemma", LockToken: g.Token})
	if err != nil || s.Fence != g.Fence {
		t.Fatalf("swap with the token: %+v %v", s, err)
	}
	e.Apply(arbiter.FinishSwap{ID: s.ID, Reason: "x"}, t0.Add(3*time.Second)) // not running: conflict, ignored
	e.Apply(arbiter.ClaimSwap{Machine: "gpu1"}, t0.Add(3*time.Second))
	e.Apply(arbiter.FinishSwap{ID: s.ID, Machine: "gpu1", OK: true}, t0.Add(4*time.Second))
	// The gate reads the lock once at the command's time: at the expiry
	// instant the lock is gone, so the swap is allowed.
	if _, err := requestSwap(e, t0.Add(10*time.Second-time.Nanosecond), arbiter.RequestSwap{Caller: user, ModelKey: "ten31"}); arbiter.ErrorCode(err) != arbiter.ELocked {
		t.Fatalf("just before expiry: %v, want locked", err)
	}
	s2, err := requestSwap(e, t0.Add(10*time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "ten31"})
	if err != nil {
		t.Fatalf("at expiry: %v, want allowed", err)
	}
	// swap:vllm guards it natively too; an admin may force.
	e.Apply(arbiter.ClaimSwap{Machine: "gpu1"}, t0.Add(11*time.Second))
	if _, err := e.Apply(arbiter.FinishSwap{ID: s2.ID, Machine: "gpu1", OK: false, Reason: "boom"}, t0.Add(11*time.Second)); err != nil {
		t.Fatal(err)
	}
	acquire(t, e, t0.Add(12*time.Second), "swap:vllm", "ops-window", time.Hour, "", tok(2))
	if _, err := requestSwap(e, t0.Add(12*time.Second), arbiter.RequestSwap{Caller: user, Service: "vllm", ModelKey: "gemma"}); arbiter.ErrorCode(err) != arbiter.ELocked {
		t.Fatalf("under swap:vllm: %v", err)
	}
	f, err := requestSwap(e, t0.Add(12*time.Second), arbiter.RequestSwap{Caller: admin, Service: "vllm", ModelKey: "gemma", Force: true})
	if err != nil || !f.Forced {
		t.Fatalf("admin force: %+v %v", f, err)
	}
}

// TestSwapGateBeforeRunningSwap: while a scheduler holds the lock and its
// swap runs, a swap without the token is refused by the lock (423 with who
// holds it), not by the running swap; the holder itself gets the conflict.
func TestSwapGateBeforeRunningSwap(t *testing.T) {
	e, _ := swapEngine(t)
	g, err := acquire(t, e, t0, "swap", "sched", time.Hour, "", tok(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma", LockToken: g.Token}); err != nil {
		t.Fatal(err)
	}
	_, err = requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "ten31"})
	var held *arbiter.LockHeldError
	if !errors.As(err, &held) || arbiter.ErrorCode(err) != arbiter.ELocked || held.Lock.Holder != "sched" {
		t.Fatalf("swap without the token while the holder's swap runs: got %v, want locked with the lock's state", err)
	}
	if _, err := requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: user, ModelKey: "ten31", LockToken: g.Token}); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("second swap by the holder: got %v, want conflict", err)
	}
	if _, err := requestSwap(e, t0.Add(time.Second), arbiter.RequestSwap{Caller: admin, ModelKey: "ten31", Force: true}); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("forced swap while one runs: got %v, want conflict", err)
	}
}

func TestSwapBadInput(t *testing.T) {
	cases := []struct {
		name string
		cmd  arbiter.Command
		code string
	}{
		{"unknown model", arbiter.RequestSwap{ModelKey: "nope"}, arbiter.EInvalid},
		{"no model", arbiter.RequestSwap{}, arbiter.EInvalid},
		{"unknown service", arbiter.RequestSwap{Service: "tgi", ModelKey: "gemma"}, arbiter.ENotFound},
		{"bad service name", arbiter.RequestSwap{Service: "../x", ModelKey: "gemma"}, arbiter.EInvalid},
		{"both repo and path", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", Repo: "a/b", LocalPath: "/models/x"}}, arbiter.EInvalid},
		{"neither", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x"}}, arbiter.EInvalid},
		{"relative path", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", LocalPath: "models/x"}}, arbiter.EInvalid},
		{"dotdot path", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", LocalPath: "/models/../etc"}}, arbiter.EInvalid},
		{"outside roots", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", LocalPath: "/modelsX/y"}}, arbiter.EInvalid},
		{"bad repo", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", Repo: "--help"}}, arbiter.EInvalid},
		{"bad key", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "a/b", Repo: "a/b"}}, arbiter.EInvalid},
		{"control args", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "vllm", Key: "x", Repo: "a/b", Args: []string{"a\nb"}}}, arbiter.EInvalid},
		{"entry of unknown service", arbiter.PutCatalogEntry{Entry: arbiter.CatalogEntry{Service: "nope", Key: "x", Repo: "a/b"}}, arbiter.ENotFound},
		{"delete unknown entry", arbiter.DeleteCatalogEntry{Service: "vllm", Key: "nope"}, arbiter.ENotFound},
		{"claim bad machine", arbiter.ClaimSwap{Machine: "a b"}, arbiter.EInvalid},
		{"log unknown swap", arbiter.AppendSwapLog{ID: "99", Lines: []string{"x"}}, arbiter.ENotFound},
		{"log too many lines", arbiter.AppendSwapLog{ID: "1", Lines: make([]string, arbiter.MaxSwapLogBatch+1)}, arbiter.EInvalid},
		{"finish unknown swap", arbiter.FinishSwap{ID: "99"}, arbiter.ENotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, _ := swapEngine(t)
			_, err := e.Apply(c.cmd, t0)
			if got := arbiter.ErrorCode(err); got != c.code {
				t.Fatalf("got %v (%s), want %s", err, got, c.code)
			}
			if ch := e.Flush(); ch.Durable() {
				t.Fatalf("a refused command changed something: %+v", ch)
			}
		})
	}
}

func TestSwapMachineMustBeUp(t *testing.T) {
	e := newEngine(t, Config{})
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{vllmService()}, Catalog: catalog()}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := requestSwap(e, t0, arbiter.RequestSwap{ModelKey: "gemma"}); arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("got %v, want conflict: machine not registered", err)
	}
}

func TestSyncServices(t *testing.T) {
	e, st := swapEngine(t)
	// An admin's entry stays across a sync; a configured one removed goes;
	// the configuration resets what it names.
	e.Apply(arbiter.PutCatalogEntry{Caller: admin, Entry: arbiter.CatalogEntry{Service: "vllm", Key: "llama", Repo: "meta/llama"}}, t0)
	e.Apply(arbiter.PutCatalogEntry{Caller: admin, Entry: arbiter.CatalogEntry{Service: "vllm", Key: "gemma", Repo: "google/other"}}, t0)
	st.take(t, e)
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{vllmService()}, Catalog: catalog()[:1]}, t0); err != nil {
		t.Fatal(err)
	}
	st.take(t, e)
	keys := []string{}
	for k, ce := range e.swaps.catalog {
		keys = append(keys, k+"="+ce.Source+":"+ce.Model())
	}
	sort.Strings(keys)
	if want := []string{"vllm/gemma=config:google/gemma-3-27b-it", "vllm/llama=api:meta/llama"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("catalog %v, want %v", keys, want)
	}
	// The only service is the default even unmarked; a second default is refused.
	if !e.swaps.services["vllm"].Default {
		t.Fatal("the only service is not the default")
	}
	two := vllmService()
	two.Name, two.Default = "b", true
	one := vllmService()
	one.Default = true
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{one, two}}, t0); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("two defaults: %v", err)
	}
	// Removing the service removes its catalog.
	if _, err := e.Apply(arbiter.SyncServices{}, t0); err != nil {
		t.Fatal(err)
	}
	if len(e.swaps.services) != 0 || len(e.swaps.catalog) != 0 {
		t.Fatalf("after removal: %v %v", e.swaps.services, e.swaps.catalog)
	}
	// Syncing the same thing twice changes nothing the second time.
	e.Apply(arbiter.SyncServices{Services: []arbiter.Service{vllmService()}, Catalog: catalog()}, t0)
	e.Flush()
	e.Apply(arbiter.SyncServices{Services: []arbiter.Service{vllmService()}, Catalog: catalog()}, t0.Add(time.Hour))
	if c := e.Flush(); c.Durable() {
		t.Fatalf("idempotent sync changed %+v", c)
	}
}

func TestSwapLogBounded(t *testing.T) {
	e, _ := swapEngine(t)
	s, _ := requestSwap(e, t0, arbiter.RequestSwap{ModelKey: "gemma"})
	e.Apply(arbiter.ClaimSwap{Machine: "gpu1"}, t0)
	lines := make([]string, 1000)
	for i := range lines {
		lines[i] = fmt.Sprint(i)
	}
	for i := 0; i < 6; i++ {
		if err := coordErr(e.Apply(arbiter.AppendSwapLog{ID: s.ID, Machine: "gpu1", Lines: lines}, t0)); err != nil {
			t.Fatal(err)
		}
	}
	e.Apply(arbiter.AppendSwapLog{ID: s.ID, Machine: "gpu1", Lines: []string{strings.Repeat("é", 5000)}}, t0)
	got := e.swaps.all[s.ID].s
	if len(got.Log) != arbiter.MaxSwapLogLines || got.LogDropped != 1001 || len(got.Log[len(got.Log)-1]) > arbiter.MaxSwapLogLine+3 {
		t.Fatalf("log %d lines, %d dropped, last %d bytes", len(got.Log), got.LogDropped, len(got.Log[len(got.Log)-1]))
	}
}

// Webhook subscriptions.

func TestWebhookSubscriptions(t *testing.T) {
	e := newEngine(t, Config{})
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	res, err := e.Apply(arbiter.CreateWebhook{Caller: admin, Webhook: arbiter.Webhook{URL: "https://hooks.example.com/a", Secret: secret, Kinds: []string{"swap.*"}}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	w := res.(arbiter.Webhook)
	if w.ID != "wh1" || !w.Enabled || w.Format != arbiter.WebhookStandard || w.Secret != secret || !w.Wants("swap.complete") || w.Wants("lock.acquired") {
		t.Fatalf("create: %+v", w)
	}
	res, _ = e.Apply(arbiter.CreateWebhook{Caller: admin, Webhook: arbiter.Webhook{URL: "http://10.0.0.5/hook", Format: arbiter.WebhookSpark}}, t0)
	if s := res.(arbiter.Webhook); s.ID != "wh2" || !reflect.DeepEqual(s.Kinds, []string{"swap.complete", "swap.failed"}) {
		t.Fatalf("spark: %+v", s)
	}
	if _, err := e.Apply(arbiter.CreateWebhook{Webhook: arbiter.Webhook{ID: "wh1", URL: "https://x.example", Secret: secret, Kinds: []string{"*"}}}, t0); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("duplicate id: %v", err)
	}
	res, err = e.Apply(arbiter.SetWebhookEnabled{ID: "wh1", Enabled: false, Reason: "receiver answered 410 Gone"}, t0)
	if err != nil || res.(arbiter.Webhook).Enabled || res.(arbiter.Webhook).Secret != "" {
		t.Fatalf("disable: %+v %v", res, err)
	}
	if _, err := e.Apply(arbiter.DeleteWebhook{ID: "wh9"}, t0); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("delete unknown: %v", err)
	}
	c := e.Flush()
	for _, ev := range c.Events {
		if strings.Contains(string(ev.Data), secret) {
			t.Fatalf("event %s holds the secret", ev.Kind)
		}
	}
}

func TestWebhookBadInput(t *testing.T) {
	sec := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cases := []struct {
		name string
		w    arbiter.Webhook
	}{
		{"empty url", arbiter.Webhook{Secret: sec, Kinds: []string{"*"}}},
		{"ftp", arbiter.Webhook{URL: "ftp://example.com/x", Secret: sec, Kinds: []string{"*"}}},
		{"no host", arbiter.Webhook{URL: "http:///x", Secret: sec, Kinds: []string{"*"}}},
		{"credentials", arbiter.Webhook{URL: "https://u:p@example.com/", Secret: sec, Kinds: []string{"*"}}},
		{"metadata ip", arbiter.Webhook{URL: "http://169.254.169.254/latest/meta-data", Secret: sec, Kinds: []string{"*"}}},
		{"metadata name", arbiter.Webhook{URL: "http://metadata.google.internal/", Secret: sec, Kinds: []string{"*"}}},
		{"link-local v6", arbiter.Webhook{URL: "http://[fe80::1]/", Secret: sec, Kinds: []string{"*"}}},
		{"mapped v6", arbiter.Webhook{URL: "http://[::ffff:169.254.169.254]/", Secret: sec, Kinds: []string{"*"}}},
		{"decimal ip", arbiter.Webhook{URL: "http://2852039166/", Secret: sec, Kinds: []string{"*"}}},
		{"hex ip", arbiter.Webhook{URL: "http://0xa9fea9fe/", Secret: sec, Kinds: []string{"*"}}},
		{"unspecified", arbiter.Webhook{URL: "http://0.0.0.0:80/", Secret: sec, Kinds: []string{"*"}}},
		{"bad port", arbiter.Webhook{URL: "http://example.com:99999/", Secret: sec, Kinds: []string{"*"}}},
		{"bad secret", arbiter.Webhook{URL: "https://example.com/", Secret: "hunter2", Kinds: []string{"*"}}},
		{"short secret", arbiter.Webhook{URL: "https://example.com/", Secret: "whsec_YWJj", Kinds: []string{"*"}}},
		{"no kinds", arbiter.Webhook{URL: "https://example.com/", Secret: sec}},
		{"bad kind", arbiter.Webhook{URL: "https://example.com/", Secret: sec, Kinds: []string{"Swap Complete"}}},
		{"spark lock", arbiter.Webhook{URL: "https://example.com/", Format: arbiter.WebhookSpark, Kinds: []string{"lock.acquired"}}},
		{"bad format", arbiter.Webhook{URL: "https://example.com/", Format: "json", Kinds: []string{"*"}}},
		{"bad id", arbiter.Webhook{ID: "a/b", URL: "https://example.com/", Secret: sec, Kinds: []string{"*"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, Config{})
			_, err := e.Apply(arbiter.CreateWebhook{Caller: admin, Webhook: c.w}, t0)
			if arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Fatalf("got %v, want invalid", err)
			}
			if ch := e.Flush(); ch.Durable() {
				t.Fatalf("changed %+v", ch)
			}
		})
	}
	// The configuration may allow link-local targets.
	e := newEngine(t, Config{})
	if _, err := e.Apply(arbiter.CreateWebhook{Webhook: arbiter.Webhook{URL: "http://169.254.10.1/", Secret: sec, Kinds: []string{"*"}}, AllowLinkLocal: true}, t0); err != nil {
		t.Fatalf("allowed link-local: %v", err)
	}
}

// Schedules.

type everyHour struct{}

func (everyHour) Next(t time.Time) time.Time { return t.Truncate(time.Hour).Add(time.Hour) }

type never struct{}

func (never) Next(time.Time) time.Time { return time.Time{} }

func TestScheduleRegistry(t *testing.T) {
	e := newEngine(t, Config{})
	st := newMemStore()
	res, err := e.Apply(arbiter.RegisterSchedule{Schedule: arbiter.Schedule{Name: "Daily Vol", Owner: " bob ", Cron: "0 * * * *"}, GeneratedID: "a1b2c3d4", CronSpec: everyHour{}}, t0)
	if err != nil {
		t.Fatal(err)
	}
	s := res.(arbiter.Schedule)
	if s.ID != "a1b2c3d4" || s.Owner != "bob" || s.NextRun != "2026-01-02T04:00:00+00:00" || !s.RegisteredAt.Equal(t0) {
		t.Fatalf("register: %+v", s)
	}
	// Registering an existing id updates it and keeps registered_at; a
	// given next_run is kept as given.
	res, err = e.Apply(arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "a1b2c3d4", Name: "Daily Vol v2", NextRun: "2026-01-03T07:00:00-05:00"}}, t0.Add(time.Hour))
	if s := res.(arbiter.Schedule); err != nil || !s.RegisteredAt.Equal(t0) || !s.UpdatedAt.Equal(t0.Add(time.Hour)) || s.NextRun != "2026-01-03T07:00:00-05:00" || s.Cron != "" {
		t.Fatalf("update: %+v %v", res, err)
	}
	// A description may span lines, as schedulers of seed 000 sent them;
	// other control characters are refused.
	desc := "Builds the daily volume report.\r\nOwner: data team\n\tRuns on the default service."
	res, err = e.Apply(arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "report", Name: "Report", Description: desc}}, t0.Add(time.Hour))
	if err != nil || res.(arbiter.Schedule).Description != desc {
		t.Fatalf("multi-line description: %+v %v", res, err)
	}
	if _, err := e.Apply(arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "report", Name: "Report", Description: "a\x00b"}}, t0.Add(time.Hour)); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("NUL in description: %v, want invalid", err)
	}
	st.take(t, e)
	e2 := New(Config{}, st.state(), t0.Add(2*time.Hour))
	if got := e2.schedules.m["a1b2c3d4"]; got == nil || got.Name != "Daily Vol v2" {
		t.Fatalf("after restart: %+v", got)
	}
	if res, err := e2.Apply(arbiter.DeleteSchedule{ID: "a1b2c3d4"}, t0); err != nil || res.(arbiter.Schedule).Name != "Daily Vol v2" {
		t.Fatalf("delete: %v %v", res, err)
	}
	if _, err := e2.Apply(arbiter.DeleteSchedule{ID: "a1b2c3d4"}, t0); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("delete again: %v", err)
	}
}

func TestScheduleBadInput(t *testing.T) {
	cases := []struct {
		name string
		cmd  arbiter.Command
	}{
		{"no name", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{}, GeneratedID: "abcd"}},
		{"blank name", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{Name: "  "}, GeneratedID: "abcd"}},
		{"traversal id", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "../../etc", Name: "x"}}},
		{"65 chars", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: strings.Repeat("a", 65), Name: "x"}}},
		{"slash id", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{ID: "a/b", Name: "x"}}},
		{"unchecked cron", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{Name: "x", Cron: "* * * * *"}, GeneratedID: "abcd"}},
		{"never fires", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{Name: "x", Cron: "0 0 30 2 *"}, GeneratedID: "abcd", CronSpec: never{}}},
		{"long description", arbiter.RegisterSchedule{Schedule: arbiter.Schedule{Name: "x", Description: strings.Repeat("d", 3000)}, GeneratedID: "abcd"}},
		{"delete traversal", arbiter.DeleteSchedule{ID: "../x"}},
		{"delete 65", arbiter.DeleteSchedule{ID: strings.Repeat("b", 65)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, Config{})
			_, err := e.Apply(c.cmd, t0)
			if arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Fatalf("got %v, want invalid", err)
			}
			if ch := e.Flush(); ch.Durable() {
				t.Fatalf("changed %+v", ch)
			}
		})
	}
}

func BenchmarkLockAcquireRelease(b *testing.B) {
	e := New(Config{}, &arbiter.State{}, t0)
	names := make([]string, 64)
	for i := range names {
		names[i] = fmt.Sprintf("lock-%02d", i)
	}
	token := tok(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := names[i%len(names)]
		if _, err := e.Apply(arbiter.AcquireLock{Name: name, Holder: "bench", TTL: time.Minute, NewToken: token}, t0); err != nil {
			b.Fatal(err)
		}
		if _, err := e.Apply(arbiter.ReleaseLock{Name: name, Token: token}, t0); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			e.Flush()
		}
	}
}

// A service holds an allocation of the GPUs its server occupies, so people
// are not given them; it lets them go when it is removed, and an admin's
// release of it is noticed.
func TestServiceHoldsItsGPUs(t *testing.T) {
	e := newEngine(t, Config{}, host("gpu1", 4))
	svc := vllmService()
	svc.GPUs = 2
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0); err != nil {
		t.Fatal(err)
	}
	held := e.swaps.services["vllm"].Allocation
	a, ok := e.Allocation(held)
	if !ok || a.State != arbiter.StateReady || a.Owner != "service:vllm" || len(a.Devices) != 2 || a.KeepaliveS != nil {
		t.Fatalf("service allocation %+v, want 2 GPUs held by service:vllm without keepalive", a)
	}
	if _, err := e.Apply(arbiter.Release{Caller: arbiter.Caller{Name: "u", Role: arbiter.RoleUser}, ID: held}, t0); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("a user releasing a service's GPUs: %v, want forbidden", err)
	}
	q := alloc1(t, e, t0, arbiter.Request{GPUs: 3})
	if q.State != arbiter.StateQueued {
		t.Fatalf("3 of 4 GPUs with 2 held by the service: %s, want queued", q.State)
	}
	// A sync that changes nothing keeps the same allocation.
	e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	if got := e.swaps.services["vllm"].Allocation; got != held {
		t.Fatalf("allocation %d after a no-op sync, want %d", got, held)
	}
	// Removing the service frees its GPUs for the queued request.
	e.Apply(arbiter.SyncServices{}, t0)
	if got, _ := e.Allocation(q.ID); got.State != arbiter.StateReady {
		t.Fatalf("after the service went: %s, want ready", got.State)
	}
	// An admin's release is noticed, and the next sync holds them again.
	e2 := newEngine(t, Config{}, host("gpu1", 4))
	e2.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	id := e2.swaps.services["vllm"].Allocation
	e2.Apply(arbiter.Release{Caller: arbiter.Caller{Role: arbiter.RoleAdmin}, ID: id}, t0)
	if got := e2.swaps.services["vllm"].Allocation; got != 0 {
		t.Fatalf("after an admin release the service still names allocation %d", got)
	}
	e2.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	if got := e2.swaps.services["vllm"].Allocation; got == 0 || got == id {
		t.Fatalf("after a new sync: allocation %d, want a new one", got)
	}
}

// TestServiceHoldsItsGPUsOnceItCan: a service whose sync could not hold
// its GPUs — its machine's agent not registered yet, or the GPUs taken —
// holds them as soon as they can be, before queued requests get them.
func TestServiceHoldsItsGPUsOnceItCan(t *testing.T) {
	e := newEngine(t, Config{HeartbeatTimeout: time.Hour})
	svc := vllmService()
	svc.GPUs = 1
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0); err != nil {
		t.Fatal(err)
	}
	if c := e.Flush(); !slices.ContainsFunc(c.Events, func(ev arbiter.Event) bool { return ev.Kind == arbiter.EventServiceGPUsUnavailable }) {
		t.Fatalf("a service on an unknown machine: %d events, none gpus_unavailable", len(c.Events))
	}
	agent := host("gpu1", 2)
	agent.Source = arbiter.SourceAgent
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agent}, t0); err != nil {
		t.Fatal(err)
	}
	id := e.swaps.services["vllm"].Allocation
	if a, ok := e.Allocation(id); !ok || a.State != arbiter.StateReady || a.Owner != "service:vllm" {
		t.Fatalf("after its machine registered the service holds %+v, want its GPU", a)
	}

	// Its GPU taken by a user: one freed goes to the service, not to the
	// request queued meanwhile.
	e2 := newEngine(t, Config{}, host("gpu1", 2))
	u1 := alloc1(t, e2, t0, arbiter.Request{GPUs: 1})
	alloc1(t, e2, t0, arbiter.Request{GPUs: 1})
	e2.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	q := alloc1(t, e2, t0, arbiter.Request{GPUs: 1})
	if _, err := e2.Apply(arbiter.Release{ID: u1.ID}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e2.Allocation(q.ID); e2.swaps.services["vllm"].Allocation == 0 || got.State != arbiter.StateQueued {
		t.Fatalf("one GPU freed: the service holds %d, the queued request is %s; want the service's, the request still queued",
			e2.swaps.services["vllm"].Allocation, got.State)
	}

	// Its GPU lost with its machine's re-registration without it: held
	// again once the GPU is back (an admin's release is not: below).
	e3 := newEngine(t, Config{HeartbeatTimeout: time.Hour})
	full := agentHost("gpu1", "GPU-0", "GPU-1")
	e3.Apply(arbiter.RegisterMachine{Machine: full}, t0)
	two := svc
	two.GPUs = 2
	e3.Apply(arbiter.SyncServices{Services: []arbiter.Service{two}, Catalog: catalog()}, t0)
	e3.Apply(arbiter.RegisterMachine{Machine: agentHost("gpu1", "GPU-0")}, t0.Add(time.Minute))
	if e3.swaps.services["vllm"].Allocation != 0 {
		t.Fatal("the service still holds an allocation on a GPU that is gone")
	}
	e3.Apply(arbiter.RegisterMachine{Machine: full}, t0.Add(3*time.Minute))
	if e3.swaps.services["vllm"].Allocation == 0 {
		t.Fatal("the service holds nothing once its GPUs are back")
	}
}

// TestStartGivesServicesTheirGPUsFirst: at start, a service on a machine
// the configuration adds gets its GPUs before a request queued before the
// restart (Reconfigure applies the services first).
func TestStartGivesServicesTheirGPUsFirst(t *testing.T) {
	e := newEngine(t, Config{}, host("a", 1))
	alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	q := alloc1(t, e, t0, arbiter.Request{GPUs: 1})
	svc := vllmService()
	svc.GPUs = 1
	c := reconfig([]arbiter.Machine{host("a", 1), host("gpu1", 1)})
	c.Services = &arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}
	if _, err := e.Apply(c, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Allocation(q.ID); e.swaps.services["vllm"].Allocation == 0 || got.State != arbiter.StateQueued {
		t.Fatalf("the service holds %d on the new gpu1; the request queued before is %s on %s", e.swaps.services["vllm"].Allocation, got.State, arbiter.StrOr(got.Machine, "-"))
	}
	if ch := e.Flush(); slices.ContainsFunc(ch.Events, func(ev arbiter.Event) bool { return ev.Kind == arbiter.EventServiceGPUsUnavailable }) {
		t.Fatal("gpus_unavailable for a service whose machine came in the same configuration")
	}
}

// TestServiceGPUsAreAHoldNotARequest: a service's GPUs are the
// configuration's hold: no group takes them in, so fair share neither
// preempts them (a preempted service took them back, and the preemption
// went round for good) nor gives them a time limit.
func TestServiceGPUsAreAHoldNotARequest(t *testing.T) {
	p := twoGroups()
	p.GraceS, p.MinRuntimeS = 30, 0
	f := newFSEnv(t, p, host("gpu1", 2))
	svc := vllmService()
	svc.GPUs = 1
	f.must(f.e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, f.now))
	f.flush()
	held := f.e.swaps.services["vllm"].Allocation
	if sa := f.get(held); sa.Preemptible || sa.Group != "" || sa.EndsAt != nil {
		t.Fatalf("the service's allocation: preemptible %v, group %q, ends %v; want none of them", sa.Preemptible, sa.Group, sa.EndsAt)
	}
	hi := f.alloc("alice", arbiter.Request{GPUs: 2, Priority: 5})
	for range 3 {
		f.advance(31 * time.Second)
	}
	if got := f.e.swaps.services["vllm"].Allocation; got != held {
		t.Fatalf("the service holds %d, want still %d", got, held)
	}
	if got := f.get(hi.ID); got.State != arbiter.StateQueued {
		t.Fatalf("the request for both GPUs: %s, want queued behind the service's", got.State)
	}
}

// TestServiceShrinkKeepsItsGPU: a service cut from 2 GPUs to 1 holds its
// one before a request queued for the machine.
func TestServiceShrinkKeepsItsGPU(t *testing.T) {
	e := newEngine(t, Config{}, host("gpu1", 2))
	svc := vllmService()
	svc.GPUs = 2
	e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	q := alloc1(t, e, t0, arbiter.Request{GPUs: 2, Machine: "gpu1"})
	svc.GPUs = 1
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.Allocation(q.ID); e.swaps.services["vllm"].Allocation == 0 || got.State != arbiter.StateQueued {
		t.Fatalf("the service shrunk to 1 GPU holds %d; the queued 2-GPU request is %s", e.swaps.services["vllm"].Allocation, got.State)
	}
}

// serviceBehindBob stores an engine whose one GPU bob holds (with a time
// limit of limitS, nil for none), while a service waits for it and a
// request is queued for it after the service.
func serviceBehindBob(t *testing.T, limitS *float64) (st *memStore, bob arbiter.Allocation, svc arbiter.Service, q arbiter.Allocation) {
	t.Helper()
	st = newMemStore()
	e := New(Config{}, &arbiter.State{}, t0)
	if _, err := e.Apply(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{host("gpu1", 1)}}, t0); err != nil {
		t.Fatal(err)
	}
	bob = alloc1(t, e, t0, arbiter.Request{Owner: "bob", GPUs: 1, TimeLimitS: limitS})
	svc = vllmService()
	svc.GPUs = 1
	e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0)
	q = alloc1(t, e, t0, arbiter.Request{GPUs: 1, Machine: "gpu1"})
	st.take(t, e)
	return st, bob, svc, q
}

// TestWaitingServiceAcrossRestart: a service waiting for its GPUs still
// does after a restart, and gets GPUs freed at the start (a time limit
// that passed meanwhile) before a queued request.
func TestWaitingServiceAcrossRestart(t *testing.T) {
	st, _, svc, q := serviceBehindBob(t, f64p(60))
	later := t0.Add(2 * time.Minute)
	e2 := New(Config{}, st.state(), later)
	c := reconfig([]arbiter.Machine{host("gpu1", 1)})
	c.Services = &arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}
	if _, err := e2.Apply(c, later); err != nil {
		t.Fatal(err)
	}
	if got, _ := e2.Allocation(q.ID); e2.swaps.services["vllm"].Allocation == 0 || got.State != arbiter.StateQueued {
		t.Fatalf("after the restart the service holds %d; the request queued before is %s", e2.swaps.services["vllm"].Allocation, got.State)
	}
}

// TestWaitingServiceFirstAtLoad: GPUs free in the stored state (here an
// allocation the store lost) go to a waiting service before a queued
// request, at the load itself and not only from the first schedule after.
func TestWaitingServiceFirstAtLoad(t *testing.T) {
	st, bob, _, q := serviceBehindBob(t, nil)
	delete(st.allocs, bob.ID)
	e2 := New(Config{}, st.state(), t0)
	if got, _ := e2.Allocation(q.ID); e2.swaps.services["vllm"].Allocation == 0 || got.State != arbiter.StateQueued {
		t.Fatalf("after the load the service holds %d; the request queued before is %s", e2.swaps.services["vllm"].Allocation, got.State)
	}
}

// TestSwapClaimAgainAfterALostAnswer: the agent process that claimed a
// swap and claims again (the answer was lost) gets the same swap, still
// running; another process's claim fails it (that agent restarted).
func TestSwapClaimAgainAfterALostAnswer(t *testing.T) {
	e, _ := swapEngine(t)
	s, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	if err != nil {
		t.Fatal(err)
	}
	e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1", Instance: "a1"}, t0.Add(time.Second)) // answer lost
	res, err := e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1", Instance: "a1"}, t0.Add(2*time.Second))
	if sw, _ := res.(*arbiter.Swap); err != nil || sw == nil || sw.ID != s.ID || e.swaps.all[s.ID].s.State != arbiter.SwapRunning {
		t.Fatalf("the same process claims again: %v %v; swap %s is %s", res, err, s.ID, e.swaps.all[s.ID].s.State)
	}
	if res, err := e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1", Instance: "b2"}, t0.Add(3*time.Second)); err != nil || res != nil && res.(*arbiter.Swap) != nil {
		t.Fatalf("another process's claim: %v %v", res, err)
	}
	if got := e.swaps.all[s.ID].s; got.State != arbiter.SwapFailed || !strings.Contains(got.Reason, "restarted") {
		t.Fatalf("after another process's claim the swap is %s (%s)", got.State, got.Reason)
	}
}

// TestDryRunsKeepRealSwaps: dry runs have a history of their own, so a
// script that validates in a loop does not push real swaps out.
func TestDryRunsKeepRealSwaps(t *testing.T) {
	e, _ := swapEngine(t)
	s, _ := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1"}, t0)
	rc := 0
	if _, err := e.Apply(arbiter.FinishSwap{ID: s.ID, Machine: "gpu1", ReturnCode: &rc, OK: true}, t0); err != nil {
		t.Fatal(err)
	}
	var last arbiter.Swap
	for i := 0; i < swapHistory; i++ {
		var err error
		if last, err = requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "ten31", DryRun: true}); err != nil {
			t.Fatal(err)
		}
	}
	if e.swaps.all[s.ID] == nil || e.swaps.all[last.ID] == nil || len(e.swaps.dryDone) != swapDryHistory {
		t.Fatalf("after %d dry runs: the real swap kept %v, the last dry run kept %v, %d dry runs kept",
			swapHistory, e.swaps.all[s.ID] != nil, e.swaps.all[last.ID] != nil, len(e.swaps.dryDone))
	}
}

// TestSwapFailsWhenItsMachineGoesDown: a swap running on a machine whose
// agent stops answering fails when the machine is marked down, not at its
// timeout (up to a week later); a pending one waits for the agent.
func TestSwapFailsWhenItsMachineGoesDown(t *testing.T) {
	e := newEngine(t, Config{HeartbeatTimeout: 30 * time.Second})
	if _, err := e.Apply(arbiter.RegisterMachine{Machine: agentHost("gpu1", "GPU-0")}, t0); err != nil {
		t.Fatal(err)
	}
	svc := vllmService()
	svc.SwapTimeoutS = 7 * 86400
	if _, err := e.Apply(arbiter.SyncServices{Services: []arbiter.Service{svc}, Catalog: catalog()}, t0); err != nil {
		t.Fatal(err)
	}
	s, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	if err != nil {
		t.Fatal(err)
	}
	e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1"}, t0.Add(time.Second))
	e.Apply(arbiter.Tick{}, t0.Add(time.Minute))
	if !e.byName["gpu1"].m.Down {
		t.Fatal("setup: the machine should be down")
	}
	if got := e.swaps.all[s.ID].s; got.State != arbiter.SwapFailed || !strings.Contains(got.Reason, "went down") {
		t.Fatalf("a minute after its machine went down, swap %s is %s (%s)", s.ID, got.State, got.Reason)
	}
}

// TestSwapCancel: its requester or an admin cancels a pending or running
// swap, which fails saying who and why; another user may not, and an
// ended swap is not cancelled again.
func TestSwapCancel(t *testing.T) {
	e, _ := swapEngine(t)
	s, err := requestSwap(e, t0, arbiter.RequestSwap{Caller: user, ModelKey: "gemma"})
	if err != nil {
		t.Fatal(err)
	}
	other := arbiter.Caller{Name: "mallory", Role: arbiter.RoleUser}
	if _, err := e.Apply(arbiter.CancelSwap{Caller: other, ID: s.ID}, t0); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("another user's cancel: %v", err)
	}
	e.Apply(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1"}, t0)
	res, err := e.Apply(arbiter.CancelSwap{Caller: user, ID: s.ID, Reason: "wrong model"}, t0.Add(time.Second))
	if got, _ := res.(arbiter.Swap); err != nil || got.State != arbiter.SwapFailed || got.Reason != "cancelled by "+user.Name+": wrong model" {
		t.Fatalf("the requester's cancel of its running swap: %+v %v", res, err)
	}
	if svc := e.swaps.services["vllm"]; svc.Swap != "" {
		t.Fatalf("the service still names swap %s", svc.Swap)
	}
	if _, err := e.Apply(arbiter.CancelSwap{Caller: admin, ID: s.ID}, t0); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("cancelling an ended swap: %v", err)
	}
	if _, err := e.Apply(arbiter.AppendSwapLog{Caller: agent, ID: s.ID, Machine: "gpu1"}, t0); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("the agent's ping after the cancel: %v, want conflict (it stops the command)", err)
	}
}

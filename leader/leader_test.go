package leader

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeLease is the lease row in memory, on the database's clock now.
type fakeLease struct {
	now func() time.Time

	mu      sync.Mutex
	h       arbiter.LeaseHolder
	err     error // every call fails with it while set (the database is cut off)
	renewed int
}

func (l *fakeLease) AcquireLease(_ context.Context, id, url string, ttl time.Duration) (arbiter.LeaseHolder, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return arbiter.LeaseHolder{}, false, l.err
	}
	now := l.now()
	if l.h.Term != 0 && now.Before(l.h.ExpiresAt) {
		h := l.h
		h.Remaining = h.ExpiresAt.Sub(now)
		return h, false, nil
	}
	l.h = arbiter.LeaseHolder{Term: l.h.Term + 1, ID: id, URL: url, Acquired: now, ExpiresAt: now.Add(ttl), Remaining: ttl}
	return l.h, true, nil
}

func (l *fakeLease) RenewLease(_ context.Context, term int64, ttl time.Duration) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false, l.err
	}
	if l.h.Term != term {
		return false, nil
	}
	l.h.ExpiresAt = l.now().Add(ttl)
	l.renewed++
	return true, nil
}

func (l *fakeLease) ReleaseLease(_ context.Context, term int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h.Term == term {
		l.h.ExpiresAt = l.now()
	}
	return nil
}

func (l *fakeLease) LeaseHolder(context.Context) (arbiter.LeaseHolder, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h, nil
}

func (l *fakeLease) set(f func(h *arbiter.LeaseHolder)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.h)
}

func (l *fakeLease) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
}

// replica is an elector with a record of its terms.
type replica struct {
	*Elector
	mu      sync.Mutex
	led     []int64
	stepped []error
	trusted []bool // whether the term was still trusted during each StepDown
}

func newReplica(id string, l arbiter.Lease, now func() time.Time, single bool) *replica {
	r := &replica{}
	r.Elector = New(Config{ID: id, URL: "http://" + id, Lease: l, TTL: 10 * time.Second, Now: now, Single: single,
		Lead: func(_ context.Context, term int64) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.led = append(r.led, term)
			return nil
		},
		StepDown: func(term int64, why error) {
			trusted := r.Trusted(term) == nil
			r.mu.Lock()
			defer r.mu.Unlock()
			r.stepped = append(r.stepped, why)
			r.trusted = append(r.trusted, trusted)
		}})
	return r
}

func (r *replica) steps() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.stepped...)
}

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func mustStep(t *testing.T, r *replica) time.Duration {
	t.Helper()
	d, err := r.step(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFollowTakeLeadRenew: a follower takes a free lease and leads; renewal
// keeps it trusted past the first TTL; another replica follows, waits for
// the moment the lease runs out and knows the leader meanwhile.
func TestFollowTakeLeadRenew(t *testing.T) {
	c := clock.NewFake(t0)
	l := &fakeLease{now: c.Now}
	a, b := newReplica("a", l, c.Now, false), newReplica("b", l, c.Now, false)
	mustStep(t, a)
	if term, ok := a.Leading(); !ok || term != 1 || len(a.led) != 1 {
		t.Fatalf("a: leading %v term %d, led %v; want term 1", ok, term, a.led)
	}
	wait := mustStep(t, b)
	if _, ok := b.Leading(); ok {
		t.Fatal("b leads too")
	}
	if id, url, ok := b.Leader(); !ok || id != "a" || url != "http://a" {
		t.Fatalf("b knows the leader as %q %q %v", id, url, ok)
	}
	if wait > b.Renew() {
		t.Fatalf("b waits %s, more than a renewal period", wait)
	}
	for range 10 { // well past the first TTL, renewed every third of it
		c.Advance(a.Renew())
		mustStep(t, a)
		if err := a.Trusted(1); err != nil {
			t.Fatalf("after renewals: %v", err)
		}
		mustStep(t, b)
	}
	if _, ok := b.Leading(); ok || l.renewed < 9 {
		t.Fatalf("b leads %v, %d renewals", ok, l.renewed)
	}
	if got := b.Cluster(); got.Role != arbiter.ReplicaFollower || got.Leader != "http://a" || got.Term != 1 {
		t.Fatalf("b's view: %+v", got)
	}
	if got := a.Cluster(); got.Role != arbiter.ReplicaLeader || got.Term != 1 || got.LeaderID != "a" {
		t.Fatalf("a's view: %+v", got)
	}
}

// TestTrustWindow: a leader that cannot renew stops trusting its lease
// TTL minus the margin after its last good renewal started — before the
// lease can lapse — and steps down; only after the lease lapsed does the
// other replica take over, with a higher term.
func TestTrustWindow(t *testing.T) {
	c := clock.NewFake(t0)
	l := &fakeLease{now: c.Now}
	a, b := newReplica("a", l, c.Now, false), newReplica("b", l, c.Now, false)
	mustStep(t, a)
	l.fail(errors.New("connection refused")) // a is cut off
	ttl, margin := a.TTL(), a.Margin()
	c.Advance(ttl - margin - time.Millisecond)
	if err := a.Trusted(1); err != nil {
		t.Fatalf("inside the window: %v", err)
	}
	c.Advance(time.Millisecond)
	if err := a.Trusted(1); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("at the window's end: %v, want unavailable", err)
	}
	mustStep(t, a)
	if len(a.steps()) != 1 {
		t.Fatalf("a stepped down %d times", len(a.steps()))
	}
	l.fail(nil)
	// The lease itself runs the margin longer: b cannot have it yet.
	mustStep(t, b)
	if _, ok := b.Leading(); ok {
		t.Fatal("b took the lease before it lapsed")
	}
	c.Advance(margin)
	mustStep(t, b)
	if term, ok := b.Leading(); !ok || term != 2 {
		t.Fatalf("b after the lapse: term %d, leading %v", term, ok)
	}
	if err := a.Trusted(1); err == nil {
		t.Fatal("a trusts term 1 again")
	}
	if got := b.Stats().Failovers; got != 1 {
		t.Fatalf("b counted %d failovers", got)
	}
}

// TestTakenOver: a renewal that finds another term steps down at once,
// naming the new holder; so does a write that found it (Lost).
func TestTakenOver(t *testing.T) {
	c := clock.NewFake(t0)
	l := &fakeLease{now: c.Now}
	a := newReplica("a", l, c.Now, false)
	mustStep(t, a)
	l.set(func(h *arbiter.LeaseHolder) { h.Term, h.ID = 7, "usurper" })
	c.Advance(a.Renew())
	mustStep(t, a) // the renewal finds term 7
	mustStep(t, a) // and steps down
	if s := a.steps(); len(s) != 1 || !strings.Contains(s[0].Error(), "usurper") {
		t.Fatalf("stepped down for %v, want the usurper named", s)
	}
	// Lost: a write found another term.
	c.Advance(a.TTL())
	mustStep(t, a)
	term, ok := a.Leading()
	if !ok {
		t.Fatal("a did not lead again once the lease lapsed")
	}
	a.Lost(term, errors.New("the fence found term 99"))
	if err := a.Trusted(term); err == nil || !strings.Contains(err.Error(), "99") {
		t.Fatalf("Trusted after Lost: %v", err)
	}
	mustStep(t, a)
	if len(a.steps()) != 2 {
		t.Fatalf("a stepped down %d times, want 2", len(a.steps()))
	}
}

// TestNeverTwoLeaders is the safety property under random schedules: three
// replicas, a lease that is sometimes cut off from one of them and a clock
// that jumps, and at no moment do two replicas trust the lease at once —
// even when the one that was cut off has not stepped down yet.
func TestNeverTwoLeaders(t *testing.T) {
	var terms uint64 // how many terms were led in all: the schedules must change leaders
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		c := clock.NewFake(t0)
		db := &fakeLease{now: c.Now}
		var rs []*replica
		var cut []*cutLease
		for _, id := range []string{"a", "b", "c"} {
			cl := &cutLease{Lease: db}
			cut = append(cut, cl)
			rs = append(rs, newReplica(id, cl, c.Now, false))
		}
		for i := 0; i < 300; i++ {
			switch x := rng.IntN(10); {
			case x < 5:
				rs[rng.IntN(3)].step(context.Background())
			case x < 8:
				c.Advance(time.Duration(rng.Int64N(int64(5 * time.Second))))
			default:
				k := rng.IntN(3)
				cut[k].setCut(!cut[k].isCut())
			}
			trusted := 0
			for _, r := range rs {
				if _, ok := r.Leading(); ok {
					trusted++
				}
			}
			if trusted > 1 {
				t.Fatalf("seed %d, step %d: %d replicas trust the lease at once", seed, i, trusted)
			}
		}
		for _, r := range rs {
			terms += r.Stats().Terms
		}
	}
	if terms < 2000 {
		t.Fatalf("only %d terms led over 200 schedules: the test does not change leaders enough", terms)
	}
}

// cutLease is one replica's connection to the lease, which the test cuts.
type cutLease struct {
	arbiter.Lease
	mu  sync.Mutex
	cut bool
}

var errCut = errors.New("cut off")

func (c *cutLease) isCut() bool   { c.mu.Lock(); defer c.mu.Unlock(); return c.cut }
func (c *cutLease) setCut(v bool) { c.mu.Lock(); defer c.mu.Unlock(); c.cut = v }
func (c *cutLease) AcquireLease(ctx context.Context, id, url string, ttl time.Duration) (arbiter.LeaseHolder, bool, error) {
	if c.isCut() {
		return arbiter.LeaseHolder{}, false, errCut
	}
	return c.Lease.AcquireLease(ctx, id, url, ttl)
}
func (c *cutLease) RenewLease(ctx context.Context, term int64, ttl time.Duration) (bool, error) {
	if c.isCut() {
		return false, errCut
	}
	return c.Lease.RenewLease(ctx, term, ttl)
}

// TestSingle is one server per database: refused naming the holder when
// the lease is held; a lost lease ends Run with an error naming the new
// holder.
func TestSingle(t *testing.T) {
	l := &fakeLease{now: time.Now}
	l.set(func(h *arbiter.LeaseHolder) {
		*h = arbiter.LeaseHolder{Term: 3, ID: "server-a", URL: "http://a:7070", ExpiresAt: time.Now().Add(time.Hour)}
	})
	b := newReplica("server-b", l, time.Now, true)
	err := b.Run(context.Background())
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "server-a") || !strings.Contains(err.Error(), "http://a:7070") {
		t.Fatalf("Run while held: %v, want a conflict naming server-a", err)
	}
	l.set(func(h *arbiter.LeaseHolder) { h.ExpiresAt = time.Now() })
	c := New(Config{ID: "server-c", Lease: l, TTL: 600 * time.Millisecond, Single: true,
		Lead: func(context.Context, int64) error { return nil }, StepDown: func(int64, error) {}})
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	poll.Until(t, 10*time.Second, "server-c to lead", func() bool { _, ok := c.Leading(); return ok })
	l.set(func(h *arbiter.LeaseHolder) { h.Term, h.ID = h.Term+1, "the other server" })
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "the other server") {
			t.Fatalf("Run after the takeover: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run goes on after losing the lease")
	}
}

// TestRunHandsOver runs two electors for real on a short lease: stopping
// the leader gives the lease back, and the other leads at once — long
// before the lease would have run out. The term stays trusted while it is
// drained (its last batches commit).
func TestRunHandsOver(t *testing.T) {
	l := &fakeLease{now: time.Now}
	a, b := newReplica("a", l, time.Now, false), newReplica("b", l, time.Now, false)
	for _, r := range []*replica{a, b} {
		r.cfg.TTL, r.cfg.Renew, r.cfg.Margin = time.Minute, 200*time.Millisecond, 6*time.Second
	}
	actx, stopA := context.WithCancel(context.Background())
	bctx, stopB := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.Run(actx) }()
	poll.Until(t, 10*time.Second, "a to lead", func() bool { _, ok := a.Leading(); return ok })
	go func() { defer wg.Done(); b.Run(bctx) }()
	poll.Until(t, 10*time.Second, "b to see a lead", func() bool { id, _, _ := b.Leader(); return id == "a" })
	stopA()
	poll.Until(t, 10*time.Second, "b to lead after a stopped", func() bool { _, ok := b.Leading(); return ok })
	if len(a.steps()) != 1 {
		t.Fatalf("a stepped down %d times", len(a.steps()))
	}
	if a.mu.Lock(); !a.trusted[0] {
		t.Fatal("a's term was no longer trusted while it was drained")
	}
	a.mu.Unlock()
	stopB()
	wg.Wait()
}

// fakeRoster lists its members; a beat of a taken node id is a conflict.
type fakeRoster struct {
	mu    sync.Mutex
	rows  map[string]arbiter.Replica
	taken bool
}

func (r *fakeRoster) JoinReplicas(_ context.Context, m arbiter.Replica, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rows == nil {
		r.rows = map[string]arbiter.Replica{}
	}
	if old, ok := r.rows[m.ID]; ok && old.Instance != m.Instance {
		return arbiter.Errorf(arbiter.EConflict, "node_id %q is in use", m.ID)
	}
	r.rows[m.ID] = m
	return nil
}

func (r *fakeRoster) BeatReplica(_ context.Context, m arbiter.Replica, _ time.Duration) ([]arbiter.Replica, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.taken {
		return nil, arbiter.Errorf(arbiter.EConflict, "node_id %q was taken over", m.ID)
	}
	var out []arbiter.Replica
	for _, x := range r.rows {
		out = append(out, x)
	}
	return out, nil
}

func (r *fakeRoster) LeaveReplicas(_ context.Context, m arbiter.Replica) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.rows, m.ID)
	return nil
}

// TestRoster: replicas join, are listed with their roles, a second one
// with a node id in use is refused; a leader whose node id another
// process took steps down and Run ends with the conflict.
func TestRoster(t *testing.T) {
	c := clock.NewFake(t0)
	l := &fakeLease{now: c.Now}
	ro := &fakeRoster{}
	mk := func(id, inst string) *replica {
		r := newReplica(id, l, c.Now, false)
		r.cfg.Roster, r.cfg.Member = ro, arbiter.Replica{ID: id, Instance: inst, URL: "http://" + id}
		return r
	}
	a, b := mk("a", "1"), mk("b", "1")
	for _, r := range []*replica{a, b} {
		if err := r.Join(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := mk("a", "2").Join(context.Background()); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("a second a: %v", err)
	}
	mustStep(t, a)
	mustStep(t, b)
	got := b.Cluster()
	roles := map[string]string{}
	for _, r := range got.Replicas {
		roles[r.ID] = r.Role
	}
	if len(got.Replicas) != 2 || roles["a"] != arbiter.ReplicaLeader || roles["b"] != arbiter.ReplicaFollower {
		t.Fatalf("b lists %+v", got.Replicas)
	}
	ro.mu.Lock()
	ro.taken = true
	ro.mu.Unlock()
	c.Advance(a.Renew())
	mustStep(t, a) // renews, and the beat finds the node id taken
	if _, err := a.step(context.Background()); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("step after the node id was taken: %v", err)
	}
	if _, ok := a.Leading(); ok || len(a.steps()) != 1 {
		t.Fatalf("a leads on (%v), stepped down %d times", ok, len(a.steps()))
	}
}

// TestLeadLongerThanTheTrustWindow: loading the state (Config.Lead) may
// take longer than the trust window; the lease is renewed meanwhile, so
// the replica leads on once it is ready rather than stepping down and
// letting the next replica load it all again.
func TestLeadLongerThanTheTrustWindow(t *testing.T) {
	const ttl = 600 * time.Millisecond
	l := &fakeLease{now: time.Now}
	var mu sync.Mutex
	var leads, stepDowns int
	e := New(Config{ID: "a", URL: "http://a", Lease: l, TTL: ttl,
		Lead: func(ctx context.Context, term int64) error {
			mu.Lock()
			leads++
			mu.Unlock()
			select { // loading a large state
			case <-time.After(ttl + ttl/3):
			case <-ctx.Done():
			}
			return nil
		},
		StepDown: func(term int64, why error) {
			mu.Lock()
			stepDowns++
			mu.Unlock()
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	// Past Lead's end and a few renewals after it (without renewals during
	// Lead, every term ends with none, so this never holds).
	poll.Until(t, 10*time.Second, "three renewals", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.renewed >= 3
	})
	_, leading := e.Leading()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !leading || leads != 1 || stepDowns > 1 { // the one step-down at Run's end
		t.Fatalf("a replica whose Lead took %s (TTL %s): leading at the end %v, led %d terms, stepped down %d times (renewals: %d)",
			ttl+ttl/3, ttl, leading, leads, stepDowns, l.renewed)
	}
}

// A refusal of Trusted is arbiter.ErrNotApplied: whoever asked has done
// nothing, and a client may send the request to another replica.
func TestTrustedRefusalIsNotApplied(t *testing.T) {
	e := New(Config{ID: "a", Lease: &fakeLease{now: time.Now}, Lead: func(context.Context, int64) error { return nil },
		StepDown: func(int64, error) {}})
	err := e.Trusted(1)
	if err == nil || !errors.Is(err, arbiter.ErrNotApplied) || arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("Trusted of a term not led: %v", err)
	}
}

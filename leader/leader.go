// Package leader elects the one server replica that runs the control loop
// (docs/guides/high-availability.md, docs/architecture.md §2.4).
//
// An Elector campaigns for a lease (arbiter.Lease: one row in the
// database, with a term that grows every time a replica takes it), leads
// while it holds it and steps down when it could lose it:
//
//   - A follower reads the lease every Renew (at most a second apart), and
//     right when the database says the holder's lease runs out; it takes the lease when it is free
//     or has expired, which raises the term. Then it leads: Config.Lead
//     loads the state and starts everything only a leader runs.
//   - A leader renews every Renew. It trusts its lease until TTL minus a
//     margin after the start of its last renewal that succeeded, measured
//     on its own monotonic clock: the database moved the expiry to TTL
//     after it received that renewal, so the leader stops trusting itself
//     at least the margin before any other replica can take over (River's
//     "trust window"). Past it, or as soon as a renewal or a fenced write
//     finds another term (Lost), it steps down: Config.StepDown stops every
//     side effect, and the replica follows again.
//   - Trusted is the word every write and every answer of a leader asks
//     for: nil only while this replica leads that term inside its trust
//     window. Writes are fenced in the database too (postgres.Fence), so a
//     leader paused or cut off past its window commits nothing whatever
//     this process believes.
//
// With Config.Single (one server per database, no HA) the first attempt
// must win — Run returns a conflict naming the holder otherwise — and a
// lost lease ends Run with an error: the server stops.
//
// Time is Config.Now; the waits between attempts are real timers, and the
// decisions (step) read Now, so tests drive a fake clock through step.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Defaults of Config.
const (
	DefaultTTL = 10 * time.Second
	minTTL     = 300 * time.Millisecond
)

// Config is what an Elector needs. Lease, Lead and StepDown are required.
type Config struct {
	// ID is this replica's node id and URL where it is reached: both are
	// written in the lease, so followers know where to forward.
	ID, URL string
	Lease   arbiter.Lease
	// Roster, when set, keeps Member in the roster: Join adds it, every
	// renewal refreshes it and lists the replicas (Cluster), Run's end
	// removes it.
	Roster arbiter.Roster
	Member arbiter.Replica
	// TTL is how long the lease lasts unrenewed (default 10s, at least
	// 300ms); Renew the time between renewals, and between a follower's
	// looks at the lease (default TTL/3). Margin is how long before the
	// lease could lapse a leader stops trusting it (default TTL/10, at
	// least 100ms): it covers the drift of this host's clock against the
	// database's over one TTL, and the time between asking Trusted and
	// acting.
	TTL, Renew, Margin time.Duration
	// Single is one server per database (see the package comment).
	Single bool
	// Now is the clock (default time.Now): its monotonic reading measures
	// the trust window.
	Now func() time.Time
	// Lead starts leading term: it returns once the replica serves as the
	// leader (state loaded), or an error, and the term is given back.
	// While it runs, Trusted(term) is nil.
	Lead func(ctx context.Context, term int64) error
	// StepDown stops leading term, for why: every side effect has stopped
	// when it returns. Trusted(term) is already an error while it runs,
	// except at a hand-over (Run's end while the term is trusted): then it
	// stays nil until StepDown returns, so that the term's last batches
	// commit.
	StepDown func(term int64, why error)
	Logger   *slog.Logger
}

// Elector is one replica's leadership. Its methods are safe for concurrent
// use; Run runs once.
type Elector struct {
	cfg  Config
	log  *slog.Logger
	poke chan struct{} // Poke, Lost: look now

	mu sync.Mutex // guards what follows
	// term is the term this replica leads (0 while it follows);
	// trustUntil the end of its trust window; lost why it must step down
	// before its next renewal (set by Lost).
	term       int64
	trustUntil time.Time
	lost       error
	// lastRenew is when the last renewal that succeeded started.
	lastRenew time.Time
	holder    arbiter.LeaseHolder // as last read
	seenTerm  int64               // the highest term seen
	failovers int64
	replicas  []arbiter.Replica
	stats     arbiter.ReplicaStats
	// lastPoke is when Poke last woke the elector; lastBeat when a
	// follower last refreshed its roster row.
	lastPoke, lastBeat time.Time
	// fatal ends Run (fail).
	fatal error
}

// New returns an Elector for cfg (defaults filled in).
func New(cfg Config) *Elector {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	cfg.TTL = max(cfg.TTL, minTTL)
	if cfg.Renew <= 0 || cfg.Renew > cfg.TTL/2 {
		cfg.Renew = cfg.TTL / 3
	}
	if cfg.Margin <= 0 {
		cfg.Margin = max(cfg.TTL/10, 100*time.Millisecond)
	}
	cfg.Margin = min(cfg.Margin, cfg.TTL-cfg.Renew) // a renewal on time keeps the window open
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Member.ID == "" {
		cfg.Member.ID, cfg.Member.URL = cfg.ID, cfg.URL
	}
	return &Elector{cfg: cfg, log: cfg.Logger, poke: make(chan struct{}, 1)}
}

// TTL, Renew and Margin are the lease's timing, defaults filled in.
func (e *Elector) TTL() time.Duration    { return e.cfg.TTL }
func (e *Elector) Renew() time.Duration  { return e.cfg.Renew }
func (e *Elector) Margin() time.Duration { return e.cfg.Margin }

// Join adds this replica to the roster (nothing without one). Errors:
// conflict when a live replica has this node id (the server must not
// start), or the database's.
func (e *Elector) Join(ctx context.Context) error {
	if e.cfg.Roster == nil {
		return nil
	}
	return e.cfg.Roster.JoinReplicas(ctx, e.cfg.Member, e.cfg.TTL)
}

// Trusted returns nil while this replica leads term inside its trust
// window, and an unavailable error saying why not otherwise. It reads the
// clock, so a leader paused past its window is refused the moment it
// wakes, before anything else has run.
func (e *Elector) Trusted(term int64) error {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.trustedLocked(term, now)
}

// trustedLocked is Trusted with e.mu held. Its refusals are
// arbiter.ErrNotApplied: whoever asked has done nothing yet.
func (e *Elector) trustedLocked(term int64, now time.Time) error {
	switch {
	case e.term == 0 || e.term != term:
		return arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "this replica no longer leads (term %d is over): nothing was done; retry, the client finds the leader", term))
	case e.lost != nil:
		return arbiter.NotApplied(e.lost)
	case !now.Before(e.trustUntil):
		return arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "this replica could not renew its lease (term %d) within %s: it no longer trusts it, and another replica may lead now; nothing was done, retry",
			term, e.cfg.TTL-e.cfg.Margin))
	}
	return nil
}

// Leading returns the term this replica leads and true while it may act as
// the leader (Trusted).
func (e *Elector) Leading() (int64, bool) {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term, e.term != 0 && e.trustedLocked(e.term, now) == nil
}

// Lost tells the elector that a write found the lease under a term other
// than term: it steps down at once. Nothing when term is not the one led.
func (e *Elector) Lost(term int64, why error) {
	e.mu.Lock()
	if e.term == term && e.lost == nil {
		e.lost = why
	}
	e.mu.Unlock()
	e.wake()
}

// Poke makes the elector look at the lease now rather than at its next
// renewal: a follower that could not reach the leader calls it. Pokes
// closer than a tenth of the renewal period apart are one.
func (e *Elector) Poke() {
	now := e.cfg.Now()
	e.mu.Lock()
	if !e.lastPoke.IsZero() && now.Sub(e.lastPoke) < e.cfg.Renew/10 {
		e.mu.Unlock()
		return
	}
	e.lastPoke = now
	e.mu.Unlock()
	e.wake()
}

func (e *Elector) wake() {
	select {
	case e.poke <- struct{}{}:
	default:
	}
}

// Cluster is what this replica knows of the deployment.
func (e *Elector) Cluster() arbiter.Cluster {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	c := arbiter.Cluster{NodeID: e.cfg.ID, Role: arbiter.ReplicaFollower, Term: e.seenTerm, Failovers: e.failovers}
	if e.term != 0 && e.trustedLocked(e.term, now) == nil {
		c.Role, c.Term, c.LeaderID, c.Leader = arbiter.ReplicaLeader, e.term, e.cfg.ID, e.cfg.URL
	} else if e.holder.Term != 0 && e.holder.Remaining > 0 && e.holder.ID != e.cfg.ID {
		c.LeaderID, c.Leader = e.holder.ID, e.holder.URL
	}
	c.Replicas = make([]arbiter.Replica, len(e.replicas))
	for i, r := range e.replicas {
		r.Role = arbiter.ReplicaFollower
		if c.LeaderID != "" && r.ID == c.LeaderID {
			r.Role = arbiter.ReplicaLeader
		}
		c.Replicas[i] = r
	}
	return c
}

// Leader returns the leader's node id and URL as this replica knows them,
// and whether there is one: itself while it leads.
func (e *Elector) Leader() (id, url string, ok bool) {
	c := e.Cluster()
	return c.LeaderID, c.Leader, c.LeaderID != ""
}

// Stats returns the counters.
func (e *Elector) Stats() arbiter.ReplicaStats {
	now := e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Term, s.Failovers, s.Replicas = e.seenTerm, e.failovers, len(e.replicas)
	s.Leading = e.term != 0 && e.trustedLocked(e.term, now) == nil
	return s
}

// Run campaigns, leads and steps down until ctx ends; then it steps down,
// gives the lease back and leaves the roster, and returns nil. With
// Single it returns an error when the first attempt finds the lease held
// (a conflict naming the holder) or when the lease is lost; and any error
// of Lead.
func (e *Elector) Run(ctx context.Context) error {
	defer e.leave()
	if _, ok := e.Leading(); e.cfg.Single && !ok {
		if err := e.First(ctx); err != nil {
			return err
		}
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		wait, err := e.step(ctx)
		if err != nil {
			return err
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			e.resign()
			return nil
		case <-t.C:
		case <-e.poke:
		}
	}
}

// First is Single's one attempt: take the lease and lead (Config.Lead),
// or refuse naming the holder (a conflict). Run, started after it, keeps
// the lease renewed; Run makes the attempt itself when First was not
// called.
func (e *Elector) First(ctx context.Context) error {
	start := e.cfg.Now() // before the statement: the trust window starts no later than the lease
	h, won, err := e.cfg.Lease.AcquireLease(ctx, e.cfg.ID, e.cfg.URL, e.cfg.TTL)
	if err != nil {
		return err
	}
	if !won {
		return heldError(h)
	}
	return e.lead(ctx, h, start)
}

// heldError is Single's refusal: another server holds the database.
func heldError(h arbiter.LeaseHolder) error {
	who := "arbiter server " + arbiter.EscapeText(h.ID, false)
	if h.URL != "" {
		who += " (" + arbiter.EscapeText(h.URL, false) + ")"
	}
	return arbiter.Errorf(arbiter.EConflict, "the database is used by %s since %s: its lease runs until %s unless renewed; "+
		"stop it or point this server at another database (one server per database)",
		who, h.Acquired.Local().Format(time.DateTime), h.ExpiresAt.Local().Format(time.DateTime))
}

// step does what is due now and returns how long to wait before the next
// step. Its error ends Run (Single's lost lease, or a roster conflict).
func (e *Elector) step(ctx context.Context) (time.Duration, error) {
	now := e.cfg.Now()
	e.mu.Lock()
	term, lost, lastRenew, trustUntil, fatal := e.term, e.lost, e.lastRenew, e.trustUntil, e.fatal
	e.mu.Unlock()
	if fatal != nil {
		if term != 0 {
			e.stepDown(term, fatal, false)
		}
		return 0, fatal
	}
	if term == 0 {
		return e.follow(ctx, now)
	}
	switch {
	case lost != nil:
		return e.stepDown(term, lost, false)
	case !now.Before(trustUntil):
		return e.stepDown(term, e.Trusted(term), false)
	case now.Before(lastRenew.Add(e.cfg.Renew)):
		return min(lastRenew.Add(e.cfg.Renew).Sub(now), trustUntil.Sub(now)), nil
	}
	e.renew(ctx, term, now, trustUntil)
	return 0, nil // the next step decides: lead on, or step down
}

// renew renews term's lease, bounded by the trust window: a renewal still
// waiting when the window closes is abandoned, and the leader steps down.
func (e *Elector) renew(ctx context.Context, term int64, start, trustUntil time.Time) {
	rctx, cancel := context.WithTimeout(ctx, min(e.cfg.Renew, trustUntil.Sub(start)))
	ok, err := e.cfg.Lease.RenewLease(rctx, term, e.cfg.TTL)
	cancel()
	taken := e.cfg.Now().Sub(start)
	switch {
	case err != nil:
		e.mu.Lock()
		e.stats.RenewFailures++
		e.lastRenew = start // the next try waits a renewal period, not a busy loop
		e.mu.Unlock()
		e.log.Warn("could not renew the lease; still trusted until the window closes", "term", term, "err", err,
			"trusted_for", trustUntil.Sub(e.cfg.Now()).Round(time.Millisecond))
	case !ok:
		why := arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "the lease was taken over (term %d is over)", term))
		if h, err := e.cfg.Lease.LeaseHolder(ctx); err == nil {
			why = arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "the database's lease was taken over by %s (term %d after our %d)",
				arbiter.EscapeText(h.ID, false), h.Term, term))
		}
		e.mu.Lock()
		if e.term == term && e.lost == nil {
			e.lost = why
		}
		e.mu.Unlock()
	default:
		e.mu.Lock()
		e.lastRenew, e.trustUntil = start, start.Add(e.cfg.TTL-e.cfg.Margin)
		e.stats.Renewals++
		e.stats.RenewSeconds += taken.Seconds()
		e.stats.LastRenewTaken = taken
		for i, b := range arbiter.ReplicaRenewBounds {
			if taken.Seconds() <= b {
				e.stats.RenewBuckets[i]++
			}
		}
		e.mu.Unlock()
		e.fail(e.beat(ctx))
	}
}

// fail keeps an error that must end Run (another process took this
// replica's node id); step returns it.
func (e *Elector) fail(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fatal == nil {
		e.fatal = err
	}
}

// follow looks at the lease and takes it when it is free or expired; it
// returns the wait until the next look: the renewal period, or just past
// the moment the database says the holder's lease runs out.
func (e *Elector) follow(ctx context.Context, now time.Time) (time.Duration, error) {
	actx, cancel := context.WithTimeout(ctx, e.cfg.Renew)
	h, won, err := e.cfg.Lease.AcquireLease(actx, e.cfg.ID, e.cfg.URL, e.cfg.TTL)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("could not read the lease", "err", err)
		}
		return e.cfg.Renew, nil
	}
	if won {
		if err := e.lead(ctx, h, now); err != nil {
			return 0, err
		}
		return 0, nil
	}
	e.see(h)
	e.mu.Lock()
	due := !now.Before(e.lastBeat.Add(e.cfg.Renew))
	e.mu.Unlock()
	if due {
		if err := e.beat(ctx); err != nil {
			return 0, err
		}
		e.mu.Lock()
		e.lastBeat = now
		e.mu.Unlock()
	}
	// A lease given back (a leader stopping) is seen within maxLook; jitter
	// keeps followers from looking in step.
	look := min(e.cfg.Renew, maxLook)
	wait := look - time.Duration(rand.Int64N(int64(look/10)+1))
	if h.Remaining > 0 && h.Remaining < wait {
		wait = h.Remaining + time.Duration(rand.Int64N(int64(10*time.Millisecond)))
	}
	return wait, nil
}

// maxLook bounds the time between a follower's looks at the lease: one
// cheap read a second.
const maxLook = time.Second

// see records the lease as read, counting a new term as a failover.
func (e *Elector) see(h arbiter.LeaseHolder) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if h.Term > e.seenTerm {
		if e.seenTerm != 0 && h.ID != "" {
			e.failovers++
		}
		e.seenTerm = h.Term
	}
	e.holder = h
}

// lead starts leading h's term, won at start.
func (e *Elector) lead(ctx context.Context, h arbiter.LeaseHolder, start time.Time) error {
	e.see(h)
	e.mu.Lock()
	e.term, e.lost = h.Term, nil
	e.lastRenew, e.trustUntil = start, start.Add(e.cfg.TTL-e.cfg.Margin)
	e.stats.Terms++
	e.mu.Unlock()
	e.log.Info("leading", "term", h.Term) // the logger names the node
	if err := e.leadRenewing(ctx, h.Term); err != nil {
		e.log.Error("could not start leading; giving the term back", "term", h.Term, "err", err)
		e.mu.Lock()
		e.term = 0
		e.mu.Unlock()
		e.cfg.StepDown(h.Term, err)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.Renew)
		_ = e.cfg.Lease.ReleaseLease(rctx, h.Term)
		cancel()
		if e.cfg.Single || ctx.Err() != nil {
			return err
		}
		// Let another replica try first.
		select {
		case <-ctx.Done():
		case <-time.After(e.cfg.Renew):
		}
		return nil
	}
	e.fail(e.beat(ctx))
	return nil
}

// leadRenewing runs Config.Lead for term while renewing the lease on
// time: loading a large state may take longer than the trust window, and
// a leader that lost its lease meanwhile would step down as soon as it
// was ready, and the next replica load it all again.
func (e *Elector) leadRenewing(ctx context.Context, term int64) error {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(e.cfg.Renew)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := e.cfg.Now()
			e.mu.Lock()
			led, lost, lastRenew, trustUntil := e.term == term, e.lost, e.lastRenew, e.trustUntil
			e.mu.Unlock()
			if !led || lost != nil || !now.Before(trustUntil) {
				return // the step after Lead steps down
			}
			if due := lastRenew.Add(e.cfg.Renew); now.Before(due) {
				t.Reset(due.Sub(now))
				continue
			}
			e.renew(ctx, term, now, trustUntil)
			t.Reset(0)
		}
	}()
	err := e.cfg.Lead(ctx, term)
	close(stop)
	<-done
	return err
}

// stepDown stops leading term for why; with Single, Run ends with why. At
// a hand-over (a trusted leader stopping) the term stays trusted while
// Config.StepDown drains it, so that what it already took in commits
// (within the trust window, as ever) instead of being refused as no
// longer led; otherwise it is untrusted from the start.
func (e *Elector) stepDown(term int64, why error, handOver bool) (time.Duration, error) {
	if handOver {
		e.log.Info("stepping down to hand over", "term", term)
	} else {
		e.forget(term)
		e.log.Warn("stepping down", "term", term, "why", why)
	}
	e.cfg.StepDown(term, why)
	e.forget(term)
	if e.cfg.Single {
		return 0, fmt.Errorf("this server no longer holds the database and writes nothing more: %w; restart it", why)
	}
	return 0, nil
}

// forget ends term here: it is no longer led, nor trusted.
func (e *Elector) forget(term int64) {
	e.mu.Lock()
	if e.term == term {
		e.term, e.lost = 0, nil
		e.holder = arbiter.LeaseHolder{}
	}
	e.mu.Unlock()
}

// resign steps down (when leading) and gives the lease back, so a
// follower takes over at once instead of after the TTL.
func (e *Elector) resign() {
	e.mu.Lock()
	term := e.term
	trusted := term != 0 && e.trustedLocked(term, e.cfg.Now()) == nil
	e.mu.Unlock()
	if term == 0 {
		return
	}
	if !trusted {
		e.stepDown(term, errors.New("shutting down"), false)
		return
	}
	e.stepDown(term, errors.New("shutting down: handing over"), true)
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Renew)
	defer cancel()
	if err := e.cfg.Lease.ReleaseLease(ctx, term); err != nil {
		e.log.Warn("could not give the lease back; the next leader waits for it to expire", "err", err)
	}
}

// beat refreshes this replica's row in the roster and lists the replicas.
// Its error (conflict: another process took this node id) ends Run.
func (e *Elector) beat(ctx context.Context) error {
	if e.cfg.Roster == nil {
		return nil
	}
	bctx, cancel := context.WithTimeout(ctx, e.cfg.Renew)
	rs, err := e.cfg.Roster.BeatReplica(bctx, e.cfg.Member, e.cfg.TTL)
	cancel()
	if arbiter.ErrorCode(err) == arbiter.EConflict {
		return err
	}
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("could not refresh this replica in the roster", "err", err)
		}
		return nil
	}
	e.mu.Lock()
	e.replicas = rs
	e.mu.Unlock()
	return nil
}

// leave removes this replica from the roster.
func (e *Elector) leave() {
	if e.cfg.Roster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Renew)
	defer cancel()
	_ = e.cfg.Roster.LeaveReplicas(ctx, e.cfg.Member)
}

// Package control runs the engine: one caller at a time applies its command
// to the engine, the commands applied while a batch is being saved form the
// next batch (group commit), and each batch is saved in one store commit,
// then its events published and its callers answered. Reads are served from
// a view updated from each committed change set, so they never see unsaved
// state and never wait behind the store (docs/architecture.md §2.2).
package control

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/engine"
)

// Options configure a Loop.
type Options struct {
	Store  arbiter.Store
	Engine engine.Config
	// Now is the clock (default time.Now). Tests pass a fake one and call Wake
	// after moving it.
	Now func() time.Time
	// MaxBatch bounds how many commands one transaction carries (default
	// 512); callers wait while the batch being collected is full.
	MaxBatch int
	Logger   *slog.Logger
	// OnCommit, if set, is called after every store commit with the number of
	// commands in the batch and how long the save took.
	OnCommit func(batch int, d time.Duration)
}

// Loop is the running control plane. Its methods are safe for concurrent use.
//
// Who saves a batch: when nothing is being saved, the caller that applied
// the batch's command saves it itself and answers from its own goroutine —
// a lone client's request costs no hand-off between goroutines, which on a
// small machine costs as much as the work. While a batch is being saved,
// later callers apply their commands and wait; the batch they form is then
// saved by the committer goroutine, which keeps saving for as long as
// batches keep coming (one hand-off per batch, not per command). The
// committer goroutine also runs the engine's deadlines.
type Loop struct {
	opts  Options
	log   *slog.Logger
	kick  chan struct{} // wakes the committer goroutine
	wake  chan struct{} // Wake: act on deadlines now
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed once the last batch is answered
	close sync.Once

	mu      sync.Mutex // guards what follows
	room    sync.Cond  // on mu: the batch being collected was taken
	eng     *engine.Engine
	pending *job      // applied, not yet taken for saving
	handoff *job      // taken by a caller for the committer goroutine to save
	saver   saver     // who saves now
	linger  bool      // the committer waits for company for a small batch
	usual   float64   // moving average of batch sizes
	armed   time.Time // when the committer's deadline timer fires; zero: not armed
	closed  bool

	view *view
	hub  *hub
}

// saver says who saves the next batch.
type saver int

const (
	nobody    saver = iota // the next caller saves its own batch
	aCaller                // a caller is saving the batch it took
	committer              // the committer goroutine saves until no batch is left
)

type call struct {
	cmd  arbiter.Command
	res  any
	err  error
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// ErrClosed is returned by Do once the loop is closed.
var ErrClosed = arbiter.Errorf(arbiter.EUnavailable, "the server is shutting down; retry against another replica or after restart")

// Open loads the state from the store, saves whatever repairs the engine made
// on loading (see engine.New), and starts the loop.
func Open(ctx context.Context, opts Options) (*Loop, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Loop{
		opts:  opts,
		log:   opts.Logger,
		kick:  make(chan struct{}, 1),
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		hub:   newHub(opts.Store),
		usual: 1,
	}
	l.room.L = &l.mu
	if err := l.load(ctx); err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// load (re)builds the engine and the view from the store.
func (l *Loop) load(ctx context.Context) error {
	st, err := l.opts.Store.Load(ctx)
	if err != nil {
		return fmt.Errorf("control: load state: %w", err)
	}
	decodeTasks(st.Records) // decode.go
	eng := engine.New(l.opts.Engine, st, l.opts.Now())
	if c := eng.Flush(); c.Durable() {
		if err := l.opts.Store.Save(ctx, c); err != nil {
			return fmt.Errorf("control: save repairs after load: %w", err)
		}
	}
	l.eng = eng
	if l.view == nil {
		l.view = newView()
	}
	l.view.reset(eng.Machines(), eng.Allocations(), eng.Records())
	l.hub.setLast(eng.LastSeq())
	return nil
}

// Do sends cmd to the engine and returns its result once the change it made
// is durable. Application errors are *arbiter.Error; a failed save returns an
// unavailable error and nothing of the batch is kept. A caller whose ctx
// ends first gets ctx's error; its command may still take effect.
func (l *Loop) Do(ctx context.Context, cmd arbiter.Command) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := callPool.Get().(*call)
	c.cmd = cmd
	l.mu.Lock()
	if !l.add(c) {
		l.mu.Unlock()
		c.cmd = nil
		callPool.Put(c)
		return nil, ErrClosed
	}
	j := l.lead()
	l.mu.Unlock()
	if j != nil {
		l.commit(j)
		l.pass()
	}
	select {
	case <-c.done:
		res, err := c.res, c.err
		c.cmd, c.res, c.err = nil, nil, nil
		callPool.Put(c)
		return res, err
	case <-ctx.Done():
		// The batch still answers c later; it is not reused.
		return nil, ctx.Err()
	case <-l.done:
		return nil, ErrClosed
	}
}

// Now is the loop's clock.
func (l *Loop) Now() time.Time { return l.opts.Now() }

// Post applies cmd without waiting for its result or for a commit: for a
// command whose answer nobody reads and whose change is memory-only, such
// as a keepalive refresh. It blocks only while the batch being collected is
// full, and does nothing once the loop is closed.
func (l *Loop) Post(cmd arbiter.Command) {
	c := &call{cmd: cmd, done: make(chan struct{}, 1)}
	l.mu.Lock()
	if !l.add(c) {
		l.mu.Unlock()
		return
	}
	if l.saver != nobody {
		l.mu.Unlock()
		return // saved with the batch being collected
	}
	// Nothing is being saved: a change that needs no save is published
	// here at once; one that does goes to the committer, so the poster
	// never waits for the disk.
	l.saver = aCaller
	j := l.take()
	if j.changes.Durable() || j.broken {
		l.handoff, l.saver = j, committer
		l.poke()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.commit(j)
	l.pass()
}

// Wake makes the loop act on deadlines now, as if its timer had fired. Tests
// with a fake clock call it after moving the clock.
func (l *Loop) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Close stops the loop once the commands already applied are saved and
// answered; later calls to Do return ErrClosed. It does not close the
// store. It is safe to call twice.
func (l *Loop) Close() error {
	l.close.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.room.Broadcast()
		l.mu.Unlock()
		close(l.stop)
	})
	<-l.done
	l.hub.closeAll()
	return nil
}

// job is one applied batch on its way to the store.
type job struct {
	calls   []*call
	changes *arbiter.Changes
	broken  bool // the engine panicked: the batch must not be saved
}

// add applies c to the engine and adds it to the batch being collected,
// first waiting while that batch is full. It returns false, having done
// nothing, once the loop is closed. l.mu is held.
func (l *Loop) add(c *call) bool {
	for !l.closed && l.pending != nil && len(l.pending.calls) >= l.opts.MaxBatch {
		l.room.Wait()
	}
	if l.closed {
		return false
	}
	l.applyLocked(c)
	// A deadline earlier than the committer's timer: it sets the timer again.
	if at := l.eng.NextDeadline(); !at.IsZero() && (l.armed.IsZero() || at.Before(l.armed)) {
		l.armed = at
		l.poke()
	}
	return true
}

func (l *Loop) applyLocked(c *call) {
	if l.pending == nil {
		l.pending = &job{calls: make([]*call, 0, 16)}
	}
	l.pending.calls = append(l.pending.calls, c)
	var panicked bool
	c.res, c.err, panicked = l.apply(c.cmd, l.opts.Now())
	l.pending.broken = l.pending.broken || panicked
}

// lead decides who saves the batch a caller just added to: nil when
// somebody else will (the caller waits), else the batch, which the caller
// saves itself. l.mu is held.
func (l *Loop) lead() *job {
	small := float64(len(l.pending.calls)) < l.usual/2
	switch {
	case l.saver == committer:
		if l.linger && !small {
			l.linger = false // company came: no need to wait longer
			l.poke()
		}
		return nil
	case l.saver == aCaller:
		return nil
	case small:
		// Group commit's trade: a batch much smaller than usual waits a
		// moment (in the committer) for the callers answered by the last
		// commit to come back, so the disk's sync is shared; a lone
		// caller never waits.
		l.saver, l.linger = committer, true
		l.poke()
		return nil
	}
	l.saver = aCaller
	return l.take()
}

// take takes the batch being collected for saving. l.mu is held.
func (l *Loop) take() *job {
	j := l.pending
	// A deadline already due — a grid board freed at once, a power-on
	// without delay — is acted on in this batch rather than the next: one
	// commit instead of two, and the next caller does not wait behind the
	// second.
	if at := l.eng.NextDeadline(); !at.IsZero() {
		if now := l.opts.Now(); !at.After(now) {
			l.applyLocked(newTick())
		}
	}
	l.usual += (float64(len(j.calls)) - l.usual) / 8
	j.changes = l.eng.Flush()
	l.pending = nil
	l.room.Broadcast()
	return j
}

// pass ends a caller's save: the batch collected meanwhile, if any, goes to
// the committer goroutine.
func (l *Loop) pass() {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.pending != nil:
		l.saver, l.linger = committer, false
		l.poke()
	default:
		l.saver = nobody
		if l.closed {
			l.poke() // Close's last look
		}
	}
}

func (l *Loop) poke() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// run is the committer goroutine: it saves the batches collected while
// another was being saved, waits a moment for company for a small one, and
// applies the engine's deadlines when they are due.
func (l *Loop) run() {
	defer close(l.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	lingerTimer := time.NewTimer(time.Hour)
	lingerTimer.Stop()
	var lingerC <-chan time.Time // set while a small batch waits for company
	stop := l.stop               // nil once closing: Close waits for what was applied
	for {
		l.mu.Lock()
		j := l.next(stop == nil, lingerTimer, &lingerC)
		if j == nil && stop == nil && l.saver != aCaller {
			l.mu.Unlock()
			return // closed, and every applied command answered
		}
		d := time.Hour
		if at := l.eng.NextDeadline(); !at.IsZero() {
			l.armed = at
			d = max(at.Sub(l.opts.Now()), 0)
		} else {
			l.armed = time.Time{}
		}
		l.mu.Unlock()
		if j != nil {
			l.commit(j)
			continue
		}
		timer.Reset(d)
		select {
		case <-l.kick:
		case <-stop:
			stop = nil
		case <-lingerC:
			lingerC = nil
			l.mu.Lock()
			l.linger = false
			l.mu.Unlock()
		case <-timer.C:
			l.tick()
		case <-l.wake:
			l.tick()
		}
	}
}

// next returns the batch the committer goroutine saves now, if any: one a
// caller handed over, or the one collected, unless it lingers for company
// (linger is then armed) — not once closing, when whatever was applied is
// saved at once. l.mu is held.
func (l *Loop) next(closing bool, lingerTimer *time.Timer, lingerC *<-chan time.Time) *job {
	var j *job
	switch {
	case l.handoff != nil:
		j, l.handoff = l.handoff, nil
	case l.saver == aCaller:
		return nil // the caller hands over what is left when done
	case l.pending == nil:
		l.saver, l.linger = nobody, false
	case l.linger && !closing:
		if *lingerC == nil {
			lingerTimer.Reset(maxLinger)
			*lingerC = lingerTimer.C
		}
	default:
		l.saver = committer
		j = l.take()
	}
	if j != nil && *lingerC != nil {
		lingerTimer.Stop()
		*lingerC = nil
	}
	return j
}

// tick applies the engine's due deadlines as a command of their own, saved
// by the committer (or with the batch a caller is saving).
func (l *Loop) tick() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applyLocked(newTick())
	if l.saver == nobody {
		l.saver, l.linger = committer, false
	}
}

// maxLinger bounds how long a small batch waits for company: a fraction of
// a commit, so latency stays within one commit of the unbatched one.
const maxLinger = 200 * time.Microsecond

func newTick() *call {
	return &call{cmd: arbiter.Tick{}, done: make(chan struct{}, 1)}
}

// commit saves a batch, then updates the view, publishes the events and
// answers the callers, in that order. A batch that could not be saved
// fails with it whatever was applied on top of it and reloads the state
// from the store before its own callers are told, so a caller who retries
// at once meets the reloaded state, not the lost batch.
func (l *Loop) commit(j *job) {
	var fail error
	switch {
	case j.broken:
		fail = arbiter.Errorf(arbiter.EInternal, "internal error")
	case j.changes.Durable():
		start := time.Now()
		if err := l.opts.Store.Save(context.Background(), j.changes); err != nil {
			l.log.Error("batch not saved; reloading state from the store", "commands", len(j.calls), "err", err)
			fail = arbiter.Errorf(arbiter.EUnavailable, "the change could not be saved (%v); nothing was changed, retry", err)
		} else if l.opts.OnCommit != nil {
			l.opts.OnCommit(len(j.calls), time.Since(start))
		}
	}
	if fail != nil {
		l.mu.Lock()
		if l.pending != nil {
			l.eng.Flush()
			answer(l.pending.calls, fail)
			l.pending = nil
			l.room.Broadcast()
		}
		l.reload()
		l.mu.Unlock()
		answer(j.calls, fail)
		return
	}
	l.view.apply(j.changes)
	// Publish before answering, so that a caller who reads LastSeq or
	// subscribes after its answer sees its own events.
	if len(j.changes.Events) > 0 {
		l.hub.publish(j.changes.Events)
	}
	for _, c := range j.calls {
		c.done <- struct{}{}
	}
}

func answer(calls []*call, err error) {
	for _, c := range calls {
		c.res, c.err = nil, err
		c.done <- struct{}{}
	}
}

// apply runs one command, turning an engine panic into an internal error so
// the batch is thrown away and state reloaded rather than the server dying.
func (l *Loop) apply(cmd arbiter.Command, now time.Time) (res any, err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			l.log.Error("engine panic", "command", fmt.Sprintf("%T", cmd), "panic", r)
			res, err, panicked = nil, fmt.Errorf("engine panic: %v", r), true
		}
	}()
	res, err = l.eng.Apply(cmd, now)
	return res, err, false
}

// reload rebuilds state from the store after a failed save, retrying with
// backoff until it succeeds or the loop is closed; l.mu is held, so
// commands wait meanwhile.
func (l *Loop) reload() {
	defer l.poke() // the committer sets its timer from the reloaded deadlines
	backoff := 50 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := l.load(ctx)
		cancel()
		if err == nil {
			return
		}
		l.log.Error("reload failed; retrying", "err", err, "in", backoff)
		select {
		case <-l.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

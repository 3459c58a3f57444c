// Package control runs the engine: one goroutine owns it, commands arrive on
// a channel, a batch is applied and saved in one store transaction (group
// commit), then its events published and its callers answered. Reads are served from a
// view updated from each committed change set, so they never see unsaved
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
	// MaxBatch bounds how many commands one transaction carries (default 512).
	MaxBatch int
	Logger   *slog.Logger
	// OnCommit, if set, is called after every store commit with the number of
	// commands in the batch and how long the save took.
	OnCommit func(batch int, d time.Duration)
}

// Loop is the running control plane. Its methods are safe for concurrent use.
type Loop struct {
	opts  Options
	log   *slog.Logger
	cmds  chan *call
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	close sync.Once

	eng  *engine.Engine // owned by the loop goroutine
	view *view
	hub  *hub
}

type call struct {
	ctx  context.Context
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
		opts: opts,
		log:  opts.Logger,
		cmds: make(chan *call, opts.MaxBatch),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		hub:  newHub(opts.Store),
	}
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
// unavailable error and nothing of the batch is kept.
func (l *Loop) Do(ctx context.Context, cmd arbiter.Command) (any, error) {
	c := callPool.Get().(*call)
	c.ctx, c.cmd = ctx, cmd
	select {
	case l.cmds <- c:
	case <-ctx.Done():
		callPool.Put(c)
		return nil, ctx.Err()
	case <-l.stop:
		callPool.Put(c)
		return nil, ErrClosed
	}
	select {
	case <-c.done:
		res, err := c.res, c.err
		c.ctx, c.cmd, c.res, c.err = nil, nil, nil, nil
		callPool.Put(c)
		return res, err
	case <-ctx.Done():
		// The loop still answers c later; it is not reused.
		return nil, ctx.Err()
	case <-l.done:
		return nil, ErrClosed
	}
}

// Now is the loop's clock.
func (l *Loop) Now() time.Time { return l.opts.Now() }

// Post sends cmd to the engine without waiting for its result or for a
// commit: for a command whose answer nobody reads and whose change is
// memory-only, such as a keepalive refresh. It blocks only while the
// command queue is full, and does nothing once the loop is closed.
func (l *Loop) Post(cmd arbiter.Command) {
	c := &call{ctx: context.Background(), cmd: cmd, done: make(chan struct{}, 1)}
	select {
	case l.cmds <- c:
	case <-l.stop:
	}
}

// Wake makes the loop act on deadlines now, as if its timer had fired. Tests
// with a fake clock call it after moving the clock.
func (l *Loop) Wake() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Close stops the loop after the batch in progress; later calls to Do return
// ErrClosed. It does not close the store. It is safe to call twice.
func (l *Loop) Close() error {
	l.close.Do(func() { close(l.stop) })
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

// run owns the engine. It applies each command as it arrives and hands the
// batch collected so far to the committer whenever the committer is idle, so
// a batch holds everything that arrived while the previous one was being
// written: the disk's sync is paid once for all of them, and applying never
// waits for the disk. Callers are answered by the committer, in order, only
// after their batch is durable, so nothing they see is unsaved.
func (l *Loop) run() {
	jobs := make(chan *job)
	// The committer says on idle that it is done with a batch: nil, or the
	// error it failed with. Unbuffered: after a failure the loop has taken
	// the error before anyone is told, so a caller who retries at once meets
	// the reloaded state, not the lost batch.
	idle := make(chan error)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		l.commit(jobs, idle)
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var pending *job
	busy := false
	usual := 1.0 // moving average of batch sizes
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	var lingerC <-chan time.Time // set while a small batch waits for company
	// handOver gives the pending batch to the idle committer.
	handOver := func() {
		// A deadline already due — a grid board freed at once, a power-on
		// without delay — is acted on in this batch rather than the
		// next: one commit instead of two, and the next caller does not
		// wait behind the second.
		if at := l.eng.NextDeadline(); !at.IsZero() {
			if now := l.opts.Now(); !at.After(now) {
				c := newTick()
				pending.calls = append(pending.calls, c)
				var panicked bool
				c.res, c.err, panicked = l.apply(c.cmd, now)
				pending.broken = pending.broken || panicked
			}
		}
		usual += (float64(len(pending.calls)) - usual) / 8
		if lingerC != nil {
			linger.Stop()
			lingerC = nil
		}
		pending.changes = l.eng.Flush()
		jobs <- pending
		pending, busy = nil, true
	}
	// settle runs once the committer is idle: after a failed save, every
	// command applied on top of the lost batch fails too, and state is
	// reloaded.
	settle := func(err error) {
		busy = false
		if err == nil {
			return
		}
		if pending != nil {
			l.eng.Flush()
			for _, c := range pending.calls {
				c.res, c.err = nil, err
				c.done <- struct{}{}
			}
			pending = nil
		}
		l.reload()
	}
	defer func() {
		if busy {
			settle(<-idle)
		}
		if pending != nil {
			handOver()
			<-idle
		}
		close(jobs)
		<-committed
		close(l.done)
	}()
	for {
		if busy {
			select { // hand over as soon as the committer is free
			case err := <-idle:
				settle(err)
			default:
			}
		}
		// Group commit's trade: a batch much smaller than usual waits a
		// moment for the callers answered by the last commit to come back, so
		// the disk's sync is shared; a lone caller never waits.
		if pending != nil && !busy {
			switch {
			case float64(len(pending.calls)) >= usual/2:
				handOver()
			case lingerC == nil:
				linger.Reset(maxLinger)
				lingerC = linger.C
			}
		}
		l.resetTimer(timer)
		cmds := l.cmds
		if pending != nil && len(pending.calls) >= l.opts.MaxBatch {
			cmds = nil // full: wait for the committer
		}
		var c *call
		select {
		case <-l.stop:
			return
		case err := <-idle:
			settle(err)
			continue
		case <-lingerC:
			lingerC = nil
			handOver() // a linger starts only with a batch and an idle committer
			continue
		case c = <-cmds:
		case <-timer.C:
			c = newTick()
		case <-l.wake:
			c = newTick()
		}
		if pending == nil {
			pending = &job{calls: make([]*call, 0, 16)}
		}
		pending.calls = append(pending.calls, c)
		if err := c.ctx.Err(); err != nil {
			c.res, c.err = nil, err // the caller gave up: do not act for it
			continue
		}
		var panicked bool
		c.res, c.err, panicked = l.apply(c.cmd, l.opts.Now())
		pending.broken = pending.broken || panicked
	}
}

// maxLinger bounds how long a small batch waits for company: a fraction of
// a commit, so latency stays within one commit of the unbatched one.
const maxLinger = 200 * time.Microsecond

func newTick() *call {
	return &call{cmd: arbiter.Tick{}, ctx: context.Background(), done: make(chan struct{}, 1)}
}

func (l *Loop) resetTimer(t *time.Timer) {
	d := time.Hour
	if at := l.eng.NextDeadline(); !at.IsZero() {
		d = max(at.Sub(l.opts.Now()), 0)
	}
	t.Reset(d)
}

// commit saves each batch in one transaction, then updates the view,
// publishes the events and answers the callers — in that order — and says
// on idle that it is done. A batch that could not be saved sends its error
// on idle first (the loop drops what it applied since and reloads), then
// answers its callers with it.
func (l *Loop) commit(jobs <-chan *job, idle chan<- error) {
	for j := range jobs {
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
			idle <- fail
			for _, c := range j.calls {
				c.res, c.err = nil, fail
				c.done <- struct{}{}
			}
			continue
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
		idle <- nil
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
// backoff until it succeeds or the loop is closed; commands wait meanwhile.
func (l *Loop) reload() {
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

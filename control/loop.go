// Package control runs the engine: one goroutine owns it, commands arrive on
// a channel, a batch is applied and saved in one store transaction (group
// commit), then its events published and its callers answered. Reads are served from a
// view updated from each committed change set, so they never see unsaved
// state and never wait behind the store (DESIGN §2.2).
package control

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
	// failed is set by the committer when a batch could not be saved; the
	// loop then reloads before applying anything more.
	failed atomic.Bool

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
	broken  bool          // the engine panicked: the batch must not be saved
	barrier chan struct{} // set on a barrier job: closed when reached
}

// run owns the engine: it collects a batch, applies it and hands the change
// set to the committer, then goes on collecting and applying the next batch
// while the store writes the previous one. Callers are answered by the
// committer, in order, only after their batch is durable, so nothing they
// see is unsaved; pipelining only lets the next batch grow while the disk
// syncs.
func (l *Loop) run() {
	// Unbuffered: a batch waits, applied, while the previous one commits, and
	// the next is collected only once it is handed over, so batches grow to
	// whatever arrived during a commit instead of being cut early.
	jobs := make(chan *job)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		l.commit(jobs)
	}()
	defer func() {
		close(jobs)
		<-committed
		close(l.done)
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.resetTimer(timer)
		var batch []*call
		select {
		case <-l.stop:
			return
		case c := <-l.cmds:
			batch = make([]*call, 1, 16)
			batch[0] = c
		drain:
			for len(batch) < l.opts.MaxBatch {
				select {
				case c := <-l.cmds:
					batch = append(batch, c)
				default:
					break drain
				}
			}
		case <-timer.C:
			batch = []*call{newTick()}
		case <-l.wake:
			batch = []*call{newTick()}
		}
		if l.failed.Load() {
			l.resync(jobs)
		}
		jobs <- l.applyBatch(batch)
	}
}

func newTick() *call {
	return &call{cmd: arbiter.Tick{}, ctx: context.Background(), done: make(chan struct{}, 1)}
}

// applyBatch applies each command of a batch at one time and collects what
// changed.
func (l *Loop) applyBatch(batch []*call) *job {
	now := l.opts.Now()
	j := &job{calls: batch}
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.res, c.err = nil, err // the caller gave up: do not act for it
			continue
		}
		var panicked bool
		c.res, c.err, panicked = l.apply(c.cmd, now)
		j.broken = j.broken || panicked
	}
	j.changes = l.eng.Flush()
	return j
}

// resync waits until the committer has dealt with every batch sent so far,
// then rebuilds the engine and the view from the store: memory was ahead of
// a save that failed.
func (l *Loop) resync(jobs chan<- *job) {
	b := &job{barrier: make(chan struct{})}
	jobs <- b
	<-b.barrier
	l.reload()
	l.failed.Store(false)
}

func (l *Loop) resetTimer(t *time.Timer) {
	d := time.Hour
	if at := l.eng.NextDeadline(); !at.IsZero() {
		d = max(at.Sub(l.opts.Now()), 0)
	}
	t.Reset(d)
}

// commit saves each batch in one transaction, then updates the view,
// publishes the events and answers the callers — in that order. After a
// failure it answers every batch already applied on top of the lost one with
// the error too, until the loop has reloaded.
func (l *Loop) commit(jobs <-chan *job) {
	var fail error
	for j := range jobs {
		if j.barrier != nil {
			fail = nil
			close(j.barrier)
			continue
		}
		if fail == nil {
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
				l.failed.Store(true)
			}
		}
		if fail != nil {
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

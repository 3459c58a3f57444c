// Package control runs the engine: commands are applied to it one at a
// time, the commands applied while a batch is being saved form the next
// batch (group commit), and each batch is saved in one store commit, then
// its events published and its callers answered. Reads are served from
// a view updated from each committed change set, so they never see unsaved
// state and never wait behind the store (docs/architecture.md §2.2).
package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	// MaxBatch bounds how many commands one transaction carries (default
	// 512), and how many may wait to be applied: callers wait beyond it.
	MaxBatch int
	Logger   *slog.Logger
	// OnCommit, if set, is called after every store commit with the number of
	// commands in the batch and how long the save took.
	OnCommit func(batch int, d time.Duration)
}

// Loop is the running control plane. Its methods are safe for concurrent use.
//
// Who applies and saves: a caller that finds nothing applied, queued or
// being saved applies its command and saves the batch itself, on its own
// goroutine — a lone client's request crosses no goroutine hand-off, and
// on a small machine each costs about as much as the work. Otherwise the
// command is queued: the applier goroutine applies queued commands one
// after the other (one goroutine, so callers do not contend for the
// engine), and the committer goroutine saves each batch they form,
// lingering a moment for company when a batch is much smaller than
// usual, and keeps saving while batches keep coming. The committer also
// wakes the engine at its deadlines.
type Loop struct {
	opts    Options
	log     *slog.Logger
	cmds    chan *call    // queued for the applier
	room    chan struct{} // the full batch the applier waits on was taken: it may fill the next
	kick    chan struct{} // wakes the committer goroutine
	wake    chan struct{} // Wake: act on deadlines now
	stop    chan struct{} // closed by Close
	applied chan struct{} // closed when the applier has stopped
	done    chan struct{} // closed once the last batch is answered
	close   sync.Once

	mu      sync.Mutex // guards what follows
	eng     *engine.Engine
	pending *job      // applied, not yet taken for saving
	handoff *job      // taken by a caller for the committer goroutine to save
	saver   saver     // who saves now
	linger  bool      // the committer waits for company for a small batch
	usual   float64   // moving average of batch sizes
	armed   time.Time // when the committer's deadline timer fires; zero: not armed
	full    bool      // the applier waits for the batch it filled to be taken
	closed  bool
	// stale: a reload gave up at Close, so memory is not what the store
	// holds; nothing more is applied or saved.
	stale bool
	// trouble says why the store cannot be read after a failed save while
	// recover keeps trying (Trouble); nil when all is well. Memory is not
	// what the store holds meanwhile: nothing is applied on it.
	trouble    atomic.Pointer[string]
	recovering sync.WaitGroup

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
	ctx  context.Context // nil: nobody gives up waiting
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
		opts:    opts,
		log:     opts.Logger,
		cmds:    make(chan *call, opts.MaxBatch),
		room:    make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		applied: make(chan struct{}),
		done:    make(chan struct{}),
		hub:     newHub(opts.Store),
		usual:   1,
	}
	if err := l.load(ctx); err != nil {
		return nil, err
	}
	go l.applier()
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
	upTo := eng.LastSeq()
	publish := func() { l.hub.setLast(upTo) }
	if l.eng != nil {
		// A reload: the events the store holds past the last published
		// (a batch the store took although its save reported an error,
		// the repairs) are read first, and published as the view changes,
		// so that a reader who sees the state finds its events.
		missed, err := l.missedEvents(ctx, upTo)
		publish = func() {
			if err != nil {
				l.log.Warn("the events saved since the last published could not be read; the subscribers start again from the store", "err", err)
				l.hub.dropAll()
				l.hub.setLast(upTo)
				return
			}
			if len(missed) > 0 {
				l.hub.publish(missed)
			}
		}
	}
	l.eng = eng
	if l.view == nil {
		l.view = newView()
	}
	l.view.reset(eng.Machines(), eng.Allocations(), eng.Records(), publish)
	return nil
}

// missedEvents reads the events up to upTo that the store holds past the
// last one published. Errors: the store's, or a gap in what it holds.
func (l *Loop) missedEvents(ctx context.Context, upTo int64) ([]arbiter.Event, error) {
	var out []arbiter.Event
	since := l.LastSeq()
	for since < upTo {
		evs, err := l.opts.Store.Events(ctx, since, catchUpPage)
		if i := slices.IndexFunc(evs, func(e arbiter.Event) bool { return e.Seq > upTo }); i >= 0 {
			evs = evs[:i]
		}
		if err != nil {
			return nil, err
		}
		if len(evs) == 0 {
			return nil, fmt.Errorf("the store holds no events after %d, up to %d", since, upTo)
		}
		out = append(out, evs...)
		since = evs[len(evs)-1].Seq
	}
	return out, nil
}

// Trouble says what is wrong with the store while a save has failed and
// the state cannot be read back from it (a full disk, a database gone):
// the loop keeps trying, and Do refuses commands meanwhile. "" when all is
// well.
func (l *Loop) Trouble() string {
	if t := l.trouble.Load(); t != nil {
		return *t
	}
	return ""
}

// Do sends cmd to the engine and returns its result once the change it made
// is durable. Application errors are *arbiter.Error; a failed save returns
// an unavailable error, and memory is reloaded from the store: nothing of
// the batch is kept, unless the store had taken it before it failed, and
// then its callers get their results as after a save that succeeded (a
// batch without events whose save timed out cannot be told: its error says
// so). A caller whose ctx ends first gets ctx's error; its command may
// still take effect.
func (l *Loop) Do(ctx context.Context, cmd arbiter.Command) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t := l.trouble.Load(); t != nil {
		return nil, troubleError(*t) // at once: recover may take long
	}
	c := callPool.Get().(*call)
	c.ctx, c.cmd = ctx, cmd
	if j := l.alone(c); j != nil {
		l.commit(j)
		l.pass()
	} else {
		select {
		case l.cmds <- c:
		case <-ctx.Done():
			c.ctx, c.cmd = nil, nil
			callPool.Put(c)
			return nil, ctx.Err()
		case <-l.stop:
			c.ctx, c.cmd = nil, nil
			callPool.Put(c)
			return nil, ErrClosed
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// The batch still answers c later; it is not reused.
		return nil, ctx.Err()
	case <-l.done:
		// Close answers what it waited for before done: when both are
		// ready, select may pick either, and c's own answer is the one.
		select {
		case <-c.done:
		default:
			return nil, ErrClosed
		}
	}
	res, err := c.res, c.err
	c.ctx, c.cmd, c.res, c.err = nil, nil, nil, nil
	callPool.Put(c)
	return res, err
}

// alone applies c and takes its batch for the caller to save when nothing
// is applied, queued or being saved (and batches have been small); else
// it returns nil, having done nothing. It never waits for the lock: a
// caller that would is not alone.
func (l *Loop) alone(c *call) *job {
	if len(l.cmds) > 0 || !l.mu.TryLock() {
		return nil
	}
	defer l.mu.Unlock()
	if l.closed || l.saver != nobody || l.pending != nil || 1 < l.usual/2 {
		return nil
	}
	l.applyLocked(c)
	l.noteDeadline()
	l.saver = aCaller
	return l.take()
}

// Now is the loop's clock.
func (l *Loop) Now() time.Time { return l.opts.Now() }

// Post applies cmd without waiting for its result or for a commit: for a
// command whose answer nobody reads and whose change is memory-only, such
// as a keepalive refresh. It blocks only while MaxBatch commands wait to
// be applied, and does nothing once the loop is closed.
func (l *Loop) Post(cmd arbiter.Command) {
	c := &call{cmd: cmd, done: make(chan struct{}, 1)}
	j := l.alone(c)
	if j == nil {
		select {
		case l.cmds <- c:
		case <-l.stop:
		}
		return
	}
	// Nothing else was in flight: a change that needs no save is published
	// here at once; one that does goes to the committer, so the poster
	// never waits for the disk.
	if j.changes.Durable() || j.broken {
		l.mu.Lock()
		l.handoff, l.saver = j, committer
		l.poke()
		l.mu.Unlock()
		return
	}
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
		// stop first: a committer reloading after a failed save holds l.mu
		// until the store answers again or stop closes (reload).
		close(l.stop)
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.poke() // a lone caller who saved meanwhile did not see closed
	})
	<-l.done
	l.recovering.Wait()
	l.hub.closeAll()
	return nil
}

// job is one applied batch on its way to the store.
type job struct {
	calls   []*call
	changes *arbiter.Changes
	broken  bool // the engine panicked: the batch must not be saved
	// refused: collected while memory is not what the store holds
	// (Loop.refusal): nothing was applied, nothing is saved.
	refused error
}

// applier applies the queued commands, as many as are waiting at a time
// under one hold of the lock, and tells the committer of the batch.
func (l *Loop) applier() {
	defer close(l.applied)
	for {
		l.mu.Lock()
		full := l.pending != nil && len(l.pending.calls) >= l.opts.MaxBatch
		l.full = full
		l.mu.Unlock()
		// Only an applier waiting on a full batch listens for room: a
		// signal nobody needs would wake this goroutine — an OS thread
		// on a small machine — at every lone caller's commit.
		cmds, room := l.cmds, (chan struct{})(nil)
		if full {
			cmds, room = nil, l.room // wait for the committer to take it
		}
		var c *call
		select {
		case <-l.stop:
			return
		case <-room:
			continue
		case c = <-cmds:
		}
		l.mu.Lock()
		l.applyQueued(c)
		for more := true; more && len(l.pending.calls) < l.opts.MaxBatch; {
			select {
			case c = <-l.cmds:
				l.applyQueued(c)
			default:
				more = false
			}
		}
		l.noteDeadline()
		l.handOver()
		l.mu.Unlock()
	}
}

// applyQueued applies a queued command, unless its caller has given up
// meanwhile: then it is only answered, with the caller's error. l.mu is
// held.
func (l *Loop) applyQueued(c *call) {
	if c.ctx != nil {
		if err := c.ctx.Err(); err != nil {
			c.res, c.err = nil, err
			l.collect(c)
			return
		}
	}
	l.applyLocked(c)
}

// noteDeadline wakes the committer when the engine's next deadline is
// earlier than the committer's timer. l.mu is held.
func (l *Loop) noteDeadline() {
	if at := l.eng.NextDeadline(); !at.IsZero() && (l.armed.IsZero() || at.Before(l.armed)) {
		l.armed = at
		l.poke()
	}
}

// handOver tells the committer of the batch the applier added to: a
// caller saving now hands it over when done. l.mu is held.
func (l *Loop) handOver() {
	small := float64(len(l.pending.calls)) < l.usual/2
	switch l.saver {
	case committer:
		if l.linger && !small {
			l.linger = false // company came: no need to wait longer
			l.poke()
		}
	case nobody:
		// Group commit's trade: a batch much smaller than usual waits a
		// moment for the callers answered by the last commit to come
		// back, so the disk's sync is shared; a lone caller never waits.
		l.saver, l.linger = committer, small
		l.poke()
	}
}

// applyLocked applies c to the engine and adds it to the batch being
// collected. l.mu is held.
func (l *Loop) applyLocked(c *call) {
	l.collect(c)
	if err := l.refusal(); err != nil {
		c.res, c.err = nil, err
		return
	}
	var panicked bool
	c.res, c.err, panicked = l.apply(c.cmd, l.opts.Now())
	l.pending.broken = l.pending.broken || panicked
}

// collect adds c, applied or answered already, to the batch being
// collected. l.mu is held.
func (l *Loop) collect(c *call) {
	if l.pending == nil {
		l.pending = &job{calls: make([]*call, 0, 16)}
	}
	l.pending.calls = append(l.pending.calls, c)
}

// take takes the batch being collected for saving. l.mu is held.
func (l *Loop) take() *job {
	j := l.pending
	// A deadline already due — a grid board freed at once, a power-on
	// without delay — is acted on in this batch rather than the next: one
	// commit instead of two, and the next caller does not wait behind the
	// second.
	j.refused = l.refusal()
	if at := l.eng.NextDeadline(); !at.IsZero() && j.refused == nil {
		if now := l.opts.Now(); !at.After(now) {
			l.applyLocked(newTick())
		}
	}
	l.usual += (float64(len(j.calls)) - l.usual) / 8
	j.changes = l.eng.Flush()
	l.pending = nil
	l.signalRoom()
	return j
}

// signalRoom tells the applier, if it waits on a full batch, that the
// batch being collected is gone. l.mu is held.
func (l *Loop) signalRoom() {
	if !l.full {
		return
	}
	l.full = false
	select {
	case l.room <- struct{}{}:
	default:
	}
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
		// Deadlines wait while the store is failing (a refused tick would
		// leave one due, and the committer spin on it): recover pokes
		// once the state is back.
		if at := l.eng.NextDeadline(); !at.IsZero() && l.refusal() == nil {
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
			<-l.applied // nothing more is applied
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
	if l.refusal() != nil {
		return // nothing is applied while the store is failing: recover pokes
	}
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
	var fail, saveErr error
	switch {
	case j.refused != nil:
		fail = j.refused
	case j.broken:
		fail = arbiter.Errorf(arbiter.EInternal, "internal error")
	case j.changes.Durable():
		start := time.Now()
		if err := l.opts.Store.Save(context.Background(), j.changes); err != nil {
			l.log.Error("batch not saved; reloading state from the store", "commands", len(j.calls), "err", err)
			saveErr = err
			fail = arbiter.Errorf(arbiter.EUnavailable, "the change could not be saved (%v); nothing was changed, retry", err)
			if errors.Is(err, arbiter.ErrNotApplied) {
				fail = arbiter.NotApplied(fail) // another replica may take it: httpapi says so
			}
		} else if l.opts.OnCommit != nil {
			l.opts.OnCommit(len(j.calls), time.Since(start))
		}
	}
	if fail != nil && j.refused != nil {
		// Refused: nothing was applied, so nothing is undone — what was
		// collected meanwhile (on a state recover may have reloaded) is
		// kept.
		answer(j.calls, fail)
		return
	}
	if fail != nil {
		l.mu.Lock()
		if l.pending != nil {
			l.eng.Flush()
			answer(l.pending.calls, fail)
			l.pending = nil
			l.signalRoom()
		}
		if errors.Is(saveErr, arbiter.ErrSaveUnknown) {
			// The save may have taken effect (the store's answer lost,
			// a sync failed after a whole write): "nothing was changed,
			// retry" would make a retry do it twice. The reloaded
			// store says it was saved when it holds the batch's last
			// event (its own, not another leader's of the same seq);
			// else nobody can tell yet.
			fail = arbiter.Errorf(arbiter.EUnavailable, "the store did not confirm the change (%v): it may or may not have been saved; look before you retry", saveErr)
		}
		if err := l.reload(); err != nil {
			// The store cannot be read back (a full disk, a database
			// gone): memory is not what it holds, so nothing more is
			// applied on it while recover keeps trying, and the
			// batch's callers are told now, not when it recovers.
			t := fmt.Sprintf("since %s, a save failed and the state cannot be read back: %v", time.Now().UTC().Format(time.RFC3339), err)
			l.trouble.Store(&t)
			l.recovering.Add(1)
			go l.recover()
			l.mu.Unlock()
			answer(j.calls, fail)
			return
		}
		saved := errors.Is(saveErr, arbiter.ErrSaveUnknown) && l.holds(j.changes.Events)
		l.mu.Unlock()
		if saved {
			l.log.Warn("the store answered the save with an error, yet it holds the batch: answered as saved", "err", saveErr)
			for _, c := range j.calls {
				c.done <- struct{}{}
			}
			return
		}
		answer(j.calls, fail)
		return
	}
	// The view and the published events change together, before the
	// callers are answered: a reader who sees the new state finds its
	// events (LastSeq, Subscribe), and a subscriber given an event reads
	// the state it describes. Publishing never blocks.
	l.view.apply(j.changes, func() {
		if len(j.changes.Events) > 0 {
			l.hub.publish(j.changes.Events)
		}
	})
	for _, c := range j.calls {
		c.done <- struct{}{}
	}
}

// holds reports whether the store holds evs' last event as evs have it: a
// batch whose save failed was saved after all. Another leader's event of
// the same seq (a deposed leader reloading the new one's state) differs in
// kind, subject, data or time. l.mu is held.
func (l *Loop) holds(evs []arbiter.Event) bool {
	if len(evs) == 0 {
		return false
	}
	want := evs[0]
	for _, ev := range evs[1:] {
		if ev.Seq > want.Seq {
			want = ev
		}
	}
	if l.eng.LastSeq() < want.Seq {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := l.opts.Store.Events(ctx, want.Seq-1, 1)
	return err == nil && len(got) == 1 && got[0].Seq == want.Seq && got[0].Kind == want.Kind &&
		got[0].Subject == want.Subject && bytes.Equal(got[0].Data, want.Data) && got[0].Time.Equal(want.Time)
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

// reload rebuilds state from the store after a failed save: one attempt,
// which Close cuts short. l.mu is held.
func (l *Loop) reload() error {
	defer l.poke() // the committer sets its timer from the reloaded deadlines
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { // a store that hangs must not hold Close either
		select {
		case <-l.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return l.load(ctx)
}

// recover reloads with backoff, after reload failed, until it succeeds
// (commands are taken again) or the loop is closed (memory is not what
// the store holds: nothing more is applied or saved).
func (l *Loop) recover() {
	defer l.recovering.Done()
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-l.stop:
			l.mu.Lock()
			l.closed, l.stale = true, true
			l.trouble.Store(nil)
			l.mu.Unlock()
			return
		case <-time.After(backoff):
		}
		l.mu.Lock()
		err := l.reload()
		if err == nil {
			l.trouble.Store(nil)
			l.mu.Unlock()
			l.log.Info("the store reads again; commands are taken again")
			return
		}
		l.mu.Unlock()
		l.log.Error("reload failed; retrying", "err", err, "in", backoff)
		backoff = min(2*backoff, 5*time.Second)
	}
}

// refusal is why a command may not be applied now: the loop is closed with
// memory not what the store holds, or the store is failing (Trouble); nil
// when it may. l.mu is held.
func (l *Loop) refusal() error {
	switch t := l.trouble.Load(); {
	case l.stale:
		return ErrClosed
	case t != nil:
		return troubleError(*t)
	}
	return nil
}

// troubleError refuses a command while the store is failing (Trouble):
// certainly not applied, so a client may send it again — to another
// replica, or here after a backoff.
func troubleError(trouble string) error {
	return arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "the server's store is failing (%s): nothing was done; retry once it recovers", trouble))
}

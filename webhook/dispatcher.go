// Package webhook delivers events to webhook subscriptions: the dispatcher
// reads the durable event outbox (committed events, from a cursor kept in
// the store), turns each event into one delivery per subscription that
// wants it, and POSTs them signed — Standard Webhooks by default, or the
// x-spark-signature form of seed 000 for compatibility.
//
// Nothing is lost across a crash: the deliveries of an event and the cursor
// past it are saved in one transaction, and every delivery stays pending in
// the store until it is delivered or given up, so a restarted dispatcher
// resumes both. Delivery is at least once; webhook-id is stable across
// retries so receivers can drop duplicates.
//
// The dispatcher runs beside the control loop and only reads it: a receiver
// that is slow, down or failing costs the dispatcher's workers time, never a
// decision of the engine. The one command it sends is to disable a
// subscription whose receiver answered 410 Gone.
package webhook

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Plane is what the dispatcher needs of the running control plane;
// *control.Loop implements it.
type Plane interface {
	// Subscribe returns committed events with Seq > since, in order.
	Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error)
	// LastSeq is the seq of the last committed event.
	LastSeq() int64
	// Records returns the committed records of a kind (the subscriptions).
	Records(kind string) []arbiter.Record
	// Do applies a command (disabling a subscription after a 410).
	Do(ctx context.Context, cmd arbiter.Command) (any, error)
}

// Options configure a Dispatcher. Plane and Log are required.
type Options struct {
	Plane Plane
	Log   arbiter.DeliveryLog
	// Timeout bounds one POST (default 10s).
	Timeout time.Duration
	// MinBackoff is the wait before the first retry (default 1s); it doubles
	// per attempt up to MaxBackoff (default 5m), with jitter.
	MinBackoff, MaxBackoff time.Duration
	// RetryFor bounds the retries: a delivery not delivered this long after
	// it was created is given up as failed (default 1h).
	RetryFor time.Duration
	// Workers is how many POSTs may be in flight at once (default 8). One
	// subscription may have half of them (at least one) in flight, and
	// only one while its receiver does not answer: a receiver that is
	// down or black-holed does not hold up the others.
	Workers int
	// Held is how many pending deliveries are held in memory at once
	// (default 10,000); the rest wait in the log and are read from it as
	// these finish, the earliest due first.
	Held int
	// Keep is how many finished deliveries the log keeps (default 10000).
	Keep int
	// AllowLinkLocal lets deliveries connect to link-local, unspecified,
	// multicast and cloud metadata addresses ([webhooks] allow_link_local).
	AllowLinkLocal bool
	// Client sends the POSTs; the default refuses forbidden addresses at
	// connection time (so a name resolving to one is refused too), and
	// loopback addresses for subscriptions marked NoLoopback, follows no
	// redirects and uses no proxy.
	Client *http.Client
	// UserAgent is sent with every POST (default "arbiter-webhook").
	UserAgent string
	Logger    *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Defaults of Options.
const (
	DefaultTimeout    = 10 * time.Second
	DefaultMinBackoff = time.Second
	DefaultMaxBackoff = 5 * time.Minute
	DefaultRetryFor   = time.Hour
	DefaultWorkers    = 8
	DefaultKeep       = 10000
	DefaultHeld       = 10000
)

// Dispatcher delivers webhooks until its Run returns. Create it with New.
type Dispatcher struct {
	o   Options
	log *slog.Logger
	// noLoopback sends the POSTs of subscriptions marked NoLoopback.
	noLoopback *http.Client
	// refillEvery is how often the log is read while fewer deliveries than
	// Options.Held but more than half of them are held; tests shorten it.
	refillEvery time.Duration

	// mu guards what Settle waits on: how many deliveries held in memory
	// are pending or in flight, whether the log holds more, and the
	// cursor; changed is closed (and replaced) when one of them changes.
	mu      sync.Mutex
	pending int
	behind  bool
	cursor  int64
	changed chan struct{}
}

// New returns a dispatcher; Run starts it.
func New(o Options) *Dispatcher {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.Keep <= 0 {
		o.Keep = DefaultKeep
	}
	if o.Held <= 0 {
		o.Held = DefaultHeld
	}
	if o.UserAgent == "" {
		o.UserAgent = "arbiter-webhook"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	noLoopback := o.Client
	if o.Client == nil {
		o.Client = NewClient(o.AllowLinkLocal)
		noLoopback = newClient(o.AllowLinkLocal, true)
	}
	return &Dispatcher{o: o, log: o.Logger, noLoopback: noLoopback, refillEvery: time.Second, changed: make(chan struct{})}
}

// NewClient returns the HTTP client deliveries use: it refuses to connect
// to link-local, unspecified, multicast and cloud metadata addresses unless
// allowLinkLocal, follows no redirects and ignores proxy settings (a proxy
// would hide the address actually reached).
func NewClient(allowLinkLocal bool) *http.Client { return newClient(allowLinkLocal, false) }

// newClient is NewClient, refusing loopback addresses too when
// refuseLoopback.
func newClient(allowLinkLocal, refuseLoopback bool) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if !allowLinkLocal || refuseLoopback {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			a, err := netip.ParseAddr(host)
			if err != nil {
				return fmt.Errorf("webhook: connect to %s: not an IP address", host)
			}
			if refuseLoopback && a.Unmap().IsLoopback() {
				return fmt.Errorf("webhook: refused to connect to %s, the server's loopback: a person's own subscription may not target it", host)
			}
			if allowLinkLocal {
				return nil
			}
			if why := arbiter.WebhookAddrRefused(a); why != "" {
				return fmt.Errorf("webhook: refused to connect to %s, %s (set [webhooks] allow_link_local = true to allow it)", host, why)
			}
			return nil
		}
	}
	tr := &http.Transport{
		DialContext:           d.DialContext,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Run delivers until ctx ends, then returns nil; attempts in flight are
// cut and stay pending in the log. It returns an error only when the log
// cannot be read at start.
func (d *Dispatcher) Run(ctx context.Context) error {
	cursor, err := d.o.Log.WebhookCursor(ctx)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	pend, err := d.o.Log.PendingDeliveries(ctx, d.o.Held, nil)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	r := &run{d: d, subs: map[string]*subQueue{}, held: map[string]struct{}{},
		results: make(chan result, d.o.Workers), work: make(chan *item)}
	r.load(pend, false)
	d.note(0, cursor)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := 0; i < d.o.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker(wctx)
		}()
	}
	r.loop(ctx, cursor)
	return nil
}

// Settle waits until the dispatcher has read every event up to seq and no
// delivery is pending or in flight (delivered or given up), or until ctx
// ends. Tests and benchmarks use it.
func (d *Dispatcher) Settle(ctx context.Context, seq int64) error {
	for {
		d.mu.Lock()
		done, ch := d.cursor >= seq && d.pending == 0 && !d.behind, d.changed
		d.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// note changes the pending count by n and the cursor to at least cursor,
// and wakes Settle.
func (d *Dispatcher) note(n int, cursor int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending += n
	d.cursor = max(d.cursor, cursor)
	close(d.changed)
	d.changed = make(chan struct{})
}

// item is a delivery waiting for its next attempt.
type item struct {
	d   arbiter.Delivery
	pos int
}

// dueBefore orders deliveries by their next attempt (none set first),
// then by event.
func dueBefore(x, y *item) bool {
	a, b := x.d.NextAttemptAt, y.d.NextAttemptAt
	switch {
	case a == nil || b == nil:
		return a == nil && b != nil
	case !a.Equal(*b):
		return a.Before(*b)
	}
	return x.d.EventSeq < y.d.EventSeq
}

type dueHeap []*item

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return dueBefore(h[i], h[j]) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].pos, h[j].pos = i, j }
func (h *dueHeap) Push(x any)        { it := x.(*item); it.pos = len(*h); *h = append(*h, it) }
func (h *dueHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

// subQueue is one subscription's deliveries waiting for an attempt.
type subQueue struct {
	id       string
	items    dueHeap
	inFlight int
	// unanswered: its last attempt got no answer (a timeout, a refused
	// connection); it may then have one attempt in flight, not more.
	unanswered bool
	pos        int // in run.ready; -1 when not there
}

// readyHeap holds the subscriptions with a delivery waiting and room for
// another attempt, the one whose first delivery is due earliest first.
type readyHeap []*subQueue

func (h readyHeap) Len() int           { return len(h) }
func (h readyHeap) Less(i, j int) bool { return dueBefore(h[i].items[0], h[j].items[0]) }
func (h readyHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].pos, h[j].pos = i, j }
func (h *readyHeap) Push(x any)        { q := x.(*subQueue); q.pos = len(*h); *h = append(*h, q) }
func (h *readyHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.pos = -1
	return q
}

// run is the state of one Run: the loop goroutine owns all but d.
type run struct {
	d         *Dispatcher
	subs      map[string]*subQueue // by subscription id, while it has deliveries held
	ready     readyHeap
	held      map[string]struct{} // ids of the deliveries held in memory, waiting or in flight
	behind    bool                // the log holds pending deliveries not held
	evictions int                 // deliveries put back in the log to make room (evictFor)
	refilled  time.Time           // the last read of the log (refill)
	inFlight  int
	work      chan *item
	results   chan result
	// refillWake retries reading the log after a failed read.
	refillWake <-chan time.Time
	finished   int // since the last trim
	// read is the cursor as far as events were read; saved is what the log
	// holds. Events that make no delivery move only read: saving the cursor
	// for each would cost a store write per batch, competing with the
	// control loop's commits for nothing. It is saved every few seconds and
	// with the next delivery; after a crash the few events re-read make
	// the same (no) deliveries.
	read, saved int64
}

type result struct {
	it         *item
	retry      bool // it goes back in the queue
	unanswered bool // the attempt got no answer
}

// push holds a pending delivery in memory for its attempts, unless as
// many as Options.Held are and none can make room for it (evictFor): it
// then waits in the log (refill). It reports whether it was left there.
func (r *run) push(it *item) (refused bool) {
	if _, ok := r.held[it.d.ID]; ok {
		return false
	}
	if len(r.held) >= r.d.o.Held && !r.evictFor(it.d.Webhook) {
		r.setBehind(true)
		return true
	}
	r.held[it.d.ID] = struct{}{}
	q := r.subs[it.d.Webhook]
	if q == nil {
		q = &subQueue{id: it.d.Webhook, pos: -1}
		r.subs[q.id] = q
	}
	heap.Push(&q.items, it)
	r.d.note(1, 0)
	r.update(q)
	return false
}

// evictFor makes room in memory for a delivery of subscription w when
// another subscription holds more waiting deliveries than w does (a dead
// receiver's, piling up): that one's latest due goes back to waiting in
// the log. So one subscription cannot fill memory and leave the others'
// new deliveries in the log until its own are given up. It reports
// whether it made room.
func (r *run) evictFor(w string) bool {
	var big *subQueue
	for _, q := range r.subs {
		if q.id != w && (big == nil || q.items.Len() > big.items.Len()) {
			big = q
		}
	}
	mine := 0
	if q := r.subs[w]; q != nil {
		mine = q.items.Len()
	}
	if big == nil || big.items.Len() <= mine {
		return false
	}
	last := 0
	for i := 1; i < big.items.Len(); i++ {
		if dueBefore(big.items[last], big.items[i]) {
			last = i
		}
	}
	it := heap.Remove(&big.items, last).(*item)
	delete(r.held, it.d.ID)
	r.d.note(-1, 0)
	r.update(big)
	r.evictions++
	r.setBehind(true) // it is still pending in the log
	return true
}

// update puts q in the ready heap, moves it there, or takes it out, after
// its deliveries or attempts in flight changed; a subscription with
// neither is forgotten.
func (r *run) update(q *subQueue) {
	limit := max(1, r.d.o.Workers/2)
	if q.unanswered {
		limit = 1
	}
	want := q.items.Len() > 0 && q.inFlight < limit
	switch {
	case want && q.pos < 0:
		heap.Push(&r.ready, q)
	case want:
		heap.Fix(&r.ready, q.pos)
	case q.pos >= 0:
		heap.Remove(&r.ready, q.pos)
	}
	if q.items.Len() == 0 && q.inFlight == 0 {
		delete(r.subs, q.id)
	}
}

func (r *run) setBehind(b bool) {
	if r.behind == b {
		return
	}
	r.behind = b
	r.d.mu.Lock()
	r.d.behind = b
	r.d.mu.Unlock()
	r.d.note(0, 0)
}

// refill reads pending deliveries that wait in the log into memory: once
// half of those held are done, or at most every d.refillEvery while there is
// room. Subscriptions that hold half of memory already (a dead receiver's,
// piling up) are left out of the read, so that the others' are read even
// when the first's fill the log. A failed read is tried again a second
// later.
func (r *run) refill(ctx context.Context) {
	if !r.behind || r.refillWake != nil || len(r.held) >= r.d.o.Held {
		return
	}
	now := time.Now()
	if len(r.held) > r.d.o.Held/2 {
		if wait := r.d.refillEvery - now.Sub(r.refilled); wait > 0 {
			r.refillWake = time.After(wait)
			return
		}
	}
	r.refilled = now
	var skip []string
	for _, q := range r.subs {
		if q.items.Len()+q.inFlight >= r.d.o.Held/2 {
			skip = append(skip, q.id)
		}
	}
	// The earliest due first; those already held are among them or later.
	pend, err := r.d.o.Log.PendingDeliveries(ctx, r.d.o.Held, skip)
	if err != nil {
		if ctx.Err() == nil {
			r.d.log.Warn("webhook: read pending deliveries; retrying", "err", err)
		}
		r.refillWake = time.After(time.Second)
		return
	}
	r.load(pend, len(skip) > 0)
}

// load holds deliveries read from the log, and records whether the log
// may hold pending deliveries that are not held: it gave as many as were
// asked for, some did not fit, some held were put back (evictFor), or
// the read left some subscriptions out (skipped).
func (r *run) load(pend []arbiter.Delivery, skipped bool) {
	evicted := r.evictions
	behind := skipped || len(pend) == r.d.o.Held
	for i := range pend {
		if r.push(&item{d: pend[i]}) {
			behind = true
		}
	}
	r.setBehind(behind || r.evictions != evicted)
}

// loop reads events, enqueues their deliveries, and hands due deliveries to
// the workers, until ctx ends.
func (r *run) loop(ctx context.Context, cursor int64) {
	var events <-chan arbiter.Event
	var paused <-chan arbiter.Event // events, while reading them waits for idle
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	defer idle.Stop()
	var subCancel context.CancelFunc = func() {}
	defer func() { subCancel() }()
	resub := time.NewTimer(0)
	var warned time.Time // when the last "cannot follow" went to the log
	defer resub.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	r.read, r.saved = cursor, cursor
	flush := time.NewTicker(cursorFlushEvery)
	defer flush.Stop()
	var batch []arbiter.Event // the events read at once, reused: enqueue keeps none of it
	defer r.saveCursor(context.WithoutCancel(ctx))
	for {
		r.refill(ctx)
		// Hand out every due delivery the workers can take.
		var next <-chan time.Time
		for r.ready.Len() > 0 && r.inFlight < r.d.o.Workers {
			q := r.ready[0]
			top := q.items[0]
			if at := top.d.NextAttemptAt; at != nil {
				if wait := at.Sub(r.d.o.Now()); wait > 0 {
					timer.Reset(wait)
					next = timer.C
					break
				}
			}
			heap.Pop(&q.items)
			q.inFlight++
			r.inFlight++
			r.update(q)
			select {
			case r.work <- top:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-resub.C:
			cursor = r.skipUnwanted(cursor)
			sctx, cancel := context.WithCancel(ctx)
			ch, err := r.d.o.Plane.Subscribe(sctx, cursor)
			if err != nil {
				cancel()
				// Once a minute at most: a closed plane (a step-down)
				// refuses until the dispatcher is stopped.
				if now := time.Now(); now.Sub(warned) >= time.Minute {
					warned = now
					r.d.log.Warn("webhook: cannot follow the event stream; retrying", "err", err)
				}
				resub.Reset(time.Second)
				continue
			}
			subCancel, events = cancel, ch
		case ev, ok := <-events:
			if !ok {
				// Closed (the dispatcher fell behind, or the loop stopped):
				// follow again from the cursor.
				subCancel()
				events = nil
				resub.Reset(100 * time.Millisecond)
				continue
			}
			batch = append(batch[:0], ev)
		more:
			for len(batch) < 512 {
				select {
				case ev, ok := <-events:
					if !ok {
						break more
					}
					batch = append(batch, ev)
				default:
					break more
				}
			}
			subs := r.subscriptions()
			if c, ok := r.enqueue(ctx, batch, subs); ok {
				cursor = c
				if !anyEnabled(subs) {
					// Nobody to deliver to: the events only move the
					// cursor, so read them in one go a moment later
					// rather than wake at every commit.
					paused, events = events, nil
					idle.Reset(idleRead)
				}
			} else {
				// Not saved: read the same events again shortly.
				subCancel()
				events = nil
				resub.Reset(time.Second)
			}
		case res := <-r.results:
			r.inFlight--
			q := r.subs[res.it.d.Webhook] // there while it has one in flight
			q.inFlight--
			q.unanswered = res.unanswered
			if res.retry {
				heap.Push(&q.items, res.it)
			} else {
				delete(r.held, res.it.d.ID)
				r.d.note(-1, 0)
				r.finished++
				if r.finished >= 1000 {
					r.finished = 0
					if err := r.d.o.Log.TrimDeliveries(ctx, r.d.o.Keep); err != nil && ctx.Err() == nil {
						r.d.log.Warn("webhook: trim the delivery log", "err", err)
					}
				}
			}
			r.update(q)
		case <-r.refillWake:
			r.refillWake = nil
		case <-idle.C:
			events, paused = paused, nil
		case <-next:
		case <-flush.C:
			r.saveCursor(ctx)
		}
	}
}

// skipUnwanted moves the cursor past every committed event when no
// subscription is enabled, and returns it: those events would make no
// delivery, so there is nothing to read. Without it a dispatcher that fell
// behind on a loaded server (a slow cursor save, a goroutine not scheduled
// for a while: the hub drops a subscriber that lags a few thousand events)
// followed again from its cursor, and the hub read those events back from
// the store while new ones piled up, so it lagged again, over and over: 7 %
// of the server's CPU at 64 spalloc connections, with no webhook.
// LastSeq is read before the subscriptions: one enabled after that read
// commits its events past it.
func (r *run) skipUnwanted(cursor int64) int64 {
	last := r.d.o.Plane.LastSeq()
	if last <= cursor || anyEnabled(r.subscriptions()) {
		return cursor
	}
	r.read = last
	r.d.note(0, last)
	return last
}

// idleRead is how long the dispatcher leaves committed events unread
// while no subscription is enabled: the events are not needed at once,
// and waking it at every commit (with spalloc's notifier) cost a lone
// spalloc client a fifth of its cycles on a 2-core machine
// (docs/guides/performance.md).
// The subscription buffers a few thousand events; one that overflows is
// followed again from the cursor.
const idleRead = 10 * time.Millisecond

// cursorFlushEvery is how often a cursor moved by events without
// deliveries is saved.
const cursorFlushEvery = 5 * time.Second

// saveCursor saves the read cursor if it moved past the saved one.
func (r *run) saveCursor(ctx context.Context) {
	if r.read <= r.saved {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.d.o.Log.EnqueueDeliveries(ctx, nil, r.read); err != nil {
		r.d.log.Warn("webhook: save the event cursor", "err", err)
		return
	}
	r.saved = r.read
}

// enqueue saves the deliveries of a batch of events and moves the cursor
// past them, then queues the deliveries, for the subscriptions subs. It
// reports the new cursor.
func (r *run) enqueue(ctx context.Context, batch []arbiter.Event, subs []arbiter.Webhook) (int64, bool) {
	now := r.d.o.Now().UTC()
	var ds []arbiter.Delivery
	for i := range batch {
		ev := &batch[i]
		for _, w := range subs {
			// An event from before the subscription (read late, after a
			// restart) is not its business.
			if !w.Enabled || !w.WantsEvent(ev.Kind, ev.Subject) || ev.Time.Before(w.CreatedAt) {
				continue
			}
			body, ok := Body(w.Format, ev)
			if !ok {
				continue
			}
			next := now
			ds = append(ds, arbiter.Delivery{
				ID: "msg_" + strconv.FormatInt(ev.Seq, 10) + "_" + w.ID, Webhook: w.ID, EventSeq: ev.Seq, EventKind: ev.Kind,
				Body: body, State: arbiter.DeliveryPending, NextAttemptAt: &next, CreatedAt: now, UpdatedAt: now,
			})
		}
	}
	last := batch[len(batch)-1].Seq
	if len(ds) == 0 {
		r.read = last
		r.d.note(0, last)
		return last, true
	}
	if err := r.d.o.Log.EnqueueDeliveries(ctx, ds, last); err != nil {
		if ctx.Err() == nil {
			r.d.log.Error("webhook: cannot save deliveries; will read the events again", "err", err, "from_seq", batch[0].Seq)
		}
		return 0, false
	}
	r.read, r.saved = last, last
	for i := range ds {
		r.push(&item{d: ds[i]})
	}
	r.d.note(0, last)
	return last, true
}

// anyEnabled reports whether one of subs is enabled.
func anyEnabled(subs []arbiter.Webhook) bool {
	return slices.ContainsFunc(subs, func(w arbiter.Webhook) bool { return w.Enabled })
}

// subscriptions returns the current subscriptions, in id order.
func (r *run) subscriptions() []arbiter.Webhook {
	recs := r.d.o.Plane.Records(arbiter.RecordWebhook)
	out := make([]arbiter.Webhook, 0, len(recs))
	for _, rec := range recs {
		if w, ok := rec.Value.(arbiter.Webhook); ok {
			out = append(out, w)
		}
	}
	return out
}

func (r *run) subscription(id string) (arbiter.Webhook, bool) {
	for _, w := range r.subscriptions() {
		if w.ID == id {
			return w, true
		}
	}
	return arbiter.Webhook{}, false
}

// worker makes attempts until ctx ends.
func (r *run) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-r.work:
			retry, unanswered := r.attempt(ctx, it)
			select {
			case r.results <- result{it: it, retry: retry, unanswered: unanswered}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// attempt makes one attempt of it's delivery, records it, and reports
// whether it must be tried again and whether the receiver did not answer.
func (r *run) attempt(ctx context.Context, it *item) (retry, unanswered bool) {
	d := &it.d
	w, ok := r.subscription(d.Webhook)
	now := r.d.o.Now().UTC()
	if ok && w.CreatedAt.After(d.CreatedAt) {
		// A later subscription given the deleted one's id: the event is
		// none of its business, nor its URL the place for it.
		ok = false
	}
	if !ok || !w.Enabled {
		why := "the subscription was deleted"
		if ok {
			why = "the subscription is disabled: " + w.DisabledReason
		}
		d.State, d.NextAttemptAt, d.LastError, d.UpdatedAt = arbiter.DeliveryFailed, nil, why, now
		r.record(ctx, d, arbiter.DeliveryAttempt{})
		return false, false
	}
	status, took, err := r.post(ctx, &w, d)
	if ctx.Err() != nil {
		return false, false // shutting down: it stays pending in the log
	}
	unanswered = err != nil
	d.Attempts++
	at := arbiter.DeliveryAttempt{N: d.Attempts, At: now, Status: status, DurationMS: float64(took.Microseconds()) / 1000}
	d.LastStatus, d.UpdatedAt = status, r.d.o.Now().UTC()
	switch {
	case err == nil && status >= 200 && status <= 299:
		d.State, d.NextAttemptAt, d.LastError = arbiter.DeliveryDelivered, nil, ""
	case err == nil && status == http.StatusGone:
		at.Error = "the receiver answered 410 Gone: the subscription is disabled"
		d.State, d.NextAttemptAt, d.LastError = arbiter.DeliveryFailed, nil, at.Error
		r.disable(ctx, &w, now)
	default:
		if err != nil {
			at.Error = err.Error()
		} else {
			at.Error = "the receiver answered " + strconv.Itoa(status) + " " + http.StatusText(status)
		}
		d.LastError = at.Error
		wait := r.backoff(d.Attempts)
		if next := d.UpdatedAt.Add(wait); next.Sub(d.CreatedAt) <= r.d.o.RetryFor {
			d.NextAttemptAt = &next
			retry = true
		} else {
			d.State, d.NextAttemptAt = arbiter.DeliveryFailed, nil
			d.LastError = fmt.Sprintf("gave up after %d attempts over %s: %s", d.Attempts, d.UpdatedAt.Sub(d.CreatedAt).Round(time.Millisecond), at.Error)
		}
	}
	r.record(ctx, d, at)
	if !retry && d.State == arbiter.DeliveryFailed {
		r.d.log.Warn("webhook delivery failed", "webhook", w.ID, "delivery", d.ID, "err", d.LastError)
	}
	return retry, unanswered
}

func (r *run) record(ctx context.Context, d *arbiter.Delivery, a arbiter.DeliveryAttempt) {
	if err := r.d.o.Log.RecordAttempt(ctx, *d, a); err != nil && ctx.Err() == nil {
		r.d.log.Error("webhook: cannot record a delivery attempt", "delivery", d.ID, "err", err)
	}
}

// post sends one attempt: the body with its headers, signed per format.
// It returns the answer's status, how long the receiver took, and why
// the attempt failed (nil: it was answered).
func (r *run) post(ctx context.Context, w *arbiter.Webhook, d *arbiter.Delivery) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, r.d.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(d.Body))
	if err != nil {
		return 0, 0, fmt.Errorf("bad url: %w", err)
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", r.d.o.UserAgent)
	h.Set(HeaderID, d.ID)
	ts := r.d.o.Now()
	switch w.Format {
	case arbiter.WebhookSpark:
		h.Set(HeaderSparkEvt, sparkEvent(d.EventKind))
		if w.Secret != "" {
			h.Set(HeaderSparkSig, SignSpark(w.Secret, d.Body))
		}
	default:
		sig, err := SignStandard(w.Secret, d.ID, ts, d.Body)
		if err != nil {
			return 0, 0, err
		}
		h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
		h.Set(HeaderSignature, sig)
	}
	client := r.d.o.Client
	if w.NoLoopback {
		client = r.d.noLoopback
	}
	start := time.Now()
	resp, err := client.Do(req)
	took := time.Since(start)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, took, fmt.Errorf("no answer within %s", r.d.o.Timeout)
		}
		return 0, took, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode, took, nil
}

func sparkEvent(kind string) string {
	if kind == arbiter.EventSwapFailed {
		return "swap_failed"
	}
	return "swap_complete"
}

// backoff is the wait after attempt n: MinBackoff·2^(n-1), capped at
// MaxBackoff, with "equal jitter" (between half and all of it) so that
// retries of many deliveries spread out.
func (r *run) backoff(n int) time.Duration {
	d := r.d.o.MinBackoff
	for i := 1; i < n && d < r.d.o.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.d.o.MaxBackoff)
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

// disable turns a subscription off after its receiver answered 410 Gone.
func (r *run) disable(ctx context.Context, w *arbiter.Webhook, now time.Time) {
	_, err := r.d.o.Plane.Do(ctx, arbiter.SetWebhookEnabled{
		Caller: arbiter.Caller{Name: "webhook-dispatcher", Role: arbiter.RoleAdmin},
		ID:     w.ID, Enabled: false,
		Reason: "the receiver answered 410 Gone at " + now.Format(time.RFC3339),
	})
	if err != nil && ctx.Err() == nil {
		r.d.log.Error("webhook: cannot disable a subscription after 410 Gone", "webhook", w.ID, "err", err)
	}
}

package control

import (
	"context"
	"sort"
	"sync"
	"unsafe"

	"github.com/arbiter-hq/arbiter"
)

// hub fans committed events out to live subscribers. Publishing never blocks
// the loop: a subscriber whose buffer is full is dropped and may resubscribe
// from the last sequence number it saw.
//
// Events go straight into the channel the subscriber reads: publishing to
// a waiting subscriber wakes exactly one goroutine, the subscriber's, and
// on a small machine each wake — a thread started on an idle CPU — costs
// about as much as a lone client's request (docs/guides/performance.md).
// A subscriber that asks for events already published is caught up by a
// goroutine of its own, which sends them while the live ones wait in
// memory, then hands the subscription to the hub and ends. It takes them
// from the hub's recent events when they are there, and from the store
// otherwise: a store read first waits for the tables written behind, so
// on a busy server a follower that resubscribes after a short lag (a
// webhook dispatcher the hub dropped, an event stream reconnecting) or a
// page that shows the latest events would otherwise write the tables
// each time (docs/guides/performance.md).
type hub struct {
	store arbiter.Store

	mu     sync.Mutex
	last   int64 // seq of the last published event
	subs   map[*sub]struct{}
	recent recent
	closed bool // closeAll ran: a subscription taken after it is closed at once
}

// recent is a ring of the last events published, at most recentEvents of
// them and recentBytes of their text: every event with from < Seq <= the
// hub's last is in it.
type recent struct {
	ring  []arbiter.Event // oldest at head; nil until the first event
	head  int
	n     int
	bytes int
	from  int64
}

// The bounds of the recent events: more than a subscriber may lag before
// it is dropped (subBuffer), so that one dropped resubscribes from memory,
// and a few MiB at most.
const (
	recentEvents = 2 * subBuffer
	recentBytes  = 8 << 20
)

// eventBytes is what an event holds in memory, about.
func eventBytes(e *arbiter.Event) int {
	return len(e.Data) + len(e.Kind) + len(e.Subject) + int(unsafe.Sizeof(*e))
}

// reset empties r: only events after from will be in it.
func (r *recent) reset(from int64) {
	clear(r.ring) // let the collector have their data
	r.head, r.n, r.bytes, r.from = 0, 0, 0, from
}

// add appends evs, published in order, dropping the oldest past the
// bounds.
func (r *recent) add(evs []arbiter.Event) {
	if r.ring == nil {
		r.ring = make([]arbiter.Event, recentEvents)
	}
	for i := range evs {
		size := eventBytes(&evs[i])
		for r.n > 0 && (r.n == len(r.ring) || r.bytes+size > recentBytes) {
			old := &r.ring[r.head]
			r.from, r.bytes = old.Seq, r.bytes-eventBytes(old)
			*old = arbiter.Event{}
			r.head, r.n = (r.head+1)%len(r.ring), r.n-1
		}
		if size > recentBytes { // alone past the bound: not kept
			r.from = evs[i].Seq
			continue
		}
		r.ring[(r.head+r.n)%len(r.ring)] = evs[i]
		r.n++
		r.bytes += size
	}
}

// after appends to dst the events with since < Seq <= upTo, at most
// limit, and reports whether r held them: false when some are older
// than r's.
func (r *recent) after(dst []arbiter.Event, since, upTo int64, limit int) ([]arbiter.Event, bool) {
	if since < r.from {
		return dst, false
	}
	// Seqs increase along the ring: find the first after since.
	i := sort.Search(r.n, func(i int) bool { return r.ring[(r.head+i)%len(r.ring)].Seq > since })
	for ; i < r.n && limit > 0; i, limit = i+1, limit-1 {
		e := &r.ring[(r.head+i)%len(r.ring)]
		if e.Seq > upTo {
			break
		}
		dst = append(dst, *e)
	}
	return dst, true
}

type sub struct {
	ch     chan arbiter.Event // the subscriber's, buffered
	after  int64              // only events with Seq > after are sent
	wanted func() bool        // nil: every batch; false: the batch is skipped
	stop   func() bool        // ends the watch on the subscriber's ctx
	// While catching is set, the catch-up goroutine sends on ch and live
	// events wait in held; a sub dropped meanwhile is marked gone and that
	// goroutine closes ch.
	catching bool
	held     []arbiter.Event
	gone     bool
}

// subBuffer is how many events a subscriber may lag before it is dropped.
const subBuffer = 4096

func newHub(s arbiter.Store) *hub { return &hub{store: s, subs: make(map[*sub]struct{})} }

// setLast starts the hub after seq, the last event in the store, with no
// recent events in memory.
func (h *hub) setLast(seq int64) {
	h.mu.Lock()
	h.last = seq
	h.recent.reset(seq)
	h.mu.Unlock()
}

// publish hands a committed batch's events to the subscribers. It holds
// h.mu throughout, so a subscriber that takes h.mu after receiving an
// event (LastSeq) finds the rest of that batch in its channel.
func (h *hub) publish(evs []arbiter.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = evs[len(evs)-1].Seq
	h.recent.add(evs)
	for s := range h.subs {
		if s.wanted != nil && !s.wanted() {
			continue
		}
		if s.catching {
			if len(s.held)+len(evs) > subBuffer {
				h.dropLocked(s)
			} else {
				s.held = append(s.held, evs...)
			}
			continue
		}
		for _, e := range evs {
			if e.Seq <= s.after {
				continue
			}
			select {
			case s.ch <- e:
			default:
				h.dropLocked(s)
				goto next
			}
		}
	next:
	}
}

// dropLocked ends a subscription: its channel is closed, by the catch-up
// goroutine if one still sends on it. h.mu is held.
func (h *hub) dropLocked(s *sub) {
	delete(h.subs, s)
	s.stop()
	if s.catching {
		s.gone = true
		return
	}
	close(s.ch)
}

// closeAll ends every subscription, and refuses later ones: the loop is
// closed.
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		h.dropLocked(s)
	}
}

// dropAll ends every subscription; the subscribers catch up from the store
// as they subscribe again.
func (h *hub) dropAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		h.dropLocked(s)
	}
}

func (h *hub) remove(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		h.dropLocked(s)
	}
}

// catchUp sends s the events after since up to live, from memory or the
// store, then the live ones held meanwhile, then leaves s to the hub. On a
// failed read or the end of ctx the channel is closed: the subscriber may
// subscribe again.
func (h *hub) catchUp(ctx context.Context, s *sub, since, live int64) {
	sent := since
	ok := true
	send := func(e arbiter.Event) {
		if e.Seq <= sent {
			return
		}
		select {
		case s.ch <- e:
			sent = e.Seq
		case <-ctx.Done():
			ok = false
		}
	}
	var buf []arbiter.Event
	for ok && sent < live {
		evs, err := h.read(ctx, buf[:0], sent, live, catchUpPage)
		if err != nil {
			ok = false
			break
		}
		if len(evs) == 0 {
			break // trimmed by age: nothing more is stored
		}
		buf = evs
		for _, e := range evs {
			if !ok {
				break
			}
			send(e)
		}
	}
	for {
		h.mu.Lock()
		if !ok && !s.gone {
			h.dropLocked(s)
		}
		if s.gone {
			h.mu.Unlock()
			close(s.ch)
			return
		}
		held := s.held
		s.held = nil
		if len(held) == 0 {
			s.catching = false // every live event from now on is past sent
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		for _, e := range held {
			if !ok {
				break
			}
			send(e)
		}
	}
}

// catchUpPage is how many events a catch-up reads at a time.
const catchUpPage = 1000

// read appends to dst up to limit events with since < Seq <= upTo, in
// order: from the recent events once they reach back far enough, from the
// store before that, a page at a time. Fewer come when the store holds
// no more of them: trimmed by age.
func (h *hub) read(ctx context.Context, dst []arbiter.Event, since, upTo int64, limit int) ([]arbiter.Event, error) {
	for left := limit; left > 0 && since < upTo; {
		h.mu.Lock()
		out, ok := h.recent.after(dst, since, upTo, left)
		h.mu.Unlock()
		if ok {
			return out, nil
		}
		evs, err := h.store.Events(ctx, since, min(left, catchUpPage))
		if err != nil {
			return dst, err
		}
		n := len(dst)
		for _, e := range evs {
			if e.Seq > upTo {
				break
			}
			dst = append(dst, e)
		}
		if len(dst) == n {
			break // trimmed by age: nothing more is stored
		}
		since, left = dst[len(dst)-1].Seq, left-(len(dst)-n)
	}
	return dst, nil
}

// Events returns up to limit of the events committed when it is called
// with Seq > since, in order and without gaps (events trimmed from the
// store by age are skipped): recent ones from memory, older ones from
// the store. For a reader that wants what is there now, it spares a
// subscription and its buffer. Errors: the store's, and ctx's while it
// reads the store.
func (l *Loop) Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error) {
	upTo := l.LastSeq()
	if since >= upTo || limit <= 0 {
		return nil, nil
	}
	out := make([]arbiter.Event, 0, min(int64(limit), upTo-since)) // at most one per seq
	out, err := l.hub.read(ctx, out, since, upTo, limit)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LastSeq is the sequence number of the last committed event.
func (l *Loop) LastSeq() int64 {
	l.hub.mu.Lock()
	defer l.hub.mu.Unlock()
	return l.hub.last
}

// Subscribe returns committed events with Seq > since: first those already
// stored, then live ones, in order and without gaps (events trimmed from the
// store by age are skipped). The channel closes when ctx ends, when the loop
// closes, or when the subscriber lags more than a few thousand events.
// Errors: ErrClosed once the loop is closed. Live events of a batch arrive together: once one of them is received,
// LastSeq returns at least the seq of the batch's last, and the rest of
// the batch is in the channel (while catching up from the store, events
// are sent one at a time).
func (l *Loop) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	return l.subscribe(ctx, since, nil)
}

// SubscribeWhile is Subscribe for a follower that needs events only at
// times, such as while a client watches for changes: a batch committed
// while wanted reports false is skipped without waking the subscriber, so
// its events never arrive (those already stored before since are sent as
// by Subscribe). wanted is called once per committed batch with the loop's
// locks held: it must be quick, such as an atomic load, and must not call
// the loop. A batch committed after wanted starts to report true is sent.
func (l *Loop) SubscribeWhile(ctx context.Context, since int64, wanted func() bool) (<-chan arbiter.Event, error) {
	return l.subscribe(ctx, since, wanted)
}

func (l *Loop) subscribe(ctx context.Context, since int64, wanted func() bool) (<-chan arbiter.Event, error) {
	h := l.hub
	h.mu.Lock()
	if h.closed {
		// The loop closed (a step-down, the server stopping): nothing will
		// be published, and a subscription kept would keep the loop. An
		// error, not a closed channel, which reads as "fell behind,
		// subscribe again": a follower would spin.
		h.mu.Unlock()
		return nil, ErrClosed
	}
	s := &sub{ch: make(chan arbiter.Event, subBuffer), after: since, wanted: wanted}
	live := h.last
	s.catching = since < live
	h.subs[s] = struct{}{}
	// Under h.mu, so that a drop — which calls stop — finds it set. A ctx
	// already done runs remove on its own goroutine, after this unlocks.
	s.stop = context.AfterFunc(ctx, func() { h.remove(s) })
	h.mu.Unlock()
	if s.catching {
		go h.catchUp(ctx, s, since, live)
	}
	return s.ch, nil
}

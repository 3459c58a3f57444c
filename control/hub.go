package control

import (
	"context"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// hub fans committed events out to live subscribers. Publishing never blocks
// the loop: a subscriber whose buffer is full is dropped and may resubscribe
// from the last sequence number it saw.
type hub struct {
	store arbiter.Store

	mu   sync.Mutex
	last int64 // seq of the last published event
	subs map[*sub]struct{}
}

type sub struct {
	ch chan arbiter.Event
}

// subBuffer is how many events a subscriber may lag before it is dropped.
const subBuffer = 4096

func newHub(s arbiter.Store) *hub { return &hub{store: s, subs: make(map[*sub]struct{})} }

func (h *hub) setLast(seq int64) {
	h.mu.Lock()
	h.last = seq
	h.mu.Unlock()
}

func (h *hub) publish(evs []arbiter.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = evs[len(evs)-1].Seq
	for s := range h.subs {
		for _, e := range evs {
			select {
			case s.ch <- e:
			default:
				close(s.ch)
				delete(h.subs, s)
				goto next
			}
		}
	next:
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		close(s.ch)
		delete(h.subs, s)
	}
}

func (h *hub) remove(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		close(s.ch)
		delete(h.subs, s)
	}
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
func (l *Loop) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	h := l.hub
	s := &sub{ch: make(chan arbiter.Event, subBuffer)}
	h.mu.Lock()
	live := h.last
	h.subs[s] = struct{}{}
	h.mu.Unlock()

	out := make(chan arbiter.Event)
	go func() {
		defer close(out)
		defer h.remove(s)
		sent := since
		send := func(e arbiter.Event) bool {
			if e.Seq <= sent {
				return true
			}
			select {
			case out <- e:
				sent = e.Seq
				return true
			case <-ctx.Done():
				return false
			}
		}
		// Catch up from the store on what was committed before subscribing.
		for sent < live {
			evs, err := h.store.Events(ctx, sent, 1000)
			if err != nil {
				return // the subscriber sees the close and may retry
			}
			if len(evs) == 0 {
				break
			}
			for _, e := range evs {
				if e.Seq > live {
					break
				}
				if !send(e) {
					return
				}
			}
			if evs[len(evs)-1].Seq >= live {
				break
			}
		}
		sent = max(sent, live)
		for {
			select {
			case e, ok := <-s.ch:
				if !ok || !send(e) {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

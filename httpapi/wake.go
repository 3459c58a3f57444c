package httpapi

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// eventWake wakes long-polls when an event of theirs is committed. One
// subscription (the pump) serves every waiter of its kind while there are
// waiters: a subscription each would give each its own buffer of a few
// thousand events — a thousand agents' orders and swap claims, a thousand
// buffers — and wake every one of them at every commit. keyOf says whose
// an event is ("" for nobody's); set it before the first wait.
type eventWake struct {
	keyOf func(ev *arbiter.Event) string

	mu      sync.Mutex
	gen     int                // the pump running, 0 for none
	pumps   int                // pumps started, numbering them
	stop    context.CancelFunc // ends it
	from    int64              // it has seen every event after this
	last    map[string]int64   // per key, its last event's seq
	waiters map[string]map[chan bool]struct{}
}

// wakeMachine: the orders long-polls wait for events about their machine
// ("machine/NAME…").
func wakeMachine(ev *arbiter.Event) string {
	name, ok := strings.CutPrefix(ev.Subject, "machine/")
	if !ok {
		return ""
	}
	name, _, _ = strings.Cut(name, "/")
	return name
}

// wakeSwapClaim: an agent's claim waits for a swap pending on its machine.
func wakeSwapClaim(ev *arbiter.Event) string {
	if ev.Kind != arbiter.EventSwapPending {
		return ""
	}
	var p struct {
		Machine string `json:"machine"`
	}
	if json.Unmarshal(ev.Data, &p) != nil {
		return ""
	}
	return p.Machine
}

// wakeAllocation: a wait for an allocation waits for its events.
func wakeAllocation(ev *arbiter.Event) string {
	if strings.HasPrefix(ev.Subject, "allocation/") {
		return ev.Subject
	}
	return ""
}

// wait returns once an event whose key is key with Seq > since is
// committed (true), or ctx ends. It returns false at once when it cannot
// tell (since is older than what the pump has seen), and when the pump
// ends (the plane closed): a spurious wake-up costs the waiter one look, a
// missed one a delay. A waiter told false more than a few times running
// should stop waiting: the plane may be closed.
func (m *eventWake) wait(ctx context.Context, p Plane, key string, since int64) bool {
	ch := make(chan bool, 1)
	m.mu.Lock()
	if m.gen == 0 {
		if m.last == nil {
			m.last = map[string]int64{}
			m.waiters = map[string]map[chan bool]struct{}{}
		}
		var pctx context.Context
		pctx, m.stop = context.WithCancel(context.Background())
		m.pumps++
		m.gen = m.pumps
		m.from = p.LastSeq()
		go m.pump(pctx, p, m.gen, m.from)
	}
	if since < m.from {
		m.mu.Unlock()
		return false
	}
	if m.last[key] > since {
		m.mu.Unlock()
		return true
	}
	ws := m.waiters[key]
	if ws == nil {
		ws = map[chan bool]struct{}{}
		m.waiters[key] = ws
	}
	ws[ch] = struct{}{}
	m.mu.Unlock()
	select {
	case woken := <-ch:
		return woken
	case <-ctx.Done():
		m.mu.Lock()
		delete(m.waiters[key], ch)
		if len(m.waiters[key]) == 0 {
			delete(m.waiters, key)
		}
		m.idleLocked()
		m.mu.Unlock()
		return false
	}
}

// idleLocked ends the pump when nobody waits any more: a subscription
// kept without waiters would be woken at every commit for nothing.
func (m *eventWake) idleLocked() {
	if len(m.waiters) == 0 && m.gen != 0 {
		m.stop()
		m.gen = 0
	}
}

// pump follows the events from from until its subscription ends (no
// waiter left, the plane closed, or it fell behind), waking the waiters of
// each event's key. At its end, if it is still the pump, it tells every
// waiter false, and the next wait starts a new one. The keys' last seqs are
// kept for waiters to come, and dropped when they grow past maxWakeKeys (a
// waiter then looks once more).
func (m *eventWake) pump(ctx context.Context, p Plane, gen int, from int64) {
	ch, err := p.Subscribe(ctx, from)
	if err == nil {
		for ev := range ch {
			key := m.keyOf(&ev)
			if key == "" {
				continue
			}
			m.mu.Lock()
			if m.gen != gen {
				m.mu.Unlock()
				break // another pump serves the waiters now
			}
			if len(m.last) >= maxWakeKeys {
				clear(m.last)
				m.from = ev.Seq - 1 // what was forgotten makes waits return at once
			}
			m.last[key] = ev.Seq
			for w := range m.waiters[key] {
				w <- true // its own buffer: never blocks
			}
			delete(m.waiters, key)
			m.idleLocked()
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen {
		return
	}
	m.stop()
	m.gen = 0
	for key, ws := range m.waiters {
		for w := range ws {
			w <- false
		}
		delete(m.waiters, key)
	}
}

// maxWakeKeys bounds the keys whose last event an eventWake remembers.
const maxWakeKeys = 100000

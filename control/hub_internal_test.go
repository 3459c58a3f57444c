package control

import (
	"bytes"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// TestRecentBounds: the recent events keep the last recentEvents of them
// and at most recentBytes, say which they hold, and hand out a range of
// them in order.
func TestRecentBounds(t *testing.T) {
	var r recent
	r.reset(10)
	ev := func(seq int64, size int) arbiter.Event {
		return arbiter.Event{Seq: seq, Kind: "k", Data: bytes.Repeat([]byte("x"), size)}
	}
	if _, ok := r.after(nil, 9, 20, 100); ok {
		t.Fatal("events before the start are said to be held")
	}
	var evs []arbiter.Event
	for seq := int64(11); seq <= 10+recentEvents+5; seq++ {
		evs = append(evs, ev(seq, 10))
	}
	r.add(evs)
	last := int64(10 + recentEvents + 5)
	if r.n != recentEvents || r.from != 15 {
		t.Fatalf("%d events from %d, want %d from 15", r.n, r.from, recentEvents)
	}
	if _, ok := r.after(nil, 14, last, 10); ok {
		t.Fatal("a dropped event is said to be held")
	}
	got, ok := r.after(nil, 15, last, 3)
	if !ok || len(got) != 3 || got[0].Seq != 16 || got[2].Seq != 18 {
		t.Fatalf("after 15, 3 of them: %v %v", ok, seqs(got))
	}
	got, _ = r.after(got[:0], last-2, last-1, 10)
	if len(got) != 1 || got[0].Seq != last-1 {
		t.Fatalf("after %d up to %d: %v", last-2, last-1, seqs(got))
	}
	if got, ok := r.after(nil, last, last, 10); !ok || len(got) != 0 {
		t.Fatalf("after the last: %v %v", ok, seqs(got))
	}

	// Bytes: a large event pushes out older ones; one larger than the
	// bound pushes out all and is not kept.
	r.add([]arbiter.Event{ev(last+1, recentBytes/2)})
	if r.bytes > recentBytes || r.from == 15 {
		t.Fatalf("%d bytes from %d", r.bytes, r.from)
	}
	r.add([]arbiter.Event{ev(last+2, recentBytes)})
	if r.n != 0 || r.bytes != 0 || r.from != last+2 {
		t.Fatalf("after an event past the bound: %d events, %d bytes, from %d", r.n, r.bytes, r.from)
	}
	r.add([]arbiter.Event{ev(last+3, 1)})
	if got, ok := r.after(nil, last+2, last+3, 10); !ok || len(got) != 1 {
		t.Fatalf("the event after: %v %v", ok, seqs(got))
	}
}

func seqs(evs []arbiter.Event) []int64 {
	var s []int64
	for _, e := range evs {
		s = append(s, e.Seq)
	}
	return s
}

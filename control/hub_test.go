package control_test

import (
	"context"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/clock"
)

// receive reads events from ch until it has the one with seq upTo and
// checks that they come in order without gaps or repeats after since.
func receive(t testing.TB, ch <-chan arbiter.Event, since, upTo int64) {
	t.Helper()
	last := since
	for last < upTo {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("closed at seq %d of %d", last, upTo)
			}
			if e.Seq != last+1 {
				t.Fatalf("got seq %d after %d: a gap or a repeat", e.Seq, last)
			}
			last = e.Seq
		case <-time.After(5 * time.Second):
			t.Fatalf("stuck at seq %d of %d", last, upTo)
		}
	}
}

// openMachine opens a loop with one machine of four GPUs.
func openMachine(t testing.TB) *fixture {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 4)}})
	return f
}

// allocate makes and releases one allocation: a few events.
func allocate(t testing.TB, f *fixture) {
	t.Helper()
	a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}).(arbiter.Allocation)
	do(t, f.loop, arbiter.Release{ID: a.ID})
}

// reopen closes f's loop and opens another on its store: the events
// committed so far are in the store only, not among the new loop's recent
// events, so a subscriber from before them is caught up from the store.
func reopen(t testing.TB, f *fixture) *fixture {
	t.Helper()
	f.close()
	return open(t, f.path, f.clk)
}

// TestSubscribeHoldsLiveEventsWhileCatchingUp: batches committed while a
// subscriber's stored events are still being read reach it after them, in
// order, and then it follows live.
func TestSubscribeHoldsLiveEventsWhileCatchingUp(t *testing.T) {
	f := openMachine(t)
	for range 5 {
		allocate(t, f)
	}
	f = reopen(t, f)
	hold := make(chan struct{})
	f.store.eventsGate.Store(&hold)
	ch, err := f.loop.Subscribe(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		allocate(t, f) // published while the catch-up waits on the store
	}
	close(hold)
	receive(t, ch, 0, f.loop.LastSeq())
	from := f.loop.LastSeq()
	allocate(t, f)
	receive(t, ch, from, f.loop.LastSeq())
}

// TestSubscribeWhileSkipsUnwantedBatches: batches committed while the
// subscriber does not want them never arrive; those after it does, do.
func TestSubscribeWhileSkipsUnwantedBatches(t *testing.T) {
	f := openMachine(t)
	var want atomic.Bool
	ch, err := f.loop.SubscribeWhile(t.Context(), f.loop.LastSeq(), want.Load)
	if err != nil {
		t.Fatal(err)
	}
	allocate(t, f)
	if len(ch) != 0 {
		t.Fatalf("%d events of unwanted batches arrived", len(ch))
	}
	want.Store(true)
	from := f.loop.LastSeq()
	allocate(t, f)
	receive(t, ch, from, f.loop.LastSeq())
}

// TestSubscriptionsEnd: a subscription's channel closes when its ctx ends
// (while catching up, too), when the store cannot be read for the
// catch-up, and when the loop closes.
func TestSubscriptionsEnd(t *testing.T) {
	f := openMachine(t)
	allocate(t, f)
	f = reopen(t, f)
	closes := func(name string, ch <-chan arbiter.Event) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-deadline:
				t.Fatalf("%s: the channel did not close", name)
			}
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	live, _ := f.loop.Subscribe(ctx, f.loop.LastSeq())
	hold := make(chan struct{})
	f.store.eventsGate.Store(&hold)
	catching, _ := f.loop.Subscribe(ctx, 0)
	allocate(t, f)
	cancel()
	closes("live, ctx ended", live)
	close(hold)
	closes("catching up, ctx ended", catching)

	f.store.failEvents.Store(true)
	failed, _ := f.loop.Subscribe(t.Context(), 0)
	closes("store unreadable", failed)
	f.store.failEvents.Store(false)

	open, _ := f.loop.Subscribe(t.Context(), f.loop.LastSeq())
	f.loop.Close()
	closes("loop closed", open)
}

// TestLiveSubscribersNeedNoGoroutine: a subscriber that starts from the
// last event is fed by the publisher itself, so a commit wakes only the
// subscriber; no goroutine per subscription stands between them.
func TestLiveSubscribersNeedNoGoroutine(t *testing.T) {
	f := openMachine(t)
	before := runtime.NumGoroutine()
	const n = 50
	chs := make([]<-chan arbiter.Event, n)
	for i := range chs {
		chs[i], _ = f.loop.Subscribe(t.Context(), f.loop.LastSeq())
	}
	if after := runtime.NumGoroutine(); after-before >= n {
		t.Fatalf("%d goroutines more for %d subscriptions", after-before, n)
	}
	from := f.loop.LastSeq()
	allocate(t, f)
	for _, ch := range chs {
		receive(t, ch, from, f.loop.LastSeq())
	}
}

// TestLaggingSubscriberIsDropped: a subscriber that does not read is
// dropped once its buffer is full, while catching up too; the loop never
// waits for it.
func TestLaggingSubscriberIsDropped(t *testing.T) {
	f := openMachine(t)
	allocate(t, f)
	f = reopen(t, f)
	live, _ := f.loop.Subscribe(t.Context(), f.loop.LastSeq())
	hold := make(chan struct{})
	f.store.eventsGate.Store(&hold)
	catching, _ := f.loop.Subscribe(t.Context(), 0)
	for f.loop.LastSeq() < 4200 {
		allocate(t, f)
	}
	close(hold)
	for name, ch := range map[string]<-chan arbiter.Event{"live": live, "catching up": catching} {
		n := 0
		for range ch {
			n++
		}
		if n > 4096+10 {
			t.Fatalf("%s: %d events before the close", name, n)
		}
	}
}

// TestCatchUpFromMemory: a subscriber from an event the loop published
// itself is caught up from memory, the store never read; one from before
// the loop's start reads the store up to there and the rest from memory.
func TestCatchUpFromMemory(t *testing.T) {
	f := openMachine(t)
	for range 5 {
		allocate(t, f)
	}
	f.store.failEvents.Store(true) // a read would close the channel
	for _, since := range []int64{0, f.loop.LastSeq() - 3} {
		ch, _ := f.loop.Subscribe(t.Context(), since)
		receive(t, ch, since, f.loop.LastSeq())
	}
	if n := f.store.eventReads.Load(); n != 0 {
		t.Fatalf("%d reads of the store", n)
	}
	f.store.failEvents.Store(false)

	stored := f.loop.LastSeq()
	f = reopen(t, f)
	for range 5 {
		allocate(t, f)
	}
	ch, _ := f.loop.Subscribe(t.Context(), 0)
	receive(t, ch, 0, f.loop.LastSeq())
	if n := f.store.eventReads.Load(); n != 1 {
		t.Fatalf("%d reads of the store for the %d events stored before the start, want 1", n, stored)
	}
}

// TestEvents: Events returns what is committed after since, at most
// limit, in order: from memory for events the loop published (the store
// unreadable meanwhile), from the store for those from before its start.
func TestEvents(t *testing.T) {
	f := openMachine(t)
	for range 5 {
		allocate(t, f)
	}
	check := func(since int64, limit int, want int64) {
		t.Helper()
		evs, err := f.loop.Events(t.Context(), since, limit)
		if err != nil {
			t.Fatalf("Events(%d, %d): %v", since, limit, err)
		}
		if int64(len(evs)) != want-since {
			t.Fatalf("Events(%d, %d): %d events, want those up to %d", since, limit, len(evs), want)
		}
		for i, e := range evs {
			if e.Seq != since+int64(i)+1 {
				t.Fatalf("Events(%d, %d): seq %d at %d", since, limit, e.Seq, i)
			}
		}
	}
	last := f.loop.LastSeq()
	f.store.failEvents.Store(true) // a read would fail
	check(0, 1000, last)
	check(2, 3, 5)
	check(last, 10, last)
	f.store.failEvents.Store(false)

	f = reopen(t, f)
	for range 2 {
		allocate(t, f)
	}
	check(0, 1000, f.loop.LastSeq())
	check(last-1, 3, last+2) // across the start
	f.store.failEvents.Store(true)
	if _, err := f.loop.Events(t.Context(), 0, 10); err == nil {
		t.Fatal("no error from a store that cannot be read")
	}
}

// BenchmarkCatchUp: a subscriber that reads the last 150 events, from
// the loop's recent events and from the store, and Events reading them
// from memory (the dashboard's events panel does, each time it is drawn).
func BenchmarkCatchUp(b *testing.B) {
	for _, how := range []string{"events", "memory", "store"} {
		b.Run(how, func(b *testing.B) {
			f := openMachine(b)
			for f.loop.LastSeq() < 300 {
				allocate(b, f)
			}
			if how == "store" {
				f = reopen(b, f)
			}
			last := f.loop.LastSeq()
			b.ResetTimer()
			for range b.N {
				if how == "events" {
					if evs, err := f.loop.Events(b.Context(), last-150, 150); err != nil || len(evs) != 150 {
						b.Fatalf("%d events, %v", len(evs), err)
					}
					continue
				}
				ctx, cancel := context.WithCancel(b.Context())
				ch, _ := f.loop.Subscribe(ctx, last-150)
				receive(b, ch, last-150, last)
				cancel()
			}
		})
	}
}

// TestSubscribeAfterCloseEnds: a subscription taken after the loop closed
// (a long-poll racing a step-down) is closed at once, rather than kept
// open for ever with the closed loop behind it.
func TestSubscribeAfterCloseEnds(t *testing.T) {
	f := openMachine(t)
	allocate(t, f)
	f.loop.Close()
	ch, err := f.loop.Subscribe(t.Context(), f.loop.LastSeq())
	if err != nil {
		return // refusing is a fine answer too
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("an event from a closed loop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a subscription taken after Close did not close")
	}
}

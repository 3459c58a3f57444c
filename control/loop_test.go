package control_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/engine"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/spalloc"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// flaky wraps a store and fails saves while fail is set, and loads while
// failLoad is; it counts the reads of stored events. A gate, once set,
// holds the next save until the test says how it ends.
type flaky struct {
	arbiter.Store
	fail     atomic.Bool
	failLoad atomic.Bool
	// failAfter saves, then reports an error it cannot tell about
	// (arbiter.ErrSaveUnknown): the change took effect. failUnsure
	// reports such an error without saving; failOther saves another
	// change with the same event seqs instead (another leader's).
	failAfter  atomic.Bool
	failUnsure atomic.Bool
	failOther  atomic.Bool
	saves      atomic.Int64
	loads      atomic.Int64
	gate       atomic.Pointer[gate]
	// eventsGate, once set, holds reads of stored events until it closes;
	// failEvents fails them.
	eventsGate atomic.Pointer[chan struct{}]
	failEvents atomic.Bool
	eventReads atomic.Int64
}

func (f *flaky) Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error) {
	f.eventReads.Add(1)
	if g := f.eventsGate.Load(); g != nil {
		<-*g
	}
	if f.failEvents.Load() {
		return nil, errors.New("disk gone")
	}
	return f.Store.Events(ctx, since, limit)
}

func (f *flaky) Load(ctx context.Context) (*arbiter.State, error) {
	f.loads.Add(1)
	if f.failLoad.Load() {
		return nil, errors.New("disk gone")
	}
	return f.Store.Load(ctx)
}

type gate struct {
	entered chan struct{} // closed when the save starts
	result  chan error    // the save's outcome (nil: save for real)
}

// holdNextSave sets a gate on the next save and returns it.
func (f *flaky) holdNextSave() *gate {
	g := &gate{entered: make(chan struct{}), result: make(chan error)}
	f.gate.Store(g)
	return g
}

func (f *flaky) Save(ctx context.Context, c *arbiter.Changes) error {
	if g := f.gate.Swap(nil); g != nil {
		close(g.entered)
		if err := <-g.result; err != nil {
			return err
		}
	}
	if f.fail.Load() {
		return errors.New("disk on fire")
	}
	f.saves.Add(1)
	switch {
	case f.failAfter.Load():
		if err := f.Store.Save(ctx, c); err != nil {
			return err
		}
		return arbiter.SaveUnknown(errors.New("the answer was lost"))
	case f.failUnsure.Load():
		return arbiter.SaveUnknown(errors.New("the answer was lost"))
	case f.failOther.Load():
		other := *c
		other.Events = slices.Clone(c.Events)
		for i := range other.Events {
			other.Events[i].Subject = "allocation/999"
		}
		if err := f.Store.Save(ctx, &other); err != nil {
			return err
		}
		return arbiter.SaveUnknown(errors.New("the answer was lost"))
	}
	return f.Store.Save(ctx, c)
}

type fixture struct {
	path  string
	store *flaky
	clk   *clock.Fake
	loop  *control.Loop
}

func open(t testing.TB, path string, clk *clock.Fake) *fixture {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{path: path, store: &flaky{Store: st}, clk: clk}
	f.loop, err = control.Open(t.Context(), control.Options{Store: f.store, Now: clk.Now, Engine: engine.Config{HeartbeatTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.close() })
	return f
}

// storedState is what the store at path holds, read by a store opened
// afresh (the fixture's is closed).
func storedState(t *testing.T, path string) *arbiter.State {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	state, err := st.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return state
}

func (f *fixture) close() {
	f.loop.Close()
	f.store.Close()
}

func machine(name string, n int) arbiter.Machine {
	m := arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{}}
	for i := 0; i < n; i++ {
		m.GPUs = append(m.GPUs, arbiter.GPU{Index: i, UUID: fmt.Sprintf("%s-%d", name, i), Model: "H100", VRAMGiB: 80, Compute: "9.0", Healthy: true})
	}
	return m
}

func ka(s float64) *float64 { return &s }

func do(t testing.TB, l *control.Loop, cmd arbiter.Command) any {
	t.Helper()
	res, err := l.Do(t.Context(), cmd)
	if err != nil {
		t.Fatalf("%T: %v", cmd, err)
	}
	return res
}

func TestAllocatePersistsAndSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, path, clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 8), machine("b", 8)}})
	a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 3, KeepaliveS: ka(30)}}).(arbiter.Allocation)
	// The view shows it as soon as Do returned.
	got, ok := f.loop.Allocation(a.ID)
	if !ok || got.State != arbiter.StateReady {
		t.Fatalf("view: %+v %v, want ready", got, ok)
	}
	ms := f.loop.Machines()
	if len(ms) != 2 || ms[0].Free != 5 || ms[0].Devices[0].Allocation == nil || *ms[0].Devices[0].Allocation != a.ID {
		t.Fatalf("machines view: %+v", ms[0])
	}
	f.close()

	clk.Advance(time.Hour)
	f2 := open(t, path, clk)
	got, ok = f2.loop.Allocation(a.ID)
	if !ok || got.State != arbiter.StateReady || len(got.Devices) != 3 || !got.ExpiresAt.Equal(clk.Now().Add(30*time.Second)) {
		t.Fatalf("after restart: %+v, want ready with 3 GPUs and a fresh keepalive", got)
	}
	b := do(t, f2.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}).(arbiter.Allocation)
	if b.ID != a.ID+1 {
		t.Fatalf("next id %d, want %d", b.ID, a.ID+1)
	}
}

// TestPostAppliesWithoutWaiting: a posted keepalive is applied (the view
// shows the new expiry) though nobody waits for it, and Post after Close
// returns at once.
func TestPostAppliesWithoutWaiting(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 1)}})
	a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1, KeepaliveS: ka(10)}}).(arbiter.Allocation)
	clk.Advance(5 * time.Second)
	f.loop.Post(arbiter.Keepalive{ID: a.ID})
	want := clk.Now().Add(10 * time.Second)
	poll.Until(t, 5*time.Second, "the posted keepalive applied", func() bool {
		got, ok := f.loop.Allocation(a.ID)
		return ok && got.ExpiresAt != nil && got.ExpiresAt.Equal(want)
	})
	f.loop.Close()
	f.loop.Post(arbiter.Keepalive{ID: a.ID})
}

func TestKeepaliveExpiresOnTimer(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 1)}})
	a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1, KeepaliveS: ka(10)}}).(arbiter.Allocation)
	saves := f.store.saves.Load()
	clk.Advance(5 * time.Second)
	do(t, f.loop, arbiter.Keepalive{ID: a.ID})
	if f.store.saves.Load() != saves {
		t.Fatal("a keepalive wrote to the store")
	}
	clk.Advance(11 * time.Second)
	f.loop.Wake()
	poll.Until(t, 5*time.Second, "the allocation destroyed on its timer", func() bool { g, _ := f.loop.Allocation(a.ID); return g.State == arbiter.StateDestroyed })
	g, _ := f.loop.Allocation(a.ID)
	if *g.Reason != "keepalive expired" {
		t.Fatalf("reason %q", *g.Reason)
	}
}

func TestFailedSaveAnswersErrorAndReloads(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	f.store.fail.Store(true)
	_, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2}})
	if arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("got %v, want unavailable", err)
	}
	f.store.fail.Store(false)
	if n := len(f.loop.Allocations(arbiter.AllocationFilter{})); n != 0 {
		t.Fatalf("view shows %d allocations from a failed save", n)
	}
	// Memory was reloaded: the GPUs the failed batch took are free again,
	// and the id it consumed is not skipped.
	a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2}}).(arbiter.Allocation)
	if a.State != arbiter.StateReady || a.ID != 1 {
		t.Fatalf("after reload: %+v, want ready with id 1", a)
	}
}

// TestFailedSaveThatTookEffect: a save whose change took effect though the
// store reported an error is not answered "nothing was changed, retry"
// (a retry would do it twice): the reloaded state holds it, so the caller
// gets its answer, and a subscriber its events.
func TestFailedSaveThatTookEffect(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := f.loop.Subscribe(ctx, f.loop.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	f.store.failAfter.Store(true)
	res, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2}})
	f.store.failAfter.Store(false)
	a, _ := res.(arbiter.Allocation)
	if err != nil || a.ID != 1 || a.State != arbiter.StateReady {
		t.Fatalf("got %+v, %v; want the allocation the save made", res, err)
	}
	if as := f.loop.Allocations(arbiter.AllocationFilter{}); len(as) != 1 || as[0].State != arbiter.StateReady {
		t.Fatalf("after the reload: %+v, want the one allocation the save made", as)
	}
	select {
	case ev := <-ch:
		if ev.Kind != arbiter.EventAllocationReady || ev.Seq > f.loop.LastSeq() {
			t.Fatalf("first event after the save: %s, seq %d (LastSeq %d)", ev.Kind, ev.Seq, f.loop.LastSeq())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a subscriber got no event of the batch saved after all")
	}
}

// TestFailedSaveOfUnknownOutcome: a save the store cannot tell about
// (arbiter.ErrSaveUnknown) whose batch the reloaded store does not hold —
// not at all, or only another leader's events of the same seqs — is
// answered "may or may not have been saved", never "nothing was changed,
// retry", nor as saved; an error the store is sure of is "nothing was
// changed".
func TestFailedSaveOfUnknownOutcome(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	for _, mode := range []*atomic.Bool{&f.store.failUnsure, &f.store.failOther} {
		mode.Store(true)
		_, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
		mode.Store(false)
		if msg := arbiter.ErrorMessage(err); arbiter.ErrorCode(err) != arbiter.EUnavailable || !strings.Contains(msg, "may or may not have been saved") {
			t.Fatalf("a save of unknown outcome answered %v, want unavailable, may or may not", err)
		}
	}
	f.store.fail.Store(true)
	_, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	f.store.fail.Store(false)
	if msg := arbiter.ErrorMessage(err); !strings.Contains(msg, "nothing was changed, retry") {
		t.Fatalf("a save that certainly failed answered %v, want nothing was changed", err)
	}
}

// TestCloseWhileTheStoreStaysDown: after a failed save the loop reloads
// from the store until it can; a store that stays down must not keep Close
// (and so the server's shutdown) waiting, and the caller hears of it.
func TestCloseWhileTheStoreStaysDown(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	f.store.fail.Store(true)
	f.store.failLoad.Store(true)
	t.Cleanup(func() { f.store.failLoad.Store(false) }) // a failed test does not hang in f.close
	loads := f.store.loads.Load()
	answered := make(chan error, 1)
	go func() {
		_, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
		answered <- err
	}()
	poll.Until(t, 5*time.Second, "a reload", func() bool { return f.store.loads.Load() > loads })
	closed := make(chan struct{})
	go func() { f.loop.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits for a store that stays down")
	}
	if err := <-answered; err == nil {
		t.Fatal("the command whose save failed was answered without an error")
	}
	if _, err := f.loop.Do(context.Background(), arbiter.Keepalive{ID: 1}); !errors.Is(err, control.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestStoreDownAnswersAtOnce: a save fails and the state cannot be read
// back (a full disk): the batch's caller is answered at once, not when the
// store recovers; new commands are refused meanwhile rather than waiting
// without end, and Trouble says why; once the store reads again, all is as
// before.
func TestStoreDownAnswersAtOnce(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	f.store.fail.Store(true)
	f.store.failLoad.Store(true)
	t.Cleanup(func() { f.store.failLoad.Store(false) })
	if _, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}); err == nil ||
		!strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("the failed save's caller: %v", err)
	}
	if f.loop.Trouble() == "" {
		t.Fatal("no trouble told while the store cannot be read")
	}
	_, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	if arbiter.ErrorCode(err) != arbiter.EUnavailable || !strings.Contains(err.Error(), "nothing was done; retry once it recovers") {
		t.Fatalf("a command while the store is down: %v", err)
	}
	f.store.fail.Store(false)
	f.store.failLoad.Store(false)
	poll.Until(t, 10*time.Second, "the reload", func() bool { return f.loop.Trouble() == "" })
	if a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}).(arbiter.Allocation); a.ID != 1 || a.State != arbiter.StateReady {
		t.Fatalf("after the store came back: %+v", a)
	}
}

// TestSaveFailureFailsWhatWasAppliedOnTop: callers that arrive while a batch
// is being written are applied on top of it in memory; when that write fails
// they fail with it (or, arriving after, succeed on the reloaded state), and
// what every caller was told matches what the store holds.
func TestSaveFailureFailsWhatWasAppliedOnTop(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "a.db")
	f := open(t, path, clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 8)}})
	g := f.store.holdNextSave()
	first := make(chan error, 1)
	go func() {
		_, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "first", GPUs: 1}})
		first <- err
	}()
	<-g.entered
	type result struct {
		id  int64
		err error
	}
	const n = 6
	results := make(chan result, n)
	for i := 0; i < n; i++ {
		go func() {
			res, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "later", GPUs: 1}})
			if err != nil {
				results <- result{err: err}
				return
			}
			results <- result{id: res.(arbiter.Allocation).ID}
		}()
	}
	g.result <- errors.New("disk on fire")
	if err := <-first; arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("the failed batch's caller got %v, want unavailable", err)
	}
	told := map[int64]bool{}
	for i := 0; i < n; i++ {
		r := <-results
		switch {
		case r.err == nil:
			told[r.id] = true
		case arbiter.ErrorCode(r.err) != arbiter.EUnavailable:
			t.Fatalf("a later caller got %v, want success or unavailable", r.err)
		}
	}
	live := f.loop.Allocations(arbiter.AllocationFilter{})
	f.close()
	state := storedState(t, path)
	stored := map[int64]bool{}
	for _, a := range state.Allocations {
		stored[a.ID] = true
	}
	if len(stored) != len(told) || len(live) != len(told) {
		t.Fatalf("callers were told of %d allocations, the view shows %d, the store holds %d", len(told), len(live), len(stored))
	}
	for id := range told {
		if !stored[id] {
			t.Errorf("allocation %d was acknowledged but not stored", id)
		}
	}
}

func TestGroupCommitBatchesConcurrentCommands(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 64)}})
	before := f.store.saves.Load()
	var wg sync.WaitGroup
	const n = 200
	ids := make(chan int64, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
			if err != nil {
				t.Error(err)
				return
			}
			ids <- res.(arbiter.Allocation).ID
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[int64]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("id %d twice", id)
		}
		seen[id] = true
	}
	saves := f.store.saves.Load() - before
	if saves >= n {
		t.Fatalf("%d saves for %d commands: no group commit", saves, n)
	}
	t.Logf("%d commands in %d transactions", n, saves)
	if got := len(f.loop.Allocations(arbiter.AllocationFilter{State: arbiter.StateReady})); got != 64 {
		t.Fatalf("%d ready, want 64", got)
	}
}

func TestSubscribeCatchesUpThenFollows(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 4)}})
	do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := f.loop.Subscribe(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	receive(t, ch, 0, f.loop.LastSeq()) // hub_test.go
}

func TestCloseAnswersUnavailable(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	f.loop.Close()
	f.loop.Close()
	if _, err := f.loop.Do(t.Context(), arbiter.Tick{}); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("got %v, want unavailable", err)
	}
}

// BenchmarkCommitPath measures allocate + release cycles through the loop
// with every answer durable in SQLite (synchronous=FULL), from 16 concurrent
// callers, so group commit is exercised as the server exercises it.
func BenchmarkCommitPath(b *testing.B) {
	st, err := sqlite.Open(filepath.Join(b.TempDir(), "b.db"), sqlite.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	var batches, cmds atomic.Int64
	l, err := control.Open(context.Background(), control.Options{Store: st, OnCommit: func(n int, _ time.Duration) {
		batches.Add(1)
		cmds.Add(int64(n))
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Do(context.Background(), arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 64), machine("b", 64)}}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(8) // 16 callers on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			res, err := l.Do(ctx, arbiter.Allocate{Request: arbiter.Request{Owner: "bench", GPUs: 1}})
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := l.Do(ctx, arbiter.Release{ID: res.(arbiter.Allocation).ID}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	if n := batches.Load(); n > 0 {
		b.ReportMetric(float64(cmds.Load())/float64(n), "cmds/commit")
	}
}

// TestCloseWaitsForWhatWasApplied: Close during a save (made by the
// caller whose command it carries) waits for it and for the commands
// applied meanwhile; every caller is answered with success and the store
// holds each change.
func TestCloseWaitsForWhatWasApplied(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "a.db")
	f := open(t, path, clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 8)}})
	g := f.store.holdNextSave()
	const n = 4
	errs := make(chan error, n)
	allocate := func() {
		_, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
		errs <- err
	}
	go allocate()
	<-g.entered // the first caller is saving its own batch
	for range n - 1 {
		go allocate()
	}
	poll.Until(t, 5*time.Second, "the later commands applied", func() bool {
		return f.loop.Pending() == n-1
	})
	closed := make(chan struct{})
	go func() {
		f.loop.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a save was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	g.result <- nil
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("a caller applied before Close got %v, want success", err)
		}
	}
	<-closed
	f.store.Close()
	state := storedState(t, path)
	if len(state.Allocations) != n {
		t.Fatalf("the store holds %d allocations, want the %d answered", len(state.Allocations), n)
	}
}

// TestFullBatchMakesCallersWait: with MaxBatch 2 and a save held, callers
// beyond the batch's room wait rather than grow it; all are answered once
// the disk moves, in batches of at most 2.
func TestFullBatchMakesCallersWait(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "a.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fl := &flaky{Store: st}
	var biggest atomic.Int64
	l, err := control.Open(t.Context(), control.Options{Store: fl, Now: clk.Now, MaxBatch: 2, OnCommit: func(n int, _ time.Duration) {
		for {
			b := biggest.Load()
			if int64(n) <= b || biggest.CompareAndSwap(b, int64(n)) {
				return
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	do(t, l, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 8)}})
	g := fl.holdNextSave()
	const n = 6
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := l.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
			errs <- err
		}()
	}
	<-g.entered
	poll.Until(t, 5*time.Second, "a full batch waiting", func() bool { return l.Pending() == 2 })
	g.result <- nil
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if b := biggest.Load(); b > 2 {
		t.Fatalf("a batch of %d commands, want at most MaxBatch 2", b)
	}
}

// TestMixedLoadAgreesWithStore: callers alone and queued, posts, callers
// that give up, and deadline ticks, all at once, then Close: nothing
// hangs, and what the view shows is what the store holds.
func TestMixedLoadAgreesWithStore(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "a.db")
	f := open(t, path, clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 16), machine("b", 16)}})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				ctx, cancel := context.WithCancel(context.Background())
				if (w+i)%7 == 0 {
					cancel() // gives up at once: nothing happens for it
				}
				res, err := f.loop.Do(ctx, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1, KeepaliveS: ka(30)}})
				cancel()
				if err != nil {
					continue
				}
				a := res.(arbiter.Allocation)
				f.loop.Post(arbiter.Keepalive{ID: a.ID})
				if i%3 != 0 {
					if _, err := f.loop.Do(context.Background(), arbiter.Release{ID: a.ID}); err != nil {
						t.Error(err)
						return
					}
				}
				if w == 0 && i%10 == 0 {
					f.loop.Wake()
				}
			}
		}()
	}
	wg.Wait()
	live := map[int64]bool{}
	for _, a := range f.loop.Allocations(arbiter.AllocationFilter{}) {
		if a.Live() {
			live[a.ID] = true
		}
	}
	f.loop.Close()
	f.store.Close()
	state := storedState(t, path)
	stored := map[int64]bool{}
	for _, a := range state.Allocations {
		if a.Live() {
			stored[a.ID] = true
		}
	}
	if !reflect.DeepEqual(live, stored) {
		t.Fatalf("the view shows %d live allocations, the store %d", len(live), len(stored))
	}
	if len(live) == 0 {
		t.Fatal("no allocation left live: the load did not run")
	}
}

// TestReadersSeeStateWithItsEvents: a reader who sees a committed change
// in the view finds its events already published (LastSeq), as the HTTP
// API's event list assumes after a read.
func TestReadersSeeStateWithItsEvents(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 1)}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := f.loop.Subscribe(ctx, f.loop.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	var destroyedAt sync.Map // allocation id → seq of its allocation.destroyed
	go func() {
		for e := range ch {
			if e.Kind == arbiter.EventAllocationDestroyed {
				var id int64
				fmt.Sscanf(e.Subject, "allocation/%d", &id)
				destroyedAt.Store(id, e.Seq)
			}
		}
	}()
	var latest atomic.Int64 // the allocation being made and released
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var stale []string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			checked := int64(0)
			for {
				select {
				case <-done:
					return
				default:
				}
				id := latest.Load()
				if id == checked {
					runtime.Gosched() // the writer shares the CPUs
					continue
				}
				a, ok := f.loop.Allocation(id)
				if !ok || a.State != arbiter.StateDestroyed {
					continue
				}
				last := f.loop.LastSeq() // right after seeing it destroyed
				checked = id
				var seq int64
				if err := poll.Try(5*time.Second, func() error {
					v, ok := destroyedAt.Load(id)
					if !ok {
						return fmt.Errorf("no allocation.destroyed for %d", id)
					}
					seq = v.(int64)
					return nil
				}); err != nil {
					mu.Lock()
					stale = append(stale, err.Error())
					mu.Unlock()
					return
				}
				if last < seq {
					mu.Lock()
					stale = append(stale, fmt.Sprintf("allocation %d seen destroyed with LastSeq %d, before its event %d", id, last, seq))
					mu.Unlock()
				}
			}
		}()
	}
	for range 300 {
		a := do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}).(arbiter.Allocation)
		latest.Store(a.ID)
		do(t, f.loop, arbiter.Release{ID: a.ID})
	}
	close(done)
	wg.Wait()
	if len(stale) > 0 {
		t.Fatalf("%d stale reads, the first: %s", len(stale), stale[0])
	}
}

// TestSubscribersFollowAfterAFailedMissedRead: after a save of unknown
// outcome that the store did take, the reload publishes the events the
// subscribers missed; when that read of the store fails, the subscribers
// are dropped to catch up from the store, and later subscriptions work: the
// loop is still open and committing (a follower such as spalloc's notifier
// does not spin).
func TestSubscribersFollowAfterAFailedMissedRead(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 4)}})
	f.store.failAfter.Store(true)  // the store takes the batch, answers "unknown"
	f.store.failEvents.Store(true) // and cannot read its events for a moment
	_, err := f.loop.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	f.store.failAfter.Store(false)
	f.store.failEvents.Store(false)
	if err == nil {
		t.Log("answered as saved")
	}
	// The store is fine again; the loop still serves.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	from := f.loop.LastSeq()
	ch, _ := f.loop.Subscribe(ctx, from)
	do(t, f.loop, arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
	select {
	case e, ok := <-ch:
		if !ok {
			t.Error("a subscription taken after the reload's failed read is closed at once: the hub stays closed for the loop's whole life")
		} else if e.Seq != from+1 {
			t.Errorf("first event %d, want %d", e.Seq, from+1)
		}
	case <-time.After(5 * time.Second):
		t.Error("no event")
	}
	// What that does to a follower of the open loop: spalloc's notifier.
	p := &countingPlane{Loop: f.loop}
	nctx, ncancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer ncancel()
	spalloc.Notify(nctx, p, spalloc.NewServer(spalloc.ServerOptions{}))
	if n := p.subs.Load(); n > 10 {
		t.Errorf("spalloc.Notify subscribed %d times in 100ms to the open loop: it spins for as long as the loop runs", n)
	}
}

// TestReloadPublishesWithTheView: a reader who sees, after a reload, the
// batch that the store took although its save reported an error finds its
// events listed (LastSeq), as after any commit (docs/architecture.md "How a
// request flows" step 5).
func TestReloadPublishesWithTheView(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 4)}})
	before := f.loop.LastSeq()
	hold := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	f.store.eventsGate.Store(&hold) // the reload's read of the missed events waits
	f.store.failAfter.Store(true)
	reads := f.store.eventReads.Load()
	done := make(chan error, 1)
	go func() {
		_, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}})
		done <- err
	}()
	poll.Until(t, 5*time.Second, "the reload reading the missed events", func() bool { return f.store.eventReads.Load() > reads })
	f.store.failAfter.Store(false)
	a, ok := f.loop.Allocation(1)
	last := f.loop.LastSeq()
	released = true
	close(hold)
	if err := <-done; err != nil {
		t.Fatalf("Do: %v", err)
	}
	if ok && last <= before {
		t.Fatalf("a reader sees allocation 1 (%s) in the view while LastSeq is still %d: its events (after %d) are not published yet", a.State, last, before)
	}
}

// TestNothingAppliedAfterAReloadGaveUp: when Close ends a reload that could
// not read the store, memory is not what the store holds: a command the
// applier had already taken is not applied on it, saved or answered as
// done.
func TestNothingAppliedAfterAReloadGaveUp(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	path := filepath.Join(t.TempDir(), "a.db")
	f := open(t, path, clk)
	do(t, f.loop, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{machine("a", 2)}})
	f.store.fail.Store(true)
	f.store.failLoad.Store(true)
	t.Cleanup(func() { f.store.failLoad.Store(false) })
	loads := f.store.loads.Load()
	first := make(chan error, 1)
	go func() {
		// Allocation 1: its save fails, and the reload cannot read the store.
		_, err := f.loop.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2}})
		first <- err
	}()
	poll.Until(t, 5*time.Second, "a reload", func() bool { return f.store.loads.Load() > loads })
	second := make(chan error, 1)
	var sent atomic.Bool
	go func() {
		sent.Store(true)
		// Releases allocation 1, which only the unsaved memory holds.
		_, err := f.loop.Do(context.Background(), arbiter.Release{ID: 1})
		second <- err
	}()
	poll.Until(t, 5*time.Second, "the release sent", sent.Load)
	time.Sleep(20 * time.Millisecond) // it is queued: the reload holds the loop's lock
	poll.Until(t, 5*time.Second, "the applier holding the release", func() bool { return f.loop.Queued() == 0 })
	f.store.fail.Store(false) // the store takes saves again; loads still fail
	f.loop.Close()
	if err := <-first; err == nil {
		t.Fatal("the failed save was answered as done")
	}
	err := <-second
	f.store.Close()
	evs := storedEvents(t, path)
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq != evs[i-1].Seq+1 {
			t.Errorf("the store's events jump from %d (%s) to %d (%s): a batch decided on unsaved memory was saved", evs[i-1].Seq, evs[i-1].Kind, evs[i].Seq, evs[i].Kind)
		}
	}
	if err == nil {
		t.Fatalf("Release of allocation 1 (never saved) was answered as done after the reload gave up; the store holds %d events", len(evs))
	}
}

func storedEvents(t *testing.T, path string) []arbiter.Event {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := st.Events(t.Context(), 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// countingPlane counts the subscriptions spalloc's notifier takes.
type countingPlane struct {
	*control.Loop
	subs atomic.Int64
}

func (p *countingPlane) SubscribeWhile(ctx context.Context, since int64, wanted func() bool) (<-chan arbiter.Event, error) {
	p.subs.Add(1)
	return p.Loop.SubscribeWhile(ctx, since, wanted)
}

// TestSubscribeToAClosedLoopIsRefused: a subscription to a closed loop
// (a step-down closes the loop before it stops the followers) is refused
// with an error, which a follower tells from "dropped for lagging": spalloc's
// notifier stops rather than subscribing again as fast as it can.
func TestSubscribeToAClosedLoopIsRefused(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	f := open(t, filepath.Join(t.TempDir(), "a.db"), clk)
	f.loop.Close()
	p := &countingPlane{Loop: f.loop}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	spalloc.Notify(ctx, p, spalloc.NewServer(spalloc.ServerOptions{}))
	if n := p.subs.Load(); n > 10 {
		t.Fatalf("spalloc.Notify subscribed %d times in 100ms to a closed loop: a busy loop until its ctx ends", n)
	}
}

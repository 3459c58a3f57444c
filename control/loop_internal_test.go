package control

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/engine"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// failingStore fails saves and loads while told to.
type failingStore struct {
	arbiter.Store
	failSave, failLoad atomic.Bool
}

func (s *failingStore) Save(ctx context.Context, c *arbiter.Changes) error {
	if s.failSave.Load() {
		return errors.New("disk full")
	}
	return s.Store.Save(ctx, c)
}

func (s *failingStore) Load(ctx context.Context) (*arbiter.State, error) {
	if s.failLoad.Load() {
		return nil, errors.New("disk gone")
	}
	return s.Store.Load(ctx)
}

func gpuMachine(n int) arbiter.Machine {
	m := arbiter.Machine{Name: "a", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{}}
	for i := 0; i < n; i++ {
		m.GPUs = append(m.GPUs, arbiter.GPU{Index: i, UUID: fmt.Sprintf("a-%d", i), Model: "H100", VRAMGiB: 80, Compute: "9.0", Healthy: true})
	}
	return m
}

func openFailing(t *testing.T, now func() time.Time) (*Loop, *failingStore) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "a.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rs := &failingStore{Store: st}
	l, err := Open(t.Context(), Options{Store: rs, Now: now, Engine: engine.Config{HeartbeatTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rs.failSave.Store(false)
		rs.failLoad.Store(false)
		l.Close()
		st.Close()
	})
	if _, err := l.Do(t.Context(), arbiter.SyncConfigMachines{Machines: []arbiter.Machine{gpuMachine(2)}}); err != nil {
		t.Fatal(err)
	}
	return l, rs
}

// TestRefusedBatchKeepsWhatCameAfter: a batch collected while the store was
// failing (refused) is committed after recover has reloaded the state and
// a new command was applied on it: the refusal is answered, and the new
// command is kept and saved, not thrown away on an engine that keeps it.
func TestRefusedBatchKeepsWhatCameAfter(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	l, rs := openFailing(t, clk.Now)
	poll.Until(t, 5*time.Second, "the loop idle", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.saver == nobody && l.pending == nil
	})
	// The store is failing (Trouble): a posted command is refused and its
	// batch taken, as alone does.
	l.mu.Lock()
	tr := "since now, disk gone"
	l.trouble.Store(&tr)
	refusedCall := &call{cmd: arbiter.Keepalive{ID: 42}, done: make(chan struct{}, 1)}
	l.applyLocked(refusedCall)
	l.saver = aCaller
	j := l.take()
	l.mu.Unlock()
	if j.refused == nil {
		t.Fatal("the batch was not refused")
	}
	// recover succeeds before commit(j) takes l.mu.
	l.mu.Lock()
	if err := l.reload(); err != nil {
		t.Fatal(err)
	}
	l.trouble.Store(nil)
	l.mu.Unlock()
	// A client's command arrives, Trouble is "": the applier applies it on
	// the fresh engine.
	res := make(chan error, 1)
	go func() {
		_, err := l.Do(context.Background(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2}})
		res <- err
	}()
	poll.Until(t, 5*time.Second, "the allocate applied", func() bool { return l.Pending() == 1 })
	l.commit(j)
	l.pass()
	if err := <-res; err != nil {
		t.Fatalf("the allocate applied on the reloaded state: %v", err)
	}
	stored, err := rs.Store.Load(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	inMemory := len(l.eng.Allocations())
	l.mu.Unlock()
	if inMemory != 1 || len(stored.Allocations) != 1 {
		t.Errorf("the engine holds %d allocations and the store %d, want 1 and 1", inMemory, len(stored.Allocations))
	}
}

// TestNoSpinWhileTheStoreFails: while the store is failing, a deadline
// that comes due (a keepalive expiring) waits for the store: the committer
// does not spin on it, ticking in vain.
func TestNoSpinWhileTheStoreFails(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	var nows atomic.Int64
	l, rs := openFailing(t, func() time.Time { nows.Add(1); return clk.Now() })
	k := 10.0
	if _, err := l.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1, KeepaliveS: &k}}); err != nil {
		t.Fatal(err)
	}
	rs.failSave.Store(true)
	rs.failLoad.Store(true)
	if _, err := l.Do(t.Context(), arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 1}}); err == nil {
		t.Fatal("the save did not fail")
	}
	if l.Trouble() == "" {
		t.Fatal("no trouble")
	}
	clk.Advance(time.Minute) // the keepalive is due
	l.Wake()
	// A rate over a moment of real time: a spinning committer reads the
	// clock thousands of times in it, an idle one hardly at all.
	time.Sleep(50 * time.Millisecond)
	before := nows.Load()
	time.Sleep(200 * time.Millisecond)
	if n := nows.Load() - before; n > 100 {
		t.Errorf("the clock was read %d times in 200ms while the store is down: the committer spins on the refused due deadline", n)
	}
}

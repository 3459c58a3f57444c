package sqlite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The crash test: a child process saves batches as fast as it can and
// says "ack K" after Save of batch K returns; the parent kills it with
// SIGKILL at a random moment (in the middle of a batch's write, its sync,
// the tables' write behind, a segment change), reopens the store and
// checks that every acknowledged batch is there whole and that no batch
// is there in part. Then the next child carries on from what is there.
//
// Batch K (K = 1, 2, …) upserts allocations 3K-2, 3K-1 and 3K, removes
// allocation 3K-5 (the first of batch K-1), appends events 3K-2 to 3K,
// upserts record ("crash", K) with a payload of random size (up to
// 96 KiB, so that some writes span many pages and a kill can cut one),
// sets the counters to 3K+1, and carries blob "blob-K" whose only other
// copy is in the child's memory until its keeper syncs (memKeeper: the
// worst an artifact pack's unsynced appends can do), so that every
// acknowledged blob must come back from the log.

const crashChildEnv = "ARBITER_SQLITE_CRASH_CHILD"

func TestCrashKeepsAnsweredBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	rounds := 12
	if v, _ := strconv.Atoi(os.Getenv("ARBITER_CRASH_ROUNDS")); v > 0 {
		rounds = v
	}
	acked := 0 // the highest batch acknowledged by any child so far
	for round := 0; round < rounds; round++ {
		cmd := exec.Command(exe, "-test.run", "^TestCrashChild$", "-test.v")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// Wait for the child to be saving, then let it run a random while.
		wait := time.After(30 * time.Second)
		started := false
		for !started {
			select {
			case l, ok := <-lines:
				if !ok {
					cmd.Wait()
					t.Fatalf("round %d: the child ended before saving: %s", round, stderr.String())
				}
				if n, ok := strings.CutPrefix(l, "ack "); ok {
					k, _ := strconv.Atoi(n)
					acked = max(acked, k)
					started = true
				}
			case <-wait:
				cmd.Process.Kill()
				t.Fatalf("round %d: the child saved nothing in 30s: %s", round, stderr.String())
			}
		}
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // a random moment, not a deadline
		cmd.Process.Signal(syscall.SIGKILL)
		for l := range lines {
			if n, ok := strings.CutPrefix(l, "ack "); ok {
				k, _ := strconv.Atoi(n)
				acked = max(acked, k)
			}
		}
		cmd.Wait()

		present := checkCrashState(t, path, acked)
		t.Logf("round %d: %d batches acknowledged, %d present", round, acked, present)
		acked = present // the next child goes on from what is there
	}
}

// checkCrashState opens the store (replaying its log) and checks it holds
// batches 1..K whole for some K >= acked, and nothing of batch K+1 or
// later; it returns K.
func checkCrashState(t *testing.T, path string, acked int) int {
	t.Helper()
	keeper := &memKeeper{dir: path + "-blobs"}
	s, err := Open(path, Options{SegmentBytes: 1 << 20, Blobs: keeper})
	if err != nil {
		t.Fatalf("reopen after the kill: %v", err)
	}
	defer s.Close()
	st, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	k := int(st.NextEventSeq-1) / 3
	for i := 1; i <= k; i++ {
		if b, err := os.ReadFile(filepath.Join(keeper.dir, fmt.Sprintf("blob-%d", i))); err != nil || string(b) != crashBlob(i) {
			t.Fatalf("the blob of batch %d is not kept: %q %v", i, b, err)
		}
	}
	if k < acked {
		t.Fatalf("batch %d was acknowledged, but the store holds only up to batch %d", acked, k)
	}
	if k > acked+1 {
		t.Fatalf("the store holds batch %d, but only %d were acknowledged and one more could have been in flight", k, acked)
	}
	if int(st.NextEventSeq) != 3*k+1 || int(st.NextAllocationID) != 3*k+1 && k > 0 {
		t.Fatalf("counters %d, %d: want %d for batch %d whole", st.NextAllocationID, st.NextEventSeq, 3*k+1, k)
	}
	// Allocations: the last batch's three, and the two later ones of the
	// batch before (its first was removed by batch k).
	want := map[int64]bool{}
	for i := 3*k - 2; i <= 3*k && k > 0; i++ {
		want[int64(i)] = true
	}
	for i := 3*k - 4; i <= 3*k-3 && k > 1; i++ {
		want[int64(i)] = true
	}
	got := map[int64]bool{}
	for _, a := range st.Allocations {
		got[a.ID] = true
	}
	// Earlier batches' allocations stay too: only each batch's first is removed.
	for id := range got {
		if id > int64(3*k) {
			t.Fatalf("allocation %d of batch %d is there, but batch %d is not", id, (id+2)/3, (id+2)/3)
		}
		if id%3 == 1 && id < int64(3*k-2) {
			t.Fatalf("allocation %d is there, but batch %d removed it", id, (id+2)/3+1)
		}
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("allocation %d of batch %d is missing", id, (id+2)/3)
		}
	}
	evs, err := s.Events(context.Background(), 0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3*k {
		t.Fatalf("%d events, want %d for batches 1..%d", len(evs), 3*k, k)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d at position %d: the events have a gap", e.Seq, i)
		}
	}
	recs := 0
	for _, r := range st.Records {
		if r.Kind != "crash" {
			continue
		}
		recs++
		n, _ := strconv.Atoi(r.Key)
		if n > k {
			t.Fatalf("record of batch %d is there, but batch %d is not", n, n)
		}
		var v struct {
			Batch int    `json:"batch"`
			Pad   string `json:"pad"`
		}
		if err := json.Unmarshal(r.Value.(json.RawMessage), &v); err != nil || v.Batch != n {
			t.Fatalf("record %s: %v, batch %d", r.Key, err, v.Batch)
		}
	}
	if recs != k {
		t.Fatalf("%d crash records, want %d", recs, k)
	}
	return k
}

// TestCrashChild is the child of TestCrashKeepsAnsweredBatches: it runs
// only when that test starts it.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("run by TestCrashKeepsAnsweredBatches")
	}
	keeper := &memKeeper{dir: path + "-blobs"}
	s, err := Open(path, Options{SegmentBytes: 1 << 20, Blobs: keeper})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	k := int(st.NextEventSeq-1) / 3
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for {
		k++
		c := &arbiter.Changes{NextAllocationID: int64(3*k + 1), NextEventSeq: int64(3*k + 1)}
		for i := 3*k - 2; i <= 3*k; i++ {
			c.Allocations = append(c.Allocations, arbiter.Allocation{ID: int64(i), Owner: "crash", State: arbiter.StateReady,
				Request: arbiter.Request{Owner: "crash", GPUs: 1}, CreatedAt: now})
			c.Events = append(c.Events, arbiter.Event{Seq: int64(i), Time: now, Kind: arbiter.EventAllocationReady,
				Subject: fmt.Sprintf("allocation/%d", i), Data: json.RawMessage(`{"id":` + strconv.Itoa(i) + `}`)})
		}
		if k > 1 {
			c.RemovedAllocations = []int64{int64(3*k - 5)}
		}
		pad := strings.Repeat("x", rand.IntN(96<<10))
		c.Records = []arbiter.Record{{Kind: "crash", Key: strconv.Itoa(k), Value: map[string]any{"batch": k, "pad": pad}}}
		id := fmt.Sprintf("blob-%d", k)
		keeper.Restore(id, []byte(crashBlob(k))) // as an upload appends it, unsynced
		c.Blobs = []arbiter.BlobBytes{{ID: id, Data: []byte(crashBlob(k))}}
		if err := s.Save(context.Background(), c); err != nil {
			t.Fatalf("Save of batch %d: %v", k, err)
		}
		if _, err := fmt.Fprintf(os.Stdout, "ack %d\n", k); err != nil {
			return
		}
	}
}

func crashBlob(k int) string { return fmt.Sprintf("the bytes of batch %d", k) }

// memKeeper is a BlobKeeper that holds what it is given in memory until
// Sync writes it to files in dir: a crash loses all it has not synced.
type memKeeper struct {
	dir     string
	mu      sync.Mutex
	pending map[string][]byte
	syncs   int
}

func (k *memKeeper) Restore(id string, data []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending == nil {
		k.pending = map[string][]byte{}
	}
	k.pending[id] = bytes.Clone(data)
	return nil
}

func (k *memKeeper) Sync() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.syncs++
	if err := os.MkdirAll(k.dir, 0o750); err != nil {
		return err
	}
	for id, data := range k.pending {
		if err := os.WriteFile(filepath.Join(k.dir, id), data, 0o640); err != nil {
			return err
		}
	}
	k.pending = nil
	return nil
}

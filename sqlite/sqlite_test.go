package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/storetest"
)

func openT(t testing.TB, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestStore(t *testing.T) {
	storetest.Exercise(t, func(t *testing.T) func() arbiter.Store {
		// A directory that does not exist yet: Open creates it.
		path := filepath.Join(t.TempDir(), "data", "arbiter.db")
		return func() arbiter.Store {
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		}
	})
}

func pragma(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

// TestPragmas reads back the settings durability and correctness rest on.
func TestPragmas(t *testing.T) {
	// The tables are written behind the batch log, unsynced, whatever
	// the option; the option decides whether the log is synced.
	cases := []struct {
		name       string
		opts       Options
		wantNoSync bool
	}{
		{"default", Options{}, false},
		{"full", Options{Synchronous: "full"}, false},
		{"normal", Options{Synchronous: "NORMAL", BusyTimeout: 1500 * time.Millisecond}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openT(t, filepath.Join(t.TempDir(), "a.db"), c.opts)
			if s.full == c.wantNoSync {
				t.Errorf("the batch log is synced: %v, want %v", s.full, !c.wantNoSync)
			}
			wantBusy := "5000"
			if c.opts.BusyTimeout > 0 {
				wantBusy = fmt.Sprint(c.opts.BusyTimeout.Milliseconds())
			}
			writer := func(name string) string {
				v, err := s.raw.text("PRAGMA " + name)
				if err != nil {
					t.Fatalf("PRAGMA %s: %v", name, err)
				}
				return v
			}
			reader := func(name string) string { return pragma(t, s.reader, name) }
			for _, p := range []struct {
				which      string
				get        func(string) string
				name, want string
			}{
				{"writer", writer, "journal_mode", "wal"},
				{"writer", writer, "synchronous", "1"},
				{"writer", writer, "foreign_keys", "1"},
				{"writer", writer, "busy_timeout", wantBusy},
				{"writer", writer, "query_only", "0"},
				{"reader", reader, "journal_mode", "wal"},
				{"reader", reader, "foreign_keys", "1"},
				{"reader", reader, "busy_timeout", wantBusy},
				{"reader", reader, "query_only", "1"},
			} {
				if got := p.get(p.name); got != p.want {
					t.Errorf("%s: PRAGMA %s: got %q, want %q", p.which, p.name, got, p.want)
				}
			}
		})
	}
}

func TestBadOptions(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "a.db"), Options{Synchronous: "OFF"})
	if arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("synchronous OFF: got error %v, want an %s error", err, arbiter.EInvalid)
	}
	if _, err := Open("", Options{}); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("empty path: got error %v, want an %s error", err, arbiter.EInvalid)
	}
}

// TestNewerSchema refuses a file written by a newer arbiter, naming both versions.
func TestNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{})
	if err := s.raw.exec(`INSERT INTO schema_migrations (version) VALUES (9999)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ms, _ := migrations()
	known := ms[len(ms)-1].Version
	_, err := Open(path, Options{})
	if err == nil {
		t.Fatal("Open of a newer schema succeeded, want an error")
	}
	for _, want := range []string{"9999", fmt.Sprint(known)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got error %q, want it to name version %s", err, want)
		}
	}
}

// TestReopenKeepsMigrations opens a file twice: the second Open applies nothing.
func TestReopenKeepsMigrations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	openT(t, path, Options{}).Close()
	s := openT(t, path, Options{})
	var n int
	if err := s.reader.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	ms, _ := migrations()
	if n != len(ms) {
		t.Errorf("got %d rows in schema_migrations, want %d", n, len(ms))
	}
}

// TestEventsDuringWrite reads events while another connection holds the write
// lock in an open transaction, as a long write of the tables would.
func TestEventsDuringWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{})
	ctx := context.Background()
	if err := s.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 1, Time: time.Unix(1, 0), Kind: "k", Subject: "s"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.behind.flush(); err != nil { // the tables hold the batch
		t.Fatal(err)
	}
	other, err := openRaw(path, "busy_timeout = 10")
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	if err := other.exec(`BEGIN IMMEDIATE`); err != nil { // holds the write lock
		t.Fatal(err)
	}
	defer other.exec(`ROLLBACK`)
	if err := other.exec(`INSERT INTO events (seq, time, kind, subject) VALUES (2, 'x', 'k', 's')`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	evs, err := s.Events(rctx, 0, 10)
	if err != nil {
		t.Fatalf("Events during a write: %v", err)
	}
	if len(evs) != 1 {
		t.Errorf("got %d events, want 1 (the uncommitted one unseen)", len(evs))
	}
	if _, err := s.Load(rctx); err != nil {
		t.Fatalf("Load during a write: %v", err)
	}
}

// TestBusy: while another process holds the tables' write lock past the
// busy timeout, the batch saved is kept in the log and later Saves are
// refused as unavailable; once the lock goes, the tables catch up and
// Saves succeed again.
func TestBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{BusyTimeout: 10 * time.Millisecond})
	other, err := openRaw(path, "busy_timeout = 10")
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	if err := other.exec(`BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ev := func(seq int64) *arbiter.Changes {
		return &arbiter.Changes{Events: []arbiter.Event{{Seq: seq, Time: time.Unix(seq, 0), Kind: "k", Subject: "s"}}, NextEventSeq: seq + 1}
	}
	if err := s.Save(ctx, ev(1)); err != nil {
		t.Fatalf("Save: %v (the log takes it whatever the tables do)", err)
	}
	if err := s.behind.flush(); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("flush while another process writes: got %v, want an unavailable error", err)
	}
	err = s.Save(ctx, ev(2))
	if got := arbiter.ErrorCode(err); got != arbiter.EUnavailable || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("Save while another process writes: got error %v (code %s), want code %s", err, got, arbiter.EUnavailable)
	}
	other.exec(`ROLLBACK`)
	poll.Until(t, 10*time.Second, "Saves to succeed once the other process let go", func() bool { return s.Save(ctx, ev(2)) == nil })
	if evs, err := s.Events(ctx, 0, 10); err != nil || len(evs) != 2 {
		t.Errorf("Events: got %d events (%v), want 2", len(evs), err)
	}
}

func BenchmarkSave(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, n := range []int{1, 64} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, n), func(b *testing.B) {
				s := openT(b, filepath.Join(b.TempDir(), "bench.db"), Options{Synchronous: sync})
				storetest.BenchSave(b, s, n)
			})
		}
	}
}

// TestBlobsSyncedBeforeTheirBatchesGo: the blob keeper is synced before
// the log lets go of a segment whose batches carried blobs, so a blob is
// always in the log or synced by its keeper; and a store without a keeper
// does not log blobs.
func TestBlobsSyncedBeforeTheirBatchesGo(t *testing.T) {
	keeper := &memKeeper{dir: filepath.Join(t.TempDir(), "blobs")}
	s := openT(t, filepath.Join(t.TempDir(), "a.db"), Options{SegmentBytes: 4096, Blobs: keeper})
	ctx := context.Background()
	for k := 1; k <= 40; k++ {
		id := fmt.Sprintf("blob-%d", k)
		keeper.Restore(id, []byte(crashBlob(k)))
		c := &arbiter.Changes{Blobs: []arbiter.BlobBytes{{ID: id, Data: []byte(crashBlob(k) + strings.Repeat(" ", 400))}}}
		if err := s.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	inLog := func() map[string]bool {
		m := map[string]bool{}
		s.log.Scan(func(seq uint64, p []byte) error {
			b, err := decodeBatch(seq, p)
			if err != nil {
				t.Fatal(err)
			}
			for _, bl := range b.blobs {
				m[string(bl.id)] = true
			}
			return nil
		})
		return m
	}
	// The tables take the batches, and the log releases its full segments.
	poll.Until(t, 10*time.Second, "a segment to be released", func() bool {
		s.behind.flush()
		return !inLog()["blob-1"]
	})
	logged := inLog()
	for k := 1; k <= 40; k++ {
		id := fmt.Sprintf("blob-%d", k)
		if _, err := os.Stat(filepath.Join(keeper.dir, id)); err != nil && !logged[id] {
			t.Fatalf("%s is neither in the log nor synced by its keeper", id)
		}
	}

	plain := openT(t, filepath.Join(t.TempDir(), "b.db"), Options{})
	if err := plain.Save(ctx, &arbiter.Changes{Blobs: []arbiter.BlobBytes{{ID: "x", Data: []byte("y")}}}); err != nil {
		t.Fatal(err)
	}
	plain.log.Scan(func(seq uint64, p []byte) error {
		if b, _ := decodeBatch(seq, p); b != nil && len(b.blobs) > 0 {
			t.Errorf("a store without a keeper logged blob %s", b.blobs[0].id)
		}
		return nil
	})
}

// flakyKeeper is a memKeeper whose first Sync fails.
type flakyKeeper struct {
	memKeeper
	failed atomic.Bool
}

func (k *flakyKeeper) Sync() error {
	if k.failed.CompareAndSwap(false, true) {
		return errors.New("the artifact disk hiccuped")
	}
	return k.memKeeper.Sync()
}

// TestAFailedStepAfterTheTablesCommitted: when the blob keeper's sync
// fails after the writer behind committed a synced write of the tables
// (before the log may release), the writer does not write those batches
// again (their events would collide) and saves go on; the release
// happens at a later write.
func TestAFailedStepAfterTheTablesCommitted(t *testing.T) {
	keeper := &flakyKeeper{memKeeper: memKeeper{dir: filepath.Join(t.TempDir(), "blobs")}}
	s := openT(t, filepath.Join(t.TempDir(), "a.db"), Options{SegmentBytes: 4096, Blobs: keeper})
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	save := func(k int) error {
		return s.Save(ctx, &arbiter.Changes{
			Events:       []arbiter.Event{{Seq: int64(k), Time: now, Kind: arbiter.EventAllocationReady, Subject: "allocation/1"}},
			NextEventSeq: int64(k + 1),
			Records:      []arbiter.Record{{Kind: "x", Key: fmt.Sprint(k), Value: strings.Repeat("p", 500)}},
		})
	}
	k := 0
	poll.Until(t, 10*time.Second, "the keeper's failing sync", func() bool {
		k++
		if err := save(k); err != nil {
			t.Fatalf("save %d: %v", k, err)
		}
		return keeper.failed.Load()
	})
	poll.Until(t, 10*time.Second, "the writer to take every batch and a segment to go", func() bool {
		s.behind.flush()
		k++
		if err := save(k); err != nil {
			t.Fatalf("save %d after the failed sync: %v", k, err)
		}
		segs, _ := filepath.Glob(filepath.Join(s.log.Dir(), "*.seg"))
		return s.behind.failure() == nil && len(segs) <= 2
	})
	st, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Records) != k {
		t.Fatalf("the tables hold %d records, want %d", len(st.Records), k)
	}
}

// TestBlobsRestoredFromBatchesTheTablesTook: after a crash, the blobs of
// batches the tables had taken but whose segment the log still held (the
// keeper had not synced them) come back, as do those of batches the
// tables had not taken.
func TestBlobsRestoredFromBatchesTheTablesTook(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s, err := Open(path, Options{Blobs: &memKeeper{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	save := func(k int) {
		t.Helper()
		c := &arbiter.Changes{Blobs: []arbiter.BlobBytes{{ID: fmt.Sprintf("blob-%d", k), Data: []byte(crashBlob(k))}}}
		if err := s.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	save(1)
	save(2)
	if err := s.behind.flush(); err != nil { // the tables take batches 1 and 2
		t.Fatal(err)
	}
	s.behind.close() // the writer stops: batch 3 stays in the log alone
	save(3)
	// A crash: the connections, the log and the lock go, nothing is
	// written or discarded, and the keeper forgets what it had not synced.
	if err := s.closeAll(); err != nil {
		t.Fatal(err)
	}
	keeper := &memKeeper{dir: filepath.Join(t.TempDir(), "blobs")}
	s = openT(t, path, Options{Blobs: keeper})
	for k := 1; k <= 3; k++ {
		if b, err := os.ReadFile(filepath.Join(keeper.dir, fmt.Sprintf("blob-%d", k))); err != nil || string(b) != crashBlob(k) {
			t.Errorf("blob %d after the crash: %q %v", k, b, err)
		}
	}
}

// TestDamagedLogMidway: a record damaged in the middle of the batch log,
// answered batches after it. With synchronous = "full" that is a damaged
// disk, and each of them was answered: the store refuses to open, saying
// what and how to go on, and leaves the log as it is. With "normal" (a
// power cut's usual leftover) it opens without them and keeps them aside.
func TestDamagedLogMidway(t *testing.T) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		t.Run(sync, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.db")
			damageBatch(t, path, crashWithTenInTheLog(t, path, sync), 5)
			logDir := path + "-batches"
			segs, _ := filepath.Glob(filepath.Join(logDir, "*.seg"))
			data, _ := os.ReadFile(segs[0])

			var logs bytes.Buffer
			s, err := Open(path, Options{Synchronous: sync, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if sync == "FULL" {
				if err == nil {
					s.Close()
					t.Fatal("opened over a damaged log whose answered batches 6 to 10 it would drop")
				}
				if msg := err.Error(); !strings.Contains(msg, "seqs 6 to 10") || !strings.Contains(msg, "mv "+logDir) {
					t.Fatalf("refusal %q: want the batches named and the way on", msg)
				}
				if kept, _ := os.ReadFile(segs[0]); !bytes.Equal(kept, data) {
					t.Fatal("the damaged log was changed by a start that refused")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if st, err := s.Load(context.Background()); err != nil || st.NextEventSeq != 5 {
				t.Fatalf("after the start: next event %d (%v), want 5: batches 1 to 4", st.NextEventSeq, err)
			}
			aside, _ := filepath.Glob(filepath.Join(logDir, "damaged-*", filepath.Base(segs[0])))
			if len(aside) != 1 || !strings.Contains(logs.String(), "seqs 6 to 10") {
				t.Fatalf("segment set aside: %v; log: %s", aside, logs.String())
			}
			if kept, _ := os.ReadFile(aside[0]); !bytes.Equal(kept, data) {
				t.Fatal("the segment set aside is not the damaged log")
			}
		})
	}
}

// damageBatch flips a bit in batch k's payload, in a log of one segment
// whose batches' encoded lengths are lens.
func damageBatch(t *testing.T, path string, lens []int, k int) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(path+"-batches", "*.seg"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	data, _ := os.ReadFile(segs[0])
	off := 16
	for i := 1; i < k; i++ {
		off += 16 + lens[i-1]
	}
	data[off+16+lens[k-1]/2] ^= 1
	if err := os.WriteFile(segs[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestGapKeepsWhatComesBeforeIt: with synchronous = "normal", a log with a
// gap still gives back what comes before it — the artifact bytes of
// batches the tables took, and, when a start fails midway, the batches
// before the gap at the next start.
func TestGapKeepsWhatComesBeforeIt(t *testing.T) {
	t.Run("blobs", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a.db")
		s := openT(t, path, Options{Synchronous: "NORMAL", Blobs: &memKeeper{}})
		var lens []int
		save := func(k int) {
			t.Helper()
			c := &arbiter.Changes{Blobs: []arbiter.BlobBytes{{ID: fmt.Sprintf("blob-%d", k), Data: []byte(crashBlob(k))}}}
			p, _ := (&encoder{}).encode(c)
			lens = append(lens, len(p))
			if err := s.Save(t.Context(), c); err != nil {
				t.Fatal(err)
			}
		}
		save(1)
		save(2)
		if err := s.behind.flush(); err != nil { // the tables take batches 1 and 2
			t.Fatal(err)
		}
		s.behind.close()
		for k := 3; k <= 5; k++ {
			save(k)
		}
		if err := s.closeAll(); err != nil { // a crash
			t.Fatal(err)
		}
		damageBatch(t, path, lens, 4) // batch 5 past a damaged one
		keeper := &memKeeper{dir: filepath.Join(t.TempDir(), "blobs")}
		openT(t, path, Options{Synchronous: "NORMAL", Blobs: keeper})
		for k := 1; k <= 3; k++ {
			if b, err := os.ReadFile(filepath.Join(keeper.dir, fmt.Sprintf("blob-%d", k))); err != nil || string(b) != crashBlob(k) {
				t.Errorf("blob %d after a crash that left a gap: %q %v", k, b, err)
			}
		}
	})
	t.Run("failed start", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a.db")
		s := openT(t, path, Options{Synchronous: "NORMAL"})
		s.behind.close()
		var lens []int
		for k := 1; k <= 5; k++ {
			c := &arbiter.Changes{Events: []arbiter.Event{{Seq: int64(k), Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Kind: arbiter.EventAllocationReady, Subject: "allocation/1"}},
				NextEventSeq: int64(k + 1)}
			p, _ := (&encoder{}).encode(c)
			lens = append(lens, len(p))
			if err := s.Save(t.Context(), c); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.closeAll(); err != nil {
			t.Fatal(err)
		}
		damageBatch(t, path, lens, 4) // a gap after batch 3
		exec := func(q string) {
			t.Helper()
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		exec(`CREATE TRIGGER refuse BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'disk full'); END`)
		if s, err := Open(path, Options{Synchronous: "NORMAL"}); err == nil {
			s.Close()
			t.Fatal("the start applied the batches despite the trigger")
		}
		exec(`DROP TRIGGER refuse`)
		s = openT(t, path, Options{Synchronous: "NORMAL"})
		if st, err := s.Load(t.Context()); err != nil || st.NextEventSeq != 4 {
			t.Fatalf("after a failed start and a good one: next event %d (%v), want 4: batches 1 to 3", st.NextEventSeq, err)
		}
	})
}

// TestFullDamagedLogKeepsWhatCameBefore: with synchronous = "full", a
// damaged record in the middle of the batch log makes the start refuse,
// advising to move the log aside to start without the batches past it.
// Following that advice word for word keeps the whole, answered batches
// that came before the damaged one (1 to 4 here): the refusing start put
// them into the tables.
func TestFullDamagedLogKeepsWhatCameBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	damageBatch(t, path, crashWithTenInTheLog(t, path, "FULL"), 5)

	_, err := Open(path, Options{Synchronous: "FULL"})
	if err == nil {
		t.Fatal("opened over a damaged log")
	}
	msg := err.Error()
	t.Logf("refusal: %s", msg)
	if !strings.Contains(msg, "mv ") {
		t.Fatalf("refusal %q gives no mv advice", msg)
	}
	// Follow the advice, word for word.
	logDir := path + "-batches"
	if err := os.Rename(logDir, logDir+".damaged"); err != nil {
		t.Fatal(err)
	}
	st, err := openT(t, path, Options{Synchronous: "FULL"}).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.NextEventSeq != 5 {
		t.Fatalf("after following the refusal's advice: next event seq %d, want 5 (batches 1 to 4 were whole and answered, before the damaged one)", st.NextEventSeq)
	}
}

// A new database and its WAL are readable by owner and group only,
// whatever the umask: they hold webhook secrets and lock tokens.
func TestNewDatabaseIsNotWorldReadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{})
	if err := s.Save(context.Background(), &arbiter.Changes{NextEventSeq: 1}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			continue // no WAL yet
		}
		if m := fi.Mode().Perm(); m&0o007 != 0 {
			t.Errorf("%s has mode %v", p, m)
		}
	}
}

// crashWithTenInTheLog saves ten answered batches (events 1 to 10) while
// the tables lag, so that they are in the batch log alone, as for the
// last moments before a crash, then stops as a crash would. It returns
// the batches' encoded lengths, for damageBatch.
func crashWithTenInTheLog(t *testing.T, path, sync string) []int {
	t.Helper()
	s, err := Open(path, Options{Synchronous: sync})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.behind.close()
	var lens []int
	for k := 1; k <= 10; k++ {
		c := &arbiter.Changes{Events: []arbiter.Event{{Seq: int64(k), Time: now, Kind: arbiter.EventAllocationReady, Subject: "allocation/1"}},
			NextEventSeq: int64(k + 1)}
		p, _ := (&encoder{}).encode(c)
		lens = append(lens, len(p))
		if err := s.Save(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.closeAll(); err != nil {
		t.Fatal(err)
	}
	return lens
}

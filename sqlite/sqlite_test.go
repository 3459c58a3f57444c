package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
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
	cases := []struct {
		name     string
		opts     Options
		wantSync string
	}{
		{"default", Options{}, "2"},
		{"full", Options{Synchronous: "full"}, "2"},
		{"normal", Options{Synchronous: "NORMAL", BusyTimeout: 1500 * time.Millisecond}, "1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := openT(t, filepath.Join(t.TempDir(), "a.db"), c.opts)
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
				{"writer", writer, "synchronous", c.wantSync},
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
// lock in an open transaction, as a long Save would.
func TestEventsDuringWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{})
	ctx := context.Background()
	if err := s.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 1, Time: time.Unix(1, 0), Kind: "k", Subject: "s"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.raw.exec(`BEGIN IMMEDIATE`); err != nil { // holds the write lock
		t.Fatal(err)
	}
	defer s.raw.exec(`ROLLBACK`)
	if err := s.raw.exec(`INSERT INTO events (seq, time, kind, subject) VALUES (2, 'x', 'k', 's')`); err != nil {
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

// TestBusy reports a lock held by another process (a sqlite3 shell, a
// backup tool: never a second server, lock.go) as unavailable.
func TestBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	s := openT(t, path, Options{BusyTimeout: 10 * time.Millisecond})
	other, err := sql.Open("sqlite", dsn(path, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), `ROLLBACK`)
	err = s.Save(context.Background(), &arbiter.Changes{NextEventSeq: 5})
	if got := arbiter.ErrorCode(err); got != arbiter.EUnavailable {
		t.Errorf("Save while another store writes: got error %v (code %s), want code %s", err, got, arbiter.EUnavailable)
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

package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/storetest"
	"github.com/arbiter-hq/arbiter/tcpproxy"
	"github.com/jackc/pgx/v5"
)

// testURL returns the database named by ARBITER_TEST_POSTGRES, skipping the
// test without it so `go test ./...` passes on a machine with no PostgreSQL.
func testURL(t testing.TB) string {
	url := os.Getenv("ARBITER_TEST_POSTGRES")
	if url == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	return url
}

// newSchema returns a fresh schema name, dropped with everything in it when t
// ends, so tests can run in parallel on one database.
func newSchema(t testing.TB, url string) string {
	var b [6]byte
	rand.Read(b[:])
	schema := "arbiter_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

func openT(t testing.TB, url, schema string) leased {
	t.Helper()
	s, err := openLeased(context.Background(), url, schema)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// leased is a Store that holds the lease, written through its Term, as a
// server's is; Close gives the lease back and closes the Store.
type leased struct{ *Term }

func (l leased) Close() error {
	l.ReleaseLease(context.Background(), l.TermNumber())
	return l.Store.Close()
}

// openLeased opens the store and takes its lease. Errors: as Open, and
// conflict when another holds the lease.
func openLeased(ctx context.Context, url, schema string) (leased, error) {
	s, err := Open(ctx, url, Options{Schema: schema})
	if err != nil {
		return leased{}, err
	}
	h, won, err := s.AcquireLease(ctx, "test", "", time.Minute)
	if err == nil && !won {
		err = arbiter.Errorf(arbiter.EConflict, "the lease is held by %s", h.ID)
	}
	if err != nil {
		s.Close()
		return leased{}, err
	}
	return leased{s.Fenced(Fence{Term: h.Term})}, nil
}

// opener gives each test a fresh schema of the database at url.
func opener(url string) storetest.Opener {
	return func(t *testing.T) func() arbiter.Store {
		schema := newSchema(t, url)
		return func() arbiter.Store {
			s, err := openLeased(t.Context(), url, schema)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		}
	}
}

func TestStore(t *testing.T) {
	storetest.Exercise(t, opener(testURL(t)))
}

// TestNewerSchema refuses a schema written by a newer arbiter, naming both versions.
func TestNewerSchema(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openT(t, url, schema)
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO schema_migrations (version) VALUES (9999)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ms, _ := migrations()
	_, err := Open(context.Background(), url, Options{Schema: schema})
	if err == nil {
		t.Fatal("Open of a newer schema succeeded, want an error")
	}
	for _, want := range []string{"9999", fmt.Sprint(ms[len(ms)-1].Version)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got error %q, want it to name version %s", err, want)
		}
	}
}

// TestConcurrentOpen opens one new schema from several servers at once:
// the migration lock lets exactly one apply it, and of those that then
// take the lease at once, exactly one wins (the others are told who).
func TestConcurrentOpen(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	type result struct {
		won bool
		err error
	}
	out := make(chan result, 4)
	for i := 0; i < cap(out); i++ {
		go func() {
			s, err := Open(context.Background(), url, Options{Schema: schema})
			if err != nil {
				out <- result{err: err}
				return
			}
			defer s.Close()
			h, won, err := s.AcquireLease(context.Background(), fmt.Sprint("server-", i), "", time.Minute)
			if err == nil && !won && h.Term == 0 {
				err = fmt.Errorf("lost the race to a holder with term 0")
			}
			out <- result{won, err}
		}()
	}
	won := 0
	for i := 0; i < cap(out); i++ {
		r := <-out
		if r.err != nil {
			t.Errorf("Open and take: %v", r.err)
		}
		if r.won {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d servers took the lease at once, want 1", won)
	}
}

func TestBadURL(t *testing.T) {
	_, err := Open(context.Background(), "postgres://u:secret@host:notaport/db", Options{})
	if arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("got error %v, want an %s error", err, arbiter.EInvalid)
	}
	if err != nil && strings.Contains(err.Error(), "secret") {
		t.Errorf("error %q shows the password", err)
	}
}

func TestUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens there.
	_, err := Open(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", Options{})
	if got := arbiter.ErrorCode(err); got != arbiter.EUnavailable {
		t.Errorf("got error %v (code %s), want code %s", err, got, arbiter.EUnavailable)
	}
}

func BenchmarkSave(b *testing.B) {
	url := testURL(b)
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			storetest.BenchSave(b, openT(b, url, newSchema(b, url)), n)
		})
	}
}

// TestEventsDuringWrite reads events while another transaction has written
// events and holds their row locks, as a long Save would.
func TestEventsDuringWrite(t *testing.T) {
	url := testURL(t)
	s := openT(t, url, newSchema(t, url))
	ctx := context.Background()
	if err := s.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 1, Time: time.Unix(1, 0), Kind: "k", Subject: "s"}}}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO events (seq, time, kind, subject) VALUES (2, 'x', 'k', 's')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE meta SET value = value`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
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

// TestSaveWhoseAnswerIsLost: a batch PostgreSQL commits but whose answer
// never comes back (the network drops the replies) fails its Save with
// arbiter.ErrSaveUnknown, so that nobody is told "nothing was changed,
// retry" about a change that is there.
func TestSaveWhoseAnswerIsLost(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	direct := openT(t, url, schema)
	direct.ReleaseLease(t.Context(), direct.TermNumber())
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	p := tcpproxy.Start(t, u.Host)
	u.Host = p.Addr
	s := openT(t, u.String(), schema)
	ctx := t.Context()
	ev := func(seq int64) *arbiter.Changes {
		return &arbiter.Changes{Events: []arbiter.Event{{Seq: seq, Time: time.Now().UTC(), Kind: "x", Subject: "y"}}, NextEventSeq: seq + 1}
	}
	if err := s.Save(ctx, ev(1)); err != nil {
		t.Fatal(err)
	}
	p.DropReplies(true)
	// The caller gives up once the batch is in (its answer lost), not
	// after a fixed time: a deadline that passed before the batch was sent
	// would rightly make the save certainly undone, and nothing committed.
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer cancel()
		poll.Try(30*time.Second, func() error {
			if evs, err := direct.Events(ctx, 0, 10); err != nil || len(evs) != 2 {
				return errors.New("not committed yet")
			}
			return nil
		})
	}()
	err = s.Save(tctx, ev(2))
	p.DropReplies(false)
	if err == nil || !errors.Is(err, arbiter.ErrSaveUnknown) {
		t.Fatalf("a save whose answer was lost: %v, want an error marked ErrSaveUnknown", err)
	}
	poll.Until(t, 10*time.Second, "the batch committed", func() bool {
		evs, err := direct.Events(ctx, 0, 10)
		return err == nil && len(evs) == 2
	})
}

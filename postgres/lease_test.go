package postgres

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/jackc/pgx/v5"
)

// TestOneStorePerDatabase is issue 12's finding 1 on PostgreSQL: while one
// Store holds the database's lease, a second Open is refused naming the
// holder; Close gives it back at once, and the next holder's term is higher.
func TestOneStorePerDatabase(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	a, err := Open(context.Background(), url, Options{Schema: schema, Holder: "server-a", URL: "http://a.example:7070"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), url, Options{Schema: schema, Holder: "server-b"})
	if arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("second Open: %v, want a conflict", err)
	}
	for _, want := range []string{"server-a", "http://a.example:7070", "another database"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	term := a.Term()
	a.Close()
	b, err := Open(context.Background(), url, Options{Schema: schema, Holder: "server-b"})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	defer b.Close()
	if b.Term() <= term {
		t.Fatalf("term %d after %d: want it to grow", b.Term(), term)
	}
}

// TestLostLeaseStopsWrites: a server whose lease was taken over — here by
// writing the row as a newer server would — commits nothing more, and says
// so on Lost.
func TestLostLeaseStopsWrites(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openT(t, url, schema)
	ctx := context.Background()
	if err := s.Save(ctx, &arbiter.Changes{NextEventSeq: 2}); err != nil {
		t.Fatal(err)
	}
	takeOver(t, url, schema, `UPDATE leader_lease SET term = term + 1, holder = 'usurper', expires_at = now() + interval '1 hour'`)
	err := s.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 2, Time: time.Now(), Kind: "x", Subject: "y"}}, NextEventSeq: 3})
	if arbiter.ErrorCode(err) != arbiter.EUnavailable || !strings.Contains(err.Error(), "usurper") {
		t.Fatalf("Save after a takeover: %v, want unavailable naming the new holder", err)
	}
	select {
	case <-s.Lost():
	default:
		t.Fatal("Lost is not closed")
	}
	if evs, _ := s.Events(ctx, 0, 10); len(evs) != 0 {
		t.Fatalf("the fenced Save wrote %d events", len(evs))
	}
	if err := s.Save(ctx, &arbiter.Changes{NextEventSeq: 4}); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("Save once lost: %v", err)
	}
}

// TestLeaseUnrenewedIsLost: past its time to live without a renewal the
// lease is no longer trusted, whatever the database says.
func TestLeaseUnrenewedIsLost(t *testing.T) {
	url := testURL(t)
	s := openT(t, url, newSchema(t, url))
	if err := s.lease.check(time.Now().Add(s.lease.ttl)); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("check past the trust window: %v, want unavailable", err)
	}
	if err := s.Save(context.Background(), &arbiter.Changes{NextEventSeq: 2}); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("Save with an untrusted lease: %v", err)
	}
}

// TestLeaseRenewed: the lease is renewed in the background, moving its
// trust window on, and Saves go on past the first time to live.
func TestLeaseRenewed(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s, err := Open(context.Background(), url, Options{Schema: schema, LeaseTTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.lease.mu.Lock()
	first := s.lease.trustUntil
	s.lease.mu.Unlock()
	renewed := func() bool {
		s.lease.mu.Lock()
		defer s.lease.mu.Unlock()
		return s.lease.trustUntil.After(first.Add(s.lease.ttl))
	}
	poll.Until(t, 10*time.Second, "the lease renewed past its first time to live", renewed)
	if err := s.Save(context.Background(), &arbiter.Changes{NextEventSeq: 2}); err != nil {
		t.Fatalf("Save after renewals: %v", err)
	}
}

// TestCrashedHolderOnThisHost: a holder on this host whose process is gone
// (killed with SIGKILL) does not make the restart wait for its lease.
func TestCrashedHolderOnThisHost(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openT(t, url, schema)
	term := s.Term()
	// Make the row say a dead process of this host holds it for an hour.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip("no `true` to get a dead pid:", err)
	}
	host, _ := os.Hostname()
	takeOver(t, url, schema, `UPDATE leader_lease SET holder = 'crashed', host = '`+host+`', pid = `+strconv.Itoa(dead.ProcessState.Pid())+
		`, expires_at = now() + interval '1 hour'`)
	s2, err := Open(context.Background(), url, Options{Schema: schema})
	if err != nil {
		t.Fatalf("Open after the holder crashed: %v", err)
	}
	defer s2.Close()
	if s2.Term() <= term {
		t.Fatalf("term %d, want above %d", s2.Term(), term)
	}
	// A live holder on another host is waited for.
	takeOver(t, url, schema, `UPDATE leader_lease SET holder = 'elsewhere', host = 'other-host', pid = 1, expires_at = now() + interval '1 hour'`)
	if _, err := Open(context.Background(), url, Options{Schema: schema}); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("Open while another host holds it: %v", err)
	}
}

func takeOver(t *testing.T, url, schema, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `SET search_path = `+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

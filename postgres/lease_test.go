package postgres

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

func openStore(t *testing.T, url, schema string, o Options) *Store {
	t.Helper()
	o.Schema = schema
	s, err := Open(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestLeaseTakenOnce: while one server holds the lease another cannot take
// it, and is told who holds it; released, the next takes it at once with a
// higher term.
func TestLeaseTakenOnce(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	a, b := openStore(t, url, schema, Options{}), openStore(t, url, schema, Options{})
	ctx := context.Background()
	if _, err := a.LeaseHolder(ctx); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("holder of a new database: %v, want not_found", err)
	}
	ha, won, err := a.AcquireLease(ctx, "server-a", "http://a.example:7070", time.Minute)
	if err != nil || !won || ha.Term != 1 || ha.ID != "server-a" {
		t.Fatalf("first take: %+v %v %v, want term 1 to server-a", ha, won, err)
	}
	hb, won, err := b.AcquireLease(ctx, "server-b", "", time.Minute)
	if err != nil || won {
		t.Fatalf("second take: won %v, err %v; want refused", won, err)
	}
	if hb.ID != "server-a" || hb.URL != "http://a.example:7070" || hb.Term != 1 || hb.Remaining <= 50*time.Second {
		t.Fatalf("second take sees %+v, want server-a's lease with about a minute left", hb)
	}
	if err := a.ReleaseLease(ctx, ha.Term); err != nil {
		t.Fatal(err)
	}
	hb, won, err = b.AcquireLease(ctx, "server-b", "", time.Minute)
	if err != nil || !won || hb.Term != 2 {
		t.Fatalf("take after release: %+v %v %v, want term 2", hb, won, err)
	}
	if ok, err := a.RenewLease(ctx, ha.Term, time.Minute); err != nil || ok {
		t.Fatalf("renewing a lost term: %v %v, want false", ok, err)
	}
	if ok, err := b.RenewLease(ctx, hb.Term, time.Minute); err != nil || !ok {
		t.Fatalf("renewing our term: %v %v, want true", ok, err)
	}
}

// TestLeaseExpires: a lease nobody renews is taken over once it has run
// out, by the database's clock.
func TestLeaseExpires(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	a, b := openStore(t, url, schema, Options{}), openStore(t, url, schema, Options{})
	ctx := context.Background()
	ha, _, err := a.AcquireLease(ctx, "a", "", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, won, err := b.AcquireLease(ctx, "b", "", time.Minute); err != nil || won {
		t.Fatalf("take of a live lease: %v %v", won, err)
	}
	// The database's clock decides; poll until it says the lease ran out.
	var h arbiter.LeaseHolder
	poll.Until(t, 10*time.Second, "b to take the expired lease", func() bool {
		var won bool
		h, won, err = b.AcquireLease(ctx, "b", "", time.Minute)
		return err == nil && won
	})
	if h.Term != ha.Term+1 || h.ID != "b" {
		t.Fatalf("take of an expired lease: %+v", h)
	}
}

// TestFencedWrites is the fence: a Term's writes commit while the lease has
// its term and are refused, whole, once another took it — the leadership
// is told at once.
func TestFencedWrites(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openT(t, url, schema)
	ctx := context.Background()
	if err := s.Save(ctx, &arbiter.Changes{NextEventSeq: 2}); err != nil {
		t.Fatal(err)
	}
	var told error
	term := s.Store.Fenced(Fence{Term: s.TermNumber(), Lost: func(err error) { told = err }})
	takeOver(t, url, schema, `UPDATE leader_lease SET term = term + 1, holder = 'usurper', expires_at = now() + interval '1 hour'`)
	err := term.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 2, Time: time.Now(), Kind: "x", Subject: "y"}}, NextEventSeq: 3})
	if arbiter.ErrorCode(err) != arbiter.EUnavailable || !strings.Contains(err.Error(), "usurper") || errors.Is(err, arbiter.ErrSaveUnknown) {
		t.Fatalf("Save after a takeover: %v, want unavailable naming the new holder, certainly not saved", err)
	}
	if told == nil || !strings.Contains(told.Error(), "usurper") {
		t.Fatalf("the leadership was told %v", told)
	}
	if evs, _ := s.Events(ctx, 0, 10); len(evs) != 0 {
		t.Fatalf("the fenced Save wrote %d events", len(evs))
	}
	if err := term.EnqueueDeliveries(ctx, nil, 5); arbiter.ErrorCode(err) != arbiter.EUnavailable {
		t.Fatalf("deliveries after a takeover: %v", err)
	}
	if c, _ := s.WebhookCursor(ctx); c != 0 {
		t.Fatalf("the fenced enqueue moved the cursor to %d", c)
	}
}

// TestUntrustedWritesNothing: past its trust window the leadership refuses
// every write before it is sent.
func TestUntrustedWritesNothing(t *testing.T) {
	url := testURL(t)
	s := openT(t, url, newSchema(t, url))
	why := arbiter.Errorf(arbiter.EUnavailable, "not trusted")
	term := s.Store.Fenced(Fence{Term: s.TermNumber(), Trusted: func() error { return why }})
	ctx := context.Background()
	if err := term.Save(ctx, &arbiter.Changes{Events: []arbiter.Event{{Seq: 1, Time: time.Now(), Kind: "x", Subject: "y"}}}); !errors.Is(err, why) || errors.Is(err, arbiter.ErrSaveUnknown) {
		t.Fatalf("Save while untrusted: %v", err)
	}
	if evs, _ := s.Events(ctx, 0, 10); len(evs) != 0 {
		t.Fatalf("an untrusted Save wrote %d events", len(evs))
	}
	if err := term.TrimDeliveries(ctx, 0); !errors.Is(err, why) {
		t.Fatalf("trim while untrusted: %v", err)
	}
}

// TestCrashedHolderOnThisHost: with ReclaimDead, a holder on this host
// whose process is gone (killed with SIGKILL) does not make the restart
// wait for its lease; a live holder elsewhere is waited for.
func TestCrashedHolderOnThisHost(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openStore(t, url, schema, Options{ReclaimDead: true})
	ctx := context.Background()
	h, _, err := s.AcquireLease(ctx, "first", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	takeOver(t, url, schema, `UPDATE leader_lease SET holder = 'crashed', host = '`+thisHost(t)+`', pid = `+strconv.Itoa(deadPID(t))+
		`, expires_at = now() + interval '1 hour'`)
	h2, won, err := s.AcquireLease(ctx, "restarted", "", time.Minute)
	if err != nil || !won || h2.Term <= h.Term {
		t.Fatalf("take after the holder crashed: %+v %v %v", h2, won, err)
	}
	takeOver(t, url, schema, `UPDATE leader_lease SET holder = 'elsewhere', host = 'other-host', pid = 1, expires_at = now() + interval '1 hour'`)
	if _, won, err := s.AcquireLease(ctx, "restarted", "", time.Minute); err != nil || won {
		t.Fatalf("take while another host holds it: %v %v", won, err)
	}
	// Without ReclaimDead (replicas), a dead holder's lease runs out first.
	takeOver(t, url, schema, `UPDATE leader_lease SET holder = 'crashed', host = '`+thisHost(t)+`', pid = `+strconv.Itoa(deadPID(t))+
		`, expires_at = now() + interval '1 hour'`)
	if _, won, err := openStore(t, url, schema, Options{}).AcquireLease(ctx, "replica", "", time.Minute); err != nil || won {
		t.Fatalf("a replica took a dead holder's live lease: %v %v", won, err)
	}
}

// TestRoster: replicas join, see each other, and a second process with a
// node id in use is refused naming the first; a stale row is taken over,
// and its old owner finds out at its next beat.
func TestRoster(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	s := openStore(t, url, schema, Options{})
	ctx := context.Background()
	a := arbiter.Replica{ID: "a", Instance: "a1", URL: "http://a:7070", Host: "host-a", PID: 1, Version: "v"}
	b := arbiter.Replica{ID: "b", Instance: "b1", URL: "http://b:7070", Spalloc: "b:22244", Host: "host-b", PID: 1}
	for _, r := range []arbiter.Replica{a, b} {
		if err := s.JoinReplicas(ctx, r, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	dup := a
	dup.Instance, dup.Host = "a2", "host-x"
	err := s.JoinReplicas(ctx, dup, time.Minute)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "host-a") {
		t.Fatalf("second process with node id a: %v, want a conflict naming host-a", err)
	}
	rs, err := s.BeatReplica(ctx, a, time.Minute)
	if err != nil || len(rs) != 2 || rs[0].ID != "a" || rs[1].Spalloc != "b:22244" {
		t.Fatalf("beat: %+v %v", rs, err)
	}
	// b goes quiet: stale, it is no longer listed, and its id may be taken.
	takeOver(t, url, schema, `UPDATE replicas SET seen_at = now() - interval '1 hour' WHERE node_id = 'b'`)
	if rs, _ := s.BeatReplica(ctx, a, time.Minute); len(rs) != 1 {
		t.Fatalf("beat lists a stale replica: %+v", rs)
	}
	b2 := b
	b2.Instance = "b2"
	if err := s.JoinReplicas(ctx, b2, time.Minute); err != nil {
		t.Fatalf("join over a stale row: %v", err)
	}
	if _, err := s.BeatReplica(ctx, b, time.Minute); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("the old owner's beat: %v, want a conflict", err)
	}
	// A process of this host that is gone leaves its row at once.
	takeOver(t, url, schema, `UPDATE replicas SET host = '`+thisHost(t)+`', pid = `+strconv.Itoa(deadPID(t))+` WHERE node_id = 'a'`)
	if err := s.JoinReplicas(ctx, dup, time.Minute); err != nil {
		t.Fatalf("join after the holder died: %v", err)
	}
	if err := s.LeaveReplicas(ctx, dup); err != nil {
		t.Fatal(err)
	}
	if rs, _ := s.BeatReplica(ctx, b2, time.Minute); len(rs) != 1 || rs[0].ID != "b" {
		t.Fatalf("after a left: %+v", rs)
	}
}

func thisHost(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	return h
}

// deadPID is the id of a process that has exited.
func deadPID(t *testing.T) int {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip("no `true` to get a dead pid:", err)
	}
	return dead.ProcessState.Pid()
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

// TestTakeoverEndsAWriteCutMidBatch: Save sends its writes as one pipelined
// batch whose first statement is the fence (SELECT … FOR SHARE on the
// lease's row), committed at the batch's Sync. A leader paused or cut off
// while the batch is on the wire leaves a session that ran the fence and
// waits for the rest: not "idle in transaction" (PostgreSQL arms that
// timeout only after a Sync), so nothing would end it before the server's
// TCP keepalive, hours later. Once the lease has run out, a takeover ends
// that session rather than wait behind it.
//
// The leader's connection is simulated at the protocol level: exactly the
// bytes of save's batch up to and including the fence's Execute, then
// nothing (no Sync).
func TestTakeoverEndsAWriteCutMidBatch(t *testing.T) {
	url := testURL(t)
	schema := newSchema(t, url)
	const idle = 500 * time.Millisecond
	a := openStore(t, url, schema, Options{IdleInTransaction: idle})
	b := openStore(t, url, schema, Options{IdleInTransaction: idle})
	ctx := context.Background()
	h, won, err := a.AcquireLease(ctx, "a", "", 300*time.Millisecond)
	if err != nil || !won {
		t.Fatal(won, err)
	}

	// The leader's connection, set up as the Store's pool sets up its own.
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "500"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	fe := conn.PgConn().Frontend()
	fe.Send(&pgproto3.Parse{Query: fenceLease})
	fe.Send(&pgproto3.Bind{ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("1")}, ResultFormatCodes: []int16{0}})
	fe.Send(&pgproto3.Execute{})
	fe.Send(&pgproto3.Flush{}) // the rest of the batch, and its Sync, never arrive
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if h.Term != 1 {
		t.Fatalf("term %d", h.Term)
	}

	// Once the lease ran out (by the database's clock), a follower takes
	// over.
	poll.Until(t, 10*time.Second, "the lease to run out", func() bool {
		h, err := b.LeaseHolder(ctx)
		return err == nil && h.Remaining == 0
	})
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hb, won, err := b.AcquireLease(tctx, "b", "", time.Minute)
	if err != nil || !won {
		t.Fatalf("a follower's takeover after the lease ran out: won %v, %+v, err %v: the cut batch's fence still holds the lease's row", won, hb, err)
	}
}

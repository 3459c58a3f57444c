package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arbiter-hq/arbiter"
)

// One server per database (docs/guides/operations.md, "One server per
// store"). Two servers on one database would each hold their own engine and
// hand out the same GPUs under the same ids, so a Store holds the database's
// lease, the one row of leader_lease, for as long as it is open:
//
//   - Open takes it when it is free, expired, or held by a server on this
//     host whose process is gone (a restart after kill -9 need not wait for
//     the lease to run out); otherwise Open fails naming the holder.
//     Taking it raises the term.
//   - A goroutine renews it every TTL/3. The store trusts its lease until
//     TTL minus a margin after the start of the last renewal that
//     succeeded, measured on its own monotonic clock; past that, or as soon
//     as a renewal finds another term, the lease is lost: Lost is closed
//     and every Save fails, so the server stops writing rather than
//     silently going on beside another.
//   - Every Save checks, inside its transaction, that the term is still its
//     own (fencing), so a paused server that wakes up after a takeover
//     commits nothing.
//   - Close gives the lease back, so the next server starts at once.
//
// Session advisory locks are never the lock: a pooled connection loses
// them silently. The HA issue turns this into leadership (a follower
// waits for the lease instead of refusing to start).

// Defaults of the lease.
const (
	DefaultLeaseTTL = 15 * time.Second
	minLeaseTTL     = 300 * time.Millisecond
)

// LeaseHolder is what the lease row says of its holder.
type LeaseHolder struct {
	Term      int64
	Holder    string
	Host      string
	PID       int
	URL       string
	Acquired  time.Time
	ExpiresAt time.Time
}

// lease is a held lease.
type lease struct {
	pool   *pgxpool.Pool
	ttl    time.Duration
	margin time.Duration
	term   int64
	holder string

	mu         sync.Mutex
	trustUntil time.Time // monotonic: last good renewal's start + ttl - margin
	lostErr    error     // set once, with lost closed
	lost       chan struct{}

	stop chan struct{}
	done chan struct{}
}

// The statements of the lease. Times are the database's (now()), so
// servers with skewed clocks agree on expiry.
const (
	// takeLease inserts the row or takes it over when it has expired, or
	// when its term is $6 (a crashed holder's). It answers nothing when
	// someone else holds it.
	takeLease = `INSERT INTO leader_lease AS l (id, term, holder, host, pid, url, acquired_at, expires_at)
		VALUES (1, 1, $1, $2, $3, $4, now(), now() + $5 * interval '1 millisecond')
		ON CONFLICT (id) DO UPDATE SET term = l.term + 1, holder = EXCLUDED.holder, host = EXCLUDED.host,
			pid = EXCLUDED.pid, url = EXCLUDED.url, acquired_at = now(), expires_at = EXCLUDED.expires_at
		WHERE l.expires_at < now() OR l.term = $6
		RETURNING term`
	readLease = `SELECT term, holder, host, pid, url, acquired_at, expires_at FROM leader_lease WHERE id = 1`
	// renewLease moves the expiry of our term; nothing when it is not ours.
	renewLease = `UPDATE leader_lease SET expires_at = now() + $2 * interval '1 millisecond'
		WHERE id = 1 AND term = $1 RETURNING term`
	releaseLease = `UPDATE leader_lease SET expires_at = now() WHERE id = 1 AND term = $1`
	// fenceLease is the first statement of every Save's transaction ($1:
	// our term): the row is share-locked until commit, so a takeover waits
	// for the Save and a Save after a takeover sees the new term; and the
	// statement fails (division by zero, on a column so that it is not
	// folded at plan time) when the term is not ours, which rolls the
	// whole pipelined batch back.
	fenceLease = `SELECT CASE WHEN term = $1 THEN term ELSE term / (term - term) END FROM leader_lease WHERE id = 1 FOR SHARE`
)

// acquireLease takes the database's lease for holder, or fails naming
// whoever holds it. Errors: conflict when it is held and live; others as
// the database gives them.
func acquireLease(ctx context.Context, pool *pgxpool.Pool, o Options) (*lease, error) {
	ttl := o.LeaseTTL
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	ttl = max(ttl, minLeaseTTL)
	host, _ := os.Hostname()
	holder := o.Holder
	if holder == "" {
		holder = fmt.Sprintf("pid %d on host %s", os.Getpid(), host)
	}
	l := &lease{pool: pool, ttl: ttl, margin: max(ttl/10, 100*time.Millisecond), holder: holder,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	take := func(deadTerm int64) (bool, error) {
		start := time.Now()
		err := pool.QueryRow(ctx, takeLease, holder, host, os.Getpid(), o.URL, ttl.Milliseconds(), deadTerm).Scan(&l.term)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		l.trustUntil = start.Add(ttl - l.margin)
		return true, nil
	}
	ok, err := take(0)
	if err != nil {
		return nil, fmt.Errorf("take the lease: %w", err)
	}
	if !ok {
		h, err := readHolder(ctx, pool)
		if err != nil {
			return nil, fmt.Errorf("read the lease: %w", err)
		}
		// A holder on this host whose process is gone crashed: its lease
		// would only make the restart wait. Taken by its term, so a
		// holder that renews meanwhile keeps it.
		if h.Host == host && h.PID > 0 && h.PID != os.Getpid() && !processAlive(h.PID) {
			if ok, err = take(h.Term); err != nil {
				return nil, fmt.Errorf("take the lease: %w", err)
			}
		}
		if !ok {
			return nil, heldError(h)
		}
	}
	go l.renew()
	return l, nil
}

// readHolder reads the lease row.
func readHolder(ctx context.Context, pool *pgxpool.Pool) (LeaseHolder, error) {
	var h LeaseHolder
	err := pool.QueryRow(ctx, readLease).Scan(&h.Term, &h.Holder, &h.Host, &h.PID, &h.URL, &h.Acquired, &h.ExpiresAt)
	return h, err
}

func heldError(h LeaseHolder) error {
	who := "arbiter server " + arbiter.EscapeText(h.Holder, false)
	if h.URL != "" {
		who += " (" + arbiter.EscapeText(h.URL, false) + ")"
	}
	return arbiter.Errorf(arbiter.EConflict, "the database is used by %s since %s: its lease runs until %s unless renewed; "+
		"stop it or point this server at another database (one server per database)",
		who, h.Acquired.Local().Format(time.DateTime), h.ExpiresAt.Local().Format(time.DateTime))
}

// renew keeps the lease until Close, or until it is lost.
func (l *lease) renew() {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
		var term int64
		err := l.pool.QueryRow(ctx, renewLease, l.term, l.ttl.Milliseconds()).Scan(&term)
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			l.trustUntil = start.Add(l.ttl - l.margin)
			l.mu.Unlock()
		case errors.Is(err, pgx.ErrNoRows):
			h, _ := readHolder(context.Background(), l.pool)
			l.lose(fmt.Errorf("the database's lease was taken over by %s (term %d after our %d)",
				arbiter.EscapeText(h.Holder, false), h.Term, l.term))
			return
		default:
			// Not reachable for now: the lease holds until trustUntil.
			if err := l.check(time.Now()); err != nil {
				return
			}
		}
	}
}

// check returns nil while the lease is trusted; past its trust window it
// is lost. Errors: unavailable.
func (l *lease) check(now time.Time) error {
	l.mu.Lock()
	lostErr, until := l.lostErr, l.trustUntil
	l.mu.Unlock()
	if lostErr != nil {
		return lostErr
	}
	if now.After(until) {
		l.lose(fmt.Errorf("the database's lease could not be renewed for %s (its time to live); another server may hold it now", l.ttl))
		return l.check(now)
	}
	return nil
}

// lose marks the lease lost, once.
func (l *lease) lose(why error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return
	}
	l.lostErr = arbiter.Errorf(arbiter.EUnavailable, "this server no longer holds the database and writes nothing more: %v; restart it", why)
	close(l.lost)
}

// close stops renewing and gives the lease back, unless it was lost.
func (l *lease) close() {
	select {
	case <-l.stop:
		return
	default:
	}
	close(l.stop)
	<-l.done
	if l.check(time.Now()) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = l.pool.Exec(ctx, releaseLease, l.term)
}

// Lost is closed when the store has lost the database's lease (LostError
// says why): it writes nothing more, and the server should stop.
func (s *Store) Lost() <-chan struct{} { return s.lease.lost }

// LostError says why the lease was lost, nil while it is held.
func (s *Store) LostError() error {
	s.lease.mu.Lock()
	defer s.lease.mu.Unlock()
	return s.lease.lostErr
}

// Term is the term of the store's lease: it grows every time a server takes
// the database.
func (s *Store) Term() int64 { return s.lease.term }

// fenceFailed reports whether err is the fence refusing a term that is not
// ours (fenceLease's division by zero), or the lease row being gone.
func fenceFailed(err error) bool {
	var pe *pgconn.PgError
	return errors.Is(err, pgx.ErrNoRows) || (errors.As(err, &pe) && pe.Code == "22012")
}

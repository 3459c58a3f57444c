package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arbiter-hq/arbiter"
)

// Who may write to the database (docs/guides/high-availability.md): the
// one row of leader_lease, with a term that grows every time a server
// takes it. The Store implements arbiter.Lease with one autocommit
// statement per call; the leadership that campaigns, renews and trusts
// the lease (package leader) drives it. Only writes made through a Term
// (term.go) reach the tables, and each checks, inside its transaction,
// that the lease still has that term: a server that lost it — paused, cut
// off, taken over — commits nothing.
//
// Session advisory locks are never the leadership: a pooled connection
// loses them silently. Times are the database's (now()), so servers with
// skewed clocks agree on expiry.

var _ arbiter.Lease = (*Store)(nil)

// The statements of the lease. Migration 0005 makes sure the row exists
// (term 0, expired), so taking it is always an UPDATE.
const (
	// readLease reads the row with how long it still runs, by the
	// database's clock, in milliseconds (0 once expired).
	readLease = `SELECT term, holder, host, pid, url, acquired_at, expires_at,
		GREATEST(0, EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::float8
		FROM leader_lease WHERE id = 1`
	// takeLease takes the row read with term $5 when it has expired, or
	// when $7 (its holder is known to be gone). A compare-and-set on the
	// term: of several servers taking it at once, one wins.
	takeLease = `UPDATE leader_lease SET term = term + 1, holder = $1, host = $2, pid = $3, url = $4,
			acquired_at = now(), expires_at = now() + $6 * interval '1 millisecond'
		WHERE id = 1 AND term = $5 AND (expires_at < now() OR $7)
		RETURNING term, acquired_at, expires_at`
	// renewLease moves the expiry of our term; nothing when it is not ours.
	renewLease = `UPDATE leader_lease SET expires_at = now() + $2 * interval '1 millisecond'
		WHERE id = 1 AND term = $1 RETURNING term`
	releaseLease = `UPDATE leader_lease SET expires_at = now() WHERE id = 1 AND term = $1`
	// fenceLease is the first statement of every write's transaction
	// (term.go; $1: the writer's term): the row is share-locked until
	// commit, so a takeover waits for the write and a write after a
	// takeover sees the new term; and the statement fails (division by
	// zero, on a column so that it is not folded at plan time) when the
	// term is not ours, which rolls a pipelined batch back as a whole.
	fenceLease = `SELECT CASE WHEN term = $1 THEN term ELSE term / (term - term) END FROM leader_lease WHERE id = 1 FOR SHARE`
)

// LeaseHolder reads the lease. Errors: not_found before any server took it.
func (s *Store) LeaseHolder(ctx context.Context) (arbiter.LeaseHolder, error) {
	h, err := scanHolder(s.pool.QueryRow(ctx, readLease))
	if err != nil {
		return h, fmt.Errorf("postgres: read the lease: %w", normalize(err))
	}
	if h.Term == 0 {
		return h, arbiter.Errorf(arbiter.ENotFound, "no server has held this database yet")
	}
	return h, nil
}

// scanHolder reads readLease's row.
func scanHolder(row pgx.Row) (arbiter.LeaseHolder, error) {
	var h arbiter.LeaseHolder
	var ms float64
	err := row.Scan(&h.Term, &h.ID, &h.Host, &h.PID, &h.URL, &h.Acquired, &h.ExpiresAt, &ms)
	h.Remaining = time.Duration(ms * float64(time.Millisecond))
	return h, err
}

// AcquireLease takes the lease for id (reached at url) for ttl when it is
// free or has expired — or, when the Store was opened with ReclaimDead,
// when its holder is a process of this host that is gone (a restart after
// kill -9 need not wait for the lease to run out). It returns the holder
// after the attempt and whether that is id. A holder that renews keeps the
// lease whatever happens here: the take is a compare-and-set on the term.
func (s *Store) AcquireLease(ctx context.Context, id, url string, ttl time.Duration) (arbiter.LeaseHolder, bool, error) {
	h, won, err := s.acquire(ctx, id, url, ttl)
	if err != nil {
		return h, false, fmt.Errorf("postgres: take the lease: %w", normalize(err))
	}
	return h, won, nil
}

func (s *Store) acquire(ctx context.Context, id, url string, ttl time.Duration) (arbiter.LeaseHolder, bool, error) {
	h, err := scanHolder(s.pool.QueryRow(ctx, readLease))
	if err != nil {
		return h, false, err
	}
	host, _ := os.Hostname()
	pid := os.Getpid()
	gone := s.reclaimDead && h.Remaining > 0 && h.Host == host && h.PID > 0 && h.PID != pid && !processAlive(h.PID)
	if h.Remaining > 0 && !gone {
		return h, false, nil
	}
	next := arbiter.LeaseHolder{ID: id, URL: url, Host: host, PID: pid, Remaining: ttl}
	take := func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", takeLockWait.Milliseconds())); err != nil {
				return err
			}
			return tx.QueryRow(ctx, takeLease, id, host, pid, url, h.Term, ttl.Milliseconds(), gone).
				Scan(&next.Term, &next.Acquired, &next.ExpiresAt)
		})
	}
	err = take()
	if lockWaited(err) {
		// The lease ran out, yet a write of its term still holds the row:
		// a leader paused or cut off in the middle of sending a batch,
		// whose session waits for the rest and is not "idle in
		// transaction", so nothing else would end it for hours. Its term
		// is over; so is that session.
		if err := s.endStuckWriters(ctx, h.Term, gone); err != nil {
			return h, false, err
		}
		err = take()
	}
	if errors.Is(err, pgx.ErrNoRows) { // someone else was quicker, or renewed
		h, err = scanHolder(s.pool.QueryRow(ctx, readLease))
		return h, false, err
	}
	if err != nil {
		return h, false, err
	}
	return next, true, nil
}

// takeLockWait is how long a takeover waits for a write of the old term
// holding the lease's row (fenceLease) before it ends that write's
// session: a live write holds it for milliseconds.
const takeLockWait = 500 * time.Millisecond

// lockWaited reports whether err is lock_timeout's.
func lockWaited(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// endStuckWriters ends the sessions that hold the lease's row share-locked
// (fenceLease) while the lease is still term's and has run out (or its
// holder is gone): writes of a term that is over. Should another replica
// have taken the lease meanwhile, its own writes hold the row, and nothing
// is ended. Sessions of this database's role may be ended by it; others
// need pg_signal_backend.
func (s *Store) endStuckWriters(ctx context.Context, term int64, gone bool) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'relation' AND relation = 'leader_lease'::regclass AND mode = 'RowShareLock'
			AND granted AND pid <> pg_backend_pid()
			AND EXISTS (SELECT 1 FROM leader_lease WHERE id = 1 AND term = $1 AND (expires_at < now() OR $2))`, term, gone)
	if err != nil {
		return fmt.Errorf("end the sessions of a write that holds the expired lease: %w", err)
	}
	return nil
}

// RenewLease moves the expiry of term's lease to ttl from now; false when
// the lease has another term (nothing changes then).
func (s *Store) RenewLease(ctx context.Context, term int64, ttl time.Duration) (bool, error) {
	var got int64
	err := s.pool.QueryRow(ctx, renewLease, term, ttl.Milliseconds()).Scan(&got)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("postgres: renew the lease: %w", normalize(err))
	}
	return true, nil
}

// ReleaseLease ends term's lease now, so the next server takes it at once.
func (s *Store) ReleaseLease(ctx context.Context, term int64) error {
	if _, err := s.pool.Exec(ctx, releaseLease, term); err != nil {
		return fmt.Errorf("postgres: release the lease: %w", normalize(err))
	}
	return nil
}

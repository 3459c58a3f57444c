package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arbiter-hq/arbiter"
)

// Fence is what every write of a Term is checked against.
type Fence struct {
	// Term is the lease's term the writes are made under.
	Term int64
	// Trusted returns nil while the leadership trusts its lease of Term
	// (its trust window has not passed), and an error saying why not
	// otherwise: a write is then refused before it is sent. Nil: trusted.
	Trusted func() error
	// Lost, when set, is told as soon as a write finds the lease under
	// another term, so the leadership steps down at once rather than at its
	// next renewal.
	Lost func(error)
	// Timeout, when set, bounds every write: one stuck on a database that
	// stopped answering (a partition drops packets, nothing resets the
	// connection) gives up, so the leader can step down and close.
	Timeout time.Duration
}

// Term is the Store as written under one term of the lease: an
// arbiter.Store and arbiter.DeliveryLog whose every write is fenced (Fence),
// so a server that no longer holds the lease commits nothing. Reads are the
// Store's. A Term is dropped when its term ends; closing it does not close
// the Store.
type Term struct {
	*Store
	fence Fence
}

var (
	_ arbiter.Store       = (*Term)(nil)
	_ arbiter.DeliveryLog = (*Term)(nil)
)

// Fenced returns the store for writing under f.Term.
func (s *Store) Fenced(f Fence) *Term { return &Term{Store: s, fence: f} }

// TermNumber is the term the writes are fenced by.
func (t *Term) TermNumber() int64 { return t.fence.Term }

// Close does nothing: the Store stays open for its owner to close.
func (t *Term) Close() error { return nil }

// Load is the Store's, bounded by the fence's Timeout like a write: a
// loop that reloads after a failed write must not wait long on a database
// that stopped answering.
func (t *Term) Load(ctx context.Context) (*arbiter.State, error) {
	ctx, cancel := t.fence.bound(ctx)
	defer cancel()
	return t.Store.Load(ctx)
}

// bound is ctx bounded by the fence's Timeout.
func (f *Fence) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, f.Timeout)
}

// trusted is the leadership's word before a write is sent.
func (f *Fence) trusted() error {
	if f.Trusted == nil {
		return nil
	}
	return f.Trusted()
}

// check compares the term read by fenceLease, inside the write's
// transaction, with the fence's: a write under a term that is no longer
// the lease's is refused (and the leadership told), never committed.
// Errors: unavailable.
func (f *Fence) check(ctx context.Context, s *Store, row pgx.Row) error {
	var term int64
	err := row.Scan(&term)
	if err != nil && !fenceFailed(err) {
		return fmt.Errorf("check the lease: %w", err)
	}
	if err == nil && term == f.Term {
		return nil
	}
	who := "another server"
	if h, err := scanHolder(s.pool.QueryRow(ctx, readLease)); err == nil {
		who = fmt.Sprintf("%s (term %d)", arbiter.EscapeText(h.ID, false), h.Term)
	}
	lost := arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "this server no longer holds the database's lease (term %d): it is held by %s; nothing was written", f.Term, who))
	if f.Lost != nil {
		f.Lost(lost)
	}
	return lost
}

// fenced runs fn in a transaction that first checks the fence.
func (f *Fence) fenced(ctx context.Context, s *Store, fn func(pgx.Tx) error) error {
	if err := f.trusted(); err != nil {
		return err
	}
	ctx, cancel := f.bound(ctx)
	defer cancel()
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := f.check(ctx, s, tx.QueryRow(ctx, fenceLease, f.Term)); err != nil {
			return err
		}
		return fn(tx)
	})
}

// Save writes c in one transaction fenced by the term: all of it or, on
// error, none. See Store.save.
func (t *Term) Save(ctx context.Context, c *arbiter.Changes) error {
	ctx, cancel := t.fence.bound(ctx)
	defer cancel()
	if err := t.save(ctx, c, &t.fence); err != nil {
		return fmt.Errorf("postgres: save: %w", normalize(err))
	}
	return nil
}

// EnqueueDeliveries is Store.enqueueDeliveries, fenced.
func (t *Term) EnqueueDeliveries(ctx context.Context, ds []arbiter.Delivery, cursor int64) error {
	return t.enqueueDeliveries(ctx, &t.fence, ds, cursor)
}

// RecordAttempt is Store.recordAttempt, fenced.
func (t *Term) RecordAttempt(ctx context.Context, d arbiter.Delivery, a arbiter.DeliveryAttempt) error {
	return t.recordAttempt(ctx, &t.fence, d, a)
}

// TrimDeliveries is Store.trimDeliveries, fenced.
func (t *Term) TrimDeliveries(ctx context.Context, keep int) error {
	return t.trimDeliveries(ctx, &t.fence, keep)
}

// fenceFailed reports whether err is fenceLease refusing a term that is
// not ours (its division by zero), or the lease row being gone.
func fenceFailed(err error) bool {
	var pe *pgconn.PgError
	return errors.Is(err, pgx.ErrNoRows) || (errors.As(err, &pe) && pe.Code == "22012")
}

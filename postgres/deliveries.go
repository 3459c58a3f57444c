package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/sqlstore"
	"github.com/jackc/pgx/v5"
)

// The webhook delivery log (arbiter.DeliveryLog): store-only data written by
// the webhook dispatcher in short transactions and read by the API.

const insertDeliveries = `INSERT INTO webhook_deliveries (id, webhook, event_seq, event_kind, body, state,
	attempts, next_attempt_at, last_status, last_error, created_at, updated_at)
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bytea[], $6::text[],
		$7::integer[], $8::timestamptz[], $9::integer[], $10::text[], $11::timestamptz[], $12::timestamptz[])
	ON CONFLICT (id) DO NOTHING`

// WebhookCursor returns the Seq of the last event turned into deliveries.
func (s *Store) WebhookCursor(ctx context.Context) (int64, error) {
	seq, err := sqlstore.WebhookCursor(ctx, pgDB{s.pool}, sqlstore.DollarNumbers)
	if err != nil {
		return 0, fmt.Errorf("postgres: webhook cursor: %w", normalize(err))
	}
	return seq, nil
}

// enqueueDeliveries inserts ds (ids present already are kept as they are)
// and moves the cursor to cursor, in one transaction fenced by f
// (Term.EnqueueDeliveries).
func (s *Store) enqueueDeliveries(ctx context.Context, f *Fence, ds []arbiter.Delivery, cursor int64) error {
	ds = lastByKey(ds, func(d *arbiter.Delivery) string { return d.ID })
	n := len(ds)
	ids, hooks, kinds, states, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	seqs := make([]int64, n)
	bodies := make([][]byte, n)
	attempts, statuses := make([]int32, n), make([]int32, n)
	next := make([]*time.Time, n)
	created, updated := make([]time.Time, n), make([]time.Time, n)
	for i, d := range ds {
		ids[i], hooks[i], seqs[i], kinds[i], bodies[i], states[i] = d.ID, d.Webhook, d.EventSeq, d.EventKind, d.Body, d.State
		if bodies[i] == nil {
			bodies[i] = []byte{}
		}
		attempts[i], next[i], statuses[i], errs[i] = int32(d.Attempts), d.NextAttemptAt, int32(d.LastStatus), d.LastError
		created[i], updated[i] = d.CreatedAt.UTC(), d.UpdatedAt.UTC()
	}
	err := f.fenced(ctx, s, func(tx pgx.Tx) error {
		if n > 0 {
			if _, err := tx.Exec(ctx, insertDeliveries, ids, hooks, seqs, kinds, bodies, states, attempts, next, statuses, errs, created, updated); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO webhook_cursor (name, seq) VALUES ($1, $2)
			ON CONFLICT (name) DO UPDATE SET seq = GREATEST(webhook_cursor.seq, EXCLUDED.seq)`, sqlstore.DeliveryCursor, cursor)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: enqueue deliveries: %w", normalize(err))
	}
	return nil
}

// PendingDeliveries returns up to limit pending deliveries with their
// bodies, the earliest next attempt first, but those of the subscriptions
// in skip.
func (s *Store) PendingDeliveries(ctx context.Context, limit int, skip []string) ([]arbiter.Delivery, error) {
	out, err := sqlstore.PendingDeliveries(ctx, pgDB{s.pool}, sqlstore.DollarNumbers, limit, skip)
	if err != nil {
		return nil, fmt.Errorf("postgres: pending deliveries: %w", normalize(err))
	}
	return out, nil
}

// recordAttempt saves d's state and appends attempt a (when a.N > 0), in
// one transaction fenced by f (Term.RecordAttempt). Errors: not_found for
// an unknown delivery.
func (s *Store) recordAttempt(ctx context.Context, f *Fence, d arbiter.Delivery, a arbiter.DeliveryAttempt) error {
	err := f.fenced(ctx, s, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE webhook_deliveries SET state = $1, attempts = $2, next_attempt_at = $3,
			last_status = $4, last_error = $5, updated_at = $6 WHERE id = $7`,
			d.State, d.Attempts, d.NextAttemptAt, d.LastStatus, d.LastError, d.UpdatedAt.UTC(), d.ID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return arbiter.Errorf(arbiter.ENotFound, "delivery %q is not in the log", d.ID)
		}
		if a.N <= 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO webhook_attempts (delivery_id, n, at, status, error, duration_ms)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (delivery_id, n) DO UPDATE SET at = EXCLUDED.at,
			status = EXCLUDED.status, error = EXCLUDED.error, duration_ms = EXCLUDED.duration_ms`,
			d.ID, a.N, a.At.UTC(), a.Status, a.Error, a.DurationMS)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: record delivery attempt: %w", normalize(err))
	}
	return nil
}

// Deliveries lists deliveries passing f, newest first, with their attempts.
func (s *Store) Deliveries(ctx context.Context, f arbiter.DeliveryFilter) ([]arbiter.Delivery, error) {
	var out []arbiter.Delivery
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		out, err = sqlstore.Deliveries(ctx, pgDB{tx}, sqlstore.DollarNumbers, f)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: deliveries: %w", normalize(err))
	}
	return out, nil
}

// trimDeliveries deletes finished deliveries beyond the newest keep, with
// their attempts (ON DELETE CASCADE), fenced by f (Term.TrimDeliveries).
func (s *Store) trimDeliveries(ctx context.Context, f *Fence, keep int) error {
	err := f.fenced(ctx, s, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id IN (
			SELECT id FROM webhook_deliveries WHERE state <> $1
			ORDER BY event_seq DESC, id DESC OFFSET $2)`, arbiter.DeliveryPending, max(keep, 0))
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: trim deliveries: %w", normalize(err))
	}
	return nil
}

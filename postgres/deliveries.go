package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/jackc/pgx/v5"
)

// The webhook delivery log (arbiter.DeliveryLog): store-only data written by
// the webhook dispatcher in short transactions and read by the API.

var _ arbiter.DeliveryLog = (*Store)(nil)

// deliveryCursor is the webhook_cursor row of the dispatcher.
const deliveryCursor = "webhooks"

// deliveryColumns are the columns every delivery query reads, bodies aside.
const deliveryColumns = `id, webhook, event_seq, event_kind, state, attempts, next_attempt_at,
	last_status, last_error, created_at, updated_at`

const insertDeliveries = `INSERT INTO webhook_deliveries (id, webhook, event_seq, event_kind, body, state,
	attempts, next_attempt_at, last_status, last_error, created_at, updated_at)
	SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bytea[], $6::text[],
		$7::integer[], $8::timestamptz[], $9::integer[], $10::text[], $11::timestamptz[], $12::timestamptz[])
	ON CONFLICT (id) DO NOTHING`

// WebhookCursor returns the Seq of the last event turned into deliveries.
func (s *Store) WebhookCursor(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT seq FROM webhook_cursor WHERE name = $1`, deliveryCursor).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: webhook cursor: %w", normalize(err))
	}
	return seq, nil
}

// EnqueueDeliveries inserts ds (ids present already are kept as they are)
// and moves the cursor to cursor, in one transaction.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []arbiter.Delivery, cursor int64) error {
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
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if n > 0 {
			if _, err := tx.Exec(ctx, insertDeliveries, ids, hooks, seqs, kinds, bodies, states, attempts, next, statuses, errs, created, updated); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO webhook_cursor (name, seq) VALUES ($1, $2)
			ON CONFLICT (name) DO UPDATE SET seq = GREATEST(webhook_cursor.seq, EXCLUDED.seq)`, deliveryCursor, cursor)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: enqueue deliveries: %w", normalize(err))
	}
	return nil
}

// PendingDeliveries returns up to limit pending deliveries with their
// bodies, the earliest next attempt first.
func (s *Store) PendingDeliveries(ctx context.Context, limit int) ([]arbiter.Delivery, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+deliveryColumns+`, body FROM webhook_deliveries
		WHERE state = $1 ORDER BY next_attempt_at NULLS FIRST, event_seq, id LIMIT $2`, arbiter.DeliveryPending, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: pending deliveries: %w", normalize(err))
	}
	out, err := scanDeliveries(rows, true)
	if err != nil {
		return nil, fmt.Errorf("postgres: pending deliveries: %w", normalize(err))
	}
	return out, nil
}

// RecordAttempt saves d's state and appends attempt a (when a.N > 0), in
// one transaction. Errors: not_found for an unknown delivery.
func (s *Store) RecordAttempt(ctx context.Context, d arbiter.Delivery, a arbiter.DeliveryAttempt) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
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
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	var where []string
	var args []any
	if f.Webhook != "" {
		args = append(args, f.Webhook)
		where = append(where, "webhook = $"+strconv.Itoa(len(args)))
	}
	if f.State != "" {
		args = append(args, f.State)
		where = append(where, "state = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + deliveryColumns + ` FROM webhook_deliveries`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	args = append(args, limit)
	q += ` ORDER BY event_seq DESC, id DESC LIMIT $` + strconv.Itoa(len(args))
	var out []arbiter.Delivery
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		if out, err = scanDeliveries(rows, false); err != nil || len(out) == 0 {
			return err
		}
		byID := make(map[string]int, len(out))
		ids := make([]string, len(out))
		for i, d := range out {
			byID[d.ID], ids[i] = i, d.ID
		}
		rows, err = tx.Query(ctx, `SELECT delivery_id, n, at, status, error, duration_ms FROM webhook_attempts
			WHERE delivery_id = ANY($1::text[]) ORDER BY delivery_id, n`, ids)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var a arbiter.DeliveryAttempt
			var n, status int32
			if err := rows.Scan(&id, &n, &a.At, &status, &a.Error, &a.DurationMS); err != nil {
				return err
			}
			a.N, a.Status, a.At = int(n), int(status), a.At.UTC()
			i := byID[id]
			out[i].History = append(out[i].History, a)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: deliveries: %w", normalize(err))
	}
	if out == nil {
		out = []arbiter.Delivery{}
	}
	return out, nil
}

// TrimDeliveries deletes finished deliveries beyond the newest keep, with
// their attempts (ON DELETE CASCADE).
func (s *Store) TrimDeliveries(ctx context.Context, keep int) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM webhook_deliveries WHERE id IN (
		SELECT id FROM webhook_deliveries WHERE state <> $1
		ORDER BY event_seq DESC, id DESC OFFSET $2)`, arbiter.DeliveryPending, max(keep, 0))
	if err != nil {
		return fmt.Errorf("postgres: trim deliveries: %w", normalize(err))
	}
	return nil
}

func scanDeliveries(rows pgx.Rows, body bool) ([]arbiter.Delivery, error) {
	defer rows.Close()
	out := []arbiter.Delivery{}
	for rows.Next() {
		var d arbiter.Delivery
		var next *time.Time
		var attempts, status int32
		dst := []any{&d.ID, &d.Webhook, &d.EventSeq, &d.EventKind, &d.State, &attempts, &next,
			&status, &d.LastError, &d.CreatedAt, &d.UpdatedAt}
		if body {
			dst = append(dst, &d.Body)
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		d.Attempts, d.LastStatus = int(attempts), int(status)
		if next != nil {
			t := next.UTC()
			d.NextAttemptAt = &t
		}
		d.CreatedAt, d.UpdatedAt = d.CreatedAt.UTC(), d.UpdatedAt.UTC()
		out = append(out, d)
	}
	return out, rows.Err()
}

package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The webhook delivery log (arbiter.DeliveryLog): store-only data written by
// the webhook dispatcher through the writer connection, in short
// transactions between Saves, and read through the readers.

var _ arbiter.DeliveryLog = (*Store)(nil)

// deliveryCursor is the webhook_cursor row of the dispatcher.
const deliveryCursor = "webhooks"

// deliveryColumns are the columns every delivery query reads, bodies aside.
const deliveryColumns = `id, webhook, event_seq, event_kind, state, attempts, next_attempt_at,
	last_status, last_error, created_at, updated_at`

const sqlInsertDelivery = `INSERT INTO webhook_deliveries (id, webhook, event_seq, event_kind, body, state, attempts,
	next_attempt_at, last_status, last_error, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (id) DO NOTHING`

// WebhookCursor returns the Seq of the last event turned into deliveries.
func (s *Store) WebhookCursor(ctx context.Context) (int64, error) {
	var seq int64
	err := s.reader.QueryRowContext(ctx, `SELECT seq FROM webhook_cursor WHERE name = ?`, deliveryCursor).Scan(&seq)
	if err == sql.ErrNoRows {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sqlite: webhook cursor: %w", normalize(err))
	}
	return seq, nil
}

// EnqueueDeliveries inserts ds (ids present already are kept as they are)
// and moves the cursor to cursor, in one transaction.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []arbiter.Delivery, cursor int64) error {
	err := s.writeTx(ctx, func(w *rawConn) error {
		for i := range ds {
			d := &ds[i]
			if err := w.exec(sqlInsertDelivery, d.ID, d.Webhook, d.EventSeq, d.EventKind, d.Body, d.State, d.Attempts,
				deliveryNanos(d.NextAttemptAt), d.LastStatus, d.LastError, formatTime(d.CreatedAt), formatTime(d.UpdatedAt)); err != nil {
				return err
			}
		}
		return w.exec(`INSERT INTO webhook_cursor (name, seq) VALUES (?, ?)
			ON CONFLICT (name) DO UPDATE SET seq = max(seq, excluded.seq)`, deliveryCursor, cursor)
	})
	if err != nil {
		return fmt.Errorf("sqlite: enqueue deliveries: %w", normalize(err))
	}
	return nil
}

// PendingDeliveries returns up to limit pending deliveries with their
// bodies, the earliest next attempt first.
func (s *Store) PendingDeliveries(ctx context.Context, limit int) ([]arbiter.Delivery, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.reader.QueryContext(ctx, `SELECT `+deliveryColumns+`, body FROM webhook_deliveries
		WHERE state = ? ORDER BY next_attempt_at, event_seq, id LIMIT ?`, arbiter.DeliveryPending, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: pending deliveries: %w", normalize(err))
	}
	out, err := scanDeliveries(rows, true)
	if err != nil {
		return nil, fmt.Errorf("sqlite: pending deliveries: %w", normalize(err))
	}
	return out, nil
}

// RecordAttempt saves d's state and appends attempt a (when a.N > 0), in
// one transaction. Errors: not_found for an unknown delivery.
func (s *Store) RecordAttempt(ctx context.Context, d arbiter.Delivery, a arbiter.DeliveryAttempt) error {
	err := s.writeTx(ctx, func(w *rawConn) error {
		if err := w.exec(`UPDATE webhook_deliveries SET state = ?, attempts = ?, next_attempt_at = ?,
			last_status = ?, last_error = ?, updated_at = ? WHERE id = ?`,
			d.State, d.Attempts, deliveryNanos(d.NextAttemptAt), d.LastStatus, d.LastError, formatTime(d.UpdatedAt), d.ID); err != nil {
			return err
		}
		if w.changes() == 0 {
			return arbiter.Errorf(arbiter.ENotFound, "delivery %q is not in the log", d.ID)
		}
		if a.N <= 0 {
			return nil
		}
		return w.exec(`INSERT INTO webhook_attempts (delivery_id, n, at, status, error, duration_ms)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (delivery_id, n) DO UPDATE SET at = excluded.at,
			status = excluded.status, error = excluded.error, duration_ms = excluded.duration_ms`,
			d.ID, a.N, formatTime(a.At), a.Status, a.Error, a.DurationMS)
	})
	if err != nil {
		return fmt.Errorf("sqlite: record delivery attempt: %w", normalize(err))
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
		where, args = append(where, "webhook = ?"), append(args, f.Webhook)
	}
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, f.State)
	}
	q := `SELECT ` + deliveryColumns + ` FROM webhook_deliveries`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY event_seq DESC, id DESC LIMIT ?`
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("sqlite: deliveries: %w", normalize(err))
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: deliveries: %w", normalize(err))
	}
	out, err := scanDeliveries(rows, false)
	if err != nil {
		return nil, fmt.Errorf("sqlite: deliveries: %w", normalize(err))
	}
	if len(out) == 0 {
		return out, nil
	}
	byID := make(map[string]int, len(out))
	ids := make([]any, len(out))
	for i, d := range out {
		byID[d.ID] = i
		ids[i] = d.ID
	}
	rows, err = tx.QueryContext(ctx, `SELECT delivery_id, n, at, status, error, duration_ms FROM webhook_attempts
		WHERE delivery_id IN (?`+strings.Repeat(",?", len(ids)-1)+`) ORDER BY delivery_id, n`, ids...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: delivery attempts: %w", normalize(err))
	}
	defer rows.Close()
	for rows.Next() {
		var id, at string
		var a arbiter.DeliveryAttempt
		if err := rows.Scan(&id, &a.N, &at, &a.Status, &a.Error, &a.DurationMS); err != nil {
			return nil, fmt.Errorf("sqlite: delivery attempts: %w", err)
		}
		if a.At, err = parseTime(at); err != nil {
			return nil, fmt.Errorf("sqlite: delivery attempts: %w", err)
		}
		i := byID[id]
		out[i].History = append(out[i].History, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: delivery attempts: %w", normalize(err))
	}
	return out, nil
}

// TrimDeliveries deletes finished deliveries beyond the newest keep, with
// their attempts (ON DELETE CASCADE).
func (s *Store) TrimDeliveries(ctx context.Context, keep int) error {
	err := s.writeTx(ctx, func(w *rawConn) error {
		return w.exec(`DELETE FROM webhook_deliveries WHERE id IN (
			SELECT id FROM webhook_deliveries WHERE state != ?
			ORDER BY event_seq DESC, id DESC LIMIT -1 OFFSET ?)`, arbiter.DeliveryPending, max(keep, 0))
	})
	if err != nil {
		return fmt.Errorf("sqlite: trim deliveries: %w", normalize(err))
	}
	return nil
}

func scanDeliveries(rows *sql.Rows, body bool) ([]arbiter.Delivery, error) {
	defer rows.Close()
	out := []arbiter.Delivery{}
	for rows.Next() {
		var d arbiter.Delivery
		var next sql.NullInt64
		var created, updated string
		dst := []any{&d.ID, &d.Webhook, &d.EventSeq, &d.EventKind, &d.State, &d.Attempts, &next,
			&d.LastStatus, &d.LastError, &created, &updated}
		if body {
			dst = append(dst, &d.Body)
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		if next.Valid {
			t := time.Unix(0, next.Int64).UTC()
			d.NextAttemptAt = &t
		}
		var err error
		if d.CreatedAt, err = parseTime(created); err != nil {
			return nil, err
		}
		if d.UpdatedAt, err = parseTime(updated); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// deliveryNanos is a next-attempt time as stored: Unix nanoseconds or NULL.
func deliveryNanos(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}

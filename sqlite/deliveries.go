package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/sqlstore"
)

// The webhook delivery log (arbiter.DeliveryLog): store-only data written by
// the webhook dispatcher through the writer connection, in short
// transactions between Saves, and read through the readers.

var _ arbiter.DeliveryLog = (*Store)(nil)

const sqlInsertDelivery = `INSERT INTO webhook_deliveries (id, webhook, event_seq, event_kind, body, state, attempts,
	next_attempt_at, last_status, last_error, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (id) DO NOTHING`

// WebhookCursor returns the Seq of the last event turned into deliveries.
func (s *Store) WebhookCursor(ctx context.Context) (int64, error) {
	seq, err := sqlstore.WebhookCursor(ctx, sqlDB{s.reader}, sqlstore.QuestionMarks)
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
				deliveryNanos(d.NextAttemptAt), d.LastStatus, d.LastError, sqlstore.FormatTime(d.CreatedAt), sqlstore.FormatTime(d.UpdatedAt)); err != nil {
				return err
			}
		}
		return w.exec(`INSERT INTO webhook_cursor (name, seq) VALUES (?, ?)
			ON CONFLICT (name) DO UPDATE SET seq = max(seq, excluded.seq)`, sqlstore.DeliveryCursor, cursor)
	})
	if err != nil {
		return fmt.Errorf("sqlite: enqueue deliveries: %w", normalize(err))
	}
	return nil
}

// PendingDeliveries returns up to limit pending deliveries with their
// bodies, the earliest next attempt first, but those of the subscriptions
// in skip.
func (s *Store) PendingDeliveries(ctx context.Context, limit int, skip []string) ([]arbiter.Delivery, error) {
	out, err := sqlstore.PendingDeliveries(ctx, sqlDB{s.reader}, sqlstore.QuestionMarks, limit, skip)
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
			d.State, d.Attempts, deliveryNanos(d.NextAttemptAt), d.LastStatus, d.LastError, sqlstore.FormatTime(d.UpdatedAt), d.ID); err != nil {
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
			d.ID, a.N, sqlstore.FormatTime(a.At), a.Status, a.Error, a.DurationMS)
	})
	if err != nil {
		return fmt.Errorf("sqlite: record delivery attempt: %w", normalize(err))
	}
	return nil
}

// Deliveries lists deliveries passing f, newest first, with their attempts.
func (s *Store) Deliveries(ctx context.Context, f arbiter.DeliveryFilter) ([]arbiter.Delivery, error) {
	out, err := s.deliveries(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("sqlite: deliveries: %w", normalize(err))
	}
	return out, nil
}

func (s *Store) deliveries(ctx context.Context, f arbiter.DeliveryFilter) ([]arbiter.Delivery, error) {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	return sqlstore.Deliveries(ctx, sqlDB{tx}, sqlstore.QuestionMarks, f)
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

// deliveryNanos is a next-attempt time as stored: Unix nanoseconds or NULL.
func deliveryNanos(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}

package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The reads of the webhook delivery log (arbiter.DeliveryLog). Its tables
// are the same in both stores but for the types of their times: SQLite
// keeps RFC 3339 text (FormatTime) and next_attempt_at as Unix nanoseconds,
// PostgreSQL timestamptz; scanTime reads either. The writes stay in each
// store.

// DeliveryCursor is the webhook_cursor row of the dispatcher.
const DeliveryCursor = "webhooks"

// deliveryColumns are the columns every delivery query reads, bodies aside,
// in the order scanDeliveries reads them.
const deliveryColumns = `id, webhook, event_seq, event_kind, state, attempts, next_attempt_at,
	last_status, last_error, created_at, updated_at`

// WebhookCursor returns the Seq of the last event turned into deliveries,
// 0 before the first.
func WebhookCursor(ctx context.Context, q Querier, d Dialect) (int64, error) {
	rows, err := q.Query(ctx, d.Bind(`SELECT seq FROM webhook_cursor WHERE name = ?`), DeliveryCursor)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var seq int64
	if rows.Next() {
		if err := rows.Scan(&seq); err != nil {
			return 0, err
		}
	}
	return seq, rows.Err()
}

// PendingDeliveries returns up to limit pending deliveries with their
// bodies, the earliest next attempt first (none set first), but those of
// the subscriptions in skip; none for a limit <= 0.
func PendingDeliveries(ctx context.Context, q Querier, d Dialect, limit int, skip []string) ([]arbiter.Delivery, error) {
	if limit <= 0 {
		return nil, nil
	}
	args := []any{arbiter.DeliveryPending}
	not := ""
	if len(skip) > 0 {
		not = ` AND webhook NOT IN (?` + strings.Repeat(`, ?`, len(skip)-1) + `)`
		for _, w := range skip {
			args = append(args, w)
		}
	}
	args = append(args, limit)
	rows, err := q.Query(ctx, d.Bind(`SELECT `+deliveryColumns+`, body FROM webhook_deliveries
		WHERE state = ?`+not+` ORDER BY next_attempt_at NULLS FIRST, event_seq, id LIMIT ?`), args...)
	if err != nil {
		return nil, err
	}
	return scanDeliveries(rows, true)
}

// Deliveries lists the deliveries passing f, newest first (by event, then
// id), with their attempts and without bodies. q should be one read-only
// transaction, so that the attempts are those of the deliveries listed.
// The result is never nil.
func Deliveries(ctx context.Context, q Querier, d Dialect, f arbiter.DeliveryFilter) ([]arbiter.Delivery, error) {
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
	args = append(args, limit)
	filter := ``
	if len(where) > 0 {
		filter = ` WHERE ` + strings.Join(where, " AND ")
	}
	filter += ` ORDER BY event_seq DESC, id DESC LIMIT ?`

	rows, err := q.Query(ctx, d.Bind(`SELECT `+deliveryColumns+` FROM webhook_deliveries`+filter), args...)
	if err != nil {
		return nil, err
	}
	out, err := scanDeliveries(rows, false)
	if err != nil || len(out) == 0 {
		return out, err
	}
	// The attempts of the same deliveries: the filter again, which within
	// one snapshot selects the same rows, spares binding a list of ids.
	rows, err = q.Query(ctx, d.Bind(`SELECT delivery_id, n, at, status, error, duration_ms FROM webhook_attempts
		WHERE delivery_id IN (SELECT id FROM webhook_deliveries`+filter+`) ORDER BY delivery_id, n`), args...)
	if err != nil {
		return nil, fmt.Errorf("attempts: %w", err)
	}
	if err := scanAttempts(rows, out); err != nil {
		return nil, fmt.Errorf("attempts: %w", err)
	}
	return out, nil
}

// scanDeliveries reads rows of deliveryColumns, and body when body is
// true, and closes rows. The result is never nil.
func scanDeliveries(rows Rows, body bool) ([]arbiter.Delivery, error) {
	defer rows.Close()
	out := []arbiter.Delivery{}
	for rows.Next() {
		var d arbiter.Delivery
		var next, created, updated scanTime
		dst := []any{&d.ID, &d.Webhook, &d.EventSeq, &d.EventKind, &d.State, &d.Attempts, &next,
			&d.LastStatus, &d.LastError, &created, &updated}
		if body {
			dst = append(dst, &d.Body)
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, err
		}
		if next.valid {
			d.NextAttemptAt = &next.t
		}
		d.CreatedAt, d.UpdatedAt = created.t, updated.t
		out = append(out, d)
	}
	return out, rows.Err()
}

// scanAttempts appends rows of attempts to the History of the delivery of
// out they belong to, and closes rows.
func scanAttempts(rows Rows, out []arbiter.Delivery) error {
	defer rows.Close()
	byID := make(map[string]int, len(out))
	for i := range out {
		byID[out[i].ID] = i
	}
	for rows.Next() {
		var id string
		var a arbiter.DeliveryAttempt
		var at scanTime
		if err := rows.Scan(&id, &a.N, &at, &a.Status, &a.Error, &a.DurationMS); err != nil {
			return err
		}
		a.At = at.t
		if i, ok := byID[id]; ok {
			out[i].History = append(out[i].History, a)
		}
	}
	return rows.Err()
}

// scanTime scans a time column as either store keeps it, in UTC: a
// time.Time (PostgreSQL's timestamptz), RFC 3339 text (SQLite's TEXT
// columns) or Unix nanoseconds (SQLite's next_attempt_at). NULL leaves it
// not valid.
type scanTime struct {
	t     time.Time
	valid bool
}

// Scan implements sql.Scanner; pgx honours it too.
func (s *scanTime) Scan(v any) error {
	var err error
	switch v := v.(type) {
	case nil:
		s.t, s.valid = time.Time{}, false
		return nil
	case time.Time:
		s.t = v.UTC()
	case int64:
		s.t = time.Unix(0, v).UTC()
	case string:
		s.t, err = ParseTime(v)
	case []byte:
		s.t, err = ParseTime(string(v))
	default:
		return fmt.Errorf("cannot read a time from %T", v)
	}
	s.valid = err == nil
	return err
}

package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Both stores keep the same tables of the state: machines (name, data),
// allocations (id, state, owner, data) and records (kind, key, data), data
// the JSON of the arbiter struct without its memory-only fields; events
// (seq, time, kind, subject, data) with time as FormatTime writes it; and
// meta (key, value) holding the counters under these keys.
const (
	KeyNextAllocationID = "next_allocation_id"
	KeyNextEventSeq     = "next_event_seq"
)

// DurableMachine is m without its memory-only fields, as it is saved.
func DurableMachine(m *arbiter.Machine) *arbiter.Machine {
	d := *m
	d.LastSeen = time.Time{}
	return &d
}

// DurableAllocation is a copy of a without its memory-only fields, as it
// is saved.
func DurableAllocation(a *arbiter.Allocation) arbiter.Allocation {
	d := *a
	d.ExpiresAt = nil
	return d
}

// FormatTime is an event's time as it is saved: RFC 3339 with nanoseconds
// in UTC, exact (PostgreSQL's timestamptz keeps only microseconds) and
// readable in either engine's shell.
func FormatTime(t time.Time) string { return string(AppendTime(nil, t)) }

// AppendTime appends t as FormatTime writes it (at most 35 bytes).
func AppendTime(b []byte, t time.Time) []byte { return t.UTC().AppendFormat(b, time.RFC3339Nano) }

// ParseTime reads a time FormatTime wrote, in UTC.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad time %q: %w", s, err)
	}
	return t.UTC(), nil
}

// Load reads the whole saved state through q, which should be one
// read-only transaction so that it is a consistent snapshot. Machines come
// in name order, allocations in id order, records in kind and key order;
// times are in UTC, memory-only fields zero. Errors name the table.
func Load(ctx context.Context, q Querier) (*arbiter.State, error) {
	st := &arbiter.State{NextAllocationID: 1, NextEventSeq: 1}
	var err error
	if st.Machines, err = loadJSON(ctx, q, `SELECT data FROM machines ORDER BY name`, fixMachine); err != nil {
		return nil, fmt.Errorf("machines: %w", err)
	}
	if st.Allocations, err = loadJSON(ctx, q, `SELECT data FROM allocations ORDER BY id`, fixAllocation); err != nil {
		return nil, fmt.Errorf("allocations: %w", err)
	}
	if st.Records, err = loadRecords(ctx, q); err != nil {
		return nil, fmt.Errorf("records: %w", err)
	}
	if err := loadMeta(ctx, q, st); err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	return st, nil
}

// loadJSON reads records stored as JSON in the first column of query.
func loadJSON[T any](ctx context.Context, q Querier, query string, fix func(*T)) ([]T, error) {
	rows, err := q.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	var data []byte
	for rows.Next() {
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", data, err)
		}
		fix(&v)
		out = append(out, v)
	}
	return out, rows.Err()
}

func fixMachine(m *arbiter.Machine) { m.LastSeen = time.Time{} }

func fixAllocation(a *arbiter.Allocation) {
	a.ExpiresAt = nil
	a.CreatedAt = a.CreatedAt.UTC()
	for _, t := range []*time.Time{a.ReadyAt, a.DestroyedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
}

func loadRecords(ctx context.Context, q Querier) ([]arbiter.Record, error) {
	rows, err := q.Query(ctx, `SELECT kind, key, data FROM records ORDER BY kind, key`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []arbiter.Record
	for rows.Next() {
		var r arbiter.Record
		var data []byte
		if err := rows.Scan(&r.Kind, &r.Key, &data); err != nil {
			return nil, err
		}
		r.Value = json.RawMessage(data)
		out = append(out, r)
	}
	return out, rows.Err()
}

// loadMeta reads the counters into st. A counter below 1 (SQLite saves
// both counters at once, the one not moved as 0) leaves it at 1.
func loadMeta(ctx context.Context, q Querier, st *arbiter.State) error {
	rows, err := q.Query(ctx, `SELECT key, value FROM meta`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return err
		}
		switch k {
		case KeyNextAllocationID:
			st.NextAllocationID = max(v, 1)
		case KeyNextEventSeq:
			st.NextEventSeq = max(v, 1)
		}
	}
	return rows.Err()
}

// Events returns up to limit events with Seq > since, in Seq order; none
// for a limit <= 0. Data is nil for an event saved without.
func Events(ctx context.Context, q Querier, d Dialect, since int64, limit int) ([]arbiter.Event, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, d.Bind(`SELECT seq, time, kind, subject, data FROM events WHERE seq > ? ORDER BY seq LIMIT ?`), since, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []arbiter.Event
	for rows.Next() {
		var e arbiter.Event
		var ts string
		var data []byte
		if err := rows.Scan(&e.Seq, &ts, &e.Kind, &e.Subject, &data); err != nil {
			return nil, err
		}
		if e.Time, err = ParseTime(ts); err != nil {
			return nil, fmt.Errorf("event %d: %w", e.Seq, err)
		}
		if data != nil {
			e.Data = data
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

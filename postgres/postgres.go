// Package postgres is the arbiter.Store on PostgreSQL, for teams that run
// more than one server replica (docs/architecture.md §2.3, §2.4). It has the same semantics
// as the SQLite store and passes the same conformance suite (storetest).
//
// A Save is one pipelined batch, which PostgreSQL runs as one transaction:
// each record kind is written by a single statement over arrays (unnest),
// so a change set of any size costs one round trip. Readers never wait for
// a Save: PostgreSQL's snapshots keep them apart.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/sqlstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options tune a Store. The zero value uses the database's default schema.
type Options struct {
	// Schema, when set, is created if missing and used for every table
	// (search_path), so several arbiters, or tests, can share one database.
	Schema string
	// MaxConns bounds the connection pool (default: pgxpool's, at least 4).
	// Save uses one connection at a time; the rest serve readers.
	MaxConns int32
	// ReclaimDead lets AcquireLease take a live lease whose holder is a
	// process of this host that is gone (lease.go): one server per
	// database restarting after kill -9. Replicas of a highly available
	// deployment leave it off and take over when the lease expires.
	ReclaimDead bool
	// IdleInTransaction ends a session that stays idle inside a
	// transaction this long (default 10s): a server paused in the middle
	// of a write must not hold the lease's row, and with it every
	// takeover, for ever. Set it no longer than the lease's time to live.
	IdleInTransaction time.Duration
}

// Store is a PostgreSQL database holding arbiter's state: its reads, the
// lease (lease.go) and the roster of replicas (replicas.go). Writes go
// through a Term (term.go), fenced by the lease's term. It is safe for
// concurrent use.
type Store struct {
	pool        *pgxpool.Pool
	reclaimDead bool

	closeOnce sync.Once
}

// Open connects to the database at url (a postgres:// URL or key=value
// string), creates Options.Schema if set and applies pending migrations. It
// takes no lease: a server takes it (AcquireLease) and then writes through
// Fenced. It fails if the URL is malformed, the server cannot be reached or
// the schema is newer than this binary knows.
func Open(ctx context.Context, url string, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The driver's message quotes the URL, which may hold a password.
		return nil, arbiter.Errorf(arbiter.EInvalid,
			"postgres: the database URL is malformed: want postgres://user@host:5432/dbname?sslmode=disable or key=value pairs")
	}
	if opts.Schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{opts.Schema}.Sanitize()
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	idle := opts.IdleInTransaction
	if idle <= 0 {
		idle = 10 * time.Second
	}
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(max(idle.Milliseconds(), 1))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", normalize(err))
	}
	if err := migrate(ctx, pool, opts.Schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: open: migrate: %w", normalize(err))
	}
	return &Store{pool: pool, reclaimDead: opts.ReclaimDead}, nil
}

// Close closes the pool, waiting for connections in use to be returned. It is
// safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(s.pool.Close)
	return nil
}

// Statements of Save, one per record kind and operation, each over arrays.
// Adding a record kind: its statements here, a step in Save and a loader in
// Load.
const (
	upsertMachines = `INSERT INTO machines (name, data)
		SELECT * FROM unnest($1::text[], $2::jsonb[])
		ON CONFLICT (name) DO UPDATE SET data = EXCLUDED.data`
	deleteMachines    = `DELETE FROM machines WHERE name = ANY($1::text[])`
	upsertAllocations = `INSERT INTO allocations (id, state, owner, data)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::jsonb[])
		ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, owner = EXCLUDED.owner, data = EXCLUDED.data`
	deleteAllocations = `DELETE FROM allocations WHERE id = ANY($1::bigint[])`
	insertEvents      = `INSERT INTO events (seq, time, kind, subject, data)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::json[])`
	trimEvents    = `DELETE FROM events WHERE seq < $1`
	upsertRecords = `INSERT INTO records (kind, key, data)
		SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[])
		ON CONFLICT (kind, key) DO UPDATE SET data = EXCLUDED.data`
	deleteRecords = `DELETE FROM records r USING unnest($1::text[], $2::text[]) AS d(kind, key)
		WHERE r.kind = d.kind AND r.key = d.key`
	setMeta = `INSERT INTO meta (key, value) VALUES ($1, $2)
		ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`
)

// save writes c in one transaction fenced by f (Term.Save): all of it or,
// on error, none. Touched lists and memory-only fields are not saved.
// Errors are wrapped "postgres: save: ..."; a server that is unreachable,
// shutting down, out of resources or read-only, or that no longer holds
// the lease, gives an arbiter.EUnavailable error.
func (s *Store) save(ctx context.Context, c *arbiter.Changes, f *Fence) error {
	if !c.Durable() && c.NextAllocationID <= 0 && c.NextEventSeq <= 0 {
		return nil
	}
	if err := f.trusted(); err != nil {
		return err
	}
	b := &pgx.Batch{}
	var steps []string // what each queued statement does, for errors
	queue := func(step, sql string, args ...any) {
		b.Queue(sql, args...)
		steps = append(steps, step)
	}

	// The fence (term.go): the first statement of the batch checks the
	// lease's term inside the transaction and fails when it is not ours,
	// so a server that lost the database writes nothing.
	b.Queue(fenceLease, f.Term)

	if ms := lastByKey(c.Machines, func(m *arbiter.Machine) string { return m.Name }); len(ms) > 0 {
		names := make([]string, len(ms))
		datas := make([][]byte, len(ms))
		for i := range ms {
			d, err := json.Marshal(sqlstore.DurableMachine(&ms[i]))
			if err != nil {
				return fmt.Errorf("encode machine %s: %w", ms[i].Name, err)
			}
			names[i], datas[i] = ms[i].Name, d
		}
		queue("upsert machines", upsertMachines, names, datas)
	}
	if len(c.RemovedMachines) > 0 {
		queue("delete machines", deleteMachines, c.RemovedMachines)
	}
	if as := lastByKey(c.Allocations, func(a *arbiter.Allocation) int64 { return a.ID }); len(as) > 0 {
		ids := make([]int64, len(as))
		states := make([]string, len(as))
		owners := make([]string, len(as))
		datas := make([][]byte, len(as))
		for i := range as {
			d, err := json.Marshal(sqlstore.DurableAllocation(&as[i]))
			if err != nil {
				return fmt.Errorf("encode allocation %d: %w", as[i].ID, err)
			}
			ids[i], states[i], owners[i], datas[i] = as[i].ID, as[i].State, as[i].Owner, d
		}
		queue("upsert allocations", upsertAllocations, ids, states, owners, datas)
	}
	if len(c.RemovedAllocations) > 0 {
		queue("delete allocations", deleteAllocations, c.RemovedAllocations)
	}
	if rs := lastByKey(c.Records, func(r *arbiter.Record) arbiter.RecordRef { return arbiter.RecordRef{Kind: r.Kind, Key: r.Key} }); len(rs) > 0 {
		kinds := make([]string, len(rs))
		keys := make([]string, len(rs))
		datas := make([][]byte, len(rs))
		for i := range rs {
			d, err := json.Marshal(rs[i].Value)
			if err != nil {
				return fmt.Errorf("encode %s record %s: %w", rs[i].Kind, rs[i].Key, err)
			}
			kinds[i], keys[i], datas[i] = rs[i].Kind, rs[i].Key, d
		}
		queue("upsert records", upsertRecords, kinds, keys, datas)
	}
	if n := len(c.RemovedRecords); n > 0 {
		kinds := make([]string, n)
		keys := make([]string, n)
		for i, r := range c.RemovedRecords {
			kinds[i], keys[i] = r.Kind, r.Key
		}
		queue("delete records", deleteRecords, kinds, keys)
	}
	if n := len(c.Events); n > 0 {
		seqs := make([]int64, n)
		times := make([]string, n)
		kinds := make([]string, n)
		subjects := make([]string, n)
		datas := make([][]byte, n) // nil is NULL
		for i, e := range c.Events {
			seqs[i], times[i], kinds[i], subjects[i] = e.Seq, sqlstore.FormatTime(e.Time), e.Kind, e.Subject
			if len(e.Data) > 0 {
				datas[i] = e.Data
			}
		}
		queue("insert events", insertEvents, seqs, times, kinds, subjects, datas)
	}
	if c.TrimEventsBefore > 0 {
		queue("trim events", trimEvents, c.TrimEventsBefore)
	}
	if c.NextAllocationID > 0 {
		queue("write "+sqlstore.KeyNextAllocationID, setMeta, sqlstore.KeyNextAllocationID, c.NextAllocationID)
	}
	if c.NextEventSeq > 0 {
		queue("write "+sqlstore.KeyNextEventSeq, setMeta, sqlstore.KeyNextEventSeq, c.NextEventSeq)
	}

	// One round trip: the statements of a batch sent at once run in one
	// implicit transaction (pgx's SendBatch), committed when the last
	// succeeds and rolled back as a whole when any fails — the fence
	// included. Begin, batch and commit were three round trips.
	br := s.pool.SendBatch(ctx, b)
	if err := f.check(ctx, s, br.QueryRow()); err != nil {
		br.Close()
		return unsettled(err)
	}
	for _, step := range steps {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return unsettled(fmt.Errorf("%s: %w", step, err))
		}
	}
	if err := br.Close(); err != nil {
		return unsettled(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// unsettled marks an error of a batch sent to the server
// arbiter.ErrSaveUnknown unless it certainly committed nothing: the server
// answered with an error (the implicit transaction is then rolled back
// whole), the fence refused the term (an *arbiter.Error of check's), or
// nothing was sent. A connection lost or a timeout after sending leaves
// the commit unknown: the server may have committed it and the answer
// been lost.
func unsettled(err error) error {
	var pe *pgconn.PgError
	var ae *arbiter.Error
	if errors.As(err, &pe) || errors.As(err, &ae) || pgconn.SafeToRetry(err) {
		return err
	}
	return arbiter.SaveUnknown(err)
}

// lastByKey returns rows without earlier duplicates, keeping each key's last
// row: one INSERT ... ON CONFLICT may not touch a row twice, and the last
// upsert is the one that counts.
func lastByKey[T any, K comparable](rows []T, key func(*T) K) []T {
	if len(rows) < 2 {
		return rows
	}
	seen := make(map[K]struct{}, len(rows))
	dup := false
	for i := range rows {
		k := key(&rows[i])
		if _, ok := seen[k]; ok {
			dup = true
			break
		}
		seen[k] = struct{}{}
	}
	if !dup {
		return rows
	}
	clear(seen)
	out := make([]T, 0, len(rows))
	for i := len(rows) - 1; i >= 0; i-- {
		k := key(&rows[i])
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			out = append(out, rows[i])
		}
	}
	return out // order within one statement does not matter once keys are unique
}

// Load returns the whole saved state, read in one repeatable-read
// transaction so it is a consistent snapshot. Machines come in name order,
// allocations in id order. Times are in UTC.
func (s *Store) Load(ctx context.Context) (*arbiter.State, error) {
	st, err := s.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("postgres: load: %w", normalize(err))
	}
	return st, nil
}

func (s *Store) load(ctx context.Context) (*arbiter.State, error) {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx)
	return sqlstore.Load(ctx, pgDB{tx})
}

// Events returns up to limit events with Seq > since in Seq order. It never
// waits for a Save. A limit <= 0 returns none.
func (s *Store) Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error) {
	evs, err := sqlstore.Events(ctx, pgDB{s.pool}, sqlstore.DollarNumbers, since, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: events: %w", normalize(err))
	}
	return evs, nil
}

// normalize turns driver errors that mean something to callers into arbiter
// errors, leaving the rest (and context errors) as they are.
func normalize(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), strings.HasPrefix(pe.Code, "57P"):
			return sqlstore.Unavailable("the PostgreSQL server is shutting down or dropped the connection: retry, or check the server", err)
		case strings.HasPrefix(pe.Code, "53"):
			return sqlstore.Unavailable("the PostgreSQL server is out of resources (disk, memory or connections): check the server", err)
		case pe.Code == "25006":
			return sqlstore.Unavailable("the PostgreSQL server is read-only: point arbiter at the primary", err)
		}
		return err
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return sqlstore.Unavailable("cannot reach the PostgreSQL server: check that it runs and the URL is right", err)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return sqlstore.Unavailable("cannot connect to the PostgreSQL server: check that it runs and the URL is right", err)
	}
	return err
}

// pgDB gives a pgx pool or transaction to sqlstore.
type pgDB struct {
	db interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

func (d pgDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	rows, err := d.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgRows{rows}, nil
}

func (d pgDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.db.Exec(ctx, query, args...)
	return err
}

// pgRows is pgx's rows with database/sql's Close.
type pgRows struct{ pgx.Rows }

func (r pgRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

// Package sqlite is the embedded arbiter.Store: one SQLite file in WAL mode,
// written by one writer at a time and read through a separate pool, so that
// reads never wait behind a commit (docs/architecture.md §2.3, §5).
//
// It uses the pure-Go modernc.org/sqlite, so cross-compiling (arm64 hosts)
// needs no C toolchain: database/sql for migrations and reads, and SQLite's
// C API directly for the writer, whose statements stay compiled
// (rawconn.go). The schema is a set of embedded, numbered migrations applied
// by Open.
package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/sqlstore"
	_ "modernc.org/sqlite" // the database/sql driver "sqlite"
	sqlitelib "modernc.org/sqlite/lib"
)

// Options tune a Store. The zero value is the durable default.
type Options struct {
	// Synchronous is SQLite's synchronous setting: "FULL" (the default; a
	// commit survives power loss) or "NORMAL" (a commit survives a crash of
	// arbiter, but the last commits may be lost on power loss; faster).
	Synchronous string
	// BusyTimeout is how long a statement waits for a lock held by another
	// process before failing (default 5s).
	BusyTimeout time.Duration
	// Readers is the number of read connections (default 4).
	Readers int
}

// Store is an arbiter.Store on one SQLite file. It is safe for concurrent use:
// writes (Save, the webhook delivery log) take the one writer connection in
// turn; Load, Events and the other reads use the readers.
type Store struct {
	path   string
	reader *sql.DB // query_only connections; WAL lets them read during a commit
	// raw is the writer connection (rawconn.go), nil once closed; writeMu
	// gives it to one transaction at a time (writeTx).
	raw     *rawConn
	writeMu sync.Mutex

	// lock is the store's claim on its file (lock.go), held until Close.
	lock *storeLock

	closeOnce sync.Once
	closeErr  error
}

var _ arbiter.Store = (*Store)(nil)

// Open opens (creating if missing, with its parent directory) the database
// file at path and applies pending migrations, holding the file for this
// Store alone until Close (lock.go). It fails if the options are invalid,
// another Store (in this process or another) has the file open — a
// conflict error naming its process and host —, the file cannot be opened,
// or the file's schema is newer than this binary knows.
func Open(path string, opts Options) (s *Store, err error) {
	if path == "" {
		return nil, arbiter.Errorf(arbiter.EInvalid, "sqlite: no database path given")
	}
	syncMode := strings.ToUpper(opts.Synchronous)
	switch syncMode {
	case "":
		syncMode = "FULL"
	case "FULL", "NORMAL":
	default:
		return nil, arbiter.Errorf(arbiter.EInvalid, "sqlite: synchronous %q is not FULL or NORMAL", opts.Synchronous)
	}
	busy := opts.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	readers := opts.Readers
	if readers <= 0 {
		readers = 4
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o750); err != nil {
		return nil, fmt.Errorf("sqlite: create directory for %s: %w", abs, err)
	}
	// The same directory reached through a symbolic link is the same store.
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(dir, filepath.Base(abs))
	}
	// One server per file (lock.go), taken before anything is read or migrated.
	lock, err := lockStore(abs)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	defer func() {
		if s == nil {
			lock.unlock()
		}
	}()

	busyPragma := fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds())
	migrator, err := sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {busyPragma, "journal_mode(WAL)", "synchronous(" + syncMode + ")", "foreign_keys(1)"},
		"_txlock": {"immediate"}, // take the write lock at BEGIN, not at the first write
	}))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	migrator.SetMaxOpenConns(1)
	// Migrations run first, on a connection of their own: it switches the
	// file to WAL before any reader could try to (a reader cannot, being
	// query-only), and a migration file may hold many statements.
	err = migrate(context.Background(), migrator)
	if cerr := migrator.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: migrate: %w", abs, normalize(err))
	}
	st := &Store{path: abs, lock: lock}
	st.raw, err = openRaw(abs, fmt.Sprintf("busy_timeout = %d", busy.Milliseconds()), "synchronous = "+syncMode, "foreign_keys = 1")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, normalize(err))
	}
	st.reader, err = sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {busyPragma, "foreign_keys(1)", "query_only(1)"},
	}))
	if err != nil {
		st.raw.close()
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	st.reader.SetMaxOpenConns(readers)
	st.reader.SetMaxIdleConns(readers)
	return st, nil
}

// dsn builds a file: URI, so that any character in the path survives.
func dsn(path string, q url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: q.Encode()}
	if !strings.HasPrefix(u.Path, "/") { // Windows: file:///C:/...
		u.Path = "/" + u.Path
	}
	return u.String()
}

// Path returns the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Close closes the connections. It is safe to call more than once; later
// calls return the first call's error.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.writeMu.Lock()
		if s.raw != nil {
			errs = append(errs, s.raw.close())
			s.raw = nil
		}
		s.writeMu.Unlock()
		errs = append(errs, s.reader.Close())
		errs = append(errs, s.lock.unlock()) // last: the file is no longer used
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("sqlite: close: %w", err)
		}
	})
	return s.closeErr
}

// Save writes c in one IMMEDIATE transaction: all of it or, on error, none.
// Touched lists and memory-only fields are not saved. Errors are wrapped
// "sqlite: save: ..."; a lock held by another process past the busy timeout
// is an arbiter.EUnavailable error.
func (s *Store) Save(ctx context.Context, c *arbiter.Changes) error {
	if err := s.save(ctx, c); err != nil {
		return fmt.Errorf("sqlite: save: %w", normalize(err))
	}
	return nil
}

func (s *Store) save(ctx context.Context, c *arbiter.Changes) error {
	if !c.Durable() && c.NextAllocationID <= 0 && c.NextEventSeq <= 0 {
		return nil
	}
	// HA leadership needs no check here: one SQLite file has one server.
	return s.writeTx(ctx, func(w *rawConn) error { return saveChanges(w, c) })
}

// saveChanges writes c, inside a transaction.
func saveChanges(w *rawConn, c *arbiter.Changes) error {
	var js jsonBuf
	for i := range c.Machines {
		m := &c.Machines[i]
		if err := js.exec(w, sqlUpsertMachine, sqlstore.DurableMachine(m), m.Name); err != nil {
			return fmt.Errorf("upsert machine %s: %w", m.Name, err)
		}
	}
	for _, name := range c.RemovedMachines {
		if err := w.exec(sqlDeleteMachine, name); err != nil {
			return fmt.Errorf("delete machine %s: %w", name, err)
		}
	}
	for i := range c.Allocations {
		a := &c.Allocations[i]
		if err := js.exec(w, sqlUpsertAllocation, sqlstore.DurableAllocation(a), a.ID, a.State, a.Owner); err != nil {
			return fmt.Errorf("upsert allocation %d: %w", a.ID, err)
		}
	}
	for _, id := range c.RemovedAllocations {
		if err := w.exec(sqlDeleteAllocation, id); err != nil {
			return fmt.Errorf("delete allocation %d: %w", id, err)
		}
	}
	for i := range c.Records {
		r := &c.Records[i]
		if err := js.exec(w, sqlUpsertRecord, r.Value, r.Kind, r.Key); err != nil {
			return fmt.Errorf("upsert record %s/%s: %w", r.Kind, r.Key, err)
		}
	}
	for _, r := range c.RemovedRecords {
		if err := w.exec(sqlDeleteRecord, r.Kind, r.Key); err != nil {
			return fmt.Errorf("delete record %s/%s: %w", r.Kind, r.Key, err)
		}
	}
	for i := range c.Events {
		e := &c.Events[i]
		var data any // NULL for no data
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		if err := w.exec(sqlInsertEvent, e.Seq, sqlstore.FormatTime(e.Time), e.Kind, e.Subject, data); err != nil {
			return fmt.Errorf("insert event %d: %w", e.Seq, err)
		}
	}
	if c.TrimEventsBefore > 0 {
		if err := w.exec(`DELETE FROM events WHERE seq < ?`, c.TrimEventsBefore); err != nil {
			return fmt.Errorf("trim events: %w", err)
		}
	}
	if c.NextAllocationID > 0 || c.NextEventSeq > 0 {
		if err := w.exec(sqlNextIDs, sqlstore.KeyNextAllocationID, max(c.NextAllocationID, 0), sqlstore.KeyNextEventSeq, max(c.NextEventSeq, 0)); err != nil {
			return fmt.Errorf("write next ids: %w", err)
		}
	}
	return nil
}

// writeTx runs fn in one IMMEDIATE transaction on the writer connection:
// all of what it writes or, on error, none.
func (s *Store) writeTx(ctx context.Context, fn func(w *rawConn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	w := s.raw
	if w == nil {
		return errors.New("the store is closed")
	}
	if err := w.exec(`BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err := fn(w)
	if err == nil {
		if err = w.exec(`COMMIT`); err != nil {
			err = fmt.Errorf("commit: %w", err)
		}
	}
	if err != nil {
		_ = w.exec(`ROLLBACK`) // fails only when SQLite already rolled back
	}
	return err
}

// The statements Save runs, one row each: compiled once on the writer
// connection (rawconn.go), a row costs only its execution. Adding a record
// kind: its upsert and delete here, a step in Save and a loader in Load.
const (
	sqlUpsertMachine    = `INSERT INTO machines (name, data) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET data = excluded.data`
	sqlDeleteMachine    = `DELETE FROM machines WHERE name = ?`
	sqlUpsertAllocation = `INSERT INTO allocations (id, state, owner, data) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET state = excluded.state, owner = excluded.owner, data = excluded.data`
	sqlDeleteAllocation = `DELETE FROM allocations WHERE id = ?`
	sqlUpsertRecord     = `INSERT INTO records (kind, key, data) VALUES (?, ?, ?) ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data`
	sqlDeleteRecord     = `DELETE FROM records WHERE kind = ? AND key = ?`
	sqlInsertEvent      = `INSERT INTO events (seq, time, kind, subject, data) VALUES (?, ?, ?, ?, ?)`
	sqlNextIDs          = `INSERT INTO meta (key, value) VALUES (?, ?), (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)`
)

// jsonBuf marshals records into one reused buffer; each value is copied
// into a string when it is bound, so the buffer may be reused for the next row.
type jsonBuf struct {
	buf bytes.Buffer
	enc *json.Encoder
}

// exec runs query with args followed by v's JSON, the record's data.
func (j *jsonBuf) exec(w *rawConn, query string, v any, args ...any) error {
	data, err := j.marshal(v)
	if err != nil {
		return err
	}
	return w.exec(query, append(args, data)...)
}

// marshal returns v's JSON as a string, so SQLite stores it as TEXT (usable
// by its json functions), not as a BLOB.
func (j *jsonBuf) marshal(v any) (string, error) {
	if j.enc == nil {
		j.enc = json.NewEncoder(&j.buf)
	}
	j.buf.Reset()
	if err := j.enc.Encode(v); err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(j.buf.Bytes(), []byte{'\n'})), nil
}

// Load returns the whole saved state, read in one transaction on a reader
// connection so it is a consistent snapshot. Machines come in name order,
// allocations in id order. Times are in UTC.
func (s *Store) Load(ctx context.Context) (*arbiter.State, error) {
	st, err := s.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlite: load: %w", normalize(err))
	}
	return st, nil
}

func (s *Store) load(ctx context.Context) (*arbiter.State, error) {
	tx, err := s.reader.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	return sqlstore.Load(ctx, sqlDB{tx})
}

// Events returns up to limit events with Seq > since in Seq order, read on a
// reader connection (it never waits for a Save). A limit <= 0 returns none.
func (s *Store) Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error) {
	evs, err := sqlstore.Events(ctx, sqlDB{s.reader}, sqlstore.QuestionMarks, since, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: events: %w", normalize(err))
	}
	return evs, nil
}

// normalize turns driver errors that mean something to callers into arbiter
// errors, leaving the rest (and context errors) as they are.
func normalize(err error) error {
	var se interface{ Code() int } // the driver's *sqlite.Error and rawError
	if errors.As(err, &se) {
		switch se.Code() & 0xff { // primary result code
		case sqlitelib.SQLITE_BUSY, sqlitelib.SQLITE_LOCKED:
			return sqlstore.Unavailable("the database is locked by another process: check that no other arbiter server uses the same file", err)
		case sqlitelib.SQLITE_FULL:
			return sqlstore.Unavailable("the disk holding the database is full: free some space", err)
		case sqlitelib.SQLITE_READONLY:
			return sqlstore.Unavailable("the database file is read-only: check its permissions", err)
		}
	}
	return err
}

// sqlDB gives a database/sql pool or transaction to sqlstore.
type sqlDB struct {
	db interface {
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	}
}

func (d sqlDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err // not a nil *sql.Rows in a non-nil interface
	}
	return rows, nil
}

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.db.ExecContext(ctx, query, args...)
	return err
}

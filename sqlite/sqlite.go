// Package sqlite is the embedded arbiter.Store: one SQLite file in WAL mode,
// written by one writer at a time and read through a separate pool, so that
// reads never wait behind a commit (docs/architecture.md §2.3, §5).
//
// A Save costs one small sequential write and one sync: the change set,
// encoded once (batch.go), is appended to a batch log beside the file
// (package batchlog, the directory FILE-batches) and is durable when Save
// returns. The tables are written behind it (behind.go), many batches to a
// transaction, and stay a readable mirror of the state; Open replays the
// batches the tables had not durably taken, so a start after a crash
// serves exactly what was answered.
//
// It uses the pure-Go modernc.org/sqlite, so cross-compiling (arm64 hosts)
// needs no C toolchain: database/sql for migrations and reads, and SQLite's
// C API directly for the writer, whose statements stay compiled
// (rawconn.go). The schema is a set of embedded, numbered migrations applied
// by Open.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/batchlog"
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
	// SegmentBytes is the size of the batch log's segments (default
	// batchlog.DefaultSegmentBytes): it bounds what a start replays.
	SegmentBytes int64
	// Logger receives the store's rare complaints (tables that cannot be
	// written); nil discards them.
	Logger *slog.Logger
	// Blobs is where the artifact bytes that batches carry
	// (arbiter.Changes.Blobs) belong: Open gives it back every one the log
	// still holds (a crash may have lost them from it) and syncs it, and
	// the log lets no batch go before Blobs is synced. Nil: the batches
	// carry none (the store drops them).
	Blobs BlobKeeper
}

// BlobKeeper keeps the artifact bytes that batches carry (the artifact
// store, with artifact.Options.CallerSyncsSmall).
type BlobKeeper interface {
	// Restore stores a blob unless it is stored; durable after Sync.
	Restore(id string, data []byte) error
	// Sync makes every blob stored so far durable.
	Sync() error
}

// Store is an arbiter.Store on one SQLite file. It is safe for concurrent use:
// writes (Save, the webhook delivery log) take the one writer connection in
// turn; Load, Events and the other reads use the readers.
type Store struct {
	path   string
	busy   time.Duration
	full   bool // synchronous = FULL: the log and the store-only writes are synced
	logger *slog.Logger
	reader *sql.DB // query_only connections; WAL lets them read during a commit
	// raw is the writer connection (rawconn.go), nil once closed; writeMu
	// gives it to one transaction at a time (mirrorTx).
	raw     *rawConn
	writeMu sync.Mutex

	// lock is the store's claim on its file (lock.go), held until Close.
	lock *storeLock

	log    *batchlog.Log
	blobs  BlobKeeper // nil: batches carry no blobs
	behind *behind    // writes the tables behind the log
	// saveMu makes Saves one at a time: they take seqs in order.
	saveMu    sync.Mutex
	enc       encoder
	nextBatch uint64 // seq of the next batch in the log
	lastEvent int64  // the highest event seq saved

	closeOnce sync.Once
	closeErr  error
}

var _ arbiter.Store = (*Store)(nil)

// Open opens (creating if missing, with its parent directory) the database
// file at path, applies pending migrations and replays its batch log,
// holding the file for this Store alone until Close (lock.go). It fails if
// the options are invalid, another Store (in this process or another) has
// the file open — a conflict error naming its process and host —, the file
// cannot be opened, or the file's schema is newer than this binary knows.
func Open(path string, opts Options) (*Store, error) {
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
	if abs, err = realPath(abs); err != nil {
		return nil, fmt.Errorf("sqlite: create directory for %s: %w", path, err)
	}
	// One server per file (lock.go), taken before anything is read, written
	// or migrated; its refusal names the server that holds the file.
	lock, err := lockStore(abs)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	// SQLite gives its -wal and -shm files the database file's mode, and
	// creates that with the umask's: a new database is made here, readable
	// by its owner and group only (webhook secrets and lock tokens live in
	// it), as the batch log's segments are.
	if f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); err == nil {
		f.Close()
	}
	// The batch log has a lock of its own too, for whoever opens it alone.
	blog, err := batchlog.Open(abs+"-batches", batchlog.Options{SegmentBytes: opts.SegmentBytes, NoSync: syncMode != "FULL"})
	if err != nil {
		lock.unlock()
		if errors.Is(err, batchlog.ErrLocked) {
			return nil, fmt.Errorf("sqlite: open %s: %w", abs, sqlstore.Unavailable(
				"the database is in use by another arbiter server: stop it, or give this one its own data directory", err))
		}
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	s := &Store{path: abs, busy: busy, full: syncMode == "FULL", log: blog, logger: opts.Logger, lock: lock, blobs: opts.Blobs}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	ok := false
	defer func() {
		if !ok {
			s.closeAll()
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
	// The tables are written behind the log, unsynced; the log carries
	// the durability (see behind.go).
	// A checkpoint copies each page changed since the last once, however
	// often it changed: checkpointing every 8,000 pages (32 MiB of WAL)
	// rather than SQLite's 1,000 copies the tables' hot last pages
	// (new events, new allocations) far less often.
	// Its page cache holds the pages the writes behind touch again and
	// again (records are keyed by random ids: a task's updates land all
	// over the table); SQLite's default of 2 MiB made it read them back.
	s.raw, err = openRaw(abs, fmt.Sprintf("busy_timeout = %d", busy.Milliseconds()), "synchronous = NORMAL", "foreign_keys = 1",
		"wal_autocheckpoint = 8000", "cache_size = -32768")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, normalize(err))
	}
	s.reader, err = sql.Open("sqlite", dsn(abs, url.Values{
		"_pragma": {busyPragma, "foreign_keys(1)", "query_only(1)"},
	}))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", abs, err)
	}
	s.reader.SetMaxOpenConns(readers)
	s.reader.SetMaxIdleConns(readers)
	applied, err := s.replay()
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: replay the batch log: %w", abs, normalize(err))
	}
	s.nextBatch = applied + 1
	s.behind = newBehind(s, applied)
	ok = true
	return s, nil
}

// replay applies the batches of the log that the tables had not taken,
// durably, then starts the log afresh, and returns the seq of the last
// batch the tables hold.
func (s *Store) replay() (uint64, error) {
	applied, err := s.appliedInTables()
	if err != nil {
		return 0, err
	}
	var bs []*batch
	last, err := s.log.Replay(applied, func(seq uint64, p []byte) error {
		b, err := decodeBatch(seq, p)
		if err != nil {
			return err
		}
		bs = append(bs, b)
		return nil
	})
	if err != nil {
		return 0, err
	}
	if gap := s.log.Gap(); gap != "" && s.full {
		// Every record was synced before the next was written: only a
		// damaged disk (or a hand) leaves records past a missing one, and
		// each was answered. Starting without them would lose answered
		// changes and give their ids and event numbers again: the
		// operator decides. (With "normal", a power cut's usual leftover,
		// they are set aside below, once what comes before the gap is
		// durable in the tables and its blobs are back.) The whole
		// batches before the gap go to the tables first, so that moving
		// the log aside loses only what the message names.
		if len(bs) > 0 {
			if err := s.applyBatches(bs, true); err != nil {
				return 0, err
			}
			if err := s.restoreBlobs(applied, bs); err != nil {
				return 0, err
			}
		}
		dir := s.log.Dir()
		return 0, fmt.Errorf("the batch log %s is damaged: %s. Each of those batches was answered, and starting would lose them: "+
			"restore the data directory from a backup or, to start without them, move the log aside (mv %s %s.damaged) and start again "+
			"(the batches before them are in the tables)", dir, gap, dir, dir)
	}
	if len(bs) > 0 {
		// Durable before the log that held them goes.
		if err := s.applyBatches(bs, true); err != nil {
			return 0, err
		}
		s.logger.Info("replayed the batch log into the tables", "batches", len(bs), "last", last)
	} else {
		// The tables may hold the log's batches only in WAL frames that a
		// process killed after an unsynced write of the writer behind
		// left in the page cache (nothing synced them if another
		// process's connection kept the WAL open): a synced write makes
		// them durable before Start removes the log.
		if err := s.mirrorTx(true, func(w *rawConn) error {
			return w.exec(sqlSetMeta, keyBatchApplied, int64(applied))
		}); err != nil {
			return 0, fmt.Errorf("sync the tables: %w", err)
		}
	}
	if err := s.restoreBlobs(applied, bs); err != nil {
		return 0, err
	}
	if gap := s.log.Gap(); gap != "" {
		aside, err := s.log.SetAside() // kept where Start leaves them
		if err != nil {
			return 0, err
		}
		s.logger.Error("the batch log has records past a missing one; they are dropped, and kept in "+aside, "log", s.log.Dir(), "gap", gap)
	}
	if err := s.log.Start(last + 1); err != nil {
		return 0, err
	}
	v, err := s.raw.text(`SELECT max(coalesce((SELECT max(seq) FROM events), 0),
		coalesce((SELECT value - 1 FROM meta WHERE key = '` + sqlstore.KeyNextEventSeq + `'), 0))`)
	if err == nil {
		s.lastEvent, err = strconv.ParseInt(v, 10, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("read the last event: %w", err)
	}
	return last, nil
}

// restoreBlobs gives the blob keeper back every blob the log carries —
// in the batches just replayed, and in those up to applied that the
// tables took but whose segment has not gone (the keeper had not synced
// their blobs) — and syncs it: the log may go then. Each batch is decoded
// once: the replayed ones are given.
func (s *Store) restoreBlobs(applied uint64, replayed []*batch) error {
	if s.blobs == nil {
		return nil
	}
	n := 0
	restore := func(b *batch) error {
		for _, bl := range b.blobs {
			if err := s.blobs.Restore(string(bl.id), bl.data); err != nil {
				return fmt.Errorf("restore blob %s of batch %d: %w", bl.id, b.seq, err)
			}
			n++
		}
		return nil
	}
	err := s.log.Scan(func(seq uint64, p []byte) error {
		if seq > applied {
			return nil // replayed, or past the log's end
		}
		b, err := decodeBatch(seq, p)
		if err != nil {
			return err
		}
		return restore(b)
	})
	for _, b := range replayed {
		if err == nil {
			err = restore(b)
		}
	}
	if err == nil && n > 0 {
		err = s.blobs.Sync()
	}
	if err != nil {
		return fmt.Errorf("artifact bytes: %w", err)
	}
	return nil
}

// syncBlobs makes the blobs of the batches the log is about to drop
// durable where they belong.
func (s *Store) syncBlobs() error {
	if s.blobs == nil {
		return nil
	}
	if err := s.blobs.Sync(); err != nil {
		return fmt.Errorf("sync the artifact bytes: %w", err)
	}
	return nil
}

// realPath is where the database file at abs really is, its directory
// created if need be. The same file reached through a symbolic link — to
// it, even before it exists, or to its directory — is the same store: its
// lock and its batch log are named from there. (A hard link is not seen.)
func realPath(abs string) (string, error) {
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	p := followLinks(abs) // a new file, or a link to one not created yet
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return "", err
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		p = filepath.Join(dir, filepath.Base(p))
	}
	return p, nil
}

// followLinks follows path while it is a symbolic link, also to a file
// that does not exist yet (which SQLite would create through the link).
func followLinks(path string) string {
	for range 40 { // as the kernel's limit
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			return path
		}
		target, err := os.Readlink(path)
		if err != nil {
			return path
		}
		if !filepath.IsAbs(target) {
			// Relative to where the link really is, as the kernel
			// reads it: ".." leaves the link's real directory.
			dir := filepath.Dir(path)
			if real, err := filepath.EvalSymlinks(dir); err == nil {
				dir = real
			}
			target = filepath.Join(dir, target)
		}
		path = target
	}
	return path
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

// Close writes what the tables lack, makes them durable and closes the
// connections; the batch log's segments are removed once the tables hold
// all of them (else the next Open replays them). It is safe to call more
// than once; later calls return the first call's error.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.saveMu.Lock()
		defer s.saveMu.Unlock()
		var errs []error
		if s.behind.close() {
			err := s.mirrorTx(true, func(w *rawConn) error {
				return w.exec(sqlSetMeta, keySyncedAt, time.Now().UnixNano())
			})
			if err == nil {
				err = s.syncBlobs()
			}
			if err == nil {
				err = s.log.Discard()
			}
			errs = append(errs, err)
		}
		errs = append(errs, s.closeAll())
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("sqlite: close: %w", err)
		}
	})
	return s.closeErr
}

// keySyncedAt is the meta key a durable commit with nothing else to write
// sets (to the time, so that the row changes and the commit syncs).
const keySyncedAt = "synced_at"

// closeAll closes the connections and the log.
func (s *Store) closeAll() error {
	var errs []error
	s.writeMu.Lock()
	if s.raw != nil {
		errs = append(errs, s.raw.close())
		s.raw = nil
	}
	s.writeMu.Unlock()
	if s.reader != nil {
		errs = append(errs, s.reader.Close())
	}
	errs = append(errs, s.log.Close())
	errs = append(errs, s.lock.unlock()) // last: the file is no longer used
	return errors.Join(errs...)
}

// Save appends c to the batch log and, with synchronous = FULL, syncs it:
// when it returns nil, c survives a crash and a power cut (with NORMAL, a
// crash of the process); on an error nothing of c is saved, unless it is
// arbiter.ErrSaveUnknown: a write of the log that failed midway and could
// not be undone for sure, which the next start may replay. The tables
// take c shortly after. Touched lists and memory-only fields are not
// saved. Errors are wrapped "sqlite: save: ..."; while the tables cannot
// be written (a lock another process holds past the busy timeout, a full
// disk) Save fails with an arbiter.EUnavailable error.
func (s *Store) Save(ctx context.Context, c *arbiter.Changes) error {
	if err := s.save(ctx, c); err != nil {
		err = fmt.Errorf("sqlite: save: %w", normalize(err))
		if errors.Is(err, batchlog.ErrMaybeWritten) {
			return arbiter.SaveUnknown(err)
		}
		return err
	}
	return nil
}

func (s *Store) save(ctx context.Context, c *arbiter.Changes) error {
	if !c.Durable() && c.NextAllocationID <= 0 && c.NextEventSeq <= 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// HA leadership needs no check here: one SQLite file has one server.
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if err := s.behind.failure(); err != nil {
		return err
	}
	// What the tables would refuse is refused here, before the log has
	// it: a batch in the log must apply.
	last, err := newEvents(c.Events, s.lastEvent)
	if err != nil {
		return err
	}
	if s.blobs == nil && len(c.Blobs) > 0 {
		cc := *c
		cc.Blobs = nil // no keeper to give them back to
		c = &cc
	}
	p, err := s.enc.encode(c)
	if err != nil {
		return err
	}
	if err := s.log.Append(s.nextBatch, p); err != nil {
		return err
	}
	s.behind.add(s.nextBatch, p)
	s.nextBatch++
	s.lastEvent = last
	return nil
}

// newEvents checks that evs are new: each seq after stored, the last
// seq saved, and none twice. It returns the highest.
func newEvents(evs []arbiter.Event, stored int64) (int64, error) {
	last, ordered := stored, true
	for i := range evs {
		seq := evs[i].Seq
		if seq <= stored {
			return 0, fmt.Errorf("event %d is not after the last saved, %d: event seqs are never reused", seq, stored)
		}
		ordered = ordered && seq > last
		last = max(last, seq)
	}
	if !ordered { // the engine's are; a change set may have them in any order
		seen := make(map[int64]bool, len(evs))
		for i := range evs {
			if seen[evs[i].Seq] {
				return 0, fmt.Errorf("event %d appears twice", evs[i].Seq)
			}
			seen[evs[i].Seq] = true
		}
	}
	return last, nil
}

// writeTx runs fn in one IMMEDIATE transaction on the writer connection,
// for what lives only in the tables (the webhook delivery log): all of
// what it writes or, on error, none; synced with synchronous = FULL.
func (s *Store) writeTx(ctx context.Context, fn func(w *rawConn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.mirrorTx(s.full, fn)
}

// mirrorTx runs fn in one IMMEDIATE transaction on the writer connection;
// its commit is synced when sync is set, and with it every commit before
// (they are earlier frames of the same WAL).
func (s *Store) mirrorTx(sync bool, fn func(w *rawConn) error) (err error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	w := s.raw
	if w == nil {
		return errors.New("the store is closed")
	}
	if sync {
		if err := w.exec(`PRAGMA synchronous = FULL`); err != nil {
			return err
		}
		defer func() {
			if rerr := w.exec(`PRAGMA synchronous = NORMAL`); err == nil {
				err = rerr
			}
		}()
	}
	if err := w.exec(`BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err = fn(w)
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

// Load returns the whole saved state, read in one transaction on a reader
// connection so it is a consistent snapshot, once the tables hold every
// batch saved before. Machines come in name order,
// allocations in id order. Times are in UTC.
func (s *Store) Load(ctx context.Context) (*arbiter.State, error) {
	st, err := s.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlite: load: %w", normalize(err))
	}
	return st, nil
}

func (s *Store) load(ctx context.Context) (st *arbiter.State, err error) {
	if err := s.behind.flush(); err != nil {
		return nil, err
	}
	// Read in one transaction on a connection of its own, through
	// SQLite's C API (rawrows.go), closed after: its page cache goes with
	// it.
	r, err := openRaw(s.path, "query_only = 1", fmt.Sprintf("busy_timeout = %d", s.busy.Milliseconds()))
	if err != nil {
		return nil, err
	}
	defer r.close()
	if err := r.exec(`BEGIN`); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer r.exec(`ROLLBACK`)
	return sqlstore.Load(ctx, rawQuerier{r})
}

// Events returns up to limit events with Seq > since in Seq order, read on a
// reader connection once the tables hold every batch saved before (it
// waits for the writer behind, never for a Save). A limit <= 0 returns
// none.
func (s *Store) Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error) {
	if err := s.behind.flush(); err != nil {
		return nil, fmt.Errorf("sqlite: events: %w", err)
	}
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

package sqlstore

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered schema change: a file NNNN_what.sql. Files are
// applied in number order and never edited once released; a schema change
// is a new file.
type Migration struct {
	Version int
	Name    string // the file's name, e.g. "0003_webhook_deliveries.sql"
	SQL     string
}

// ReadMigrations returns the migrations in directory dir of fsys (a
// store's embedded files) in version order. A malformed, repeated or
// missing number is a build mistake, reported as an error.
func ReadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %q does not start with a positive number and '_'", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q share version %d", ms[i-1].Name, ms[i].Name, ms[i].Version)
		}
	}
	// Only versions above the stored one are applied, so a gap filled later
	// would be skipped on every database already past it.
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %q has version %d, want %d: migrations are numbered 1, 2, 3… without gaps", m.Name, m.Version, i+1)
		}
	}
	return ms, nil
}

// Migrate brings a schema up to date inside tx, the caller's transaction,
// so that a crash half way leaves the old schema. The caller has created
// the table schema_migrations (version PRIMARY KEY), in its engine's types,
// and has made sure no other process migrates at the same time (SQLite's
// write lock, PostgreSQL's advisory lock); it commits.
//
// Each migration above the recorded version is applied and recorded, in
// order. A schema newer than ms know is refused: an older arbiter must not
// write to it.
func Migrate(ctx context.Context, tx Tx, d Dialect, ms []Migration) error {
	known := 0
	if len(ms) > 0 {
		known = ms[len(ms)-1].Version
	}
	current, err := schemaVersion(ctx, tx)
	if err != nil {
		return err
	}
	if current > known {
		return fmt.Errorf("database schema is version %d but this arbiter knows only up to version %d: run a newer arbiter, or restore a backup made for this version", current, known)
	}
	record := d.Bind(`INSERT INTO schema_migrations (version) VALUES (?)`)
	for _, m := range ms {
		if m.Version <= current {
			continue
		}
		if err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("apply %s: %w", m.Name, err)
		}
		if err := tx.Exec(ctx, record, m.Version); err != nil {
			return fmt.Errorf("record %s: %w", m.Name, err)
		}
	}
	return nil
}

// schemaVersion is the highest version recorded, 0 for none.
func schemaVersion(ctx context.Context, q Querier) (int, error) {
	rows, err := q.Query(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var v int
	if rows.Next() {
		if err := rows.Scan(&v); err != nil {
			return 0, err
		}
	}
	return v, rows.Err()
}

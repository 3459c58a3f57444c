package sqlite

import (
	"context"
	"database/sql"
	"embed"

	"github.com/arbiter-hq/arbiter/sqlstore"
)

// migrationFiles holds the schema, one numbered file per change:
// migrations/NNNN_what.sql (see sqlstore.Migration).
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded migrations in version order.
func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.ReadMigrations(migrationFiles, "migrations")
}

// migrate brings the schema up to date in one write transaction, so a crash
// half way leaves the old schema, and a second process opening the same file
// waits (busy_timeout) instead of applying the same migration twice.
func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the connection's _txlock
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return err
	}
	if err := sqlstore.Migrate(ctx, sqlDB{tx}, sqlstore.QuestionMarks, ms); err != nil {
		return err
	}
	return tx.Commit()
}

package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// migrateLock is the advisory lock key that serialises migrations: replicas
// starting together must not apply the same migration twice.
const migrateLock = 0x61726269746572 // "arbiter"

// migrate creates schema (if not "") and brings it up to date in one
// transaction, so a crash half way leaves the old schema.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
		return err
	}
	if schema != "" {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY)`); err != nil {
		return err
	}
	if err := sqlstore.Migrate(ctx, pgDB{tx}, sqlstore.DollarNumbers, ms); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

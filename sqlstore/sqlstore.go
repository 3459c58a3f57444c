// Package sqlstore is what the SQL stores (sqlite, postgres) do alike: the
// migration runner, reading the saved state and events back into arbiter's
// types, and the reads of the webhook delivery log.
//
// Each store keeps what is its own: its driver and connections, its
// migration files, its writes (SQLite's compiled statements on one writer
// connection, PostgreSQL's batched unnest statements) and its error
// normalisation. It hands this package a Querier (a transaction or a pool,
// adapted to the small interfaces below) and its Dialect, which says how
// the engine writes a statement's parameters; the shared statements are
// plain SQL both engines run. This package imports no driver.
package sqlstore

import (
	"context"
	"strconv"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// Rows is a query's result, read row by row. database/sql's *sql.Rows is
// one; a store adapts its driver's rows where they differ.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// Querier runs a query. A store passes a transaction where the reads must
// see one snapshot, or its pool.
type Querier interface {
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Tx is a transaction that also runs statements, as Migrate needs.
type Tx interface {
	Querier
	Exec(ctx context.Context, query string, args ...any) error
}

// Dialect is how an engine writes a statement's parameters. The shared
// statements are written with ?, which Bind puts in the engine's form.
type Dialect int

const (
	// QuestionMarks writes every parameter as ? (SQLite).
	QuestionMarks Dialect = iota
	// DollarNumbers writes the nth parameter as $n (PostgreSQL).
	DollarNumbers
)

// Bind returns query, whose parameters are written ?, in d's form. The
// shared statements hold no ? but their parameters.
func (d Dialect) Bind(query string) string {
	if d != DollarNumbers || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] != '?' {
			b.WriteByte(query[i])
			continue
		}
		n++
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// Unavailable returns err as an arbiter.EUnavailable error saying msg (what
// went wrong and what to do), keeping err: logs show both, and errors.As
// finds either. Stores use it to normalise the driver errors that mean the
// database cannot serve now.
func Unavailable(msg string, err error) error {
	return &unavailable{arbiter.Errorf(arbiter.EUnavailable, "%s", msg), err}
}

type unavailable struct {
	app    *arbiter.Error
	driver error
}

func (w *unavailable) Error() string   { return w.app.Message + ": " + w.driver.Error() }
func (w *unavailable) Unwrap() []error { return []error{w.app, w.driver} }

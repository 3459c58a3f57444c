package sqlite

import (
	"context"
	"fmt"

	"github.com/arbiter-hq/arbiter/sqlstore"
	"modernc.org/libc"
	sqlitelib "modernc.org/sqlite/lib"
)

// Load reads the whole state, 100,000 tasks and more at a large site,
// through SQLite's C API: database/sql and the driver cost a third of the
// start's reading. rawQuerier gives a raw connection to sqlstore.Load; its
// rows scan into *[]byte, *string and *int64, which is what Load asks for.

type rawQuerier struct{ c *rawConn }

func (q rawQuerier) Query(_ context.Context, query string, args ...any) (sqlstore.Rows, error) {
	st, err := q.c.prepare(query)
	if err != nil {
		return nil, err
	}
	for i, a := range args {
		if err := q.c.bind(st, int32(i+1), a); err != nil {
			sqlitelib.Xsqlite3_reset(q.c.tls, st)
			sqlitelib.Xsqlite3_clear_bindings(q.c.tls, st)
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
	}
	return &rawRows{c: q.c, st: st}, nil
}

// rawRows steps a compiled statement; Close resets it for the next use.
type rawRows struct {
	c    *rawConn
	st   uintptr
	err  error
	done bool
}

func (r *rawRows) Next() bool {
	if r.done {
		return false
	}
	switch rc := sqlitelib.Xsqlite3_step(r.c.tls, r.st); rc {
	case sqlitelib.SQLITE_ROW:
		return true
	case sqlitelib.SQLITE_DONE:
	default:
		r.err = r.c.errorOf(rc)
	}
	r.done = true
	return false
}

func (r *rawRows) Scan(dest ...any) error {
	tls, st := r.c.tls, r.st
	for i, d := range dest {
		col := int32(i)
		switch d := d.(type) {
		case *int64:
			*d = sqlitelib.Xsqlite3_column_int64(tls, st, col)
		case *[]byte:
			if sqlitelib.Xsqlite3_column_type(tls, st, col) == sqlitelib.SQLITE_NULL {
				*d = nil
				continue
			}
			p := sqlitelib.Xsqlite3_column_blob(tls, st, col)
			n := sqlitelib.Xsqlite3_column_bytes(tls, st, col)
			*d = append([]byte(nil), libc.GoBytes(p, int(n))...) // a copy: SQLite's is gone at the next step
		case *string:
			p := sqlitelib.Xsqlite3_column_text(tls, st, col)
			n := sqlitelib.Xsqlite3_column_bytes(tls, st, col)
			*d = string(libc.GoBytes(p, int(n)))
		default:
			return fmt.Errorf("column %d: cannot scan into %T", i, d)
		}
	}
	return nil
}

func (r *rawRows) Err() error { return r.err }

func (r *rawRows) Close() error {
	sqlitelib.Xsqlite3_reset(r.c.tls, r.st)
	sqlitelib.Xsqlite3_clear_bindings(r.c.tls, r.st)
	r.done = true
	return nil
}

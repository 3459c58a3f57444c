package sqlite

import (
	"fmt"
	"reflect"
	"unsafe"

	"modernc.org/libc"
	sqlitelib "modernc.org/sqlite/lib"
)

// rawConn is one SQLite connection driven through SQLite's C API (as
// modernc.org/sqlite transpiles it to Go) rather than database/sql: the
// Store's writer. The database/sql driver compiles a statement on every
// execution, which was a quarter of each commit's time; here each statement
// is compiled once and kept for the life of the connection.
//
// It is not safe for concurrent use; the Store gives it to one transaction
// at a time.
type rawConn struct {
	tls   *libc.TLS
	db    uintptr
	stmts map[string]uintptr // compiled statements by their text
	empty uintptr            // a C string "", to bind empty text
}

// rawError is an error SQLite returned: its extended result code and
// message. normalize reads the code as it reads the driver's errors.
type rawError struct {
	code int
	msg  string
}

func (e *rawError) Error() string { return fmt.Sprintf("%s (%d)", e.msg, e.code) }

// Code is the extended result code, as the driver's errors report it.
func (e *rawError) Code() int { return e.code }

// sqliteTransient tells sqlite3_bind_text to copy the text at once, so the
// C string can be freed right after binding.
const sqliteTransient = ^uintptr(0)

// openRaw opens the database at path (which must exist: Open migrates it
// first through database/sql) and runs the given PRAGMA statements.
func openRaw(path string, pragmas ...string) (_ *rawConn, err error) {
	c := &rawConn{tls: libc.NewTLS(), stmts: map[string]uintptr{}}
	c.empty = libc.Xcalloc(c.tls, 1, 1)
	name, err := libc.CString(path)
	if err != nil || c.empty == 0 {
		c.close()
		return nil, fmt.Errorf("open %s: out of memory", path)
	}
	defer libc.Xfree(c.tls, name)
	pdb := c.tls.Alloc(8)
	defer c.tls.Free(8)
	rc := sqlitelib.Xsqlite3_open_v2(c.tls, name, pdb, sqlitelib.SQLITE_OPEN_READWRITE|sqlitelib.SQLITE_OPEN_FULLMUTEX, 0)
	c.db = libc.AtomicLoadPUintptr(pdb)
	if rc != sqlitelib.SQLITE_OK {
		err := c.errorOf(rc)
		c.close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	sqlitelib.Xsqlite3_extended_result_codes(c.tls, c.db, 1)
	for _, p := range pragmas {
		if err := c.exec("PRAGMA " + p); err != nil {
			return nil, fmt.Errorf("PRAGMA %s: %w", p, err)
		}
	}
	return c, nil
}

// exec runs query, one statement, with args (nil, integers, floats,
// strings, bytes), compiling it the first time it is seen. Rows a statement
// returns (a PRAGMA's answer) are stepped over.
func (c *rawConn) exec(query string, args ...any) error {
	st, err := c.prepare(query)
	if err != nil {
		return err
	}
	defer func() {
		sqlitelib.Xsqlite3_reset(c.tls, st)
		sqlitelib.Xsqlite3_clear_bindings(c.tls, st)
	}()
	for i, a := range args {
		if err := c.bind(st, int32(i+1), a); err != nil {
			return fmt.Errorf("argument %d: %w", i+1, err)
		}
	}
	for {
		switch rc := sqlitelib.Xsqlite3_step(c.tls, st); rc {
		case sqlitelib.SQLITE_ROW:
			continue
		case sqlitelib.SQLITE_DONE:
			return nil
		default:
			return c.errorOf(rc)
		}
	}
}

func (c *rawConn) prepare(query string) (uintptr, error) {
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	q, err := libc.CString(query)
	if err != nil {
		return 0, err
	}
	defer libc.Xfree(c.tls, q)
	pst := c.tls.Alloc(8)
	defer c.tls.Free(8)
	if rc := sqlitelib.Xsqlite3_prepare_v2(c.tls, c.db, q, -1, pst, 0); rc != sqlitelib.SQLITE_OK {
		return 0, c.errorOf(rc)
	}
	st := libc.AtomicLoadPUintptr(pst)
	if st == 0 {
		return 0, fmt.Errorf("no statement in %q", query)
	}
	c.stmts[query] = st
	return st, nil
}

func (c *rawConn) bind(st uintptr, i int32, a any) error {
	var rc int32
	switch v := a.(type) {
	case nil:
		rc = sqlitelib.Xsqlite3_bind_null(c.tls, st, i)
	case int64:
		rc = sqlitelib.Xsqlite3_bind_int64(c.tls, st, i, v)
	case int:
		rc = sqlitelib.Xsqlite3_bind_int64(c.tls, st, i, int64(v))
	case float64:
		rc = sqlitelib.Xsqlite3_bind_double(c.tls, st, i, v)
	case string:
		rc = c.bindText(st, i, v)
	case text:
		rc = c.bindText(st, i, unsafe.String(unsafe.SliceData(v), len(v)))
	case []byte:
		rc = c.bindBlob(st, i, v)
	default:
		// Named string and integer types (states, kinds).
		switch rv := reflect.ValueOf(a); rv.Kind() {
		case reflect.String:
			rc = c.bindText(st, i, rv.String())
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			rc = sqlitelib.Xsqlite3_bind_int64(c.tls, st, i, rv.Int())
		default:
			return fmt.Errorf("cannot store a %T", a)
		}
	}
	if rc != sqlitelib.SQLITE_OK {
		return c.errorOf(rc)
	}
	return nil
}

func (c *rawConn) bindText(st uintptr, i int32, s string) int32 {
	if s == "" {
		// An empty Go string has no bytes to point at; bind a NUL-terminated one.
		return sqlitelib.Xsqlite3_bind_text(c.tls, st, i, c.empty, 0, sqliteTransient)
	}
	p, err := libc.CString(s)
	if err != nil {
		return sqlitelib.SQLITE_NOMEM
	}
	defer libc.Xfree(c.tls, p)
	return sqlitelib.Xsqlite3_bind_text(c.tls, st, i, p, int32(len(s)), sqliteTransient)
}

func (c *rawConn) bindBlob(st uintptr, i int32, b []byte) int32 {
	if len(b) == 0 {
		return sqlitelib.Xsqlite3_bind_blob(c.tls, st, i, c.empty, 0, sqliteTransient)
	}
	p, err := libc.CString(string(b)) // bound by length: zero bytes are kept
	if err != nil {
		return sqlitelib.SQLITE_NOMEM
	}
	defer libc.Xfree(c.tls, p)
	return sqlitelib.Xsqlite3_bind_blob(c.tls, st, i, p, int32(len(b)), sqliteTransient)
}

// text is bytes bound as TEXT (a []byte is bound as a BLOB): the JSON of
// a record, which SQLite's json functions read only as text.
type text []byte

// changes is how many rows the last statement changed.
func (c *rawConn) changes() int64 { return sqlitelib.Xsqlite3_changes64(c.tls, c.db) }

// text runs query and returns the first column of its first row as text
// ("" when there is none): for reading a PRAGMA back.
func (c *rawConn) text(query string) (string, error) {
	st, err := c.prepare(query)
	if err != nil {
		return "", err
	}
	defer sqlitelib.Xsqlite3_reset(c.tls, st)
	switch rc := sqlitelib.Xsqlite3_step(c.tls, st); rc {
	case sqlitelib.SQLITE_ROW:
		return libc.GoString(sqlitelib.Xsqlite3_column_text(c.tls, st, 0)), nil
	case sqlitelib.SQLITE_DONE:
		return "", nil
	default:
		return "", c.errorOf(rc)
	}
}

// errorOf is the connection's current error, for result code rc.
func (c *rawConn) errorOf(rc int32) error {
	code := int(rc)
	msg := "sqlite error"
	if c.db != 0 {
		code = int(sqlitelib.Xsqlite3_extended_errcode(c.tls, c.db))
		msg = libc.GoString(sqlitelib.Xsqlite3_errmsg(c.tls, c.db))
	}
	return &rawError{code: code, msg: msg}
}

// close finalises the statements and closes the connection.
func (c *rawConn) close() error {
	var err error
	for _, st := range c.stmts {
		sqlitelib.Xsqlite3_finalize(c.tls, st)
	}
	c.stmts = nil
	if c.db != 0 {
		if rc := sqlitelib.Xsqlite3_close_v2(c.tls, c.db); rc != sqlitelib.SQLITE_OK {
			err = c.errorOf(rc)
		}
		c.db = 0
	}
	if c.empty != 0 {
		libc.Xfree(c.tls, c.empty)
		c.empty = 0
	}
	c.tls.Close()
	return err
}

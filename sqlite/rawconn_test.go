package sqlite

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	sqlitelib "modernc.org/sqlite/lib"
)

// TestRawConn checks the raw connection's binding and errors directly:
// empty and named-type text, NULL, a constraint violation with SQLite's
// extended code, a type it cannot store, and a statement reused after one.
// Blobs and floats are exercised by the delivery log's conformance test.
func TestRawConn(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "a.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type kind string
	w := s.raw
	compiled := len(w.stmts)
	if err := w.exec(sqlInsertEvent, int64(1), "2026-01-01T00:00:00Z", kind("k"), "", nil); err != nil {
		t.Fatal(err)
	}
	err = w.exec(sqlInsertEvent, int64(1), "t", "k", "s", nil)
	var re *rawError
	if !errors.As(err, &re) || re.Code() != sqlitelib.SQLITE_CONSTRAINT_PRIMARYKEY || !strings.Contains(err.Error(), "UNIQUE") {
		t.Fatalf("duplicate key: %v, want SQLITE_CONSTRAINT_PRIMARYKEY", err)
	}
	if err := w.exec(sqlInsertEvent, int64(2), "t", "k", "s", struct{}{}); err == nil || !strings.Contains(err.Error(), "cannot store a struct {}") {
		t.Fatalf("a struct: %v, want refused", err)
	}
	if err := w.exec(sqlInsertEvent, 3, "2026-01-01T00:00:01Z", "k2", "s2", `{"a":1}`); err != nil {
		t.Fatalf("the statement after a failed one: %v", err)
	}
	var subject, kinds string
	var data *string
	if err := s.reader.QueryRow(`SELECT subject, data FROM events WHERE seq = 1`).Scan(&subject, &data); err != nil {
		t.Fatal(err)
	}
	if err := s.reader.QueryRow(`SELECT group_concat(kind, ',') FROM events`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if subject != "" || data != nil || kinds != "k,k2" {
		t.Fatalf("stored subject %q, data %v, kinds %q; want empty, NULL, k,k2", subject, data, kinds)
	}
	if n := len(w.stmts) - compiled; n != 1 {
		t.Fatalf("%d statements compiled for one text", n)
	}
}

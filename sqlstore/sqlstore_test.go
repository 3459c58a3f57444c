package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/arbiter-hq/arbiter"
)

func TestBind(t *testing.T) {
	for _, tt := range []struct {
		d        Dialect
		in, want string
	}{
		{QuestionMarks, "a = ? AND b = ?", "a = ? AND b = ?"},
		{DollarNumbers, "a = ? AND b IN (SELECT c WHERE d = ? LIMIT ?)", "a = $1 AND b IN (SELECT c WHERE d = $2 LIMIT $3)"},
		{DollarNumbers, "SELECT 1", "SELECT 1"},
	} {
		if got := tt.d.Bind(tt.in); got != tt.want {
			t.Errorf("Bind(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestUnavailable(t *testing.T) {
	driver := errors.New("database is locked (5)")
	err := Unavailable("the database is locked by another process: check it", driver)
	if arbiter.ErrorCode(err) != arbiter.EUnavailable || !errors.Is(err, driver) {
		t.Errorf("got %v (code %s), want unavailable wrapping the driver's error", err, arbiter.ErrorCode(err))
	}
	if got, want := err.Error(), "the database is locked by another process: check it: database is locked (5)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReadMigrations(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	ms, err := ReadMigrations(fstest.MapFS{
		"m/0002_b.sql":  file("B"),
		"m/0001_a.sql":  file("A"),
		"m/0010_c.sql":  file("C"), // 10 after 2, though it sorts first as a name
		"m/0003_x.sql":  file("X"),
		"m/0004_y.sql":  file("Y"),
		"m/0005_z.sql":  file("Z"),
		"m/0006_z.sql":  file("Z"),
		"m/0007_z.sql":  file("Z"),
		"m/0008_z.sql":  file("Z"),
		"m/0009_z.sql":  file("Z"),
		"other/0011.sq": file("-"),
	}, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 10 || ms[0] != (Migration{1, "0001_a.sql", "A"}) || ms[9] != (Migration{10, "0010_c.sql", "C"}) {
		t.Errorf("got %+v", ms)
	}
	for _, tt := range []struct {
		name string
		fs   fstest.MapFS
		want string
	}{
		{"no number", fstest.MapFS{"m/init.sql": file("")}, `"init.sql" does not start with a positive number`},
		{"zero", fstest.MapFS{"m/0000_a.sql": file("")}, "does not start with a positive number"},
		{"twice", fstest.MapFS{"m/0001_a.sql": file(""), "m/1_b.sql": file("")}, `migrations "0001_a.sql" and "1_b.sql" share version 1`},
		{"gap", fstest.MapFS{"m/0001_a.sql": file(""), "m/0003_c.sql": file("")}, `migration "0003_c.sql" has version 3, want 2`},
		{"no directory", fstest.MapFS{}, "m"},
	} {
		if _, err := ReadMigrations(tt.fs, "m"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// fakeTx is a transaction whose schema_migrations holds version; it records
// the statements run and fails the one containing fail.
type fakeTx struct {
	version int
	fail    string
	execs   []string
}

func (tx *fakeTx) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	if !strings.Contains(query, "schema_migrations") {
		return nil, errors.New("unexpected query " + query)
	}
	return &fakeRows{rows: [][]any{{tx.version}}}, nil
}

func (tx *fakeTx) Exec(ctx context.Context, query string, args ...any) error {
	if tx.fail != "" && strings.Contains(query, tx.fail) {
		return errors.New("syntax error")
	}
	tx.execs = append(tx.execs, strings.TrimSpace(fmt.Sprint(query, " ", fmt.Sprint(args...))))
	return nil
}

type fakeRows struct {
	rows [][]any
	i    int
}

func (r *fakeRows) Next() bool   { r.i++; return r.i <= len(r.rows) }
func (r *fakeRows) Err() error   { return nil }
func (r *fakeRows) Close() error { return nil }
func (r *fakeRows) Scan(dest ...any) error {
	for i, d := range dest {
		*d.(*int) = r.rows[r.i-1][i].(int)
	}
	return nil
}

func TestMigrate(t *testing.T) {
	ms := []Migration{{1, "0001_a.sql", "CREATE a"}, {2, "0002_b.sql", "CREATE b"}, {3, "0003_c.sql", "CREATE c"}}
	ctx := context.Background()

	tx := &fakeTx{version: 1}
	if err := Migrate(ctx, tx, DollarNumbers, ms); err != nil {
		t.Fatal(err)
	}
	want := []string{"CREATE b", "INSERT INTO schema_migrations (version) VALUES ($1) 2", "CREATE c", "INSERT INTO schema_migrations (version) VALUES ($1) 3"}
	if strings.Join(tx.execs, "\n") != strings.Join(want, "\n") {
		t.Errorf("applied\n%s\nwant\n%s", strings.Join(tx.execs, "\n"), strings.Join(want, "\n"))
	}

	tx = &fakeTx{version: 3}
	if err := Migrate(ctx, tx, QuestionMarks, ms); err != nil || len(tx.execs) != 0 {
		t.Errorf("up to date: got %v, applied %q", err, tx.execs)
	}

	tx = &fakeTx{version: 9}
	if err := Migrate(ctx, tx, QuestionMarks, ms); err == nil || !strings.Contains(err.Error(), "database schema is version 9 but this arbiter knows only up to version 3") || len(tx.execs) != 0 {
		t.Errorf("newer schema: got %v, applied %q", err, tx.execs)
	}

	tx = &fakeTx{fail: "CREATE b"}
	if err := Migrate(ctx, tx, QuestionMarks, ms); err == nil || err.Error() != "apply 0002_b.sql: syntax error" || len(tx.execs) != 2 {
		t.Errorf("failing migration: got %v, applied %q", err, tx.execs)
	}
}

func TestScanTime(t *testing.T) {
	want := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	for _, v := range []any{want.In(time.FixedZone("x", 3600)), want.UnixNano(), "2026-01-02T03:04:05.000006Z", []byte("2026-01-02T04:04:05.000006+01:00")} {
		var s scanTime
		if err := s.Scan(v); err != nil || !s.valid || !s.t.Equal(want) || s.t.Location() != time.UTC {
			t.Errorf("Scan(%#v): got %v %v %v, want %v in UTC", v, s.t, s.valid, err, want)
		}
	}
	s := scanTime{t: want, valid: true}
	if err := s.Scan(nil); err != nil || s.valid || !s.t.IsZero() {
		t.Errorf("Scan(nil): got %v %v %v, want not valid", s.t, s.valid, err)
	}
	for _, v := range []any{"yesterday", 1.5} {
		if err := s.Scan(v); err == nil || s.valid {
			t.Errorf("Scan(%#v): got %v, want an error", v, s.t)
		}
	}
}

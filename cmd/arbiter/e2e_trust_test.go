package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
)

// Issue 12 ("Trust and safety"), end to end: the findings that need the
// real server wired together.

// openServerAt opens (without serving) a server on the given data
// directory and configuration, returning Open's error.
func openServerAt(t *testing.T, configText, dataDir string, getenv func(string) string, extra ...string) (*serverMain, error) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o600); err != nil {
		t.Fatal(err)
	}
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	env := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: getenv}
	args := append([]string{"--config", cfg, "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--no-local"}, extra...)
	m, err := newServerMain(env, args)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(context.Background()); err != nil {
		return nil, err
	}
	t.Cleanup(m.Close)
	return m, nil
}

// TestSecondServerOnOneDataDirRefused is finding 1 on SQLite: a second
// server on the data directory of a running one refuses to start, naming
// it, instead of handing out the same GPUs under the same ids.
func TestSecondServerOnOneDataDirRefused(t *testing.T) {
	dir := t.TempDir()
	a, err := openServerAt(t, twoHosts, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openServerAt(t, twoHosts, dir, nil)
	if err == nil {
		t.Fatal("a second server started on the same data directory")
	}
	for _, want := range []string{"data directory " + dir, fmt.Sprintf("arbiter server pid %d", os.Getpid()), "--data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Once the first has stopped, the next may start.
	a.Close()
	if _, err := openServerAt(t, twoHosts, dir, nil); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}

// TestSecondServerOnOnePostgresRefused is finding 1 on PostgreSQL.
func TestSecondServerOnOnePostgresRefused(t *testing.T) {
	url := os.Getenv("ARBITER_TEST_POSTGRES")
	if url == "" {
		t.Skip("ARBITER_TEST_POSTGRES is not set")
	}
	db := pgSchemaURL(t, url)
	conf := twoHosts + "\n[server]\ndatabase = \"" + db + "\"\n"
	a, err := openServerAt(t, conf, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = openServerAt(t, conf, t.TempDir(), nil)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), a.URL()) {
		t.Fatalf("second server on one database: %v, want a conflict naming %s", err, a.URL())
	}
	a.Close()
	if _, err := openServerAt(t, conf, t.TempDir(), nil); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
}

// pgSchemaURL returns url aimed at a fresh schema (search_path), dropped
// when t ends.
func pgSchemaURL(t *testing.T, url string) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	schema := "arbiter_e2e_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			conn.Close(ctx)
		}
	})
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// TestHistoryZeroEndToEnd is finding 6: allocations.history = 0 keeps no
// destroyed allocation (the engine used to take 0 for its default, 1200).
func TestHistoryZeroEndToEnd(t *testing.T) {
	_, url := startServer(t, twoHosts+"\n[allocations]\nhistory = 0\n", nil)
	a := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--keepalive", "never")
	cliJSON[arbiter.Allocation](t, url, "release", fmt.Sprint(a.ID))
	if all := cliJSON[[]arbiter.Allocation](t, url, "ps", "--all"); len(all) != 0 {
		t.Fatalf("history = 0 kept %d destroyed allocations: %+v", len(all), all)
	}
}

// signInCookie signs in through the dashboard's form, as a browser on the
// page does, and returns the session cookie.
func signInCookie(t *testing.T, url, token string) *http.Cookie {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/ui/login", strings.NewReader("token="+token))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "arbiter_session" && c.Value != "" {
			return c
		}
	}
	t.Fatalf("sign-in: %d, no session cookie", resp.StatusCode)
	return nil
}

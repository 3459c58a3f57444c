package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
)

// cliEnv runs an arbiter client command with the given environment.
func cliEnv(t *testing.T, vars map[string]string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return vars[k] }}
	code := run(context.Background(), env, args)
	return out.String(), errb.String(), code
}

func TestTasksCLI(t *testing.T) {
	dir := t.TempDir()
	man := filepath.Join(dir, "m.toml")
	os.WriteFile(man, []byte("[defaults]\ncommand = [\"true\"]\n[[jobs]]\nmodel = \"a\"\nmode = \"x\"\npriority = 2\n[[jobs]]\nmodel = \"b\"\nmode = \"y\"\n"), 0o600)
	_, url := startServer(t, "[server]\nlocal = false\n[tasks]\nmanifest = \""+man+"\"\n", nil)
	vars := map[string]string{"ARBITER_URL": url}

	ts := cliJSON[[]arbiter.Task](t, url, "tasks", "list")
	if len(ts) != 2 || ts[0].Spec.Model != "a" {
		t.Fatalf("list: %+v", ts)
	}
	out, _, code := cliEnv(t, vars, "tasks", "list")
	if code != 0 || !strings.Contains(out, "a-x-") || !strings.Contains(out, "pending") {
		t.Fatalf("list table: %d %s", code, out)
	}
	short := ts[1].ID[:8]
	out, _, code = cliEnv(t, vars, "tasks", "cancel", short, "--reason", "not needed")
	if code != 0 || !strings.Contains(out, "is cancelled") {
		t.Fatalf("cancel: %d %s", code, out)
	}
	if _, errs, code := cliEnv(t, vars, "tasks", "cancel", short); code != 1 || !strings.Contains(errs, "already cancelled") {
		t.Fatalf("cancel twice: %d %s", code, errs)
	}
	// With an operator token the fleet API is used (here: loopback).
	vars["ARBITER_OPERATOR_TOKEN"] = "some-operator-token"
	out, errs, code := cliEnv(t, vars, "tasks", "requeue", ts[1].ID, "-o", "json")
	if code != 0 || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("requeue through /v1: %d %s %s", code, out, errs)
	}
	if _, errs, code := cliEnv(t, vars, "tasks", "requeue", ts[1].ID); code != 1 || !strings.Contains(errs, "not requeued") {
		t.Fatalf("requeue of a pending task through /v1: %d %s", code, errs)
	}
	out, _, code = cliEnv(t, vars, "tasks", "reload")
	if code != 0 || !strings.Contains(out, "2 unchanged") {
		t.Fatalf("reload through /v1: %d %s", code, out)
	}
	delete(vars, "ARBITER_OPERATOR_TOKEN")

	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tasks"}, 2, "want a command"},
		{[]string{"tasks", "frob"}, 2, "unknown command"},
		{[]string{"tasks", "show"}, 2, "want 1 argument"},
		{[]string{"tasks", "show", "xyz"}, 2, "at least the first 6"},
		{[]string{"tasks", "show", "abcdef"}, 1, "no task id starts with abcdef"},
		{[]string{"tasks", "list", "--status", "done"}, 1, "not one of"},
		{[]string{"tasks", "status", "extra"}, 2, "unexpected argument"},
		{[]string{"artifacts", "get", "0123456789"}, 1, "no artifact has an id starting with 0123456789"},
		{[]string{"artifacts", "list", "--task", "zz"}, 2, "at least the first 6"},
		{[]string{"bench", "tasks"}, 2, "--manifest"},
		{[]string{"agent", "--max-tasks", "-1"}, 2, "--max-tasks"},
	} {
		_, errs, code := cliEnv(t, vars, tt.args...)
		if code != tt.code || !strings.Contains(errs, tt.want) {
			t.Errorf("arbiter %v: exit %d %q, want %d mentioning %q", tt.args, code, errs, tt.code, tt.want)
		}
	}
	// A manifest with a bad field is refused whole; nothing changes.
	os.WriteFile(man, []byte("[defaults]\ncommand = [\"true\"]\n[[jobs]]\nmodel = \"a\"\nmode = \"x\"\npriority = 2\n[[jobs]]\nmodel = \"c\"\nstale_after_s = -1\n"), 0o600)
	if _, errs, code := cliEnv(t, vars, "tasks", "reload"); code != 1 || !strings.Contains(errs, "m.toml:9: jobs[1] (c): stale_after_s") {
		t.Errorf("reload of a broken manifest: %d %s", code, errs)
	}
	if ts := cliJSON[[]arbiter.Task](t, url, "tasks", "list"); len(ts) != 2 || !ts[0].InManifest || !ts[1].InManifest {
		t.Errorf("a refused manifest changed the tasks: %+v", ts)
	}
	out, _, code = cliEnv(t, vars, "tasks", "status")
	if code != 0 || !strings.Contains(out, "2 tasks: pending 2") {
		t.Errorf("status: %d %s", code, out)
	}
	out, _, code = cliEnv(t, vars, "tasks", "workers")
	if code != 0 || !strings.Contains(out, "no workers yet") {
		t.Errorf("workers: %d %s", code, out)
	}
}

// refusedStart opens a server on a configuration file holding cfg (and
// the files in more, by name), with the environment env, and returns why
// it refused to start; it fails the test when the server started.
func refusedStart(t *testing.T, cfg string, more map[string]string, env map[string]string) error {
	t.Helper()
	dir := t.TempDir()
	for name, text := range more {
		os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600)
	}
	path := filepath.Join(dir, "a.toml")
	os.WriteFile(path, []byte(cfg), 0o600)
	e := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(k string) string { return env[k] }}
	m, err := newServerMain(e, []string{"--config", path, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Open(context.Background())
	if err == nil {
		m.Close()
		t.Fatal("the server started")
	}
	return err
}

func TestServerRefusesBrokenManifest(t *testing.T) {
	err := refusedStart(t, "[server]\nlocal = false\n[tasks]\nmanifest = \"m.toml\"\n",
		map[string]string{"m.toml": "[[jobs]]\nmodel = \"a\"\ncommand = [\"true\"]\nmin_ram_gib = -4\n"}, nil)
	if !strings.Contains(err.Error(), "m.toml:4: jobs[0] (a): min_ram_gib") {
		t.Fatalf("got %v, want the file, line, entry and key", err)
	}
}

// TestServerRefusesAShortOperatorToken: the operator token acts as an admin
// on the fleet API's operator endpoints, so it is held to the length of
// tokens' secrets.
func TestServerRefusesAShortOperatorToken(t *testing.T) {
	err := refusedStart(t, "[server]\nlocal = false\n", nil, map[string]string{"ARBITER_OPERATOR_TOKEN": "letmein"})
	if !strings.Contains(err.Error(), "$ARBITER_OPERATOR_TOKEN is 7 characters; use at least 16") {
		t.Fatalf("got %v", err)
	}
}

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
	"github.com/arbiter-hq/arbiter/client"
)

// TestBenchState writes a small state with `arbiter bench state` and
// starts a server on it, reading its manifest: everything written is
// served, and a second run refuses the directory.
func TestBenchState(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	var out, errb bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	args := []string{"bench", "state", "--data-dir", data, "--tasks", "300", "--allocations", "20", "--events", "2000"}
	if code := run(context.Background(), env, args); code != 0 {
		t.Fatalf("bench state: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "wrote 300 tasks, 20 live allocations") {
		t.Errorf("got %q", out.String())
	}
	if code := run(context.Background(), env, args); code == 0 || !strings.Contains(errb.String(), "already holds a state") {
		t.Errorf("second run on the same directory: exit %d, %q; want a refusal", code, errb.String())
	}

	cfg := filepath.Join(dir, "arbiter.toml")
	os.WriteFile(cfg, []byte("[events]\nkeep = 100000\n[tasks]\nmanifest = \""+filepath.Join(data, "bench-state.toml")+"\"\n"), 0o600)
	senv := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	m, err := newServerMain(senv, []string{"--config", cfg, "--data-dir", data, "--listen", "127.0.0.1:0", "--no-local"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c := client.New(m.URL(), "")
	live, err := c.Allocations(ctx, arbiter.AllocationFilter{State: "live"})
	if err != nil || len(live) != 20 {
		t.Errorf("live allocations: %d, %v; want 20", len(live), err)
	}
	sum, err := c.TaskSummary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Counts[arbiter.TaskPending] != 300 || sum.Total != 300 {
		t.Errorf("tasks: %+v, want 300 pending", sum)
	}
	if m.loop.LastSeq() < 2000 {
		t.Errorf("last event %d, want at least 2000", m.loop.LastSeq())
	}
}

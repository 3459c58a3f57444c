package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter/cli"
)

// BenchmarkHTTPTasks runs `arbiter bench tasks` against an in-process
// server on SQLite: b.N no-op tasks, 64 workers, four requests per task.
func BenchmarkHTTPTasks(b *testing.B) {
	dir := b.TempDir()
	man := filepath.Join(dir, "m.toml")
	os.WriteFile(man, []byte("name = \"bench\"\n"), 0o600)
	t := &testing.T{}
	_ = t
	m, url := startServerB(b, "[server]\nlocal = false\nsynchronous = \"normal\"\n[tasks]\nmanifest = \""+man+"\"\n")
	_ = m
	var out bytes.Buffer
	env := &cli.Env{Stdout: &out, Stderr: &out, Getenv: func(k string) string {
		if k == "ARBITER_URL" {
			return url
		}
		return ""
	}}
	b.ResetTimer()
	code := run(context.Background(), env, []string{"bench", "tasks", "--manifest", man, "--tasks", strconv.Itoa(max(b.N, 64)), "--workers", "64"})
	b.StopTimer()
	if code != 0 || !strings.Contains(out.String(), " 0 errors") {
		b.Fatalf("bench: exit %d: %s", code, out.String())
	}
	b.Log(strings.SplitN(out.String(), "\n", 2)[0])
}

// startServerB is startServer for benchmarks.
func startServerB(b *testing.B, configText string) (*serverMain, string) {
	b.Helper()
	dir := b.TempDir()
	cfg := filepath.Join(dir, "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o600); err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	env := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &stderr, Getenv: func(string) string { return "" }}
	m, err := newServerMain(env, []string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		b.Fatalf("open: %v\n%s", err, stderr.String())
	}
	url := m.URL()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		<-done
	})
	return m, url
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/webhook"
)

// BenchmarkLockHTTP measures lock acquire + release pairs over HTTP against
// the real server (SQLite, synchronous=full, group commit), from parallel
// clients each on its own lock. One op is one pair: two durable decisions.
func BenchmarkLockHTTP(b *testing.B) {
	_, url := coordStartServerB(b, "", "--no-local")
	c := client.NewWithOptions(url, "", client.Options{MaxIdleConnsPerHost: 128})
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		name := fmt.Sprintf("bench-%d", n.Add(1))
		for pb.Next() {
			g, err := c.AcquireLock(ctx, name, client.LockRequest{Holder: "bench"})
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := c.ReleaseLock(ctx, name, g.Token, false); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

// BenchmarkWebhookLatency measures the time from an event's commit (the
// acquire's answer, which comes after the commit) to its arrival at a
// webhook receiver on loopback, one event at a time, with the real
// dispatcher (its own SQLite writes included).
func BenchmarkWebhookLatency(b *testing.B) {
	_, url := coordStartServerB(b, "", "--no-local")
	rcv := make(chan time.Time, 1)
	recv := coordHookReceiverB(b, func(body []byte) {
		var sb webhook.StandardBody
		if json.Unmarshal(body, &sb) == nil && sb.Type == arbiter.EventLockAcquired {
			rcv <- time.Now()
		}
	})
	c := client.New(url, "")
	ctx := context.Background()
	if _, err := c.CreateWebhook(ctx, arbiter.Webhook{URL: recv, Kinds: []string{arbiter.EventLockAcquired}}); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.AcquireLock(ctx, fmt.Sprintf("l%d", i), client.LockRequest{Holder: "bench"}); err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		select {
		case at := <-rcv:
			lat = append(lat, at.Sub(committed))
		case <-time.After(10 * time.Second):
			b.Fatal("no delivery")
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// coordStartServerB runs the real server in-process for a benchmark, as
// startServer does for tests.
func coordStartServerB(b *testing.B, config string, extra ...string) (*serverMain, string) {
	b.Helper()
	dir := b.TempDir()
	cfg := filepath.Join(dir, "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		b.Fatal(err)
	}
	var stderr syncBuffer
	env := &cli.Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
	args := append([]string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"}, extra...)
	m, err := newServerMain(env, args)
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

// coordHookReceiverB is a webhook receiver calling got with each body.
func coordHookReceiverB(b *testing.B, got func(body []byte)) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got(body)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

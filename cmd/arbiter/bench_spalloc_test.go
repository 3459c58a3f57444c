package main

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/bench"
)

// BenchmarkSpallocCycle runs the whole path in one process — 16 protocol
// connections, the spalloc server, the control loop and SQLite
// (synchronous = normal) — each connection doing create_job →
// get_job_state until ready → destroy_job with power delay and
// seconds_before_free 0. It reports cycles/s; -cpuprofile shows where the
// time goes. The number to quote is `arbiter bench spalloc` against a
// running server (client and server then do not share a process).
func BenchmarkSpallocCycle(b *testing.B) {
	cfg := strings.NewReplacer("power_delay_s = 1", "power_delay_s = 0", "seconds_before_free = 5", "seconds_before_free = 0",
		"[server]\n", "[server]\nsynchronous = \"normal\"\nlog_level = \"warn\"\n").Replace(gridConfig(""))
	m, stop := startServerWith(b, cfg, b.TempDir(), nil, nil)
	defer stop()
	const conns = 16
	per := b.N/conns + 1
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	b.ResetTimer()
	start := time.Now()
	for range conns {
		c, err := net.Dial("tcp", m.SpallocAddr())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			create := `{"command": "create_job", "args": [], "kwargs": {"owner": "bench", "keepalive": 60.0}}` + "\n"
			err := bench.SpallocCycles(context.Background(), c, create, per)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	b.ReportMetric(float64(conns*per)/time.Since(start).Seconds(), "cycles/s")
}

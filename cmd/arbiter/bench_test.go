package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// TestBenchAlloc runs `arbiter bench alloc` against the real server: it
// reports its numbers, leaves nothing held, and refuses to start when no
// machine could take its allocations.
func TestBenchAlloc(t *testing.T) {
	_, url := startServer(t, twoHosts, nil)
	stdout, stderr, code := cmdline(t, url, "bench", "alloc", "--clients", "3", "--duration", "100ms", "--warmup", "20ms")
	if code != 0 {
		t.Fatalf("got exit %d: %s", code, stderr)
	}
	for _, want := range []string{"cycles/s", "p99", "allocate", "release", "0 errors"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("got:\n%s\nwant %q", stdout, want)
		}
	}
	if live := cliJSON[[]arbiter.Allocation](t, url, "ps"); len(live) != 0 {
		t.Errorf("%d allocations left live after the bench, want none", len(live))
	}
	stdout, stderr, code = cmdline(t, url, "bench", "alloc", "-o", "json", "--clients", "2", "--duration", "50ms", "--warmup", "0s")
	var rep map[string]any
	if code != 0 || json.Unmarshal([]byte(stdout), &rep) != nil || rep["cycles_per_s"] == nil {
		t.Errorf("-o json: exit %d, %q (%s), want one JSON report", code, stdout, stderr)
	}
	// --ceiling: the same load against a do-nothing server first, then
	// the server, interleaved, and their ratio.
	stdout, stderr, code = cmdline(t, url, "bench", "alloc", "--ceiling", "--repeat", "2", "--clients", "2", "--duration", "50ms", "--warmup", "0s")
	if code != 0 || strings.Count(stdout, "ceiling") < 3 || !strings.Contains(stdout, "server / ceiling:") {
		t.Errorf("--ceiling: exit %d, %q (%s), want both targets and their ratio", code, stdout, stderr)
	}
	if live := cliJSON[[]arbiter.Allocation](t, url, "ps"); len(live) != 0 {
		t.Errorf("%d allocations left live after the bench, want none", len(live))
	}
	for _, args := range [][]string{{"bench"}, {"bench", "swap"}, {"bench", "alloc", "--clients", "0"}, {"bench", "alloc", "--repeat", "0"}} {
		if stdout, stderr, code := cmdline(t, url, args...); code != 2 || stdout != "" || !strings.Contains(stderr, "arbiter bench") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q: want a usage error naming the command", args, code, stdout, stderr)
		}
	}
	_, stderr, code = cmdline(t, url, "bench", "alloc", "--gpus", "64", "--duration", "50ms")
	if code != 1 || !strings.Contains(stderr, "free GPUs") {
		t.Errorf("got exit %d and %q, want a refusal naming free GPUs", code, stderr)
	}
}

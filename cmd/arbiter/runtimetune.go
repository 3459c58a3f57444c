package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The server's garbage collector works half as often as Go's default
// (GOGC 200 rather than 100): a serving server's live heap is small next
// to what it allocates per request, and collections interrupt the control
// loop and the committer, which every command waits for in turn. A soft
// memory limit keeps the heap from growing past what the default would
// allow at the live size: twice the live heap, at least gcLimitFloor,
// re-read every gcRetune as the state grows. Setting GOGC or GOMEMLIMIT
// in the environment leaves the runtime's own settings alone.

const (
	gcPercent    = 200
	gcLimitFloor = 256 << 20
	gcRetune     = 30 * time.Second
)

// tuneGC applies the server's GC settings and keeps the limit in step
// with the live heap until ctx ends. It returns at once when the
// environment sets GOGC or GOMEMLIMIT.
func tuneGC(ctx context.Context, getenv func(string) string) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	retune := func() {
		metrics.Read(sample)
		live := int64(0)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = int64(sample[0].Value.Uint64())
		}
		debug.SetMemoryLimit(max(gcLimitFloor, 2*live))
	}
	retune()
	go func() {
		t := time.NewTicker(gcRetune)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				retune()
			}
		}
	}()
}

// The server runs with more Ps (GOMAXPROCS) than the machine has CPUs.
// A goroutine in a blocking system call keeps its P until the runtime's
// monitor takes it back, 20 µs to 10 ms later, and the server always
// has goroutines in such calls: the committer in the batch log's
// synced write, the writer behind in SQLite's writes, uploads in the
// packs'. With one P per CPU, the goroutines with work to do waited for
// those Ps; with extraProcs more, they run on the CPUs the syscalls
// leave idle. On two CPUs (docs/guides/performance.md) that raised
// `bench tasks` and 64 spalloc connections by 10–20 % and lowered their
// p99, and left one client's rate within the noise. GOMAXPROCS in the
// environment leaves the runtime's own setting alone; so does any later
// change of a container's CPU limit, which the runtime follows only
// while GOMAXPROCS was never set.
const extraProcs = 2

// tuneProcs sets GOMAXPROCS to the runtime's default plus extraProcs,
// unless the environment sets GOMAXPROCS. Calling it again sets the same.
func tuneProcs(getenv func(string) string) {
	if getenv("GOMAXPROCS") != "" {
		return
	}
	runtime.SetDefaultGOMAXPROCS()
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + extraProcs)
}

package main

import (
	"context"
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

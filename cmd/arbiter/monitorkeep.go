package main

import (
	"context"
	"runtime"
	"time"
)

// Go's monitor thread (sysmon) sleeps deeply while every P is idle, and
// the first system call after that wakes it; it then naps 20 µs at a time
// until 50 naps in a row found nothing to do, and only then backs off
// towards 10 ms. A server with one client goes idle and busy again a few
// times a request, so its monitor hardly ever backs off: at one spalloc
// connection it was woken ~3,500 times a second (a runtime built to
// count), took a fifth of the server's CPU samples and napped four to six
// times per cycle (docs/guides/performance.md). While the server is busy
// but uses less than a CPU, one goroutine keeps a P in a short sleeping
// system call: a P that is never idle keeps the monitor out of deep
// sleep, nothing wakes it, and it backs off as the runtime intends. An
// idle server is left alone but for a look, once a second, at how much
// CPU the process used.

const (
	// keepNap is one sleep in a system call: under the 10 ms after which
	// the monitor takes a P back from a system call even with Ps to spare.
	keepNap = 9 * time.Millisecond
	// keepPeriod is how often the keeper decides whether the server is busy.
	keepPeriod = time.Second
	// keepBusy and keepSaturated bound the CPU a period must use for the
	// next to keep the monitor backed off: from 5 % of a CPU (a lone
	// client's server uses ~60 %) to a whole one. Busier than that, the
	// server rarely has every P idle, so the monitor backs off by itself,
	// and the P the keeper would hold (for up to a nap, as the backed-off
	// monitor takes it back late) is missed: under 64 spalloc
	// connections an unbounded keeper cost 8 %.
	keepBusy      = keepPeriod / 20
	keepSaturated = keepPeriod
	// keepMinProcs: the P the keeper holds must be one to spare (the
	// server runs two more Ps than CPUs, runtimetune.go).
	keepMinProcs = 3
)

// monitorKeeper decides, period by period, whether to hold a P in naps.
// Its functions are the process's (monitorkeep_linux.go) or a test's.
type monitorKeeper struct {
	cpu  func() time.Duration                            // the process's CPU time so far
	nap  func()                                          // one keepNap in a system call, holding the P
	wait func(ctx context.Context, d time.Duration) bool // d without holding a P; false once ctx ended
	now  func() time.Time
}

// run keeps the monitor backed off through each period after a busy one,
// until ctx ends.
func (k monitorKeeper) run(ctx context.Context) {
	prev, busy := k.cpu(), false
	for {
		start := k.now()
		if busy {
			for ctx.Err() == nil && k.now().Sub(start) < keepPeriod {
				k.nap()
				// A new scheduling tick each nap: the monitor takes a P
				// back from a goroutine that ran 10 ms on one tick.
				runtime.Gosched()
			}
		} else if !k.wait(ctx, keepPeriod) {
			return
		}
		if ctx.Err() != nil {
			return
		}
		cur := k.cpu()
		used := cur - prev
		busy, prev = used >= keepBusy && used < keepSaturated, cur
	}
}

// sleepCtx waits d or until ctx ends, reporting whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

package main

import (
	"context"
	"testing"
	"time"
)

// Against the real clock and process: while the process keeps about half
// a CPU busy the keeper naps in its system call, and it ends with its
// context.
func TestMonitorKeeperNapsWhileBusy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	napped := make(chan struct{}, 1)
	k := monitorKeeper{cpu: processCPU, wait: sleepCtx, now: time.Now, nap: func() {
		select {
		case napped <- struct{}{}:
		default:
		}
		napInSyscall()
	}}
	done := make(chan struct{})
	go func() { k.run(ctx); close(done) }()
	// Spin a millisecond, rest a millisecond (the process uses part of a
	// CPU, as a server with one client does) until the keeper naps: after
	// the first period, which finds the process busy.
	deadline := time.Now().Add(5 * keepPeriod)
	for busy := true; busy; {
		select {
		case <-napped:
			busy = false
		default:
			if time.Now().After(deadline) {
				t.Fatalf("no nap while the process used part of a CPU (%s in all)", processCPU())
			}
			for spin := time.Now().Add(time.Millisecond); time.Now().Before(spin); {
			}
			time.Sleep(time.Millisecond)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * keepPeriod):
		t.Fatal("the keeper did not end with its context")
	}
}

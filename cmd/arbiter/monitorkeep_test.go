package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/clock"
)

// The keeper holds a P in naps through exactly the periods that follow a
// busy one that used less than a whole CPU, waits without one otherwise,
// and stops when its context ends.
func TestMonitorKeeper(t *testing.T) {
	// CPU used in each period, as the keeper finds it at the period's end.
	used := []time.Duration{0, keepBusy, keepBusy / 2, 2 * keepBusy, keepBusy, 0, keepSaturated, 3 * keepSaturated / 2, 0}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := clock.NewFake(time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC))
	var cpu time.Duration
	period, naps := 0, map[int]int{}
	next := func() { // a period ends: the process used what the script says
		if period == len(used) {
			cancel()
			return
		}
		cpu += used[period]
		period++
	}
	k := monitorKeeper{
		cpu: func() time.Duration { return cpu },
		nap: func() {
			naps[period]++
			if clk.Advance(keepNap); naps[period]*int(keepNap) >= int(keepPeriod) {
				next()
			}
		},
		wait: func(ctx context.Context, d time.Duration) bool {
			if d != keepPeriod {
				t.Errorf("waited %s, want a period", d)
			}
			clk.Advance(d)
			next()
			return ctx.Err() == nil
		},
		now: clk.Now,
	}
	done := make(chan struct{})
	go func() { k.run(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper did not stop when its context ended")
	}
	// Periods are numbered from 0 by the script; a period of naps is the
	// one after a busy but not saturated one.
	want := map[int]int{}
	for i := 1; i < len(used); i++ {
		if used[i-1] >= keepBusy && used[i-1] < keepSaturated {
			want[i] = int((keepPeriod + keepNap - 1) / keepNap)
		}
	}
	if fmt.Sprint(naps) != fmt.Sprint(want) {
		t.Errorf("naps by period: %v, want %v", naps, want)
	}
}

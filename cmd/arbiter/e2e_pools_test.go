package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

const poolConfig = `
[[machines]]
name = "gpu1"
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 2 } ]

[[pools]]
name = "small-gpu"
backing = { gpus = 1, min_vram_gib = 40 }
slots = 4
grace_time_s = 60
`

// TestEndToEndPoolSlots: four `arbiter alloc --pool … -- CMD` processes
// share one backing GPU, a fifth gets a second backing, and both backings
// are given back after the grace time once all have exited.
func TestEndToEndPoolSlots(t *testing.T) {
	bin := buildBinary(t)
	clk := clock.NewFake(time.Now().UTC())
	m, url := startServer(t, poolConfig, clk)
	dir := t.TempDir()
	release := filepath.Join(dir, "go")
	// Each command records what it was given, then waits for the test.
	// The record is written whole, then renamed, so the test never reads
	// half of it.
	script := `echo "$ARBITER_ALLOCATION_ID $ARBITER_SLOT $CUDA_VISIBLE_DEVICES" > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; while [ ! -e "` + release + `" ]; do sleep 0.02; done`
	// Whatever happens, let the commands finish: a failed test must not
	// leave them waiting forever.
	t.Cleanup(func() { os.WriteFile(release, nil, 0o600) })

	var wg sync.WaitGroup
	errs := make([]string, 5)
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := exec.Command(bin, "alloc", "--pool", "small-gpu", "--owner", "nb", "--", "sh", "-c", script)
			cmd.Env = append(os.Environ(), "ARBITER_URL="+url, "OUT="+filepath.Join(dir, "out"+string(rune('0'+i))))
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = err.Error() + ": " + string(out)
			}
		}(i)
		// One at a time, so which process lands on which backing is known.
		poll.Until(t, 30*time.Second, "the slot's command to write its output", func() bool { _, err := os.Stat(filepath.Join(dir, "out"+string(rune('0'+i)))); return err == nil })
	}
	c := client.New(url, "")
	p, err := c.Pool(context.Background(), "small-gpu")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Backings) != 2 || busy(p.Backings[0]) != 4 || busy(p.Backings[1]) != 1 {
		t.Fatalf("pool %+v: want 2 backings with 4 and 1 slots in use", p)
	}
	gpus := map[string]int{}
	slots := map[string]bool{}
	for i := 0; i < 5; i++ {
		b, _ := os.ReadFile(filepath.Join(dir, "out"+string(rune('0'+i))))
		f := strings.Fields(string(b))
		if len(f) != 3 {
			t.Fatalf("command %d saw %q, want id, slot and GPU", i, b)
		}
		gpus[f[2]]++
		slots[f[1]+"@"+f[2]] = true
	}
	if len(gpus) != 2 || len(slots) != 5 {
		t.Fatalf("GPUs %v slots %v: want 4 commands on one GPU and 1 on the other, each in its own slot", gpus, slots)
	}

	os.WriteFile(release, nil, 0o600)
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Fatalf("command %d: %s", i, e)
		}
	}
	// All slots are free; the backings wait out the grace time…
	p, _ = c.Pool(context.Background(), "small-gpu")
	if len(p.Backings) != 2 || busy(p.Backings[0]) != 0 || p.Backings[0].ReleaseAt == nil {
		t.Fatalf("after the commands exited: %+v, want 2 empty backings with a release time", p)
	}
	clk.Advance(59 * time.Second)
	m.loop.Wake()
	if p, _ = c.Pool(context.Background(), "small-gpu"); len(p.Backings) != 2 {
		t.Fatalf("before the grace time: %d backings, want 2", len(p.Backings))
	}
	// …and are given back after it.
	clk.Advance(2 * time.Second)
	m.loop.Wake()
	poll.Until(t, 30*time.Second, "the idle backings to be given back", func() bool { p, _ = c.Pool(context.Background(), "small-gpu"); return len(p.Backings) == 0 })
	live, _ := c.Allocations(context.Background(), arbiter.AllocationFilter{State: "live"})
	if len(live) != 0 {
		t.Fatalf("%d allocations still live, want none", len(live))
	}
}

func busy(b arbiter.BackingStatus) int {
	n := 0
	for _, s := range b.Slots {
		if s != nil {
			n++
		}
	}
	return n
}

// poolRestartConfig has two one-GPU hosts, so that each backing of a pool
// of two slots is on its own machine; without gpu2 or the pool when asked.
func poolRestartConfig(gpu2, pool bool) string {
	s := `
[[machines]]
name = "gpu1"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 1 } ]
`
	if gpu2 {
		s += `
[[machines]]
name = "gpu2"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, count = 1 } ]
`
	}
	if pool {
		s += `
[[pools]]
name = "small-gpu"
backing = { gpus = 1, min_vram_gib = 40 }
slots = 2
grace_time_s = 60
`
	}
	return s
}

// TestEndToEndPoolRestart restarts the real server on its store in the
// middle of a pool's life: every slot comes back on its backing at its index;
// then, at a second restart, one backing's machine is gone (its slot ends
// naming why) and the pool is removed (its other backing drains and is given
// back once empty), without an error.
func TestEndToEndPoolRestart(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Now().UTC())
	data := t.TempDir()
	m, stop := startServerWith(t, poolRestartConfig(true, true), data, clk, nil)
	c := client.New(m.URL(), "")
	take := func(c *client.Client) arbiter.Allocation {
		t.Helper()
		a, err := c.Allocate(ctx, arbiter.Request{Owner: "nb", Pool: "small-gpu"})
		if err != nil {
			t.Fatal(err)
		}
		if a.State != arbiter.StateReady || a.Backing == nil || a.Slot == nil {
			t.Fatalf("slot %+v, want ready with a backing and an index", a)
		}
		return a
	}
	s1, s2, s3 := take(c), take(c), take(c)
	if *s1.Backing != *s2.Backing || *s3.Backing == *s1.Backing || *s1.Slot != 0 || *s2.Slot != 1 || *s3.Slot != 0 {
		t.Fatalf("slots on backings %d %d %d at %d %d %d, want 0 and 1 of one, 0 of another",
			*s1.Backing, *s2.Backing, *s3.Backing, *s1.Slot, *s2.Slot, *s3.Slot)
	}
	if _, err := c.Release(ctx, s2.ID, "done"); err != nil {
		t.Fatal(err)
	}
	stop()

	// Restart in the middle: s1 and s3 are where they were, slot 1 of the
	// first backing is free and is the one a new request takes.
	m, stop = startServerWith(t, poolRestartConfig(true, true), data, clk, nil)
	c = client.New(m.URL(), "")
	for _, s := range []arbiter.Allocation{s1, s3} {
		got, err := c.Allocation(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != arbiter.StateReady || *got.Backing != *s.Backing || *got.Slot != *s.Slot || *got.Machine != *s.Machine {
			t.Fatalf("slot %d after the restart: %+v, want ready on backing %d slot %d", s.ID, got, *s.Backing, *s.Slot)
		}
	}
	p, err := c.Pool(ctx, "small-gpu")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Backings) != 2 || p.Backings[0].Allocation != *s1.Backing || p.Backings[1].Allocation != *s3.Backing ||
		busy(p.Backings[0]) != 1 || busy(p.Backings[1]) != 1 || *p.Backings[0].Slots[0] != s1.ID || *p.Backings[1].Slots[0] != s3.ID {
		t.Fatalf("pool after the restart: %+v, want backings %d [%d -] and %d [%d -]", p, *s1.Backing, s1.ID, *s3.Backing, s3.ID)
	}
	s4 := take(c)
	if *s4.Backing != *s1.Backing || *s4.Slot != 1 {
		t.Fatalf("new slot on backing %d index %d, want the freed slot 1 of %d", *s4.Backing, *s4.Slot, *s1.Backing)
	}
	stop()

	// The machine of the second backing and the pool are gone from the
	// configuration.
	gone := *s3.Machine
	keep := "gpu1"
	if gone == "gpu1" {
		t.Fatalf("the second backing is on gpu1; want it on gpu2 (bin-packing, then name order)")
	}
	m, stop = startServerWith(t, poolRestartConfig(false, true), data, clk, nil)
	c = client.New(m.URL(), "")
	b3, _ := c.Allocation(ctx, *s3.Backing)
	got3, _ := c.Allocation(ctx, s3.ID)
	if b3.State != arbiter.StateDestroyed || !strings.Contains(arbiter.StrOr(b3.Reason, ""), gone) ||
		got3.State != arbiter.StateDestroyed || !strings.Contains(arbiter.StrOr(got3.Reason, ""), fmt.Sprintf("backing allocation %d of pool small-gpu ended", *s3.Backing)) {
		t.Fatalf("backing on the removed machine: %s (%s), its slot %s (%s): want both destroyed naming why",
			b3.State, arbiter.StrOr(b3.Reason, ""), got3.State, arbiter.StrOr(got3.Reason, ""))
	}
	if p, _ = c.Pool(ctx, "small-gpu"); len(p.Backings) != 1 || busy(p.Backings[0]) != 2 || *p.Backings[0].Machine != keep {
		t.Fatalf("pool: %+v, want the backing on %s with both slots", p, keep)
	}
	stop()

	// The pool is removed: its backing drains, takes no new slot, and is
	// given back as soon as its last slot is freed (grace ignored).
	m, _ = startServerWith(t, poolRestartConfig(false, false), data, clk, nil)
	c = client.New(m.URL(), "")
	p, err = c.Pool(ctx, "small-gpu")
	if err != nil || p.Configured || len(p.Backings) != 1 || !p.Backings[0].Draining || busy(p.Backings[0]) != 2 {
		t.Fatalf("removed pool: %+v (%v), want its backing draining with both slots", p, err)
	}
	if _, err := c.Allocate(ctx, arbiter.Request{Owner: "nb", Pool: "small-gpu"}); arbiter.ErrorCode(err) != arbiter.EInvalid ||
		!strings.Contains(err.Error(), "not configured") {
		t.Fatalf("slot of a removed pool: %v, want invalid: not configured", err)
	}
	for _, s := range []arbiter.Allocation{s1, s4} {
		if _, err := c.Release(ctx, s.ID, "done"); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := c.Allocation(ctx, *s1.Backing); b.State != arbiter.StateDestroyed || !strings.Contains(arbiter.StrOr(b.Reason, ""), "drained and empty") {
		t.Fatalf("backing of the removed pool once empty: %s (%s), want given back", b.State, arbiter.StrOr(b.Reason, ""))
	}
	if _, err := c.Pool(ctx, "small-gpu"); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Fatalf("removed pool with no backing left: %v, want not_found", err)
	}
}

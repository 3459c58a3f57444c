package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpapi"
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
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	clk := &fakeClock{t: time.Now().UTC()}
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
		waitUntil(t, func() bool { _, err := os.Stat(filepath.Join(dir, "out"+string(rune('0'+i)))); return err == nil })
	}
	c := httpapi.NewClient(url, "")
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
	clk.Add(59 * time.Second)
	m.loop.Wake()
	if p, _ = c.Pool(context.Background(), "small-gpu"); len(p.Backings) != 2 {
		t.Fatalf("before the grace time: %d backings, want 2", len(p.Backings))
	}
	// …and are given back after it.
	clk.Add(2 * time.Second)
	m.loop.Wake()
	waitUntil(t, func() bool { p, _ = c.Pool(context.Background(), "small-gpu"); return len(p.Backings) == 0 })
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

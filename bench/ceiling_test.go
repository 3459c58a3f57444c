package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
)

// The do-nothing servers answer the workloads' requests as the server
// does, so each load tool runs against them without errors.
func TestCeilingServers(t *testing.T) {
	ctx := context.Background()
	sp, err := startCeilingSpalloc(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	sl := spallocLoad{conns: 2, duration: 100 * time.Millisecond, create: func(i int) string {
		return fmt.Sprintf(`{"command": "create_job", "args": [], "kwargs": {"owner": "t%d"}}`+"\n", i)
	}}
	rep, err := sl.run(ctx, sp.Addr(), io.Discard)
	if err != nil || rep.Cycles == 0 || rep.Errors != 0 {
		t.Errorf("spalloc against the ceiling: %d cycles, %d errors, %v", rep.Cycles, rep.Errors, err)
	}

	h, err := startCeilingHTTP(nil)
	if err != nil {
		t.Fatal(err)
	}
	h.tasks.Store(50)
	defer h.Close()
	al := allocLoad{clients: 2, duration: 100 * time.Millisecond, gpus: 1}
	arep, err := al.run(ctx, h.URL(), "", io.Discard)
	if err != nil || arep.Cycles == 0 || arep.Errors != 0 {
		t.Errorf("alloc against the ceiling: %d cycles, %d errors, %v", arep.Cycles, arep.Errors, err)
	}
	trep := tasksLoad{tasks: 50, workers: 4, payload: 64}.run(ctx, h.URL(), "")
	if trep.Completed != 50 || trep.Errors != 0 {
		t.Errorf("tasks against the ceiling: %d of 50 completed, %d errors %v", trep.Completed, trep.Errors, trep.ErrorSample)
	}
}

// TestCompare: runs alternate between the targets, and the summary is
// each side's median and range and their ratio.
func TestCompare(t *testing.T) {
	var order []string
	rates := map[string][]float64{"ceiling": {100, 300, 200}, "server": {50, 40, 90}}
	cmp, err := compare(context.Background(), "w", "cycles", 3, true, func(_ context.Context, target string) (measured, error) {
		order = append(order, target)
		r := rates[target][0]
		rates[target] = rates[target][1:]
		return measured{Rate: r, P50: 1, P99: r / 10}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ceiling", "server", "ceiling", "server", "ceiling", "server"}; !reflect.DeepEqual(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if c, s := cmp.Ceiling, cmp.Server; c.Rate != 200 || c.RateMin != 100 || c.RateMax != 300 || s.Rate != 50 || s.Runs != 3 {
		t.Errorf("summaries: ceiling %+v, server %+v", c, s)
	}
	if cmp.Ratio != 0.25 || cmp.P99Ratio != 0.25 {
		t.Errorf("ratios %v, %v; want 0.25, 0.25", cmp.Ratio, cmp.P99Ratio)
	}
	var b strings.Builder
	if err := printComparison(&b, cmp); err != nil || !strings.Contains(b.String(), "server / ceiling: 0.25") {
		t.Errorf("printed:\n%s", b.String())
	}
	b.Reset()
	cmp.DurableCeiling = true
	if err := printComparison(&b, cmp); err != nil || !strings.Contains(b.String(), "server / durable ceiling: 0.25") {
		t.Errorf("printed against the durable ceiling:\n%s", b.String())
	}
	if med, _, _ := medianRange([]float64{4, 1, 3, 2}); med != 2.5 {
		t.Errorf("median of four: %v, want 2.5", med)
	}
}

// TestDurableCeiling: every commit returns after a synced record covers
// it, concurrent commits share records (group commit), the workloads run
// against the durable servers without errors, and a server's Close
// removes its log.
func TestDurableCeiling(t *testing.T) {
	d, err := newDurable(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const callers, each = 8, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := d.commit(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if d.seq < 1 || d.seq > callers*each || d.synced != callers*each {
		t.Errorf("%d records for %d commits (%d covered)", d.seq, callers*each, d.synced)
	}
	t.Logf("%d commits in %d records", callers*each, d.seq)

	ctx := context.Background()
	sp, err := startCeilingSpalloc(d)
	if err != nil {
		t.Fatal(err)
	}
	before := d.synced
	rep, err := spallocLoad{conns: 2, duration: 100 * time.Millisecond, create: func(i int) string {
		return fmt.Sprintf(`{"command": "create_job", "args": [], "kwargs": {"owner": "t%d"}}`+"\n", i)
	}}.run(ctx, sp.Addr(), io.Discard)
	if cerr := sp.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil || rep.Cycles == 0 || rep.Errors != 0 {
		t.Fatalf("spalloc against the durable ceiling: %d cycles, %d errors, %v", rep.Cycles, rep.Errors, err)
	}
	// Two commits per cycle (create, destroy); the warm-up's are not counted.
	if got := d.synced - before; got < 2*uint64(rep.Cycles) {
		t.Errorf("%d commits for %d spalloc cycles, want at least two each", got, rep.Cycles)
	}

	if _, err := os.Stat(d.dir); !os.IsNotExist(err) {
		t.Errorf("the log's directory is still there after Close: %v", err)
	}

	d, err = newDurable(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h, err := startCeilingHTTP(d)
	if err != nil {
		t.Fatal(err)
	}
	h.tasks.Store(20)
	trep := tasksLoad{tasks: 20, workers: 4, payload: 64}.run(ctx, h.URL(), "")
	h.Close()
	if trep.Completed != 20 || trep.Errors != 0 {
		t.Errorf("tasks against the durable ceiling: %d of 20 completed, %d errors %v", trep.Completed, trep.Errors, trep.ErrorSample)
	}
	if _, err := os.Stat(d.dir); !os.IsNotExist(err) {
		t.Errorf("the log's directory is still there after Close: %v", err)
	}
}

// TestDurableCeilingOnARAMDisk: a durable ceiling whose log would sync
// for free is used, with a warning that says what to do.
func TestDurableCeilingOnARAMDisk(t *testing.T) {
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil || !strings.Contains(string(mounts), " /dev/shm tmpfs ") {
		t.Skip("no tmpfs at /dev/shm")
	}
	var warned strings.Builder
	rf := &roundFlags{durable: true, durableDir: "/dev/shm"}
	d, err := rf.durableLog(&warned)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !strings.Contains(warned.String(), "RAM disk") || !strings.Contains(warned.String(), "--durable-ceiling-dir") {
		t.Errorf("warning: %q", warned.String())
	}
	warned.Reset()
	rf.durableDir = t.TempDir()
	d2, err := rf.durableLog(&warned)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if onRAMDisk(rf.durableDir) != (warned.Len() > 0) {
		t.Errorf("warned %q for %s", warned.String(), rf.durableDir)
	}
}

// TestServeCeiling: `arbiter bench ceiling` serves the durable ceilings on
// the ports it prints, each workload runs against them without errors and
// commits, and an interrupt stops it and removes its log.
func TestServeCeiling(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	var stderr strings.Builder
	env := &cli.Env{Stdout: outW, Stderr: &stderr, Getenv: func(string) string { return "" }}
	dir := t.TempDir()
	done := make(chan error, 1)
	go func() { done <- benchCeiling(ctx, env, []string{"--durable", "--durable-dir", dir, "--tasks", "30"}) }()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, outR)
	var httpURL, spAddr, logDir string
	if _, err := fmt.Sscanf(strings.NewReplacer(",", " ").Replace(line), "serving the durable ceiling  log in %s %s spalloc %s", &logDir, &httpURL, &spAddr); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if filepath.Dir(logDir) != dir {
		t.Errorf("the log is in %s, want it under %s", logDir, dir)
	}

	rep, err := spallocLoad{conns: 2, duration: 100 * time.Millisecond, create: func(i int) string {
		return fmt.Sprintf(`{"command": "create_job", "args": [], "kwargs": {"owner": "t%d"}}`+"\n", i)
	}}.run(ctx, spAddr, io.Discard)
	if err != nil || rep.Cycles == 0 || rep.Errors != 0 {
		t.Errorf("spalloc against the served ceiling: %d cycles, %d errors, %v", rep.Cycles, rep.Errors, err)
	}
	arep, err := allocLoad{clients: 2, duration: 100 * time.Millisecond, gpus: 1}.run(ctx, httpURL, "", io.Discard)
	if err != nil || arep.Cycles == 0 || arep.Errors != 0 {
		t.Errorf("alloc against the served ceiling: %d cycles, %d errors, %v", arep.Cycles, arep.Errors, err)
	}
	// bench tasks reloads the manifest first, which hands out --tasks claims.
	if _, err := client.New(httpURL, "").ReloadTasks(ctx); err != nil {
		t.Fatal(err)
	}
	trep := tasksLoad{tasks: 30, workers: 4, payload: 64}.run(ctx, httpURL, "")
	if trep.Completed != 30 || trep.Errors != 0 {
		t.Errorf("tasks against the served ceiling: %d of 30 completed, %d errors %v", trep.Completed, trep.Errors, trep.ErrorSample)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("after the interrupt: %v", err)
	}
	outW.Close()
	if _, err := os.Stat(logDir); !os.IsNotExist(err) {
		t.Errorf("the log's directory is still there: %v", err)
	}
	if stderr.Len() > 0 && !onRAMDisk(dir) {
		t.Errorf("stderr: %q", stderr.String())
	}
}

// TestServeCeilingRejects: bad flags are usage errors and serve nothing.
func TestServeCeilingRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--tasks", "0"},
		{"--durable-dir", t.TempDir()},
		{"extra"},
		{"--listen", "nowhere"},
	} {
		var out strings.Builder
		env := &cli.Env{Stdout: &out, Stderr: io.Discard, Getenv: func(string) string { return "" }}
		err := benchCeiling(context.Background(), env, args)
		if err == nil || out.Len() > 0 {
			t.Errorf("%q: err %v, printed %q", args, err, out.String())
		}
	}
}

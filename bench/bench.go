// Package bench holds arbiter's load tools, `arbiter bench alloc|tasks|
// spalloc`: many concurrent clients driving a running server through its
// real interfaces (the HTTP API, the fleet /v1 API, the spalloc protocol)
// and a report of throughput and latency percentiles, for people and, with
// -o json, for scripts.
package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
)

// Run is `arbiter bench WORKLOAD [flags]`: it load-tests a running server.
func Run(ctx context.Context, env *cli.Env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(env.Stderr, "usage: arbiter bench alloc|tasks|spalloc|ceiling [flags]\n\nworkloads:\n  alloc  concurrent allocate → release cycles\n  tasks  simulated fleet workers: claim → heartbeat → upload → complete (tasks.go)\n  spalloc  spalloc protocol connections: create_job → get_job_state until ready → destroy_job\n\n  ceiling  serve the do-nothing servers of --ceiling in a process of their own, to load like a server")
		if len(args) == 0 {
			return cli.Usagef("want a workload: alloc, tasks or spalloc")
		}
		return nil
	}
	switch args[0] {
	case "alloc":
		return benchAlloc(ctx, env, args[1:])
	case "tasks":
		return benchTasks(ctx, env, args[1:])
	case "spalloc":
		return benchSpalloc(ctx, env, args[1:]) // spalloc.go
	case "ceiling":
		return benchCeiling(ctx, env, args[1:]) // ceilingserve.go
	}
	return cli.Usagef("unknown workload %q: want alloc, tasks or spalloc (or ceiling)", args[0])
}

// benchStats is one kind of timed operation's latency summary.
type benchStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// benchReport is what bench alloc prints (-o json prints it as is).
type benchReport struct {
	URL         string                `json:"url"`
	Clients     int                   `json:"clients"`
	GPUs        int                   `json:"gpus"`
	DurationS   float64               `json:"duration_s"` // measured time, without warmup
	Cycles      int                   `json:"cycles"`
	CyclesPerS  float64               `json:"cycles_per_s"`
	Ready       int                   `json:"ready"`  // cycles whose allocation was ready at once
	Queued      int                   `json:"queued"` // cycles whose allocation was queued (released while queued)
	Errors      int                   `json:"errors"`
	ErrorSample []string              `json:"error_samples"` // a few distinct error messages
	Latency     map[string]benchStats `json:"latency"`       // "cycle", "allocate", "release"
}

// benchSamples is what one client goroutine measured.
type benchSamples struct {
	cycle, allocate, release []time.Duration
	ready, queued, errors    int
	errs                     map[string]bool
	leftover                 []int64 // allocations it could not release
}

// benchAlloc runs N goroutines, each allocating (keepalive null) and
// releasing in a loop through one shared client, for warmup+duration.
func benchAlloc(ctx context.Context, env *cli.Env, args []string) error {
	fs, cf := cli.NewClientFlags(env, "bench alloc", "")
	clients := fs.Int("clients", 16, "concurrent clients")
	duration := fs.Duration("duration", 10*time.Second, "how long to measure")
	warmup := fs.Duration("warmup", time.Second, "how long to run before measuring")
	gpus := fs.Int("gpus", 1, "GPUs per allocation")
	rf := addRoundFlags(fs)
	pos, err := cli.ParseFlags(env, fs, args, true)
	if err != nil {
		return cli.HelpOK(err)
	}
	switch {
	case len(pos) > 0:
		return cli.Usagef("unexpected argument %q", pos[0])
	case *clients < 1 || *clients > 4096:
		return cli.Usagef("--clients %d: want 1 to 4096", *clients)
	case *duration <= 0 || *duration > time.Hour:
		return cli.Usagef("--duration %s: want more than 0 and at most 1h", *duration)
	case *warmup < 0 || *warmup > time.Hour:
		return cli.Usagef("--warmup %s: want 0 to 1h", *warmup)
	case *gpus < 1 || *gpus > arbiter.MaxGPUsPerMachine:
		return cli.Usagef("--gpus %d: want 1 to %d", *gpus, arbiter.MaxGPUsPerMachine)
	}
	if err := rf.check(); err != nil {
		return err
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	var ceil *ceilingHTTP
	if rf.ceiling {
		if ceil, err = startCeiling(rf, env.Stderr, startCeilingHTTP); err != nil {
			return fmt.Errorf("start the ceiling server: %w", err)
		}
		defer ceil.Close()
	}
	load := allocLoad{clients: *clients, duration: *duration, warmup: *warmup, gpus: *gpus}
	runOne := func(ctx context.Context, target string) (benchReport, error) {
		url, token := cf.URL(), cf.Token()
		if target == "ceiling" {
			url, token = ceil.URL(), ""
		}
		rep, err := load.run(ctx, url, token, env.Stderr)
		if ctx.Err() != nil {
			fmt.Fprintln(env.Stderr, "interrupted: reporting what was measured")
		}
		return rep, err
	}
	return runRounds(ctx, env.Stdout, cf.JSON(), rf, "alloc", "cycles", runOne, func(rep benchReport) measured {
		c := rep.Latency["cycle"]
		return measured{Rate: rep.CyclesPerS, P50: c.P50, P99: c.P99, Report: rep}
	}, printBench)
}

// allocLoad is one bench alloc run's shape.
type allocLoad struct {
	clients          int
	duration, warmup time.Duration
	gpus             int
}

// run loads the server at url and reports what it measured.
// Allocations it could not release are named on warn.
func (l allocLoad) run(ctx context.Context, url, token string, warn io.Writer) (benchReport, error) {
	// One client for all goroutines, with enough idle connections that
	// each goroutine keeps its own instead of dialling per request.
	hc := benchHTTPClient(l.clients)
	defer hc.CloseIdleConnections()
	c := client.NewWithOptions(url, token, client.Options{HTTPClient: hc})
	if err := benchCheckCapacity(ctx, c, l.gpus); err != nil {
		return benchReport{}, err
	}

	host, _ := os.Hostname()
	start := time.Now()
	measureFrom := start.Add(l.warmup)
	stopAt := measureFrom.Add(l.duration)
	// The run is bounded even if the server hangs: in-flight calls get
	// the client's own timeout after stopAt.
	samples := make([]benchSamples, l.clients)
	var wg sync.WaitGroup
	for i := range l.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("bench-%d@%s", i, host)
			samples[i] = benchClient(ctx, c, owner, l.gpus, measureFrom, stopAt)
		}()
	}
	wg.Wait()
	end := time.Now()
	if end.After(stopAt) {
		end = stopAt
	}
	rep := benchSummarise(samples, end.Sub(measureFrom))
	rep.URL, rep.Clients, rep.GPUs = url, l.clients, l.gpus
	var leftover []int64
	for _, s := range samples {
		leftover = append(leftover, s.leftover...)
	}
	if len(leftover) > 0 {
		fmt.Fprintf(warn, "warning: %d allocations could not be released (ids %v); release them with arbiter release\n", len(leftover), leftover)
	}
	return rep, nil
}

// benchHTTPClient is an HTTP client for n concurrent callers: each keeps
// its own connection instead of dialling per request, and a request costs
// the load tool as little as it can (client.Transport).
func benchHTTPClient(n int) *http.Client {
	std := &http.Transport{MaxIdleConns: 2 * (n + 4), MaxIdleConnsPerHost: n + 4, IdleConnTimeout: time.Minute}
	return &http.Client{Transport: client.NewTransport(std, n+4)}
}

// benchCheckCapacity refuses to load a server that has nowhere to place
// the allocations: every cycle would only queue.
func benchCheckCapacity(ctx context.Context, c *client.Client, gpus int) error {
	ms, err := c.Machines(ctx)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.State == arbiter.MachineUp && m.Free >= gpus {
			return nil
		}
	}
	return fmt.Errorf("no machine that is up has %d free GPUs; bench needs idle capacity (see arbiter status)", gpus)
}

// benchClient runs allocate → release cycles until stopAt, recording the
// cycles that start at or after measureFrom.
func benchClient(ctx context.Context, c *client.Client, owner string, gpus int, measureFrom, stopAt time.Time) benchSamples {
	s := benchSamples{errs: map[string]bool{}}
	fail := func(err error) {
		s.errors++
		if len(s.errs) < 5 {
			s.errs[err.Error()] = true
		}
	}
	// Releases use a context that an interrupt does not cancel, so that an
	// interrupted run leaves nothing held.
	rctx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(stopAt) {
			break
		}
		measure := !t0.Before(measureFrom)
		a, err := c.Allocate(ctx, arbiter.Request{Owner: owner, GPUs: gpus})
		t1 := time.Now()
		if err != nil {
			if ctx.Err() == nil && measure {
				fail(err)
			}
			continue
		}
		_, err = c.Release(rctx, a.ID, "bench")
		t2 := time.Now()
		if err != nil {
			s.leftover = append(s.leftover, a.ID)
			if measure {
				fail(err)
			}
			continue
		}
		if !measure {
			continue
		}
		s.allocate = append(s.allocate, t1.Sub(t0))
		s.release = append(s.release, t2.Sub(t1))
		s.cycle = append(s.cycle, t2.Sub(t0))
		if a.State == arbiter.StateReady {
			s.ready++
		} else {
			s.queued++
		}
	}
	return s
}

// benchSummarise merges the goroutines' samples over the measured time.
func benchSummarise(samples []benchSamples, measured time.Duration) benchReport {
	var cycle, alloc, rel []time.Duration
	rep := benchReport{ErrorSample: []string{}}
	var errs []map[string]bool
	for _, s := range samples {
		cycle = append(cycle, s.cycle...)
		alloc = append(alloc, s.allocate...)
		rel = append(rel, s.release...)
		rep.Ready += s.ready
		rep.Queued += s.queued
		rep.Errors += s.errors
		errs = append(errs, s.errs)
	}
	rep.ErrorSample = errorSample(errs)
	rep.Cycles = len(cycle)
	rep.DurationS = measured.Seconds()
	if measured > 0 {
		rep.CyclesPerS = float64(rep.Cycles) / measured.Seconds()
	}
	rep.Latency = map[string]benchStats{
		"cycle":    benchStatsOf(cycle),
		"allocate": benchStatsOf(alloc),
		"release":  benchStatsOf(rel),
	}
	return rep
}

// benchStatsOf returns the nearest-rank percentiles of ds in milliseconds.
func benchStatsOf(ds []time.Duration) benchStats {
	if len(ds) == 0 {
		return benchStats{}
	}
	slices.Sort(ds)
	pct := func(p float64) float64 {
		i := int(p*float64(len(ds)) + 0.999999)
		i = min(max(i-1, 0), len(ds)-1)
		return benchMillis(ds[i])
	}
	return benchStats{Count: len(ds), P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: benchMillis(ds[len(ds)-1])}
}

func benchMillis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func printBench(w io.Writer, r benchReport) error {
	fmt.Fprintf(w, "%d cycles in %.1fs with %d clients: %.1f cycles/s (%d ready at once, %d queued), %d errors\n",
		r.Cycles, r.DurationS, r.Clients, r.CyclesPerS, r.Ready, r.Queued, r.Errors)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency\tcount\tp50\tp90\tp99\tmax\t")
	for _, k := range []string{"cycle", "allocate", "release"} {
		s := r.Latency[k]
		fmt.Fprintf(tw, "%s\t%d\t%.2fms\t%.2fms\t%.2fms\t%.2fms\t\n", k, s.Count, s.P50, s.P90, s.P99, s.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range r.ErrorSample {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

// errorSample returns up to five distinct error messages of the clients of a
// load run, sorted, for the report.
func errorSample(sets []map[string]bool) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, set := range sets {
		for e := range set {
			if !seen[e] {
				seen[e] = true
				out = append(out, e)
			}
		}
	}
	sort.Strings(out)
	if len(out) > 5 {
		out = out[:5]
	}
	return out
}

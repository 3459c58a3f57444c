package bench

import (
	"flag"

	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter/cli"
)

// The ceiling is what the transport allows on this machine at this moment:
// a do-nothing server, in this process, answering the workload's requests
// in the same wire format with fixed replies (the sizes of the real ones).
// `--ceiling` runs the same load against it, then against the server, so
// that a number is read as a ratio to what the transport allows rather
// than against a figure from another machine or another hour.

// Fixed replies, as long as the real server's for the bench's requests.
const (
	ceilAllocation = `{"id":1,"owner":"bench-0@host","state":"ready","reason":null,"machine":"gpu1","devices":[{"machine":"gpu1","index":0,"uuid":"","model":"NVIDIA H100 80GB HBM3","vram_gib":80}],"request":{"owner":"bench-0@host","gpus":1,"keepalive_s":60},"priority":0,"keepalive_s":60,"created_at":"2026-11-25T19:05:59.531552696Z","ready_at":"2026-11-25T19:05:59.531552696Z","destroyed_at":null,"expires_at":"2026-11-25T19:06:59.531552696Z","why_queued":null}`
	ceilReleased   = `{"id":1,"owner":"bench-0@host","state":"destroyed","reason":"bench","machine":"gpu1","devices":[{"machine":"gpu1","index":0,"uuid":"","model":"NVIDIA H100 80GB HBM3","vram_gib":80}],"request":{"owner":"bench-0@host","gpus":1,"keepalive_s":60},"priority":0,"keepalive_s":60,"created_at":"2026-11-25T19:05:59.531552696Z","ready_at":"2026-11-25T19:05:59.531552696Z","destroyed_at":"2026-11-25T19:05:59.548411436Z","expires_at":null,"why_queued":null}`
	ceilMachines   = `{"machines":[{"name":"gpu1","kind":"gpu","source":"config","state":"up","tags":["default"],"cores":0,"ram_gib":0,"cuda":"12.4","driver":"","last_seen":null,"free":64,"devices":[]}]}`
	ceilClaim      = `{"job_id":"eb75cce3a7414af9bef1f1febf82a6150c80900c0df32aacc7230f5df974c95a","name":"bench-r1-eb75cce3","spec":{"model":"bench","mode":"r1","hyper":{},"split_recipe":"","train_hosts":[],"seed":1,"priority":0,"require_cuda":false,"prefer_cuda":false,"min_vram_gib":0,"min_ram_gib":0,"gpus":0,"allowed_hosts":[],"command":["true"],"max_attempts":1,"stale_after_s":600},"attempts":1,"allocation_id":null,"gpus":[],"cuda_visible_devices":""}`
	ceilNoJob      = `{"job":null}`
	ceilOK         = `{"ok":true}`
	ceilStored     = `{"artifact_id":"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824","size_bytes":256,"status":"stored"}`
	ceilReload     = `{"manifest":"bench","tasks":0,"added":0,"updated":0,"unchanged":0,"removed":0}`

	ceilJobID    = `{"return": 1}` + "\n"
	ceilJobState = `{"return": {"state": 3, "power": true, "keepalive": 60.0, "reason": null, "start_time": 1795633552.260682, "keepalivehost": "127.0.0.1"}}` + "\n"
	ceilNull     = `{"return": null}` + "\n"
)

// ceilingHTTP is the do-nothing HTTP server of the alloc and tasks
// workloads. It serves tasks claims until it has handed out its quota.
type ceilingHTTP struct {
	srv   *http.Server
	ln    net.Listener
	d     *durable     // nil: the plain ceiling
	tasks atomic.Int64 // claims left to answer with a job
}

// startCeilingHTTP serves a ceiling on a loopback port.
func startCeilingHTTP(d *durable) (*ceilingHTTP, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return serveCeilingHTTP(ln, d, 0), nil
}

// serveCeilingHTTP serves fixed replies on ln to the requests bench alloc
// and bench tasks send. Claims get a job while c.tasks is above zero: it
// starts at zero, and with reloadTasks above zero each manifest reload
// sets it to reloadTasks. With d, the requests that change state in
// arbiter wait for d's commit first (durable.go); Close closes d.
func serveCeilingHTTP(ln net.Listener, d *durable, reloadTasks int64) *ceilingHTTP {
	c := &ceilingHTTP{ln: ln, d: d}
	replyAs := func(code int, body string, commits bool) http.HandlerFunc {
		b := []byte(body)
		return func(w http.ResponseWriter, r *http.Request) {
			// The real server reads every body it is sent; so does this.
			_, _ = io.Copy(io.Discard, r.Body)
			if commits {
				if err := d.commit(); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			}
			h := w.Header()
			h["Cache-Control"] = []string{"no-store"}
			h["Content-Type"] = []string{"application/json"}
			h["X-Content-Type-Options"] = []string{"nosniff"}
			w.WriteHeader(code)
			_, _ = w.Write(b)
		}
	}
	reply := func(code int, body string) http.HandlerFunc { return replyAs(code, body, false) }
	commit := func(code int, body string) http.HandlerFunc { return replyAs(code, body, true) }
	// A task's heartbeat is memory-only in arbiter, and an empty claim
	// changes nothing: neither commits.
	job, none := commit(http.StatusOK, ceilClaim), reply(http.StatusOK, ceilNoJob)
	reload := commit(http.StatusOK, ceilReload)
	if reloadTasks > 0 {
		reloaded := reload
		reload = func(w http.ResponseWriter, r *http.Request) {
			c.tasks.Store(reloadTasks)
			reloaded(w, r)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /api/v1/health", reply(http.StatusOK, ceilOK))
	mux.Handle("GET /api/v1/machines", reply(http.StatusOK, ceilMachines))
	mux.Handle("POST /api/v1/allocations", commit(http.StatusCreated, ceilAllocation))
	mux.Handle("DELETE /api/v1/allocations/{id}", commit(http.StatusOK, ceilReleased))
	mux.Handle("POST /api/v1/tasks/reload", reload)
	mux.Handle("POST /v1/manifest/reload", reload)
	mux.HandleFunc("POST /v1/job/claim", func(w http.ResponseWriter, r *http.Request) {
		if c.tasks.Add(-1) >= 0 {
			job(w, r)
		} else {
			none(w, r)
		}
	})
	mux.Handle("POST /v1/job/{id}/heartbeat", reply(http.StatusOK, ceilOK))
	mux.Handle("POST /v1/job/{id}/complete", commit(http.StatusOK, ceilOK))
	mux.Handle("PUT /v1/model/{id}", commit(http.StatusCreated, ceilStored))
	c.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	go func() { _ = c.srv.Serve(ln) }()
	return c
}

// URL is where the ceiling server listens.
func (c *ceilingHTTP) URL() string { return "http://" + c.ln.Addr().String() }

// Close stops the server and its connections, and closes its durable log.
func (c *ceilingHTTP) Close() error { return errors.Join(c.srv.Close(), c.d.Close()) }

// ceilingSpalloc is the do-nothing spalloc server: each request line gets
// a fixed reply chosen by its command name, from one goroutine per
// connection, as the real server answers. With d, create_job and
// destroy_job wait for d's commit first (durable.go); Close closes d.
type ceilingSpalloc struct {
	ln    net.Listener
	d     *durable
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startCeilingSpalloc serves a spalloc ceiling on a loopback port.
func startCeilingSpalloc(d *durable) (*ceilingSpalloc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return serveCeilingSpalloc(ln, d), nil
}

// serveCeilingSpalloc serves the spalloc ceiling on ln.
func serveCeilingSpalloc(ln net.Listener, d *durable) *ceilingSpalloc {
	c := &ceilingSpalloc{ln: ln, d: d, conns: map[net.Conn]struct{}{}}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			c.conns[nc] = struct{}{}
			c.mu.Unlock()
			c.wg.Add(1)
			go c.serve(nc)
		}
	}()
	return c
}

func (c *ceilingSpalloc) serve(nc net.Conn) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		delete(c.conns, nc)
		c.mu.Unlock()
		nc.Close()
	}()
	r := bufio.NewReaderSize(nc, 16<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		var out string
		switch {
		case bytes.Contains(line, []byte(`"create_job"`)):
			out = c.committed(ceilJobID)
		case bytes.Contains(line, []byte(`"get_job_state"`)):
			out = ceilJobState
		case bytes.Contains(line, []byte(`"destroy_job"`)):
			out = c.committed(ceilNull)
		default:
			out = ceilNull
		}
		if _, err := io.WriteString(nc, out); err != nil {
			return
		}
	}
}

// committed is reply once the durable ceiling's commit is done, or the
// protocol's exception if it failed.
func (c *ceilingSpalloc) committed(reply string) string {
	if err := c.d.commit(); err != nil {
		return fmt.Sprintf(`{"exception": %q}`, err.Error()) + "\n"
	}
	return reply
}

// Addr is the ceiling's spalloc address.
func (c *ceilingSpalloc) Addr() string { return c.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for them.
func (c *ceilingSpalloc) Close() error {
	err := c.ln.Close()
	c.mu.Lock()
	for nc := range c.conns {
		nc.Close()
	}
	c.mu.Unlock()
	c.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return errors.Join(err, c.d.Close())
}

// measured is what one run of a workload gives for the comparison: its
// throughput (per second, of the workload's unit), the latency of its
// cycle, and the whole report.
type measured struct {
	Target string  `json:"target"` // "ceiling" or "server"
	Rate   float64 `json:"rate_per_s"`
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	Report any     `json:"report"`
}

// comparison is what --ceiling prints: the runs in the order they ran
// (ceiling and server interleaved), each side's median and range, and the
// ratios of the medians.
type comparison struct {
	Workload string `json:"workload"`
	Unit     string `json:"unit"`
	// DurableCeiling is set when the ceiling synced its changes
	// (--durable-ceiling, durable.go).
	DurableCeiling bool       `json:"durable_ceiling"`
	Runs           []measured `json:"runs"`
	Ceiling        summary    `json:"ceiling"`
	Server         summary    `json:"server"`
	// Ratio is the server's median throughput over the ceiling's; P99Ratio
	// the server's median p99 over the ceiling's.
	Ratio    float64 `json:"ratio"`
	P99Ratio float64 `json:"p99_ratio"`
}

// summary is one side's median and range over its runs.
type summary struct {
	Runs    int     `json:"runs"`
	Rate    float64 `json:"median_rate_per_s"`
	RateMin float64 `json:"min_rate_per_s"`
	RateMax float64 `json:"max_rate_per_s"`
	P50     float64 `json:"median_p50_ms"`
	P99     float64 `json:"median_p99_ms"`
	P99Min  float64 `json:"min_p99_ms"`
	P99Max  float64 `json:"max_p99_ms"`
}

func summarise(runs []measured, target string) summary {
	var rates, p50s, p99s []float64
	for _, m := range runs {
		if m.Target == target {
			rates, p50s, p99s = append(rates, m.Rate), append(p50s, m.P50), append(p99s, m.P99)
		}
	}
	s := summary{Runs: len(rates)}
	if len(rates) == 0 {
		return s
	}
	s.Rate, s.RateMin, s.RateMax = medianRange(rates)
	s.P50, _, _ = medianRange(p50s)
	s.P99, s.P99Min, s.P99Max = medianRange(p99s)
	return s
}

// medianRange returns the median (the mean of the middle two for an even
// count), the least and the greatest of xs, which must not be empty.
func medianRange(xs []float64) (med, lo, hi float64) {
	s := append([]float64(nil), xs...)
	for i := 1; i < len(s); i++ { // insertion sort: a handful of runs
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// compare runs one workload rounds times against the ceiling and the
// server, interleaved (ceiling, server, ceiling, server …) so that both
// see the same machine, and summarises. run is one run against a target
// ("ceiling" or "server"); between runs it pauses a moment so that one
// run's connections are gone before the next starts.
func compare(ctx context.Context, workload, unit string, rounds int, ceiling bool, run func(ctx context.Context, target string) (measured, error)) (comparison, error) {
	cmp := comparison{Workload: workload, Unit: unit}
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		targets := []string{"server"}
		if ceiling {
			targets = []string{"ceiling", "server"}
		}
		for _, tg := range targets {
			if len(cmp.Runs) > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
			m, err := run(ctx, tg)
			if err != nil {
				return cmp, err
			}
			m.Target = tg
			cmp.Runs = append(cmp.Runs, m)
		}
	}
	cmp.Ceiling, cmp.Server = summarise(cmp.Runs, "ceiling"), summarise(cmp.Runs, "server")
	if cmp.Ceiling.Rate > 0 {
		cmp.Ratio = cmp.Server.Rate / cmp.Ceiling.Rate
	}
	if cmp.Ceiling.P99 > 0 {
		cmp.P99Ratio = cmp.Server.P99 / cmp.Ceiling.P99
	}
	return cmp, nil
}

// printComparison writes the runs and the summary for a person.
func printComparison(w io.Writer, c comparison) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\ttarget\t%s/s\tp50\tp99\t\n", c.Unit)
	for i, m := range c.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.3fms\t%.3fms\t\n", i+1, m.Target, m.Rate, m.P50, m.P99)
	}
	for _, side := range []struct {
		name string
		s    summary
	}{{"ceiling", c.Ceiling}, {"server", c.Server}} {
		if side.s.Runs > 0 {
			fmt.Fprintf(tw, "median\t%s\t%.0f (%.0f–%.0f)\t%.3fms\t%.3fms\t\n",
				side.name, side.s.Rate, side.s.RateMin, side.s.RateMax, side.s.P50, side.s.P99)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c.Ceiling.Runs > 0 {
		ceiling := "ceiling"
		if c.DurableCeiling {
			ceiling = "durable ceiling"
		}
		_, err := fmt.Fprintf(w, "server / %s: %.2f of the throughput, %.2f× the p99\n", ceiling, c.Ratio, c.P99Ratio)
		return err
	}
	return nil
}

// roundFlags are the flags every workload shares for repeated and
// compared runs.
type roundFlags struct {
	ceiling    bool
	durable    bool
	durableDir string
	repeat     int
}

func addRoundFlags(fs *flag.FlagSet) *roundFlags {
	rf := &roundFlags{}
	fs.BoolVar(&rf.ceiling, "ceiling", false, "first run the same load against a do-nothing server in this process (fixed replies, same wire format), then against the server, and print both and their ratio")
	fs.BoolVar(&rf.durable, "durable-ceiling", false, "--ceiling, with a do-nothing server that also makes each change durable as arbiter must: one record appended to a batch log and synced per batch of the requests that change state")
	fs.StringVar(&rf.durableDir, "durable-ceiling-dir", "", "where the durable ceiling's log goes (default: the system's temporary directory): a directory on the disk the server writes to")
	fs.IntVar(&rf.repeat, "repeat", 1, "runs of each target; with --ceiling they alternate (ceiling, server, ceiling, server …) and medians and ranges are reported")
	return rf
}

func (rf *roundFlags) check() error {
	if rf.repeat < 1 || rf.repeat > 100 {
		return cli.Usagef("--repeat %d: want 1 to 100", rf.repeat)
	}
	rf.ceiling = rf.ceiling || rf.durable
	return nil
}

// startCeiling starts a ceiling with the log rf asks for (durable with
// --durable-ceiling, else none), which the ceiling's Close closes; if
// start fails, the log is closed here.
func startCeiling[C any](rf *roundFlags, warn io.Writer, start func(*durable) (C, error)) (C, error) {
	d, err := rf.durableLog(warn)
	if err != nil {
		var none C
		return none, err
	}
	c, err := start(d)
	if err != nil {
		d.Close()
	}
	return c, err
}

// durableLog is the durable ceiling's log when --durable-ceiling asks for
// it, else nil (a plain ceiling).
func (rf *roundFlags) durableLog(warn io.Writer) (*durable, error) {
	if !rf.durable {
		return nil, nil
	}
	return openDurable(rf.durableDir, "--durable-ceiling-dir", warn)
}

// openDurable opens a durable ceiling's log under dir (newDurable). A log
// on a RAM disk, whose syncs cost nothing, is used with a warning to warn
// that names dirFlag, the flag that gives it another directory.
func openDurable(dir, dirFlag string, warn io.Writer) (*durable, error) {
	d, err := newDurable(dir)
	if err != nil {
		return nil, err
	}
	if onRAMDisk(d.dir) {
		fmt.Fprintf(warn, "warning: the durable ceiling's log is in %s, on a RAM disk, where a sync costs nothing; pass %s with a directory on the server's disk\n", d.dir, dirFlag)
	}
	return d, nil
}

// runRounds runs a workload as rf asks and prints the result to w: one
// run against the server, printed by print (or as JSON); or, with
// --ceiling or --repeat, the rounds compared, each run summarised by
// measure. run's target is "server" or "ceiling".
func runRounds[R any](ctx context.Context, w io.Writer, asJSON bool, rf *roundFlags, workload, unit string,
	run func(ctx context.Context, target string) (R, error), measure func(R) measured, print func(io.Writer, R) error) error {
	if !rf.ceiling && rf.repeat == 1 {
		rep, err := run(ctx, "server")
		if err != nil {
			return err
		}
		if asJSON {
			return cli.WriteJSON(w, rep)
		}
		return print(w, rep)
	}
	cmp, err := compare(ctx, workload, unit, rf.repeat, rf.ceiling, func(ctx context.Context, target string) (measured, error) {
		rep, err := run(ctx, target)
		return measure(rep), err
	})
	if err != nil {
		return err
	}
	cmp.DurableCeiling = rf.durable
	if asJSON {
		return cli.WriteJSON(w, cmp)
	}
	return printComparison(w, cmp)
}

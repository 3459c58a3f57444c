package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter/cli"
)

// benchSpallocReport is what bench spalloc prints (-o json prints it as is).
type benchSpallocReport struct {
	Addr        string                `json:"addr"`
	Conns       int                   `json:"conns"`
	Args        []int                 `json:"args"`
	DurationS   float64               `json:"duration_s"` // measured time, without warmup
	Cycles      int                   `json:"cycles"`
	CyclesPerS  float64               `json:"cycles_per_s"`
	Polls       int                   `json:"polls"` // get_job_state calls in measured cycles
	Errors      int                   `json:"errors"`
	ErrorSample []string              `json:"error_samples"`
	Latency     map[string]benchStats `json:"latency"` // "cycle", "create", "state", "destroy"
}

type benchSpallocSamples struct {
	cycle, create, state, destroy []time.Duration
	polls, errors                 int
	errs                          map[string]bool
	leftover                      []int64
}

// benchSpalloc opens N spalloc protocol connections, each running
// create_job → get_job_state until ready → destroy_job cycles, as a spalloc
// client does, and reports throughput and latencies. It speaks raw JSON
// lines, so the server's path is measured, not a client library's.
func benchSpalloc(ctx context.Context, env *cli.Env, args []string) error {
	fs := flag.NewFlagSet("arbiter bench spalloc", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	addr := fs.String("addr", "127.0.0.1:22244", "the spalloc listener (server.spalloc_listen)")
	conns := fs.Int("conns", 16, "concurrent protocol connections")
	duration := fs.Duration("duration", 10*time.Second, "how long to measure")
	warmup := fs.Duration("warmup", time.Second, "how long to run before measuring")
	jobArgs := fs.String("args", "", `create_job's positional arguments, e.g. "2" (boards) or "1,1" (a triad); "" = one board`)
	machine := fs.String("machine", "", "the machine to use (default: by the default tag)")
	output := fs.String("o", "", `output: "json" for one JSON document`)
	rf := addRoundFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter bench spalloc [flags]\n\nEach connection runs create_job → get_job_state until ready → destroy_job\ncycles against a server's spalloc listener. Run the server with power_delay_s = 0\nand [spalloc] seconds_before_free = 0 to measure the protocol and engine alone.\n\n")
		fs.PrintDefaults()
	}
	pos, err := cli.ParseFlags(env, fs, args, false)
	if err != nil {
		return cli.HelpOK(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q; arbiter bench spalloc takes only flags", pos[0])
	}
	var nums []int
	if *jobArgs != "" {
		for _, f := range strings.Split(*jobArgs, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return cli.Usagef("--args %q: want up to three integers separated by commas", *jobArgs)
			}
			nums = append(nums, n)
		}
	}
	switch {
	case fs.NArg() > 0:
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	case *conns < 1 || *conns > 4096:
		return cli.Usagef("--conns %d: want 1 to 4096", *conns)
	case *duration <= 0 || *duration > time.Hour:
		return cli.Usagef("--duration %s: want more than 0 and at most 1h", *duration)
	case *warmup < 0 || *warmup > time.Hour:
		return cli.Usagef("--warmup %s: want 0 to 1h", *warmup)
	case len(nums) > 3:
		return cli.Usagef("--args %q: at most three numbers", *jobArgs)
	case *output != "" && *output != "json":
		return cli.Usagef("-o %q: want json", *output)
	}
	if err := rf.check(); err != nil {
		return err
	}
	host, _ := os.Hostname()
	kw := `"keepalive": 60.0`
	if *machine != "" {
		kw += `, "machine": ` + strconv.Quote(*machine)
	}
	argList := "[]"
	if len(nums) > 0 {
		argList = "[" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(nums)), ", "), "[]") + "]"
	}
	load := spallocLoad{conns: *conns, duration: *duration, warmup: *warmup, nums: nums,
		create: func(i int) string {
			return fmt.Sprintf(`{"command": "create_job", "args": %s, "kwargs": {"owner": "bench-%d@%s", %s}}`+"\n", argList, i, host, kw)
		}}
	var ceil *ceilingSpalloc
	if rf.ceiling {
		if ceil, err = startCeiling(rf, env.Stderr, startCeilingSpalloc); err != nil {
			return fmt.Errorf("start the ceiling server: %w", err)
		}
		defer ceil.Close()
	}
	runOne := func(ctx context.Context, target string) (benchSpallocReport, error) {
		a := *addr
		if target == "ceiling" {
			a = ceil.Addr()
		}
		return load.run(ctx, a, env.Stderr)
	}
	return runRounds(ctx, env.Stdout, *output == "json", rf, "spalloc", "cycles", runOne, func(rep benchSpallocReport) measured {
		c := rep.Latency["cycle"]
		return measured{Rate: rep.CyclesPerS, P50: c.P50, P99: c.P99, Report: rep}
	}, printBenchSpalloc)
}

// spallocLoad is one bench spalloc run's shape; create is connection i's
// create_job line.
type spallocLoad struct {
	conns            int
	duration, warmup time.Duration
	nums             []int
	create           func(i int) string
}

// run loads the spalloc listener at addr and reports what it measured;
// jobs it could not destroy are named on warn.
func (l spallocLoad) run(ctx context.Context, addr string, warn io.Writer) (benchSpallocReport, error) {
	start := time.Now()
	measureFrom := start.Add(l.warmup)
	stopAt := measureFrom.Add(l.duration)
	samples := make([]benchSpallocSamples, l.conns)
	var wg sync.WaitGroup
	var dialErr error
	var once sync.Once
	for i := range l.conns {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return benchSpallocReport{}, fmt.Errorf("connect to the spalloc listener %s: %w", addr, err)
		}
		defer c.Close()
		create := l.create(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := benchSpallocConn(ctx, c, create, measureFrom, stopAt, 0)
			if err != nil {
				once.Do(func() { dialErr = err })
			}
			samples[i] = s
		}()
	}
	wg.Wait()
	if dialErr != nil {
		return benchSpallocReport{}, dialErr
	}
	end := time.Now()
	if end.After(stopAt) {
		end = stopAt
	}
	rep := benchSpallocSummarise(samples, end.Sub(measureFrom))
	rep.Addr, rep.Conns, rep.Args = addr, l.conns, l.nums
	if rep.Args == nil {
		rep.Args = []int{}
	}
	var leftover []int64
	for _, s := range samples {
		leftover = append(leftover, s.leftover...)
	}
	if len(leftover) > 0 {
		fmt.Fprintf(warn, "warning: %d jobs could not be destroyed (ids %v)\n", len(leftover), leftover)
	}
	return rep, nil
}

// SpallocCycles runs n create_job → get_job_state until ready → destroy_job
// cycles on c, creating each job with the request line create, for a Go
// benchmark that starts its own server. Errors: the connection failed, or
// a cycle did (a job that ended before it was ready, an error answer).
func SpallocCycles(ctx context.Context, c net.Conn, create string, n int) error {
	s, err := benchSpallocConn(ctx, c, create, time.Time{}, time.Now().Add(24*time.Hour), n)
	if err != nil {
		return err
	}
	if s.errors > 0 {
		return fmt.Errorf("%d of %d spalloc cycles failed: %v", s.errors, n, s.errs)
	}
	return nil
}

// benchSpallocConn runs cycles on one connection until stopAt (or, with
// limit > 0, that many cycles). An error is returned only when the
// connection itself fails; a job that ends before it is ready counts as an
// error of its cycle.
func benchSpallocConn(ctx context.Context, c net.Conn, create string, measureFrom, stopAt time.Time, limit int) (benchSpallocSamples, error) {
	s := benchSpallocSamples{errs: map[string]bool{}}
	r := bufio.NewReaderSize(c, 16<<10)
	buf := make([]byte, 0, 128)
	// call sends one request line and returns the "return" value's bytes.
	call := func(req []byte) ([]byte, error) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(req); err != nil {
			return nil, err
		}
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return nil, err
			}
			if v, ok := bytes.CutPrefix(line, []byte(`{"return": `)); ok {
				return bytes.TrimSuffix(bytes.TrimSpace(v), []byte("}")), nil
			}
			if bytes.HasPrefix(line, []byte(`{"exception": `)) {
				return nil, fmt.Errorf("server: %s", bytes.TrimSpace(line))
			}
			// A notification: not asked for, ignored.
		}
	}
	fail := func(err error) {
		s.errors++
		if len(s.errs) < 5 {
			s.errs[err.Error()] = true
		}
	}
	for n := 0; ctx.Err() == nil && (limit <= 0 || n < limit); n++ {
		t0 := time.Now()
		if !t0.Before(stopAt) {
			break
		}
		measure := !t0.Before(measureFrom)
		v, err := call([]byte(create))
		if err != nil {
			return s, err
		}
		id, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return s, fmt.Errorf("create_job returned %q", v)
		}
		t1 := time.Now()
		var states []time.Duration
		buf = fmt.Appendf(buf[:0], `{"command": "get_job_state", "args": [%d], "kwargs": {}}`+"\n", id)
		ready := false
		for !ready {
			ts := time.Now()
			v, err := call(buf)
			if err != nil {
				return s, err
			}
			states = append(states, time.Since(ts))
			st, ok := benchJobState(v)
			switch {
			case !ok:
				return s, fmt.Errorf("get_job_state returned %q", v)
			case st == 3:
				ready = true
			case st == 4 || st == 0:
				ready = true
				if measure {
					fail(fmt.Errorf("job ended before it was ready: %s", v))
				}
			}
		}
		t2 := time.Now()
		buf = fmt.Appendf(buf[:0], `{"command": "destroy_job", "args": [%d, "bench"], "kwargs": {}}`+"\n", id)
		if _, err := call(buf); err != nil {
			s.leftover = append(s.leftover, id)
			return s, err
		}
		t3 := time.Now()
		if !measure {
			continue
		}
		s.create = append(s.create, t1.Sub(t0))
		s.state = append(s.state, states...)
		s.polls += len(states)
		s.destroy = append(s.destroy, t3.Sub(t2))
		s.cycle = append(s.cycle, t3.Sub(t0))
	}
	return s, nil
}

// benchJobState reads "state" out of a get_job_state answer.
func benchJobState(v []byte) (int, bool) {
	_, rest, ok := bytes.Cut(v, []byte(`"state": `))
	if !ok || len(rest) == 0 {
		return 0, false
	}
	return int(rest[0] - '0'), rest[0] >= '0' && rest[0] <= '4'
}

func benchSpallocSummarise(samples []benchSpallocSamples, measured time.Duration) benchSpallocReport {
	var cycle, create, state, destroy []time.Duration
	rep := benchSpallocReport{ErrorSample: []string{}}
	var errs []map[string]bool
	for _, s := range samples {
		cycle = append(cycle, s.cycle...)
		create = append(create, s.create...)
		state = append(state, s.state...)
		destroy = append(destroy, s.destroy...)
		rep.Polls += s.polls
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
		"cycle": benchStatsOf(cycle), "create": benchStatsOf(create),
		"state": benchStatsOf(state), "destroy": benchStatsOf(destroy),
	}
	return rep
}

func printBenchSpalloc(w io.Writer, r benchSpallocReport) error {
	perCycle := 0.0
	if r.Cycles > 0 {
		perCycle = float64(r.Polls) / float64(r.Cycles)
	}
	fmt.Fprintf(w, "%d cycles in %.1fs with %d connections: %.1f cycles/s (%.2f get_job_state per cycle), %d errors\n",
		r.Cycles, r.DurationS, r.Conns, r.CyclesPerS, perCycle, r.Errors)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency\tcount\tp50\tp90\tp99\tmax\t")
	for _, k := range []string{"cycle", "create", "state", "destroy"} {
		s := r.Latency[k]
		fmt.Fprintf(tw, "%s\t%d\t%.3fms\t%.3fms\t%.3fms\t%.3fms\t\n", k, s.Count, s.P50, s.P90, s.P99, s.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range r.ErrorSample {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
)

// benchTasksReport is what bench tasks prints (-o json prints it as is).
type benchTasksReport struct {
	URL         string                `json:"url"`
	Tasks       int                   `json:"tasks"`
	Workers     int                   `json:"workers"`
	Completed   int                   `json:"completed"`
	DurationS   float64               `json:"duration_s"`
	TasksPerS   float64               `json:"tasks_per_s"`
	RequestsPS  float64               `json:"requests_per_s"`
	Errors      int                   `json:"errors"`
	ErrorSample []string              `json:"error_samples"`
	Latency     map[string]benchStats `json:"latency"` // claim, heartbeat, upload, complete; task: all four
}

// benchTasks writes a manifest of N no-op tasks to the file the server
// reads its manifest from, has the server reload it, and runs M simulated
// fleet workers over HTTP, each looping claim → heartbeat → upload a tiny
// artifact → complete through the /v1 API until the queue is empty.
func benchTasks(ctx context.Context, env *cli.Env, args []string) error {
	fs, cf := cli.NewClientFlags(env, "bench tasks", "")
	path := fs.String("manifest", "", "the server's manifest file ([tasks] manifest): the bench overwrites it (required)")
	n := fs.Int("tasks", 10000, "no-op tasks to run")
	m := fs.Int("workers", 64, "simulated workers")
	payload := fs.Int("payload", 256, "bytes of each task's artifact")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	rf := addRoundFlags(fs)
	pos, err := cli.ParseFlags(env, fs, args, true)
	if err != nil {
		return cli.HelpOK(err)
	}
	switch {
	case len(pos) > 0:
		return cli.Usagef("unexpected argument %q", pos[0])
	case *path == "":
		return cli.Usagef("--manifest: name the server's manifest file (a scratch one: the bench overwrites it)")
	case *n < 1 || *n > 100000:
		return cli.Usagef("--tasks %d: want 1 to 100000", *n)
	case *m < 1 || *m > 4096:
		return cli.Usagef("--workers %d: want 1 to 4096", *m)
	case *payload < 1 || *payload > 1<<20:
		return cli.Usagef("--payload %d: want 1 to 1048576 bytes", *payload)
	}
	if err := rf.check(); err != nil {
		return err
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var ceil *ceilingHTTP
	if rf.ceiling {
		if ceil, err = startCeiling(rf, env.Stderr, startCeilingHTTP); err != nil {
			return fmt.Errorf("start the ceiling server: %w", err)
		}
		defer ceil.Close()
	}
	load := tasksLoad{tasks: *n, workers: *m, payload: *payload}
	runOne := func(ctx context.Context, target string) (benchTasksReport, error) {
		url, token := cf.URL(), cf.Token()
		if target == "ceiling" {
			ceil.tasks.Store(int64(*n))
			url, token = ceil.URL(), ""
		} else if err := load.queue(ctx, env, cf, *path); err != nil {
			return benchTasksReport{}, err
		}
		rep := load.run(ctx, url, token)
		if ctx.Err() != nil {
			fmt.Fprintln(env.Stderr, "stopped early (interrupted or --timeout): reporting what was measured")
		}
		return rep, nil
	}
	return runRounds(ctx, env.Stdout, cf.JSON(), rf, "tasks", "tasks", runOne, func(rep benchTasksReport) measured {
		c := rep.Latency["task"]
		return measured{Rate: rep.TasksPerS, P50: c.P50, P99: c.P99, Report: rep}
	}, printBenchTasks)
}

// tasksLoad is one bench tasks run's shape.
type tasksLoad struct {
	tasks, workers, payload int
}

// queue writes a manifest of the run's no-op tasks to the file the server
// reads its manifest from and has the server reload it. Each run's tasks
// are new: the run's start time is in their identity.
func (l tasksLoad) queue(ctx context.Context, env *cli.Env, cf *cli.ClientFlags, path string) error {
	run := time.Now().UTC().Format("20060102T150405.000")
	run = strings.ReplaceAll(run, ".", "_")
	var b strings.Builder
	fmt.Fprintf(&b, "name = \"bench %s\"\n[defaults]\ncommand = [\"true\"]\nmax_attempts = 1\nstale_after_s = 600\n", run)
	for i := 0; i < l.tasks; i++ {
		fmt.Fprintf(&b, "[[jobs]]\nmodel = \"bench\"\nmode = \"r%s\"\nseed = %d\n", run, i)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o640); err != nil {
		return fmt.Errorf("write the manifest: %w", err)
	}
	c := client.New(cf.URL(), cf.Token())
	var err error
	if op := env.Getenv("ARBITER_OPERATOR_TOKEN"); op != "" {
		_, err = c.FleetOperator(ctx, "reload", "", op)
	} else {
		_, err = c.ReloadTasks(ctx)
	}
	if err != nil {
		return fmt.Errorf("reload the manifest (is the server's [tasks] manifest %s?): %w", path, err)
	}
	return nil
}

// run has the workers drain the queue of the server at url (calling with
// token, when one is given) and reports what they measured.
func (l tasksLoad) run(ctx context.Context, url, token string) benchTasksReport {
	hc := benchHTTPClient(l.workers)
	defer hc.CloseIdleConnections()
	start := time.Now()
	samples := make([]benchTaskSamples, l.workers)
	var wg sync.WaitGroup
	for i := range l.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &benchWorker{hc: hc, base: url, token: token, host: fmt.Sprintf("bench-w%d", i), payload: l.payload, s: &samples[i]}
			w.s.errs = map[string]bool{}
			w.run(ctx)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	rep := benchTasksReport{URL: url, Tasks: l.tasks, Workers: l.workers, DurationS: elapsed.Seconds(), ErrorSample: []string{}}
	lat := map[string][]time.Duration{}
	var errs []map[string]bool
	for _, s := range samples {
		rep.Completed += s.completed
		rep.Errors += s.errors
		for k, v := range map[string][]time.Duration{"claim": s.claim, "heartbeat": s.beat, "upload": s.upload, "complete": s.complete} {
			lat[k] = append(lat[k], v...)
		}
		errs = append(errs, s.errs)
	}
	rep.ErrorSample = errorSample(errs)
	rep.Latency = map[string]benchStats{}
	requests := 0
	for k, v := range lat {
		rep.Latency[k] = benchStatsOf(v)
		requests += len(v)
	}
	var task []time.Duration
	for _, s := range samples {
		task = append(task, s.task...)
	}
	rep.Latency["task"] = benchStatsOf(task)
	if elapsed > 0 {
		rep.TasksPerS = float64(rep.Completed) / elapsed.Seconds()
		rep.RequestsPS = float64(requests) / elapsed.Seconds()
	}
	return rep
}

func printBenchTasks(w io.Writer, rep benchTasksReport) error {
	fmt.Fprintf(w, "%d of %d tasks in %.2fs with %d workers: %.0f tasks/s (%.0f requests/s), %d errors\n",
		rep.Completed, rep.Tasks, rep.DurationS, rep.Workers, rep.TasksPerS, rep.RequestsPS, rep.Errors)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "latency\tcount\tp50\tp90\tp99\tmax\t")
	for _, k := range []string{"claim", "heartbeat", "upload", "complete", "task"} {
		s := rep.Latency[k]
		fmt.Fprintf(tw, "%s\t%d\t%.2fms\t%.2fms\t%.2fms\t%.2fms\t\n", k, s.Count, s.P50, s.P90, s.P99, s.Max)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, e := range rep.ErrorSample {
		fmt.Fprintf(w, "error: %s\n", e)
	}
	return nil
}

type benchTaskSamples struct {
	claim, beat, upload, complete []time.Duration
	task                          []time.Duration // claim sent to completion answered
	completed, errors             int
	errs                          map[string]bool
}

// benchWorker is one simulated fleet worker speaking /v1.
type benchWorker struct {
	hc      *http.Client
	base    string
	token   string // the bearer token, if any
	host    string
	payload int
	s       *benchTaskSamples
}

func (w *benchWorker) fail(err error) {
	w.s.errors++
	if len(w.s.errs) < 5 {
		w.s.errs[err.Error()] = true
	}
}

// call sends one request and returns the status and body.
func (w *benchWorker) call(ctx context.Context, method, path string, hdr map[string]string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, w.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Lab-Host", w.host)
	if w.token != "" {
		// A server with tokens takes /v1 workers with an agent token.
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (w *benchWorker) run(ctx context.Context) {
	capability := []byte(`{"capability": {"hostname": "` + w.host + `", "cores": 1, "ram_gib": 1, "cuda": false}}`)
	jsonHdr := map[string]string{"Content-Type": "application/json"}
	for ctx.Err() == nil {
		t0 := time.Now()
		code, body, err := w.call(ctx, http.MethodPost, "/v1/job/claim", jsonHdr, capability)
		if err != nil || code != http.StatusOK {
			w.fail(benchErr("claim", code, body, err))
			return
		}
		w.s.claim = append(w.s.claim, time.Since(t0))
		var job struct {
			JobID string `json:"job_id"`
		}
		if err := json.Unmarshal(body, &job); err != nil || job.JobID == "" {
			return // {"job": null}: the queue is empty
		}
		t1 := time.Now()
		code, body, err = w.call(ctx, http.MethodPost, "/v1/job/"+job.JobID+"/heartbeat", nil, nil)
		if err != nil || code != http.StatusOK {
			w.fail(benchErr("heartbeat", code, body, err))
			continue
		}
		w.s.beat = append(w.s.beat, time.Since(t1))
		art := bytes.Repeat([]byte("bench "+job.JobID+"\n"), w.payload/72+1)[:w.payload]
		sum := sha256.Sum256(art)
		sha := hex.EncodeToString(sum[:])
		t2 := time.Now()
		code, body, err = w.call(ctx, http.MethodPut, "/v1/model/"+job.JobID, map[string]string{"X-Content-SHA256": sha}, art)
		if err != nil || (code != http.StatusCreated && code != http.StatusOK) {
			w.fail(benchErr("upload", code, body, err))
			continue
		}
		w.s.upload = append(w.s.upload, time.Since(t2))
		t3 := time.Now()
		code, body, err = w.call(ctx, http.MethodPost, "/v1/job/"+job.JobID+"/complete", jsonHdr, []byte(`{"artifact_id": "`+sha+`"}`))
		if err != nil || code != http.StatusOK {
			w.fail(benchErr("complete", code, body, err))
			continue
		}
		w.s.complete = append(w.s.complete, time.Since(t3))
		w.s.task = append(w.s.task, time.Since(t0))
		w.s.completed++
	}
}

func benchErr(what string, code int, body []byte, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %d %s", what, code, strings.TrimSpace(string(body)))
}

package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/procgroup"
)

// SwapServer is what the swap runner needs of the server; *client.Client
// implements it. When Config.Server implements it too, Run carries out the
// swaps of services on this machine (docs/reference/coordination.md §2).
type SwapServer interface {
	// ClaimSwap takes this machine's next swap, waiting up to wait; nil
	// when there is none.
	ClaimSwap(ctx context.Context, machine string, wait time.Duration) (*arbiter.Swap, error)
	// AppendSwapLog sends output lines of the running swap.
	AppendSwapLog(ctx context.Context, id, machine string, lines []string) error
	// FinishSwap reports the swap's end.
	FinishSwap(ctx context.Context, id string, r client.SwapResult) (arbiter.Swap, error)
}

// Timings of the swap runner.
const (
	swapClaimWait     = 30 * time.Second       // one long-poll for work
	swapLogFlush      = 200 * time.Millisecond // output is sent at least this often
	swapLogBatch      = 200                    // or when this many lines wait
	swapEndpointPoll  = 500 * time.Millisecond // between endpoint checks
	swapEndpointCall  = 5 * time.Second        // one endpoint check
	swapKillGrace     = 5 * time.Second        // after SIGTERM, before SIGKILL
	swapReportTimeout = 10 * time.Second       // reporting the end when the agent stops
	swapFinishRetry   = 2 * time.Minute        // how long a failing report of the end is retried
)

// startSwaps starts the swap runner beside the heartbeat loop when the
// server supports swaps, and returns a function that stops it and waits.
func (a *agent) startSwaps(ctx context.Context) (stop func()) {
	srv, ok := a.cfg.Server.(SwapServer)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &swapRunner{
		srv: srv, machine: a.machine.Name, log: a.log,
		minBackoff: a.cfg.MinBackoff, maxBackoff: a.cfg.MaxBackoff, callTimeout: a.cfg.CallTimeout,
		http: probeClient(swapEndpointCall),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// probeClient is the client of endpoint checks. It follows no redirect: an
// endpoint that sends the probe elsewhere does not itself serve the model.
func probeClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// swapRunner claims this machine's swaps one at a time and carries them out.
type swapRunner struct {
	srv                    SwapServer
	machine                string
	log                    *slog.Logger
	minBackoff, maxBackoff time.Duration
	callTimeout            time.Duration
	http                   *http.Client
	// dir holds each swap's output directory; "" is the system's
	// temporary directory.
	dir string
	// killGrace is how long a stopped command's process group has after
	// SIGTERM before SIGKILL (0: swapKillGrace).
	killGrace time.Duration

	mu      sync.Mutex
	outDirs map[string]string // per service, the output directory of its last swap

	// Of the run goroutine only. left is the group of the running swap's
	// command while something of it runs after the command exited (a
	// launched server), for stopLeftovers; unreported are the ends of
	// swaps the server could not be told of, reported again, not run
	// again, when a claim hands one back.
	left       *exec.Cmd
	unreported map[string]client.SwapResult
}

func (r *swapRunner) run(ctx context.Context) {
	backoff := r.minBackoff
	// retry logs what failed and waits, longer each time; false when the
	// agent stops meanwhile.
	retry := func(msg string, args ...any) bool {
		r.log.Warn(msg, append(args, "retry_in", backoff)...)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, r.maxBackoff)
		return true
	}
	for ctx.Err() == nil {
		sw, err := r.srv.ClaimSwap(ctx, r.machine, swapClaimWait)
		if err != nil {
			// Unknown machine, credentials, a server down: the heartbeat
			// loop reports what is fatal; here we only wait and retry.
			if ctx.Err() != nil || !retry("claiming swaps failed; retrying", "machine", r.machine, "err", err) {
				return
			}
			continue
		}
		if sw == nil {
			backoff = r.minBackoff
			continue
		}
		if res, ok := r.unreported[sw.ID]; ok {
			// Its end was not reported, and this process's claim hands it
			// back: report it again rather than run it again.
			err := r.finish(ctx, sw.ID, res)
			if code := arbiter.ErrorCode(err); err == nil || code == arbiter.EConflict || code == arbiter.ENotFound {
				delete(r.unreported, sw.ID) // told, or nothing left to tell
			} else if !retry("reporting the end of a swap again failed; retrying", "swap", sw.ID, "err", err) {
				return
			}
			continue
		}
		backoff = r.minBackoff
		r.runSwap(ctx, sw)
	}
}

// runSwap carries out one swap and reports its end.
func (r *swapRunner) runSwap(ctx context.Context, sw *arbiter.Swap) {
	log := r.log.With("swap", sw.ID, "service", sw.Service, "model", sw.ModelKey)
	log.Info("swap starting", "command", sw.Command)
	// sctx ends, besides with the agent, when the server answers that the
	// swap is no longer running (timed out, failed): what it runs stops.
	sctx, ended := context.WithCancelCause(ctx)
	defer ended(nil)
	r.left = nil
	out := r.newLogSender(sw.ID, ended)
	res := r.execute(sctx, sw, out)
	out.close()
	if cause := context.Cause(sctx); errors.Is(cause, errSwapEnded) {
		// Perhaps learnt only from the last lines' answer, after the
		// command and the endpoint check: what it launched goes too.
		r.stopLeftovers(nil)
		log.Warn("the server had ended the swap; what it ran was stopped", "reason", cause)
		return
	}
	if ctx.Err() != nil && res.Reason == "" {
		res.OK, res.Reason = false, "the agent stopped during the swap"
	}
	res.Machine = r.machine
	res.Reason = arbiter.EscapeText(res.Reason, true) // it may quote the command's output
	if err := r.finish(ctx, sw.ID, res); err != nil {
		if code := arbiter.ErrorCode(err); code != arbiter.EConflict && code != arbiter.ENotFound {
			if r.unreported == nil {
				r.unreported = map[string]client.SwapResult{}
			}
			if len(r.unreported) >= 16 { // a server gone for hours: keep the newest
				clear(r.unreported)
			}
			r.unreported[sw.ID] = res
		}
		log.Error("could not report the end of the swap; it is reported again if the server hands it back, else the server fails it at its timeout", "err", err)
		return
	}
	if res.OK {
		log.Info("swap complete")
	} else {
		log.Warn("swap failed", "reason", res.Reason)
	}
}

// finish reports a swap's end, even when the agent is stopping: retried
// while the server is unreachable or failing (5xx), up to swapFinishRetry
// (swapReportTimeout when stopping), since the next claim would fail a
// swap still running here as if this agent had restarted.
func (r *swapRunner) finish(ctx context.Context, id string, res client.SwapResult) error {
	giveUp := time.Now().Add(swapFinishRetry)
	backoff := r.minBackoff
	for {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), swapReportTimeout)
		_, err := r.srv.FinishSwap(rctx, id, res)
		cancel()
		if err == nil {
			return nil
		}
		if !retryable(err) {
			return err // the server's answer: no retry changes it
		}
		if stopping := time.Now().Add(swapReportTimeout); ctx.Err() != nil && stopping.Before(giveUp) {
			giveUp = stopping
		}
		if time.Now().Add(backoff).After(giveUp) {
			return err
		}
		r.log.Warn("reporting the end of a swap failed; retrying", "swap", id, "err", err, "retry_in", backoff)
		time.Sleep(backoff) // not cut short by ctx: the end is reported even when the agent stops
		backoff = min(2*backoff, r.maxBackoff)
	}
}

// execute checks the local path, runs the command and checks the endpoint.
func (r *swapRunner) execute(ctx context.Context, sw *arbiter.Swap, out *logSender) client.SwapResult {
	if len(sw.Command) == 0 {
		return client.SwapResult{Reason: "the swap has no command"}
	}
	out.add(fmt.Sprintf("arbiter agent on %s: swap %s of %s to %s", r.machine, sw.ID, sw.Service, sw.ModelKey))
	if sw.LocalPath != "" {
		if err := checkLocalDir(sw.LocalPath, sw.LocalRoots); err != nil {
			out.add("arbiter agent: " + err.Error())
			return client.SwapResult{Reason: err.Error()}
		}
	}
	out.add("arbiter agent: running " + strings.Join(sw.Command, " "))
	// The whole swap, command and endpoint, within what was left of its
	// timeout when it was claimed: the server counts it from the request.
	left := swapTimeLeft(sw)
	deadline := time.Now().Add(left)
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rc, ended, cmd, err := r.runCommand(cctx, sw, out)
	if cmd != nil && procgroup.Running(cmd) {
		// Looked at now, not later: once the group is empty its id may
		// be another's after a long endpoint wait.
		r.left = cmd
	}
	switch {
	case ctx.Err() != nil:
		return client.SwapResult{ReturnCode: rc, Reason: stoppedWhy(ctx) + "; the command was stopped"}
	case cctx.Err() != nil:
		return client.SwapResult{ReturnCode: rc, Reason: fmt.Sprintf("the swap command did not finish within the %s left of the swap's timeout and was stopped", left.Round(time.Second))}
	case err != nil:
		return client.SwapResult{Reason: err.Error()}
	case *rc != 0:
		how := fmt.Sprintf("exited with status %d", *rc)
		if *rc < 0 { // killed by a signal: ProcessState says which
			how = "ended by " + ended
		}
		out.add("arbiter agent: the swap command " + how)
		r.stopLeftovers(out)
		return client.SwapResult{ReturnCode: rc, Reason: "the swap command " + how}
	}
	out.add("arbiter agent: the swap command exited with status 0")
	if why := r.checkEndpoint(ctx, sw, deadline, out); why != "" {
		out.add("arbiter agent: " + why)
		if ctx.Err() == nil || errors.Is(context.Cause(ctx), errSwapEnded) {
			// Not the agent stopping: what the command started in the
			// background serves nothing arbiter records, and holds GPUs.
			r.stopLeftovers(out)
		}
		return client.SwapResult{ReturnCode: rc, Reason: why}
	}
	return client.SwapResult{ReturnCode: rc, OK: true}
}

// retryable reports whether a report's error may go with a retry: the
// server could not be reached, or failed (5xx); not its answer.
func retryable(err error) bool {
	code := arbiter.ErrorCode(err)
	return code == arbiter.EUnavailable || code == arbiter.EInternal
}

// errSwapEnded is the cause of a swap's context when the server answered
// that the swap is no longer running.
var errSwapEnded = errors.New("the server ended the swap")

// stoppedWhy says why a swap's context ended: the agent stopping, or the
// server having ended the swap.
func stoppedWhy(ctx context.Context) string {
	if cause := context.Cause(ctx); errors.Is(cause, errSwapEnded) {
		return cause.Error()
	}
	return "the agent stopped during the swap"
}

// swapTimeLeft is what was left of a swap's timeout (swap_timeout_s from
// its request, default an hour) when it was claimed, both times the
// server's: no clock of this host's is compared with them.
func swapTimeLeft(sw *arbiter.Swap) time.Duration {
	total := time.Duration(sw.TimeoutS * float64(time.Second))
	if total <= 0 {
		total = time.Hour
	}
	if sw.StartedAt != nil && !sw.CreatedAt.IsZero() && sw.StartedAt.After(sw.CreatedAt) {
		total -= sw.StartedAt.Sub(sw.CreatedAt)
	}
	return max(total, time.Second)
}

// stopLeftovers stops what a failed swap's command left running in its
// process group (a launch script's server started in the background), and
// says so in out when there is one.
func (r *swapRunner) stopLeftovers(out *logSender) {
	cmd := r.left
	r.left = nil
	if cmd == nil {
		return
	}
	grace := r.killGrace
	if grace <= 0 {
		grace = swapKillGrace
	}
	if procgroup.Stop(cmd, grace) {
		if out != nil {
			out.add("arbiter agent: stopped what the swap command left running")
		} else {
			r.log.Info("stopped what the swap command left running")
		}
	}
}

// childEnv is the environment of a swap command or a task: the agent's,
// without the credentials it was given (ARBITER_TOKEN …), which the
// command — and what it runs: a model's remote code — has no business
// with and might print in its log, which everyone may read.
func childEnv(extra ...string) []string {
	env := os.Environ()
	out := make([]string, 0, len(env)+len(extra))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		u := strings.ToUpper(name)
		if strings.HasPrefix(u, "ARBITER_") && (strings.Contains(u, "TOKEN") || strings.Contains(u, "SECRET") || strings.Contains(u, "PASSWORD")) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// runCommand runs the swap's argv (never through a shell) and returns its
// exit status; its output, stdout and stderr together, goes to out line by
// line. The output goes through a file, not a pipe: a launch script that
// leaves a server running in the background (nohup vllm serve … &) must
// not see its output pipe closed (SIGPIPE) or full (blocked) once the
// script has exited; that server keeps writing to the file, in a private
// directory the next swap of the service removes. It returns the exit
// status (-1 for a signal) and how the command ended ("signal: killed").
// Errors: the command could not start.
func (r *swapRunner) runCommand(ctx context.Context, sw *arbiter.Swap, out *logSender) (*int, string, *exec.Cmd, error) {
	dir, err := os.MkdirTemp(r.dir, "arbiter-swap-"+sw.Service+"-")
	if err != nil {
		return nil, "", nil, fmt.Errorf("cannot create the output file of the swap command: %v", err)
	}
	r.mu.Lock()
	if r.outDirs == nil {
		r.outDirs = map[string]string{}
	}
	if prev := r.outDirs[sw.Service]; prev != "" {
		_ = os.RemoveAll(prev)
	}
	r.outDirs[sw.Service] = dir
	r.mu.Unlock()
	path := filepath.Join(dir, "output.log")
	w, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", nil, fmt.Errorf("cannot create the output file of the swap command: %v", err)
	}
	rd, err := os.Open(path)
	if err != nil {
		w.Close()
		return nil, "", nil, fmt.Errorf("cannot read the output file of the swap command: %v", err)
	}
	defer rd.Close()
	out.add("arbiter agent: output also in " + path)
	cmd := exec.CommandContext(ctx, sw.Command[0], sw.Command[1:]...)
	cmd.Env = childEnv("ARBITER_SWAP_ID="+sw.ID, "ARBITER_SERVICE="+sw.Service, "ARBITER_MODEL_KEY="+sw.ModelKey)
	cmd.Stdout, cmd.Stderr = w, w
	grace := r.killGrace
	if grace <= 0 {
		grace = swapKillGrace
	}
	// Its own process group, stopped whole on cancellation, so that a
	// launch script's children stop with it.
	reap := procgroup.StopOnCancel(cmd, grace)
	err = cmd.Start()
	w.Close() // the command has its own copy
	if err != nil {
		return nil, "", nil, fmt.Errorf("cannot start the swap command %s: %v", sw.Command[0], err)
	}
	exited := make(chan struct{})
	lines := make(chan struct{})
	go func() {
		defer close(lines)
		readLines(&followReader{f: rd, exited: exited}, out.add)
	}()
	err = cmd.Wait()
	reap()
	close(exited)
	<-lines
	rc, ended := -1, ""
	if cmd.ProcessState != nil {
		rc, ended = cmd.ProcessState.ExitCode(), cmd.ProcessState.String()
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) && !errors.Is(err, exec.ErrWaitDelay) && ctx.Err() == nil {
		return &rc, ended, cmd, fmt.Errorf("the swap command failed: %v", err)
	}
	return &rc, ended, cmd, nil
}

// followReader reads a file that a running command appends to: at its end
// it waits for more until exited is closed, then ends at the next end of
// file (what a process left running writes later is not the swap's).
type followReader struct {
	f      *os.File
	exited chan struct{}
	done   bool
}

func (fr *followReader) Read(p []byte) (int, error) {
	for {
		n, err := fr.f.Read(p)
		if n > 0 || err != io.EOF {
			return n, err
		}
		if fr.done {
			return 0, io.EOF
		}
		select {
		case <-fr.exited:
			fr.done = true // one more read catches the last output
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// readLines calls emit with each line read from r, cut to
// arbiter.MaxSwapLogLine bytes and made valid UTF-8.
func readLines(r io.Reader, emit func(string)) {
	br := bufio.NewReaderSize(r, 64<<10)
	var cur []byte
	flush := func() {
		emit(strings.ToValidUTF8(string(cur), "\uFFFD"))
		cur = cur[:0]
	}
	for {
		frag, more, err := br.ReadLine()
		if room := arbiter.MaxSwapLogLine - len(cur); room > 0 {
			cur = append(cur, frag[:min(len(frag), room)]...)
		}
		if err != nil {
			if len(cur) > 0 {
				flush()
			}
			_, _ = io.Copy(io.Discard, r)
			return
		}
		if !more {
			flush()
		}
	}
}

// checkLocalDir checks on this host that a model's local path is a
// directory inside one of roots, symbolic links resolved.
func checkLocalDir(p string, roots []string) error {
	if err := arbiter.CheckLocalPath(p, roots); err != nil {
		return errors.New(arbiter.ErrorMessage(err))
	}
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("local_path %s: %v", p, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("local_path %s is not a directory", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("local_path %s: %v", p, err)
	}
	for _, root := range roots {
		rr, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if real == rr || strings.HasPrefix(real, strings.TrimSuffix(rr, string(filepath.Separator))+string(filepath.Separator)) {
			return nil
		}
	}
	return fmt.Errorf("local_path %s resolves to %s, outside the allowed roots %s", p, real, strings.Join(roots, ", "))
}

// checkEndpoint waits, up to the ready timeout, for the service's endpoint
// to serve the new model: for vLLM, GET {endpoint}/v1/models lists one of
// its served names; for a command service with an endpoint, the endpoint
// answers 2xx. It returns "" when ready, or why not.
func (r *swapRunner) checkEndpoint(ctx context.Context, sw *arbiter.Swap, swapDeadline time.Time, out *logSender) string {
	if sw.Endpoint == "" {
		return ""
	}
	url := strings.TrimRight(sw.Endpoint, "/")
	if sw.Kind == arbiter.ServiceVLLM {
		url += "/v1/models"
	}
	wait := time.Duration(sw.ReadyTimeoutS * float64(time.Second))
	if wait <= 0 {
		wait = 10 * time.Minute
	}
	wait = max(min(wait, time.Until(swapDeadline)), 0) // the swap's own timeout bounds it too
	out.add(fmt.Sprintf("arbiter agent: waiting up to %s for %s to serve %s", wait, url, strings.Join(sw.ServedNames, " or ")))
	deadline := time.Now().Add(wait)
	last := ""
	for {
		why := r.probe(ctx, url, sw)
		if why == "" {
			out.add("arbiter agent: " + url + " serves " + sw.ModelKey)
			return ""
		}
		if why != last {
			out.add("arbiter agent: not ready yet: " + why)
			last = why
		}
		if time.Now().Add(swapEndpointPoll).After(deadline) {
			return fmt.Sprintf("the endpoint did not serve the model within %s: %s", wait, why)
		}
		select {
		case <-ctx.Done():
			return stoppedWhy(ctx) + " while the agent waited for the endpoint"
		case <-time.After(swapEndpointPoll):
		}
	}
}

// probe checks the endpoint once: "" when it serves the model.
func (r *swapRunner) probe(ctx context.Context, url string, sw *arbiter.Swap) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return "GET " + url + ": " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Sprintf("GET %s answered %s", url, resp.Status)
	}
	if sw.Kind != arbiter.ServiceVLLM {
		return ""
	}
	var models struct {
		Data []struct {
			ID   string `json:"id"`
			Root string `json:"root"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &models); err != nil {
		return arbiter.Clip("GET "+url+" did not answer an OpenAI model list: "+err.Error(), maxProbeReason)
	}
	var have []string
	for _, m := range models.Data {
		for _, n := range sw.ServedNames {
			if (m.ID == n || m.Root == n) && servesModel(m.Root, sw) {
				return ""
			}
		}
		have = append(have, m.ID)
		if m.Root != "" && m.Root != m.ID {
			have[len(have)-1] += " (" + m.Root + ")"
		}
	}
	// Bounded: an endpoint listing thousands of models (or long names)
	// would make a log line, and the swap's reason, larger than the
	// server takes.
	return arbiter.Clip(fmt.Sprintf("it serves [%s], not %s", strings.Join(have, ", "), strings.Join(sw.ServedNames, " or ")), maxProbeReason)
}

// maxProbeReason bounds why a probe is not ready, well inside a swap log
// line (arbiter.MaxSwapLogLine) once escaped.
const maxProbeReason = 800

// servesModel reports whether a listed model's root (what vLLM was started
// with) is the swap's model: catalog entries often share one served name,
// which the previous server, still up, lists too. An unknown root, or a
// swap of an older server that did not say its model, passes.
func servesModel(root string, sw *arbiter.Swap) bool {
	if root == "" || sw.Repo == "" && sw.LocalPath == "" {
		return true
	}
	root = strings.TrimRight(root, "/")
	return root == sw.Repo || sw.LocalPath != "" && root == strings.TrimRight(sw.LocalPath, "/")
}

// logSender batches a swap's output lines to the server: at least every
// swapLogFlush, or at swapLogBatch lines.
type logSender struct {
	r  *swapRunner
	id string
	// ended is called when the server answers that the swap is not
	// running any more: it stops the swap.
	ended context.CancelCauseFunc
	mu    sync.Mutex
	buf   []string
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

func (r *swapRunner) newLogSender(id string, ended context.CancelCauseFunc) *logSender {
	s := &logSender{r: r, id: id, ended: ended, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	return s
}

// add queues a line; past 10,000 waiting lines (the server unreachable),
// lines are dropped rather than memory grown.
func (s *logSender) add(line string) {
	s.mu.Lock()
	if len(s.buf) < 10000 {
		// Program output may hold colours and cursor moves; the server
		// takes only text (arbiter.ValidateLines), so they go escaped.
		s.buf = append(s.buf, arbiter.EscapeText(line, true))
	}
	n := len(s.buf)
	s.mu.Unlock()
	if n >= swapLogBatch {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

func (s *logSender) loop() {
	defer close(s.done)
	t := time.NewTicker(swapLogFlush)
	defer t.Stop()
	heard := time.Now()
	for {
		select {
		case <-s.stop:
			s.flush()
			return
		case <-t.C:
		case <-s.kick:
		}
		if s.flush() {
			heard = time.Now()
		} else if time.Since(heard) >= swapLogPing {
			s.ping()
			heard = time.Now()
		}
	}
}

// swapLogPing is how long a swap may go without the agent asking the
// server about it: a silent one (a command or an endpoint wait with
// nothing to say) learns within it that it was cancelled or failed.
const swapLogPing = 5 * time.Second

// ping sends no lines, to hear whether the swap still runs.
func (s *logSender) ping() {
	ctx, cancel := context.WithTimeout(context.Background(), s.r.callTimeout)
	err := s.r.srv.AppendSwapLog(ctx, s.id, s.r.machine, []string{})
	cancel()
	if code := arbiter.ErrorCode(err); (code == arbiter.EConflict || code == arbiter.ENotFound) && s.ended != nil {
		s.ended(fmt.Errorf("%w (%s)", errSwapEnded, arbiter.ErrorMessage(err)))
	}
}

// swapLogBatchBytes bounds the text of one batch, well under the server's
// smallest body limit (max_body_bytes, 1 MiB by default) even once JSON
// escapes it.
const swapLogBatchBytes = 128 << 10

// flush sends what waits, in batches of at most arbiter.MaxSwapLogBatch
// lines and about swapLogBatchBytes; a batch the server finds too large is
// sent in halves, one it refuses otherwise is retried a few times, then
// dropped with a warning. It reports whether it sent anything.
func (s *logSender) flush() (sent bool) {
	for {
		s.mu.Lock()
		n, size := 0, 0
		for n < min(len(s.buf), arbiter.MaxSwapLogBatch) && (n == 0 || size+len(s.buf[n]) <= swapLogBatchBytes) {
			size += len(s.buf[n]) + 8
			n++
		}
		batch := append([]string(nil), s.buf[:n]...)
		s.mu.Unlock()
		if n == 0 {
			return sent
		}
		sent = true
		var err error
		for try := 0; try < 3; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), s.r.callTimeout)
			err = s.r.srv.AppendSwapLog(ctx, s.id, s.r.machine, batch)
			cancel()
			if arbiter.ErrorCode(err) == arbiter.ETooLarge && n > 1 {
				n /= 2 // the server's limit is lower than thought: halves
				batch = batch[:n]
				try--
				continue
			}
			if code := arbiter.ErrorCode(err); code == arbiter.EConflict || code == arbiter.ENotFound {
				if s.ended != nil {
					s.ended(fmt.Errorf("%w (%s)", errSwapEnded, arbiter.ErrorMessage(err)))
				}
				break
			}
			if err == nil {
				break
			}
			time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
		}
		if err != nil {
			s.r.log.Warn("could not send swap output; lines dropped", "swap", s.id, "lines", n, "err", err)
		}
		s.mu.Lock()
		s.buf = s.buf[n:]
		s.mu.Unlock()
	}
}

// close sends what is left and stops the sender.
func (s *logSender) close() {
	close(s.stop)
	<-s.done
}

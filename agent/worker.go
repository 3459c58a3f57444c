package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/procgroup"
)

// TaskServer is what the task worker needs of the server; *client.Client
// implements it. Errors the server reports are *arbiter.Error: conflict or
// not_found on a task's call means the task is no longer this worker's.
type TaskServer interface {
	ClaimTask(ctx context.Context, worker string, cp arbiter.Capability, o client.ClaimOptions) (*arbiter.Task, error)
	HeartbeatTask(ctx context.Context, id, worker string, claim int64) (arbiter.Task, error)
	CompleteTask(ctx context.Context, id, worker string, claim int64, artifactID string) (arbiter.Task, error)
	FailTask(ctx context.Context, id, worker string, claim int64, msg string, interrupted bool) (arbiter.Task, error)
	UploadArtifact(ctx context.Context, id, worker, sha string, r io.Reader, size int64) (arbiter.Artifact, bool, error)
}

// WorkerConfig configures the task worker (docs/reference/fleet.md §5): it claims the
// tasks this host may run, runs each as a subprocess in its own process
// group with CUDA_VISIBLE_DEVICES set to the GPUs the claim holds, keeps it
// alive with heartbeats, packs its output directory (tar + zstd), uploads it
// and completes the task; a non-zero exit fails it with the log's tail.
// Zero fields take the defaults.
type WorkerConfig struct {
	// Dir holds a working directory per attempt: DIR/<task id>-<attempt>,
	// with output/ (packed on success) and task.log; it is removed once the
	// output is uploaded, kept after a failure. Default ./arbiter-work.
	Dir string
	// MaxTasks bounds the tasks running at once; 0 means as many as the
	// host's GPUs allow plus the CPU-only ones.
	MaxTasks int
	// CPUTasks bounds the tasks that need no GPU running at once: 0 means 1,
	// negative means none.
	CPUTasks int
	// Heartbeat is the time between a running task's heartbeats; default
	// 30s, shorter for a task whose stale_after_s is under three of them.
	Heartbeat time.Duration
	// Poll is how long the worker waits before asking again when nothing
	// fits; default 10s.
	Poll time.Duration
	// KillGrace is how long a task has between SIGTERM and SIGKILL when it
	// must stop; default 10s.
	KillGrace time.Duration
	// LogTail is how much of the end of a failed task's log is reported;
	// default 4 KiB.
	LogTail int
	// Version is the software version the capability reports.
	Version string
}

// Defaults of WorkerConfig.
const (
	DefaultTaskHeartbeat = 30 * time.Second
	DefaultTaskPoll      = 10 * time.Second
	DefaultKillGrace     = 10 * time.Second
	DefaultLogTail       = 4 << 10
	workerReportTimeout  = 30 * time.Second // a report when the agent stops
)

func (c *WorkerConfig) setDefaults(gpus int) {
	if c.Dir == "" {
		c.Dir = "arbiter-work"
	}
	switch {
	case c.CPUTasks == 0:
		c.CPUTasks = 1
	case c.CPUTasks < 0:
		c.CPUTasks = 0
	}
	if c.MaxTasks <= 0 {
		c.MaxTasks = gpus + c.CPUTasks
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultTaskHeartbeat
	}
	if c.Poll <= 0 {
		c.Poll = DefaultTaskPoll
	}
	if c.KillGrace <= 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.LogTail <= 0 {
		c.LogTail = DefaultLogTail
	}
}

// startTasks starts the worker when configured, and returns a function that
// stops it (stopping its tasks and reporting them) and waits.
func (a *agent) startTasks(ctx context.Context, host gpu.Host) (stop func(), err error) {
	if a.cfg.Tasks == nil {
		return func() {}, nil
	}
	srv, ok := a.cfg.Server.(TaskServer)
	if !ok {
		return nil, errors.New("agent: the server client cannot run tasks (no TaskServer)")
	}
	cfg := *a.cfg.Tasks
	cfg.setDefaults(len(host.GPUs))
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("task directory: %w", err)
	}
	cfg.Dir = dir // created with the first task
	w := &worker{
		cfg: cfg, srv: srv, log: a.log, name: a.machine.Name, cp: capabilityOf(host, cfg.Version),
		gpus: len(host.GPUs), callTimeout: a.cfg.CallTimeout, minBackoff: a.cfg.MinBackoff, maxBackoff: a.cfg.MaxBackoff,
		running: map[*workerRun]struct{}{}, finished: make(chan struct{}, 1), registered: make(chan struct{}),
	}
	a.onRegistered = append(a.onRegistered, func() { close(w.registered) })
	a.taskEnded = w.allocationsEnded
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}, nil
}

// capabilityOf is the capability a worker presents: what the agent detected.
func capabilityOf(h gpu.Host, ver string) arbiter.Capability {
	cp := arbiter.Capability{Hostname: h.Hostname, Cores: h.Cores, RAMGiB: h.RAMGiB, CUDA: h.CUDA != "",
		GPUs: make([]arbiter.CapabilityGPU, 0, len(h.GPUs))}
	for _, g := range h.GPUs {
		cp.GPUs = append(cp.GPUs, arbiter.CapabilityGPU{Index: g.Index, Name: g.Model, VRAMGiB: g.VRAMGiB, UUID: g.UUID})
		cp.VRAMGiB = max(cp.VRAMGiB, g.VRAMGiB)
	}
	extra := map[string]string{"arbiter": ver, "os": runtime.GOOS, "arch": runtime.GOARCH, "cuda_version": h.CUDA, "driver": h.Driver}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				cp.GitCommit = s.Value
			}
		}
	}
	cp.Extra = map[string]json.RawMessage{}
	for k, v := range extra {
		if v != "" {
			b, _ := json.Marshal(v)
			cp.Extra[k] = b
		}
	}
	return cp
}

// worker claims and runs tasks. Its fields below mu are shared with the
// goroutines supervising each task.
type worker struct {
	cfg                    WorkerConfig
	srv                    TaskServer
	log                    *slog.Logger
	name                   string
	cp                     arbiter.Capability
	gpus                   int
	callTimeout            time.Duration
	minBackoff, maxBackoff time.Duration
	registered             chan struct{}
	finished               chan struct{} // a run ended: there may be room

	mu sync.Mutex
	// running holds the runs under way; two of one task when the server
	// handed it out again (a requeue) while the earlier run stops.
	running map[*workerRun]struct{}
	wg      sync.WaitGroup
}

// workerRun is one running attempt.
type workerRun struct {
	task arbiter.Task
	dir  string
	stop chan string // the reason the agent stops it
	// ended: the task's allocation ended (cancelled, taken back); the
	// process group is killed at once (docs/reference/gpu-truth.md).
	ended chan struct{}
}

// run is the claim loop: claim while there is room, wait for a task to end
// or the poll interval, and stop everything when ctx ends.
func (w *worker) run(ctx context.Context) {
	select {
	case <-w.registered:
	case <-ctx.Done():
		return
	}
	w.log.Info("task worker started", "worker", w.name, "max_tasks", w.cfg.MaxTasks, "cpu_tasks", w.cfg.CPUTasks, "dir", w.cfg.Dir)
	backoff := w.minBackoff
	for {
		wait := w.cfg.Poll
		if err := w.claimAll(ctx); err != nil && ctx.Err() == nil {
			switch arbiter.ErrorCode(err) {
			case arbiter.EUnauthorized, arbiter.EForbidden:
				w.log.Error("the server refuses this agent's claims; the task worker stops (give the agent a token with the agent role)", "err", err)
				w.shutdown("the agent's token may not run tasks")
				return
			case arbiter.ENotFound:
				w.log.Warn("the server has no work queue; asking again later", "err", err)
				wait = max(wait, time.Minute)
			default:
				wait = backoff + time.Duration(rand.Int64N(int64(backoff)/5+1))
				backoff = min(2*backoff, w.maxBackoff)
				w.log.Warn("claim failed; retrying", "err", err, "retry_in", wait.Round(time.Millisecond))
			}
		} else {
			backoff = w.minBackoff
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			w.shutdown(fmt.Sprintf("the agent on %s was stopped (SIGTERM) while the task ran; it will be retried", w.name))
			return
		case <-w.finished:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// room says what the worker may claim now.
func (w *worker) room() (o client.ClaimOptions, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cpu, gpu := 0, 0
	for r := range w.running {
		if r.task.Spec.GPUs == 0 {
			cpu++
		} else {
			gpu++
		}
	}
	total := cpu + gpu
	o.NoCPU = cpu >= w.cfg.CPUTasks || total >= w.cfg.MaxTasks
	o.NoGPU = w.gpus == 0 || gpu >= w.gpus || total >= w.cfg.MaxTasks
	return o, !(o.NoCPU && o.NoGPU)
}

// claimAll claims and starts tasks until nothing fits or there is no room.
func (w *worker) claimAll(ctx context.Context) error {
	for ctx.Err() == nil {
		o, ok := w.room()
		if !ok {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, w.callTimeout)
		t, err := w.srv.ClaimTask(cctx, w.name, w.cp, o)
		cancel()
		if err != nil {
			return err
		}
		if t == nil {
			return nil
		}
		w.start(ctx, *t)
	}
	return nil
}

// forget drops r, ended, and wakes the claim loop: there may be room.
func (w *worker) forget(r *workerRun) {
	w.mu.Lock()
	delete(w.running, r)
	w.mu.Unlock()
	select {
	case w.finished <- struct{}{}:
	default:
	}
}

// shutdown stops every running task, reporting each failed with reason,
// and waits for them.
func (w *worker) shutdown(reason string) {
	w.mu.Lock()
	for r := range w.running {
		select {
		case r.stop <- reason:
		default:
		}
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// start runs task t: a fresh working directory, the subprocess, and a
// goroutine that supervises it to the end. A run of the same task still
// under way is of an earlier claim the server took back: it is stopped.
func (w *worker) start(ctx context.Context, t arbiter.Task) {
	n := int64(t.Attempts)
	if t.Claim > 0 { // unique, unlike attempts (a requeue resets them)
		n = t.Claim
	}
	r := &workerRun{task: t, dir: filepath.Join(w.cfg.Dir, fmt.Sprintf("%s-%d", t.ID[:16], n)), stop: make(chan string, 1),
		ended: make(chan struct{}, 1)}
	w.mu.Lock()
	for old := range w.running {
		if old.task.ID == t.ID {
			select {
			case old.stop <- fmt.Sprintf("the server handed task %s out again (claim %d)", t.Name, t.Claim):
			default:
			}
		}
	}
	w.running[r] = struct{}{}
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer w.forget(r)
		w.supervise(ctx, r)
	}()
}

// heartbeatEvery is the time between a task's heartbeats: every (the
// agent's setting), but at least three within the task's stale_after_s,
// so that a manifest with a short one does not see its tasks taken back.
func heartbeatEvery(every time.Duration, staleAfterS float64) time.Duration {
	if stale := time.Duration(staleAfterS * float64(time.Second)); stale > 0 {
		every = min(every, stale/3)
	}
	return max(every, 100*time.Millisecond)
}

// report sends a task's last call with its own bounded context, so that it
// is sent even while the agent stops.
func (w *worker) report(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), max(w.callTimeout, workerReportTimeout))
}

// fail reports t's attempt failed; interrupted: the worker stopped it,
// through no fault of the task.
func (w *worker) fail(ctx context.Context, t arbiter.Task, msg string, interrupted bool) {
	// The message ends with the task's log, which may hold colours and
	// cursor moves; the server takes only text (arbiter.ValidateLines).
	msg = arbiter.EscapeText(msg, true)
	rctx, cancel := w.report(ctx)
	defer cancel()
	if _, err := w.srv.FailTask(rctx, t.ID, w.name, t.Claim, msg, interrupted); err != nil {
		w.log.Warn("could not report the task failed; the server will find it stale", "task", t.Name, "err", err)
		return
	}
	w.log.Info("task failed", "task", t.Name, "attempt", t.Attempts, "error", firstLine(msg))
}

// supervise runs one attempt to its end and reports it.
func (w *worker) supervise(ctx context.Context, r *workerRun) {
	t := r.task
	log := w.log.With("task", t.Name, "id", t.ID[:12], "attempt", t.Attempts)
	if err := os.RemoveAll(r.dir); err != nil {
		w.fail(ctx, t, fmt.Sprintf("the worker on %s cannot clear %s: %v", w.name, r.dir, err), false)
		return
	}
	outDir := filepath.Join(r.dir, "output")
	if err := os.MkdirAll(outDir, 0o750); err != nil { // and the work directory with it
		w.fail(ctx, t, fmt.Sprintf("the worker on %s cannot create %s: %v", w.name, outDir, err), false)
		return
	}
	logPath := filepath.Join(r.dir, "task.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		w.fail(ctx, t, fmt.Sprintf("the worker on %s cannot create the task log: %v", w.name, err), false)
		return
	}
	defer logf.Close()
	devices := make([]string, len(t.GPUs))
	for i, g := range t.GPUs {
		devices[i] = strconv.Itoa(g)
	}
	cmd := exec.Command(t.Spec.Command[0], t.Spec.Command[1:]...)
	cmd.Dir = r.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = childEnv( // swap.go
		"CUDA_VISIBLE_DEVICES="+strings.Join(devices, ","),
		"ARBITER_TASK_ID="+t.ID,
		"ARBITER_TASK_NAME="+t.Name,
		"ARBITER_TASK_ATTEMPT="+strconv.Itoa(t.Attempts),
		"ARBITER_TASK_MODEL="+t.Spec.Model,
		"ARBITER_TASK_MODE="+t.Spec.Mode,
		"ARBITER_TASK_SEED="+strconv.FormatInt(t.Spec.Seed, 10),
		"ARBITER_HYPER="+string(t.Spec.Hyper),
		"ARBITER_OUTPUT_DIR="+outDir,
		"ARBITER_WORKER="+w.name,
	)
	if t.AllocationID != 0 {
		// Ties the task's processes to its GPUs (docs/reference/gpu-truth.md).
		cmd.Env = append(cmd.Env, gpu.AllocationEnv+"="+strconv.FormatInt(t.AllocationID, 10))
	}
	procgroup.Own(cmd) // stopping it stops everything it started
	if err := cmd.Start(); err != nil {
		w.fail(ctx, t, fmt.Sprintf("the worker on %s cannot start %q: %v", w.name, t.Spec.Command[0], err), false)
		return
	}
	log.Info("task started", "pid", cmd.Process.Pid, "gpus", strings.Join(devices, ","), "dir", r.dir)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	beat := time.NewTicker(heartbeatEvery(w.cfg.Heartbeat, t.Spec.StaleAfterS))
	defer beat.Stop()
	// The first heartbeat goes at once: it is what makes the task running
	// for everyone watching, not claimed until the ticker's first tick.
	first := make(chan time.Time, 1)
	first <- time.Now()
	var stopReason string // why the worker stopped the process itself
	lost := false         // the server says the task is no longer ours
	var waitErr error
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case <-first:
		case <-beat.C:
		case reason := <-r.stop:
			stopReason = reason
			log.Info("stopping the task", "reason", reason)
			waitErr = w.stopProcess(cmd, exited)
			break wait
		case <-r.ended:
			log.Warn("the task's allocation ended (cancelled or taken back); killing its process group")
			lost = true
			_ = procgroup.Signal(cmd, os.Kill)
			waitErr = <-exited
			break wait
		}
		err := w.heartbeat(context.WithoutCancel(ctx), t)
		switch arbiter.ErrorCode(err) {
		case "":
		case arbiter.EConflict, arbiter.ENotFound:
			log.Warn("the server took the task back; stopping it", "reason", arbiter.ErrorMessage(err))
			lost = true
			waitErr = w.stopProcess(cmd, exited)
			break wait
		default:
			log.Warn("heartbeat failed; the task keeps running", "err", err)
		}
	}
	_ = procgroup.Signal(cmd, os.Kill) // whatever the task left running in its group
	logf.Sync()
	switch {
	case lost:
		return
	case stopReason != "":
		w.fail(ctx, t, stopReason, true)
		return
	case waitErr != nil:
		w.fail(ctx, t, fmt.Sprintf("%s on %s; the end of its log:\n%s", exitText(waitErr), w.name, tail(logPath, w.cfg.LogTail)), false)
		return
	}
	if err := w.finish(ctx, t, r.dir, outDir); err != nil {
		if arbiter.ErrorCode(err) == arbiter.EConflict || arbiter.ErrorCode(err) == arbiter.ENotFound {
			log.Warn("the server took the task back before it completed", "reason", arbiter.ErrorMessage(err))
			return
		}
		w.fail(ctx, t, fmt.Sprintf("the task succeeded but its output could not be delivered from %s: %v", w.name, err), false)
		return
	}
	// The output is on the server now; a failed attempt's directory stays
	// for whoever looks into it.
	if err := os.RemoveAll(r.dir); err != nil {
		log.Warn("could not remove the task's directory", "dir", r.dir, "err", err)
	}
}

// allocationsEnded kills at once the running tasks holding any of ids:
// their allocations ended on the server (a cancel, an expiry), so their
// GPUs wait, releasing, for them to go. Safe for concurrent use.
func (w *worker) allocationsEnded(ids []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for r := range w.running {
		for _, id := range ids {
			if r.task.AllocationID == id && id != 0 {
				select {
				case r.ended <- struct{}{}:
				default:
				}
			}
		}
	}
}

// stopProcess stops the task's process group: SIGTERM, then SIGKILL after
// the grace period. It returns the process's wait error.
func (w *worker) stopProcess(cmd *exec.Cmd, exited <-chan error) error {
	_ = procgroup.Signal(cmd, syscall.SIGTERM)
	timer := time.NewTimer(w.cfg.KillGrace)
	defer timer.Stop()
	select {
	case err := <-exited:
		return err
	case <-timer.C:
		_ = procgroup.Signal(cmd, os.Kill)
		return <-exited
	}
}

// heartbeat tells the server the task is alive, within one call's time.
func (w *worker) heartbeat(ctx context.Context, t arbiter.Task) error {
	hctx, cancel := context.WithTimeout(ctx, w.callTimeout)
	defer cancel()
	_, err := w.srv.HeartbeatTask(hctx, t.ID, w.name, t.Claim)
	return err
}

// finish packs the output directory, uploads it and completes the task.
// It heartbeats meanwhile, since packing and sending a large output can
// take longer than the task's stale_after_s, and gives up as soon as a
// heartbeat says the server took the task back. It goes on while the
// agent stops, as the task's last reports do; the upload is bounded by
// its size (client.UploadArtifact), not by one call's time.
func (w *worker) finish(ctx context.Context, t arbiter.Task, dir, outDir string) error {
	fctx, lost := context.WithCancelCause(context.WithoutCancel(ctx))
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		w.beatUntil(fctx, t, lost)
	}()
	defer func() {
		lost(nil)
		<-beating
	}()
	takenBack := func(err error) error {
		if cause := context.Cause(fctx); fctx.Err() != nil && cause != context.Canceled {
			return cause // the heartbeat's not_found or conflict
		}
		return err
	}
	bundle := filepath.Join(dir, "output.tar.zst")
	sha, size, err := PackDir(outDir, bundle)
	if err != nil {
		return fmt.Errorf("pack %s: %w", outDir, err)
	}
	f, err := os.Open(bundle)
	if err != nil {
		return err
	}
	defer f.Close()
	a, existed, err := w.srv.UploadArtifact(fctx, t.ID, w.name, sha, f, size)
	if err != nil {
		return takenBack(fmt.Errorf("upload: %w", err))
	}
	rctx, cancel := context.WithTimeout(fctx, max(w.callTimeout, workerReportTimeout))
	defer cancel()
	if _, err := w.srv.CompleteTask(rctx, t.ID, w.name, t.Claim, a.ID); err != nil {
		return takenBack(err)
	}
	w.log.Info("task completed", "task", t.Name, "attempt", t.Attempts, "artifact", a.ID[:12], "bytes", size, "deduplicated", existed)
	return nil
}

// beatUntil heartbeats t until ctx ends, and calls lost with the answer
// when the server says the task is no longer this worker's.
func (w *worker) beatUntil(ctx context.Context, t arbiter.Task, lost context.CancelCauseFunc) {
	tick := time.NewTicker(heartbeatEvery(w.cfg.Heartbeat, t.Spec.StaleAfterS))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := w.heartbeat(ctx, t)
		if c := arbiter.ErrorCode(err); c == arbiter.EConflict || c == arbiter.ENotFound {
			lost(err)
			return
		}
	}
}

// PackDir writes the tree under dir to out as a tar archive compressed with
// zstd, and returns its sha256 (hex) and size. The archive depends only on
// the names, contents, modes and link targets of the files: entries are in
// name order, times are the Unix epoch, owners are 0. So the same output
// gives the same bytes, and identical results are stored once. Files that
// are neither regular, directories nor symbolic links are skipped.
func PackDir(dir, out string) (sha string, size int64, err error) {
	f, err := os.Create(out)
	if err != nil {
		return "", 0, err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			os.Remove(out)
		}
	}()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return "", 0, err
	}
	tw := tar.NewWriter(zw)
	epoch := time.Unix(0, 0).UTC()
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(info.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case info.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		default:
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		if _, err := io.CopyN(tw, src, hdr.Size); err != nil {
			return fmt.Errorf("%s changed while it was packed: %w", rel, err)
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// exitText says how a process ended.
func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ee.Exited() {
			return fmt.Sprintf("the task exited with status %d", ee.ExitCode())
		}
		if s := ee.String(); s != "" {
			return "the task ended by " + s // "signal: killed"
		}
	}
	return "the task failed: " + err.Error()
}

// tail returns the last n bytes of a file, from a line start when it can.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	off := max(st.Size()-int64(n), 0)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		return "(log unreadable: " + err.Error() + ")"
	}
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	s := strings.ToValidUTF8(string(b), "?")
	if strings.TrimSpace(s) == "" {
		return "(the log is empty)"
	}
	return s
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

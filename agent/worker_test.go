package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/poll"
)

// taskFake is a server for the worker: it registers the machine and hands
// out the tasks queued in it, recording every call.
type taskFake struct {
	mu        sync.Mutex
	queue     []arbiter.Task
	claims    []client.ClaimOptions
	beats     map[string]int
	lost      map[string]bool // heartbeats answer conflict
	failed    map[string]string
	completed map[string]string
	uploads   map[string][]byte
	// running counts claimed tasks not yet reported, by kind; max* are the
	// highest counts seen.
	runCPU, runGPU, maxCPU, maxGPU int
	gpuOf                          map[string]bool
	claimOf                        map[string]int64 // each task's last claim: a call of another is refused
	refused                        int              // calls of an earlier claim
	interrupted                    map[string]bool  // the last failure's flag
	// onUpload, when set, runs as an upload starts, before its bytes are
	// read, without the lock: the bytes "travel" while it runs.
	onUpload func(ctx context.Context, id string) error
}

func newTaskFake(ts ...arbiter.Task) *taskFake {
	return &taskFake{queue: ts, beats: map[string]int{}, lost: map[string]bool{}, failed: map[string]string{},
		completed: map[string]string{}, uploads: map[string][]byte{}, gpuOf: map[string]bool{}, claimOf: map[string]int64{}, interrupted: map[string]bool{}}
}

func (f *taskFake) RegisterMachine(_ context.Context, m arbiter.Machine) (arbiter.MachineStatus, error) {
	return arbiter.MachineStatus{Name: m.Name, State: arbiter.MachineUp}, nil
}

func (f *taskFake) Heartbeat(context.Context, string) (arbiter.MachineStatus, error) {
	return arbiter.MachineStatus{State: arbiter.MachineUp}, nil
}

func (f *taskFake) ClaimTask(_ context.Context, worker string, cp arbiter.Capability, o client.ClaimOptions) (*arbiter.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, o)
	for i, t := range f.queue {
		if (t.Spec.GPUs == 0 && o.NoCPU) || (t.Spec.GPUs > 0 && o.NoGPU) {
			continue
		}
		f.queue = append(f.queue[:i], f.queue[i+1:]...)
		t.Status, t.ClaimedBy, t.Attempts = arbiter.TaskClaimed, worker, t.Attempts+1
		f.claimOf[t.ID]++
		t.Claim = f.claimOf[t.ID]
		f.gpuOf[t.ID] = t.Spec.GPUs > 0
		if t.Spec.GPUs > 0 {
			f.runGPU++
			f.maxGPU = max(f.maxGPU, f.runGPU)
		} else {
			f.runCPU++
			f.maxCPU = max(f.maxCPU, f.runCPU)
		}
		return &t, nil
	}
	return nil, nil
}

// earlier reports whether claim is not the task's last.
func (f *taskFake) earlier(id string, claim int64) error {
	if claim != f.claimOf[id] {
		f.refused++
		return arbiter.Errorf(arbiter.EConflict, "task %s was claimed again since claim %d", id, claim)
	}
	return nil
}

func (f *taskFake) HeartbeatTask(_ context.Context, id, worker string, claim int64) (arbiter.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.earlier(id, claim); err != nil {
		return arbiter.Task{}, err
	}
	f.beats[id]++
	if f.lost[id] {
		return arbiter.Task{}, arbiter.Errorf(arbiter.EConflict, "task is no longer claimed by %s", worker)
	}
	return arbiter.Task{ID: id, Status: arbiter.TaskRunning}, nil
}

func (f *taskFake) CompleteTask(_ context.Context, id, _ string, claim int64, artifactID string) (arbiter.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.earlier(id, claim); err != nil {
		return arbiter.Task{}, err
	}
	if _, ok := f.uploads[artifactID]; !ok {
		return arbiter.Task{}, arbiter.Errorf(arbiter.EInvalid, "artifact %s was not uploaded", artifactID)
	}
	f.completed[id] = artifactID
	f.ended(id)
	return arbiter.Task{ID: id, Status: arbiter.TaskCompleted}, nil
}

func (f *taskFake) FailTask(_ context.Context, id, _ string, claim int64, msg string, interrupted bool) (arbiter.Task, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.earlier(id, claim); err != nil {
		return arbiter.Task{}, err
	}
	f.failed[id] = msg
	f.interrupted[id] = interrupted
	f.ended(id)
	return arbiter.Task{ID: id, Status: arbiter.TaskPending}, nil
}

func (f *taskFake) ended(id string) {
	if f.gpuOf[id] {
		f.runGPU--
	} else {
		f.runCPU--
	}
}

func (f *taskFake) UploadArtifact(ctx context.Context, id, _, sha string, r io.Reader, size int64) (arbiter.Artifact, bool, error) {
	if f.onUpload != nil {
		if err := f.onUpload(ctx, id); err != nil {
			return arbiter.Artifact{}, false, err
		}
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return arbiter.Artifact{}, false, err
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != sha || int64(len(b)) != size {
		return arbiter.Artifact{}, false, arbiter.Errorf(arbiter.EInvalid, "sha mismatch")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, existed := f.uploads[sha]
	f.uploads[sha] = b
	return arbiter.Artifact{ID: sha, SizeBytes: size}, existed, nil
}

// waitFor polls cond, under the fake's lock, while the worker works.
func (f *taskFake) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, what, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return cond()
	})
}

func shTask(name string, gpus []int, script string) arbiter.Task {
	s := sha256.Sum256([]byte(name))
	return arbiter.Task{ID: hex.EncodeToString(s[:]), Name: name, GPUs: gpus, Spec: &arbiter.TaskSpec{
		Model: "m", Mode: name, Hyper: json.RawMessage(`{"lr":0.5}`), GPUs: len(gpus), Command: []string{"sh", "-c", script},
		MaxAttempts: 3, StaleAfterS: 60}}
}

// runWorker runs the agent with the worker until the returned stop is called.
func runWorker(t *testing.T, f *taskFake, wc WorkerConfig, gpus int) (stop func() error) {
	t.Helper()
	host := gpu.Host{Hostname: "box", Cores: 4, RAMGiB: 16}
	if gpus > 0 {
		host.CUDA = "12.4"
	}
	for i := 0; i < gpus; i++ {
		host.GPUs = append(host.GPUs, arbiter.GPU{Index: i, Model: "L4", VRAMGiB: 24, Healthy: true})
	}
	if wc.Dir == "" {
		wc.Dir = t.TempDir()
	}
	if wc.Heartbeat == 0 {
		wc.Heartbeat = 20 * time.Millisecond
	}
	if wc.Poll == 0 {
		wc.Poll = 20 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Server: f, Name: "box", Tasks: &wc, HeartbeatInterval: time.Hour,
			Detect: func(context.Context) (gpu.Host, error) { return host, nil }})
	}()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("the agent did not stop")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return stop
}

// untar reads a tar.zst into name → content ("dir/" for directories, "->
// target" for links).
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			out[h.Name] = "-> " + h.Linkname
		case tar.TypeDir:
			out[h.Name] = "dir"
		default:
			c, _ := io.ReadAll(tr)
			out[h.Name] = string(c)
		}
	}
}

func TestWorkerRunsAndUploads(t *testing.T) {
	script := `echo "training $ARBITER_TASK_NAME" ; printf '%s|%s|%s' "$CUDA_VISIBLE_DEVICES" "$ARBITER_HYPER" "$ARBITER_TASK_ATTEMPT" > "$ARBITER_OUTPUT_DIR/env.txt"; mkdir -p "$ARBITER_OUTPUT_DIR/sub"; echo w > "$ARBITER_OUTPUT_DIR/sub/weights.bin"; ln -s sub/weights.bin "$ARBITER_OUTPUT_DIR/latest"`
	f := newTaskFake(shTask("gpu-job", []int{1, 3}, script), shTask("cpu-job", nil, script))
	runWorker(t, f, WorkerConfig{}, 4)
	f.waitFor(t, "both tasks completed", func() bool { return len(f.completed) == 2 })
	for _, tk := range []arbiter.Task{shTask("gpu-job", []int{1, 3}, script), shTask("cpu-job", nil, script)} {
		files := untar(t, f.uploads[f.completed[tk.ID]])
		cvd := "1,3"
		if tk.Spec.GPUs == 0 {
			cvd = ""
		}
		if got := files["env.txt"]; got != cvd+`|{"lr":0.5}|1` {
			t.Errorf("%s: env.txt %q, want CUDA_VISIBLE_DEVICES %q, the hyper-parameters and attempt 1", tk.Name, got, cvd)
		}
		if files["sub/"] != "dir" || files["sub/weights.bin"] != "w\n" || files["latest"] != "-> sub/weights.bin" {
			t.Errorf("%s: archive holds %v", tk.Name, files)
		}
	}
	if len(f.failed) != 0 {
		t.Errorf("failures reported: %v", f.failed)
	}
	// The outputs differ (env.txt), so the artifacts do.
	if f.completed[shTask("gpu-job", nil, "").ID] == f.completed[shTask("cpu-job", nil, "").ID] {
		t.Errorf("different outputs gave the same artifact")
	}
}

func TestWorkerReportsFailureWithLogTail(t *testing.T) {
	f := newTaskFake(shTask("bad", nil, `for i in $(seq 1 2000); do echo "line $i"; done; echo "Traceback: ValueError: lr must be positive" >&2; exit 3`))
	runWorker(t, f, WorkerConfig{LogTail: 200}, 0)
	id := shTask("bad", nil, "").ID
	f.waitFor(t, "the failure", func() bool { return f.failed[id] != "" })
	msg := f.failed[id]
	if !strings.Contains(msg, "exited with status 3") || !strings.Contains(msg, "ValueError: lr must be positive") ||
		!strings.Contains(msg, "line 2000") || strings.Contains(msg, "line 1\n") || len(msg) > 400 {
		t.Errorf("got failure %q, want the exit status and the log's tail", msg)
	}
}

func TestWorkerStopsTaskOnConflict(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "term")
	// The task traps SIGTERM, notes it and exits: it was asked politely.
	tk := shTask("long", nil, `trap 'echo got-term > `+marker+`; exit 0' TERM; while true; do sleep 0.05; done`)
	f := newTaskFake(tk)
	stop := runWorker(t, f, WorkerConfig{KillGrace: 5 * time.Second}, 0)
	f.waitFor(t, "a heartbeat", func() bool { return f.beats[tk.ID] >= 1 })
	f.mu.Lock()
	f.lost[tk.ID] = true // cancelled by the operator
	f.mu.Unlock()
	poll.Until(t, 10*time.Second, "the task to get SIGTERM after the server took it back", func() bool {
		b, err := os.ReadFile(marker)
		return err == nil && strings.TrimSpace(string(b)) == "got-term"
	})
	// Nothing more may be reported: stop waits until the task's supervisor
	// has ended, so whatever it would report has been reported by then.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failed) != 0 || len(f.completed) != 0 {
		t.Errorf("a task the server took back was reported: failed %v completed %v", f.failed, f.completed)
	}
}

func TestWorkerSIGTERMKillsAndReports(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	// The task ignores SIGTERM: the worker must SIGKILL it after the grace.
	tk := shTask("stubborn", []int{0}, `trap '' TERM; echo $$ > `+pidFile+`; while true; do sleep 0.05; done`)
	f := newTaskFake(tk)
	stop := runWorker(t, f, WorkerConfig{KillGrace: 300 * time.Millisecond}, 1)
	// The pid is written after the trap is set: only then does SIGTERM go
	// unheeded.
	f.waitFor(t, "the task to start", func() bool { b, _ := os.ReadFile(pidFile); return len(b) > 0 })
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("stopped after %v, before the grace period", d)
	}
	msg := f.failed[tk.ID]
	if !strings.Contains(msg, "stopped (SIGTERM)") || !strings.Contains(msg, "retried") {
		t.Errorf("got failure %q, want a clear reason", msg)
	}
	b, _ := os.ReadFile(pidFile)
	pid := strings.TrimSpace(string(b))
	if pid == "" {
		t.Fatal("no pid")
	}
	if _, err := os.Stat("/proc/" + pid); err == nil {
		if st, _ := os.ReadFile("/proc/" + pid + "/stat"); !strings.Contains(string(st), ") Z") {
			t.Errorf("task process %s still runs after the agent stopped", pid)
		}
	}
	// Nothing is claimed after the stop: no goroutine of the agent is left
	// to claim anything.
	goleak.VerifyNone(t)
}

func TestWorkerConcurrency(t *testing.T) {
	sleep := `sleep 0.3; echo ok > "$ARBITER_OUTPUT_DIR/x"`
	var ts []arbiter.Task
	for i := 0; i < 3; i++ {
		ts = append(ts, shTask("cpu"+string(rune('a'+i)), nil, sleep))
	}
	ts = append(ts, shTask("gpu-a", []int{0}, sleep), shTask("gpu-b", []int{1}, sleep), shTask("gpu-c", []int{0}, sleep))
	f := newTaskFake(ts...)
	runWorker(t, f, WorkerConfig{}, 2)
	f.waitFor(t, "all done", func() bool { return len(f.completed) == 6 })
	// With 2 GPUs and the default one CPU task, no claim asked for more.
	f.mu.Lock()
	defer f.mu.Unlock()
	sawGPUOnly := false
	for _, o := range f.claims {
		if o.NoCPU && !o.NoGPU {
			sawGPUOnly = true
		}
	}
	if !sawGPUOnly {
		t.Errorf("the worker never asked for GPU tasks only while its CPU slot was busy: %+v", f.claims)
	}
	if f.maxCPU != 1 || f.maxGPU != 2 {
		t.Errorf("ran at most %d CPU and %d GPU tasks at once, want 1 and 2", f.maxCPU, f.maxGPU)
	}
}

func TestPackDirIsDeterministic(t *testing.T) {
	build := func(mtime time.Time) string {
		d := t.TempDir()
		os.MkdirAll(filepath.Join(d, "b", "c"), 0o750)
		os.WriteFile(filepath.Join(d, "b", "c", "w.bin"), bytes.Repeat([]byte{1, 2, 3}, 1000), 0o640)
		os.WriteFile(filepath.Join(d, "a.txt"), []byte("hello"), 0o644)
		for _, p := range []string{"a.txt", "b/c/w.bin", "b/c", "b"} {
			os.Chtimes(filepath.Join(d, p), mtime, mtime)
		}
		sha, size, err := PackDir(d, filepath.Join(t.TempDir(), "out.tar.zst"))
		if err != nil || size == 0 {
			t.Fatal(err)
		}
		return sha
	}
	a := build(time.Unix(1000, 0))
	b := build(time.Unix(2000000, 0))
	if a != b {
		t.Errorf("the same tree at other times packed to %s and %s", a, b)
	}
	names := []string{}
	d := t.TempDir()
	os.WriteFile(filepath.Join(d, "z"), nil, 0o600)
	os.WriteFile(filepath.Join(d, "a"), nil, 0o600)
	out := filepath.Join(t.TempDir(), "o")
	if _, _, err := PackDir(d, out); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(out)
	for n := range untar(t, raw) {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "a,z" {
		t.Errorf("got %v", names)
	}
}

// TestWorkerStopsTheRunOfAnEarlierClaim: the server hands this worker a
// task it still runs (taken back and requeued before the run heard of
// it): the earlier run is stopped, its report refused as of an earlier
// claim, and the later one, in a directory of its own, is the one a
// SIGTERM of the agent stops and reports.
func TestWorkerStopsTheRunOfAnEarlierClaim(t *testing.T) {
	started := filepath.Join(t.TempDir(), "started")
	t1 := shTask("again", nil, `echo "$ARBITER_TASK_ATTEMPT $PWD" >> `+started+`; exec sleep 20`)
	t2 := t1
	t2.Attempts = 1 // attempt 2 once claimed
	f := newTaskFake(t1, t2)
	stop := runWorker(t, f, WorkerConfig{KillGrace: 300 * time.Millisecond, CPUTasks: 2, MaxTasks: 2}, 0)
	second := func() string {
		b, _ := os.ReadFile(started)
		for _, l := range strings.Split(string(b), "\n") {
			if dir, ok := strings.CutPrefix(l, "2 "); ok {
				return dir
			}
		}
		return ""
	}
	f.waitFor(t, "the earlier run's report to be refused and the later run to start", func() bool { return f.refused > 0 && second() != "" })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	msg, interrupted := f.failed[t1.ID], f.interrupted[t1.ID]
	f.mu.Unlock()
	if !strings.Contains(msg, "SIGTERM") || !interrupted {
		t.Fatalf("the task's last report is %q (interrupted %v); want the later run stopped by SIGTERM, interrupted", firstLine(msg), interrupted)
	}
	if dir := second(); !strings.HasSuffix(dir, "-2") {
		t.Fatalf("the later run ran in %s; want the directory of claim 2", dir)
	}
}

// TestHeartbeatEvery: three heartbeats at least within stale_after_s.
func TestHeartbeatEvery(t *testing.T) {
	for _, c := range []struct {
		every time.Duration
		stale float64
		want  time.Duration
	}{
		{30 * time.Second, 60, 20 * time.Second},
		{30 * time.Second, 600, 30 * time.Second},
		{30 * time.Second, 0, 30 * time.Second},
		{30 * time.Second, 0.01, 100 * time.Millisecond},
	} {
		if got := heartbeatEvery(c.every, c.stale); got != c.want {
			t.Errorf("heartbeatEvery(%s, %g) = %s, want %s", c.every, c.stale, got, c.want)
		}
	}
}

// TestExitText: a failed task's first line says how it ended in words.
func TestExitText(t *testing.T) {
	for script, want := range map[string]string{
		"exit 2":     "the task exited with status 2",
		"kill -9 $$": "the task ended by signal: killed",
	} {
		err := exec.Command("sh", "-c", script).Run()
		if got := exitText(err); got != want {
			t.Errorf("%s: %q, want %q", script, got, want)
		}
	}
}

// TestWorkerHeartbeatsWhileItDeliversTheOutput: packing and uploading a
// large output can take longer than stale_after_s; the worker heartbeats
// meanwhile, and the upload is bounded by its size (the client's), not by
// one call's 30 s. Before, the heartbeats stopped with the process: the
// server took the task back mid-upload and ran it again elsewhere.
func TestWorkerHeartbeatsWhileItDeliversTheOutput(t *testing.T) {
	f := newTaskFake(shTask("big", nil, `echo x > "$ARBITER_OUTPUT_DIR/w"`))
	beatsSeen, deadline := -1, false
	f.onUpload = func(ctx context.Context, id string) error {
		f.mu.Lock()
		_, deadline = ctx.Deadline()
		start := f.beats[id]
		f.mu.Unlock()
		err := poll.Try(20*time.Second, func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if beatsSeen = f.beats[id] - start; beatsSeen < 2 {
				return errors.New("no heartbeats during the upload")
			}
			return nil
		})
		return err
	}
	stop := runWorker(t, f, WorkerConfig{}, 0)
	defer stop()
	f.waitFor(t, "the task completed or failed", func() bool { return len(f.completed)+len(f.failed) == 1 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.completed) != 1 || beatsSeen < 2 || deadline {
		t.Fatalf("completed %v, failed %v; %d heartbeats during the upload, upload given a deadline: %v", f.completed, f.failed, beatsSeen, deadline)
	}
}

// TestWorkerStopsDeliveringATaskTakenBack: a heartbeat during the upload
// that says the task is no longer this worker's ends the upload; the task
// is neither completed nor reported failed (it is someone else's now).
func TestWorkerStopsDeliveringATaskTakenBack(t *testing.T) {
	task := shTask("big", nil, `echo x > "$ARBITER_OUTPUT_DIR/w"`)
	f := newTaskFake(task)
	cut := false
	f.onUpload = func(ctx context.Context, id string) error {
		f.mu.Lock()
		f.lost[id] = true
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			f.mu.Lock()
			cut = true
			f.mu.Unlock()
			return ctx.Err()
		case <-time.After(20 * time.Second):
			return errors.New("the upload went on after the task was taken back")
		}
	}
	stop := runWorker(t, f, WorkerConfig{}, 0)
	defer stop()
	f.waitFor(t, "the upload to end", func() bool { return f.beats[task.ID] > 0 && f.lost[task.ID] })
	poll.Until(t, 20*time.Second, "the upload cut", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return cut
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.completed) != 0 || len(f.failed) != 0 {
		t.Fatalf("a task taken back mid-upload: completed %v, failed %v", f.completed, f.failed)
	}
}

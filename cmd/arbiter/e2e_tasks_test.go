package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

// TestMain fails the package's tests if a goroutine outlives them, and
// removes the binary buildBinary built once every test is done.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binPath != "" {
			os.RemoveAll(filepath.Dir(binPath))
		}
		os.Exit(code)
	}))
}

// syncBuffer is a bytes.Buffer safe for a process writing and a test reading.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startAgent runs `arbiter agent` as a process; extraEnv goes to it.
func startAgent(t *testing.T, bin, url, name string, extraEnv []string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	work := t.TempDir()
	// --trust-pids: the recorded nvidia-smi reports the pids of the
	// namespace the tests run in, a container's too.
	all := append([]string{"agent", "--url", url, "--name", name, "--heartbeat", "1s", "--task-heartbeat", "100ms",
		"--task-poll", "50ms", "--kill-grace", "1s", "--work-dir", work, "--no-nvml", "--trust-pids"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), extraEnv...)
	logs := runProcess(t, cmd, "agent "+name, 15*time.Second)
	return cmd, logs
}

// e2eManifest is the manifest of the end-to-end test. {LONG} is replaced
// by the long task (phase 2) or nothing.
const e2eManifest = `name = "e2e"

[defaults]
command = ["sh", "-c", "echo {model}-{mode} > \"$ARBITER_OUTPUT_DIR/result.txt\""]
max_attempts = 3
stale_after_s = 5

[[hosts]]
name = "cuda-host"
deny_jobs = ["cpuonly*"]

[[jobs]]
model = "cudajob"
mode = "train"
gpus = 2
require_cuda = true
min_vram_gib = 40
priority = 5
command = ["sh", "-c", "printf '%s' \"$CUDA_VISIBLE_DEVICES\" > \"$ARBITER_OUTPUT_DIR/cvd.txt\"; echo $ARBITER_HYPER > \"$ARBITER_OUTPUT_DIR/hyper.json\""]
hyper = { lr = 0.001, layers = 4 }

[[jobs]]
model = "cpuonly"
mode = "train"
command = ["sh", "-c", "printf '%s|%s' \"$CUDA_VISIBLE_DEVICES\" \"$ARBITER_WORKER\" > \"$ARBITER_OUTPUT_DIR/where.txt\""]

[[jobs]]
model = "dedup"
mode = "x"
command = ["sh", "-c", "echo identical > \"$ARBITER_OUTPUT_DIR/same.txt\""]

[[jobs]]
model = "dedup"
mode = "y"
command = ["sh", "-c", "echo identical > \"$ARBITER_OUTPUT_DIR/same.txt\""]

[[jobs]]
model = "failing"
mode = "train"
max_attempts = 2
command = ["sh", "-c", "echo starting; echo 'Traceback: ValueError: bad split' >&2; exit 3"]
{LONG}`

// e2eLong is the task the killed agent holds: on cuda-host it hangs (and
// notes its pid), anywhere else it finishes.
const e2eLong = `
[[jobs]]
model = "longjob"
mode = "train"
priority = 100
allowed_hosts = ["cuda-host", "cpu-*"]
command = ["sh", "-c", "if [ \"$ARBITER_WORKER\" = cuda-host ]; then echo $$ > {PIDFILE}; exec sleep 600; fi; echo finished > \"$ARBITER_OUTPUT_DIR/long.txt\""]
`

// TestEndToEndWorkQueue runs the real server and two real agents as
// processes on this machine pretending to be different hosts: cuda-host
// with a fake nvidia-smi (8 H100s, CUDA 12.4) and cpu-host with no GPU.
func TestEndToEndWorkQueue(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	manPath := filepath.Join(dir, "training.toml")
	pidFile := filepath.Join(dir, "long.pid")
	write := func(long bool) {
		l := ""
		if long {
			l = strings.ReplaceAll(e2eLong, "{PIDFILE}", pidFile)
		}
		if err := os.WriteFile(manPath, []byte(strings.ReplaceAll(e2eManifest, "{LONG}", l)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(false)
	clk := clock.NewFake(time.Now().UTC())
	m, url := startServer(t, "[server]\nlocal = false\n[agents]\nheartbeat_timeout_s = 3600\n[tasks]\nmanifest = \""+manPath+"\"\n", clk)
	c := client.New(url, "")
	ctx := context.Background()

	smi := fakeSMI(t)
	agentA, logsA := startAgent(t, bin, url, "cuda-host", []string{"FAKE_NVIDIA_SMI=h100x8"}, "--nvidia-smi", smi)
	_ = logsA

	byName := func() map[string]arbiter.Task {
		ts, err := c.Tasks(ctx, client.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]arbiter.Task{}
		for _, tk := range ts {
			out[tk.Spec.Model+"/"+tk.Spec.Mode] = tk
		}
		return out
	}
	waitFor := func(what string, cond func(map[string]arbiter.Task) bool) map[string]arbiter.Task {
		t.Helper()
		var ts map[string]arbiter.Task
		err := poll.Try(60*time.Second, func() error {
			if ts = byName(); !cond(ts) {
				return fmt.Errorf("waiting for %s; tasks: %+v", what, ts)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	status := func(ts map[string]arbiter.Task, key string) string { return ts[key].Status }

	// Phase 1: the CUDA host runs everything its policy allows.
	ts := waitFor("cuda-host's tasks", func(ts map[string]arbiter.Task) bool {
		return status(ts, "cudajob/train") == "completed" && status(ts, "dedup/x") == "completed" &&
			status(ts, "dedup/y") == "completed" && status(ts, "failing/train") == "failed"
	})
	if got := ts["cpuonly/train"]; got.Status != "pending" || got.Attempts != 0 {
		t.Fatalf("cpuonly ran on the CUDA host against its policy: %+v", got)
	}
	// The failing task was retried up to its limit, with its log's tail.
	if f := ts["failing/train"]; f.Attempts != 2 || !strings.Contains(f.LastError, "exited with status 3") ||
		!strings.Contains(f.LastError, "Traceback: ValueError: bad split") || f.ClaimedBy != "cuda-host" {
		t.Fatalf("failing task: %+v", f)
	}

	// Phase 2: reload with the long task (CLI); the CUDA host takes it.
	write(true)
	out, errs, code := cmdline(t, url, "tasks", "reload")
	if code != 0 || !strings.Contains(out, "1 added") {
		t.Fatalf("tasks reload: %d %s %s", code, out, errs)
	}
	waitFor("longjob running on cuda-host", func(ts map[string]arbiter.Task) bool {
		l := ts["longjob/train"]
		return l.Status == "running" && l.ClaimedBy == "cuda-host"
	})

	// The CPU host joins and takes what the CUDA host may not run.
	startAgent(t, bin, url, "cpu-host", nil, "--nvidia-smi", "none")
	ts = waitFor("cpuonly completed", func(ts map[string]arbiter.Task) bool { return status(ts, "cpuonly/train") == "completed" })
	if ts["longjob/train"].ClaimedBy != "cuda-host" {
		t.Fatalf("longjob was taken from cuda-host: %+v", ts["longjob/train"])
	}

	// Kill the CUDA host's agent (and its task, as a machine dying would).
	agentA.Process.Signal(syscall.SIGKILL)
	agentA.Wait()
	if b, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Nothing happens until the task is stale: a sweep at the server's
	// (fake) time leaves it, one after moving the clock takes it back.
	if _, err := m.loop.Do(ctx, arbiter.Tick{}); err != nil {
		t.Fatal(err)
	}
	if l := byName()["longjob/train"]; l.Status != "running" {
		t.Fatalf("longjob before the stale time: %s", l.Status)
	}
	clk.Advance(6 * time.Second)
	m.loop.Wake()
	ts = waitFor("longjob swept back and finished by cpu-host", func(ts map[string]arbiter.Task) bool {
		return status(ts, "longjob/train") == "completed"
	})
	long := ts["longjob/train"]
	if long.ClaimedBy != "cpu-host" || long.Attempts != 2 || !strings.Contains(long.LastError, "stale: worker cuda-host stopped heartbeating (attempt 1 of 3)") {
		t.Fatalf("longjob: %+v", long)
	}

	// Every task ran on a host allowed to run it.
	want := map[string]string{"cudajob/train": "cuda-host", "cpuonly/train": "cpu-host", "dedup/x": "cuda-host", "dedup/y": "cuda-host"}
	for k, host := range want {
		if got := ts[k]; got.ClaimedBy != host || got.Status != "completed" {
			t.Errorf("%s: %s by %q, want completed by %s", k, got.Status, got.ClaimedBy, host)
		}
	}

	// The CUDA task held 2 GPUs of cuda-host through an allocation, with
	// CUDA_VISIBLE_DEVICES set to them, and gave them back.
	cj := ts["cudajob/train"]
	files := e2eArtifact(t, url, cj.ArtifactID)
	if len(cj.GPUs) != 2 || files["cvd.txt"] != fmt.Sprintf("%d,%d", cj.GPUs[0], cj.GPUs[1]) || !strings.Contains(files["hyper.json"], `"lr":0.001`) {
		t.Fatalf("cudajob GPUs %v, artifact %v", cj.GPUs, files)
	}
	alloc, err := c.Allocation(ctx, cj.AllocationID)
	if err != nil || alloc.Owner != arbiter.TaskOwnerPrefix+cj.ID || alloc.State != arbiter.StateDestroyed || *alloc.Machine != "cuda-host" {
		t.Fatalf("cudajob's allocation: %+v %v", alloc, err)
	}
	if got := e2eArtifact(t, url, ts["cpuonly/train"].ArtifactID)["where.txt"]; got != "|cpu-host" {
		t.Errorf("cpuonly ran with %q, want no GPUs on cpu-host", got)
	}

	// The two identical outputs were stored once.
	if ts["dedup/x"].ArtifactID != ts["dedup/y"].ArtifactID {
		t.Errorf("identical outputs gave different artifacts")
	}
	arts := cliJSON[[]arbiter.Artifact](t, url, "artifacts", "list")
	ids := map[string]bool{}
	for _, a := range arts {
		ids[a.ID] = true
	}
	if len(arts) != 4 || len(ids) != 4 {
		t.Errorf("got %d artifact records (%d distinct), want 4: cudajob, cpuonly, dedup, longjob", len(arts), len(ids))
	}
	// Stored once each (small ones in a pack): the duplicate upload added
	// nothing.
	blobs, err := m.tasks.artifacts.List()
	if err != nil || len(blobs) != 4 {
		t.Errorf("got %d blobs in the artifact store (%v), want 4", len(blobs), err)
	}

	// Workers and the operator's view.
	ws := cliJSON[[]arbiter.Worker](t, url, "tasks", "workers")
	caps := map[string]arbiter.Capability{}
	for _, w := range ws {
		caps[w.Name] = w.Capability
	}
	if a, b := caps["cuda-host"], caps["cpu-host"]; !a.CUDA || len(a.GPUs) != 8 || b.CUDA || len(b.GPUs) != 0 {
		t.Errorf("worker capabilities: %+v", caps)
	}
	sum := cliJSON[arbiter.TaskSummary](t, url, "tasks", "status")
	if sum.Counts["completed"] != 5 || sum.Counts["failed"] != 1 || len(sum.Failed) != 1 {
		t.Errorf("status: %+v", sum)
	}
	out, _, code = cmdline(t, url, "tasks", "show", arbiter.ShortID(ts["failing/train"].ID))
	if code != 0 || !strings.Contains(out, "Traceback: ValueError: bad split") || !strings.Contains(out, "2 of 2") {
		t.Errorf("tasks show: %s", out)
	}
	// Requeue the failed task: it runs (and fails) again on cpu-host.
	if _, _, code := cmdline(t, url, "tasks", "requeue", arbiter.ShortID(ts["failing/train"].ID)); code != 0 {
		t.Fatal("requeue failed")
	}
	waitFor("failing requeued and failed again", func(ts map[string]arbiter.Task) bool {
		f := ts["failing/train"]
		return f.Status == "failed" && f.ClaimedBy == "cpu-host" && f.Attempts == 2
	})
}

// e2eArtifact downloads an artifact with the CLI and unpacks it.
func e2eArtifact(t *testing.T, url, id string) map[string]string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "a.tar.zst")
	if _, errs, code := cmdline(t, url, "artifacts", "get", id, "--out", out); code != 0 {
		t.Fatalf("artifacts get: %s", errs)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name] = string(b)
	}
}

// TestFleetPythonWorker: a worker in plain Python 3, standard library only,
// speaking the /v1 API as docs/reference/fleet.md §3 lists it.
func TestFleetPythonWorker(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	dir := t.TempDir()
	man := filepath.Join(dir, "m.toml")
	os.WriteFile(man, []byte(`name = "py"
[defaults]
command = ["python3", "-c", "import json, os; h = json.loads(os.environ['HYPER']); open(os.path.join(os.environ['ARBITER_OUTPUT_DIR'], 'w.json'), 'w').write(json.dumps(h))"]
max_attempts = 1
[[jobs]]
model = "gbt"
mode = "realistic"
hyper = { lr = 0.1, depth = 6 }
[[jobs]]
model = "mlp"
mode = "oracle"
[[jobs]]
model = "broken"
mode = "x"
command = ["python3", "-c", "raise SystemExit('no data for split v2')"]
`), 0o600)
	_, url := startServer(t, "[server]\nlocal = false\n[tasks]\nmanifest = \""+man+"\"\n", nil)
	script, _ := filepath.Abs(filepath.Join("testdata", "fleet_worker.py"))
	cmd := exec.Command(py, script, url, "pi-worker")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python worker: %v\n%s", err, out)
	}
	var summary struct {
		Summary [][2]string `json:"summary"`
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), `{"summary"`) {
			json.Unmarshal(sc.Bytes(), &summary)
		}
	}
	got := map[string]string{}
	for _, p := range summary.Summary {
		got[p[0][:strings.LastIndexByte(p[0], '-')]] = p[1]
	}
	if got["gbt-realistic"] != "completed" || got["mlp-oracle"] != "completed" || got["broken-x"] != "failed" {
		t.Fatalf("got %v from\n%s", got, out)
	}
	ts, _ := client.New(url, "").Tasks(context.Background(), client.TaskFilter{Status: "failed"})
	if len(ts) != 1 || !strings.Contains(ts[0].LastError, "no data for split v2") || ts[0].ClaimedBy != "pi-worker" {
		t.Fatalf("failed task: %+v", ts)
	}
}

// TestServerSIGHUPReloadsManifest runs the binary's server and changes its
// manifest: SIGHUP loads it; a broken one is refused and the old one stays.
func TestServerSIGHUPReloadsManifest(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	man := filepath.Join(dir, "m.toml")
	job := func(mode string) string {
		return "[[jobs]]\nmodel = \"m\"\nmode = \"" + mode + "\"\ncommand = [\"true\"]\n"
	}
	os.WriteFile(man, []byte(job("a")), 0o600)
	cfg := filepath.Join(dir, "a.toml")
	os.WriteFile(cfg, []byte("[server]\nlocal = false\n[tasks]\nmanifest = \"m.toml\"\n"), 0o600)
	port := freePort(t)
	url := "http://127.0.0.1:" + port
	srv := exec.Command(bin, "server", "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:"+port)
	logs := &syncBuffer{}
	srv.Stderr = logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	c := client.New(url, "")
	count := func() int {
		ts, err := c.Tasks(context.Background(), client.TaskFilter{})
		if err != nil {
			return -1
		}
		return len(ts)
	}
	poll.Until(t, 30*time.Second, "the manifest's one task", func() bool { return count() == 1 })
	os.WriteFile(man, []byte(job("a")+job("b")), 0o600)
	srv.Process.Signal(syscall.SIGHUP)
	poll.Until(t, 30*time.Second, "the reloaded manifest's two tasks", func() bool { return count() == 2 })
	os.WriteFile(man, []byte(job("a")+"[[jobs]]\nmodel = \"m\"\ngpus = 99\ncommand = [\"true\"]\n"), 0o600)
	srv.Process.Signal(syscall.SIGHUP)
	poll.Until(t, 30*time.Second, "the server to log the failed reload", func() bool { return strings.Contains(logs.String(), "reload failed") })
	if !strings.Contains(logs.String(), "m.toml:7: jobs[1] (m): gpus: must be 0 to 64") {
		t.Errorf("the log does not say what is wrong:\n%s", logs.String())
	}
	if n := count(); n != 2 {
		t.Errorf("after a broken manifest: %d tasks, want the 2 of the one in force", n)
	}
}

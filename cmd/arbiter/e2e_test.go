package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

const twoHosts = `
[[machines]]
name = "gpu1"
tags = ["default"]
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8 } ]

[[machines]]
name = "gpu2"
tags = ["default"]
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8 } ]
`

// startServer runs the real server in-process on a free loopback port.
func startServer(t *testing.T, configText string, clk *clock.Fake, extra ...string) (*serverMain, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	env := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &stderr, Getenv: func(string) string { return "" }}
	args := append([]string{"--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0"}, extra...)
	m, err := newServerMain(env, args)
	if err != nil {
		t.Fatal(err)
	}
	if clk != nil {
		m.now = clk.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatalf("open: %v\n%s", err, stderr.String())
	}
	url := m.URL()
	loop := m.loop
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
		_ = loop
	})
	return m, url
}

// cmdline runs an arbiter client command in-process and returns stdout.
func cmdline(t *testing.T, url string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "ARBITER_URL" {
			return url
		}
		return ""
	}}
	code := run(context.Background(), env, args)
	return out.String(), errb.String(), code
}

func cliJSON[T any](t *testing.T, url string, args ...string) T {
	t.Helper()
	out, errs, code := cmdline(t, url, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("arbiter %v: exit %d: %s", args, code, errs)
	}
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("arbiter %v: output is not one JSON document: %v\n%s", args, err, out)
	}
	return v
}

func TestEndToEndGPUAllocation(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	m, url := startServer(t, twoHosts, clk)

	ms := cliJSON[[]arbiter.MachineStatus](t, url, "status")
	if len(ms) != 2 || ms[0].Free != 8 || ms[1].Free != 8 {
		t.Fatalf("status: %+v", ms)
	}
	a := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "6", "--owner", "alice", "--keepalive", "30")
	b := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "8", "--owner", "bob", "--keepalive", "never")
	if a.State != "ready" || b.State != "ready" || *a.Machine == *b.Machine {
		t.Fatalf("a %s on %v, b %s on %v: want both ready on different machines", a.State, *a.Machine, b.State, *b.Machine)
	}
	// 4 GPUs fit nowhere now (2 free on a's machine): queued, with a reason.
	q := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "4", "--owner", "carol", "--no-wait", "--keepalive", "never")
	if q.State != "queued" || q.WhyQueued == nil {
		t.Fatalf("q: %+v, want queued with why_queued", q)
	}
	// Backfill: 2 GPUs still fit.
	s := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "2", "--owner", "dave", "--keepalive", "never")
	if s.State != "ready" || *s.Machine != *a.Machine {
		t.Fatalf("s: %+v, want backfilled on %s", s, *a.Machine)
	}
	// Impossible: destroyed at once with a reason naming the constraint.
	out, errs, code := cmdline(t, url, "alloc", "--gpus", "1", "--min-vram", "100", "-o", "json")
	if code == 0 || !strings.Contains(out+errs, "100 GiB") {
		t.Fatalf("impossible: exit %d out %s err %s", code, out, errs)
	}
	// Keepalive expiry, driven by the fake clock: a refresh holds it...
	clk.Advance(20 * time.Second)
	cliJSON[arbiter.Allocation](t, url, "keepalive", strconv.FormatInt(a.ID, 10))
	clk.Advance(20 * time.Second)
	m.loop.Wake()
	if g := getAlloc(t, url, a.ID); g.State != "ready" {
		t.Fatalf("a after refresh: %s, want ready", g.State)
	}
	// ...and silence loses it; the queued request gets the freed GPUs.
	clk.Advance(11 * time.Second)
	m.loop.Wake()
	poll.Until(t, 30*time.Second, "the silent allocation to expire", func() bool { return getAlloc(t, url, a.ID).State == "destroyed" })
	if g := getAlloc(t, url, a.ID); *g.Reason != "keepalive expired" {
		t.Fatalf("reason %q", *g.Reason)
	}
	poll.Until(t, 30*time.Second, "the queued allocation to get the freed GPUs", func() bool { return getAlloc(t, url, q.ID).State == "ready" })

	// Release through the CLI; the history keeps it with the reason.
	r := cliJSON[arbiter.Allocation](t, url, "release", strconv.FormatInt(b.ID, 10), "--reason", "done")
	if r.State != "destroyed" || *r.Reason != "done" {
		t.Fatalf("release: %+v", r)
	}
	live := cliJSON[[]arbiter.Allocation](t, url, "ps")
	if len(live) != 2 {
		t.Fatalf("ps: %d live allocations, want 2 (q and s)", len(live))
	}

	// Drain: nothing new lands on the drained machine.
	cliJSON[arbiter.MachineStatus](t, url, "drain", "gpu2")
	d := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "8", "--no-wait", "--keepalive", "never")
	if d.State != "queued" {
		t.Fatalf("on a drained machine: %s, want queued", d.State)
	}
	cliJSON[arbiter.MachineStatus](t, url, "undrain", "gpu2")
	poll.Until(t, 30*time.Second, "the allocation to land on the undrained machine", func() bool { return getAlloc(t, url, d.ID).State == "ready" })
}

func TestEndToEndAllocRunsCommand(t *testing.T) {
	_, url := startServer(t, twoHosts, nil)
	out := filepath.Join(t.TempDir(), "env")
	_, errs, code := cmdline(t, url, "alloc", "--gpus", "2", "--", "sh", "-c", `echo "$CUDA_VISIBLE_DEVICES" > `+out+`; exit 7`)
	if code != 7 {
		t.Fatalf("exit %d, want the command's 7: %s", code, errs)
	}
	got, _ := os.ReadFile(out)
	if strings.TrimSpace(string(got)) != "0,1" {
		t.Fatalf("CUDA_VISIBLE_DEVICES=%q, want 0,1", got)
	}
	live := cliJSON[[]arbiter.Allocation](t, url, "ps")
	if len(live) != 0 {
		t.Fatalf("%d allocations still held after the command exited", len(live))
	}
}

func getAlloc(t *testing.T, url string, id int64) arbiter.Allocation {
	t.Helper()
	a, err := client.New(url, "").Allocation(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestKill9KeepsAcknowledgedAllocations runs the real binary, kills it with
// SIGKILL right after an allocation is acknowledged, restarts it on the same
// data directory and checks the allocation is there with its id and GPUs.
func TestKill9KeepsAcknowledgedAllocations(t *testing.T) {
	dir := t.TempDir()
	bin := buildBinary(t)
	cfg := filepath.Join(dir, "arbiter.toml")
	os.WriteFile(cfg, []byte(twoHosts), 0o600)
	port := freePort(t)
	url := "http://127.0.0.1:" + port
	start := func() *exec.Cmd {
		return serverProcess(t, bin, url, "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:"+port)
	}
	c := client.New(url, "")
	srv := start()
	var last arbiter.Allocation
	for i := 0; i < 5; i++ {
		a, err := c.Allocate(context.Background(), arbiter.Request{Owner: "k", GPUs: 2, KeepaliveS: nil})
		if err != nil {
			t.Fatal(err)
		}
		last = a
	}
	if last.State != arbiter.StateReady {
		t.Fatalf("setup: last allocation %s, want ready", last.State)
	}
	srv.Process.Signal(syscall.SIGKILL) // right after the last acknowledgement
	srv.Wait()

	start()
	got, err := c.Allocation(context.Background(), last.ID)
	if err != nil {
		t.Fatalf("after kill -9: %v", err)
	}
	if got.State != last.State || *got.Machine != *last.Machine || len(got.Devices) != len(last.Devices) {
		t.Fatalf("after kill -9: %+v, want %+v", got, last)
	}
	for i := range got.Devices {
		if got.Devices[i].Index != last.Devices[i].Index {
			t.Fatalf("GPU %d is now %d", last.Devices[i].Index, got.Devices[i].Index)
		}
	}
	next, err := c.Allocate(context.Background(), arbiter.Request{Owner: "k", GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if next.ID != last.ID+1 {
		t.Fatalf("next id %d, want %d", next.ID, last.ID+1)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// buildBinary builds the arbiter binary once per test run, for the tests
// that run it as a process of its own (killed, sent signals); -short skips
// them. ARBITER_TEST_BINARY names one built before, for a machine with no
// Go toolchain (a GPU host the real-GPU test is carried to).
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if bin := os.Getenv("ARBITER_TEST_BINARY"); bin != "" {
		return bin
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "arbiter-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "arbiter")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// runProcess starts cmd with its output kept and stops it when the test
// ends: SIGTERM and up to grace to exit (0: no grace), then SIGKILL. What
// it wrote is logged under name if the test failed.
func runProcess(t *testing.T, cmd *exec.Cmd, name string, grace time.Duration) *syncBuffer {
	t.Helper()
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		if grace > 0 {
			cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-done:
		case <-time.After(grace):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logs.String())
		}
	})
	return logs
}

// gpuConfig is the configuration of a server for GPU tests: agents never
// time out, and gpus is the [gpus] table's keys (and any tables after).
func gpuConfig(gpus string) string {
	return "[server]\nlocal = false\n[agents]\nheartbeat_timeout_s = 3600\n[gpus]\n" + gpus
}

// fakeSMI is the path of the recorded nvidia-smi the tests use.
func fakeSMI(t *testing.T) string {
	t.Helper()
	fake, err := filepath.Abs(filepath.Join("..", "..", "gpu", "testdata", "fake-nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	return fake
}

// fakeSMIDir is a directory holding nvidia-smi, the recorded one the tests
// use, for an agent's PATH.
func fakeSMIDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(fakeSMI(t), filepath.Join(dir, "nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serverProcess runs `arbiter server args…` from bin until the test ends
// (then killed, its log shown if the test failed) and waits for its health
// check at url.
func serverProcess(t *testing.T, bin, url string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"server"}, args...)...)
	runProcess(t, cmd, "server", 0)
	poll.Until(t, 30*time.Second, "the server to answer /api/v1/health", func() bool {
		resp, err := http.Get(url + "/api/v1/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return cmd
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// gpuBurner is the program the real-GPU test runs on a GPU: it takes
// memory there, writes its pid to argv[1] once it has, and then keeps the
// GPU busy until killed; with argv[2] "hold" it keeps the memory and
// leaves the GPU idle.
const gpuBurner = `import os, sys, time, torch
x = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while len(sys.argv) > 2 and sys.argv[2] == "hold":
    time.sleep(3600)
while True:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
`

// TestRealGPU checks GPU ground truth against a real GPU, once through
// NVML and once through the real nvidia-smi: detection, sampling,
// attribution of a real CUDA process to its allocation, the kill of that
// process when its allocation is released (and no grant before it is
// gone), an unmanaged CUDA process flagged and killed, and an allocation
// whose CUDA process holds memory but computes nothing released as idle.
//
// It needs an NVIDIA GPU, its driver and python3 with PyTorch, and runs
// only with ARBITER_TEST_REAL_GPU=1 (CI has no GPU; see
// docs/development.md for how it is run on a GPU host). The host's GPUs
// must be otherwise unused: it refuses to start where a compute process
// runs, and with unmanaged = "kill" any that appears is killed.
func TestRealGPU(t *testing.T) {
	if os.Getenv("ARBITER_TEST_REAL_GPU") != "1" {
		t.Skip("needs an NVIDIA GPU: set ARBITER_TEST_REAL_GPU=1 on a GPU host")
	}
	bin := buildBinary(t)
	python := os.Getenv("ARBITER_TEST_PYTHON")
	if python == "" {
		python = "python3"
	}
	script := filepath.Join(t.TempDir(), "burn.py")
	if err := os.WriteFile(script, []byte(gpuBurner), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(python, "-c", "import torch; assert torch.cuda.is_available()").CombinedOutput(); err != nil {
		t.Fatalf("%s with PyTorch and a CUDA GPU is needed (ARBITER_TEST_PYTHON names another python): %v\n%s", python, err, out)
	}
	for _, src := range []struct{ name, flag string }{{"nvml", ""}, {"nvidia-smi", "--no-nvml"}} {
		t.Run(src.name, func(t *testing.T) { realGPU(t, bin, python, script, src.flag) })
	}
}

// realGPU is TestRealGPU through one sampling path: flag is the agent's
// flag that chooses it ("" for NVML).
func realGPU(t *testing.T, bin, python, script, flag string) {
	args := []string{"agent", "--sample-once", "-o", "json"}
	if flag != "" {
		args = append(args, flag)
	}
	once, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("arbiter %s: %v\n%s", strings.Join(args, " "), err, once)
	}
	t.Logf("arbiter %s:\n%s", strings.Join(args, " "), once)
	// The test kills what it finds on the GPUs: it refuses to start on GPUs
	// someone uses.
	var sampled struct {
		Report arbiter.GPUReport `json:"report"`
	}
	if err := json.Unmarshal(once, &sampled); err != nil {
		t.Fatalf("arbiter %s: %v", strings.Join(args, " "), err)
	}
	for _, g := range sampled.Report.GPUs {
		for _, p := range g.Processes {
			t.Fatalf("GPU %d runs process %d (%s, %s): this test kills processes with no allocation; run it on unused GPUs", g.Index, p.PID, p.User, p.Command)
		}
	}

	_, url := startServer(t, gpuConfig(`sample_s = 0.5
kill_grace_s = 2
unmanaged = "kill"
unmanaged_grace_s = 1
# Idle well after a PyTorch program has started computing (3-4 s).
idle_after_s = 8
idle_grace_s = 1
idle_action = "release"
`), nil)
	c := client.New(url, "")
	ctx := context.Background()
	agentArgs := []string{"agent", "--url", url, "--name", "gpu-host", "--heartbeat", "1s", "--kill-grace", "2s", "--work-dir", t.TempDir()}
	if flag != "" {
		agentArgs = append(agentArgs, flag)
	}
	agentLogs := runProcess(t, exec.Command(bin, agentArgs...), "agent", 15*time.Second)
	var m arbiter.MachineStatus
	machine := func() arbiter.MachineStatus {
		m, err := c.Machine(ctx, "gpu-host")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	dump := func() string {
		b, _ := json.MarshalIndent(machine().Devices, "", "  ")
		smi, _ := exec.Command("nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv").CombinedOutput()
		return fmt.Sprintf("devices: %s\nnvidia-smi compute apps:\n%s\nagent:\n%s", b, smi, agentLogs.String())
	}
	poll.Until(t, 60*time.Second, "the agent reporting its GPUs", func() bool {
		m, err = c.Machine(ctx, "gpu-host")
		if err != nil || len(m.Devices) == 0 {
			return false
		}
		for _, d := range m.Devices {
			if d.Usage == nil {
				return false
			}
		}
		return true
	})
	for _, d := range m.Devices {
		if d.Model == "" || d.VRAMGiB <= 0 || !strings.HasPrefix(d.UUID, "GPU-") || d.Usage.MemTotalMiB <= 0 || !d.Healthy {
			t.Errorf("GPU %d as detected and sampled: %+v, usage %+v", d.Index, d, *d.Usage)
		}
		t.Logf("GPU %d: %s, %.0f GiB, compute %s, %s; sampled %d/%d MiB used", d.Index, d.Model, d.VRAMGiB, d.Compute, d.UUID, d.Usage.MemUsedMiB, d.Usage.MemTotalMiB)
	}
	n := len(m.Devices)

	// A CUDA process under `arbiter alloc -- CMD` is seen on its GPU,
	// attributed to the allocation, with the GPU busy and memory used.
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	alloc, pid, allocSaid := startAlloc(t, bin, url, os.Environ(), pidFile, 90*time.Second,
		"--gpus", fmt.Sprint(n), "--owner", "real", "--keepalive", "5", "--", python, script, pidFile)
	as, err := c.Allocations(ctx, arbiter.AllocationFilter{Owner: "real", State: "live"})
	if err != nil || len(as) != 1 || as[0].State != arbiter.StateReady {
		t.Fatalf("the allocation of arbiter alloc: %+v %v\n%s", as, err, allocSaid())
	}
	held := as[0].ID
	var seen arbiter.DeviceStatus
	if err := poll.Try(30*time.Second, func() error {
		for _, d := range machine().Devices {
			if d.Usage == nil {
				continue
			}
			for _, p := range d.Usage.Processes {
				if p.PID == pid && p.Allocation != nil && *p.Allocation == held && d.Usage.UtilPct != nil && *d.Usage.UtilPct > 0 && p.MemMiB > 0 {
					seen = d
					return nil
				}
			}
		}
		return fmt.Errorf("pid %d of allocation %d not yet reported on a busy GPU, attributed and with memory", pid, held)
	}); err != nil {
		t.Fatalf("%v\n%s", err, dump())
	}
	t.Logf("pid %d seen on GPU %d: util %d%%, %d MiB, attributed to allocation %d; unmanaged %v", pid, seen.Index, *seen.Usage.UtilPct, seen.Usage.MemUsedMiB, held, seen.Unmanaged)
	if seen.Unmanaged {
		t.Errorf("GPU %d flagged unmanaged while only its holder's process runs\n%s", seen.Index, dump())
	}

	// The holder's client dies and its command does not; the allocation
	// released, the agent kills that command, and the GPUs are granted to
	// the next request only once it is gone.
	alloc.Process.Signal(syscall.SIGKILL)
	alloc.Wait()
	if !alive(pid) {
		t.Fatalf("the CUDA program died with arbiter alloc; it said:\n%s", allocSaid())
	}
	waiter, err := c.Allocate(ctx, arbiter.Request{Owner: "waiter", GPUs: n, Machine: "gpu-host", IdleExempt: true})
	if err != nil || waiter.State != arbiter.StateQueued {
		t.Fatalf("a request for every GPU: %+v %v", waiter, err)
	}
	released := time.Now()
	if _, err := c.Release(ctx, held, "real-gpu test"); err != nil {
		t.Fatal(err)
	}
	noGrantWhileAlive(t, c, waiter.ID, pid, 20*time.Second)
	t.Logf("the released allocation's CUDA process was gone %s after the release", time.Since(released).Round(time.Millisecond))
	poll.Until(t, 20*time.Second, "the waiter granted once the GPUs are clean", func() bool {
		w, err := c.Allocation(ctx, waiter.ID)
		return err == nil && w.State == arbiter.StateReady
	})
	t.Logf("waiter granted %s after the release", time.Since(released).Round(time.Millisecond))
	if _, err := c.Release(ctx, waiter.ID, "done"); err != nil {
		t.Fatal(err)
	}

	// A CUDA process no allocation accounts for is flagged, and killed.
	roguePID := filepath.Join(dir, "rogue.pid")
	rogue := exec.Command(python, script, roguePID)
	rogueOut, rogueDone := startWatched(t, rogue)
	started := time.Now()
	flagged := false
	select {
	case <-rogueDone:
	case <-time.After(90 * time.Second):
		t.Fatalf("the unmanaged CUDA process was not killed\n%s", dump())
	}
	for _, ev := range gpuEvents(t, url, arbiter.EventGPUUnmanaged) {
		var u arbiter.GPUUnmanagedEvent
		if json.Unmarshal(ev.Data, &u) == nil && u.PID == rogue.Process.Pid && u.Action == "kill" && u.Machine == "gpu-host" {
			flagged = true
			t.Logf("unmanaged: %+v; killed %s after it started (CUDA start-up included)", u, time.Since(started).Round(time.Millisecond))
		}
	}
	if !flagged {
		t.Fatalf("no gpu.unmanaged event for pid %d; it said:\n%s\n%s", rogue.Process.Pid, rogueOut.String(), dump())
	}
	poll.Until(t, 20*time.Second, "the GPUs clean again", func() bool {
		for _, d := range machine().Devices {
			if d.Unmanaged || d.Usage == nil || len(d.Usage.Processes) > 0 {
				return false
			}
		}
		return true
	})

	// A CUDA program that holds memory and computes nothing reads idle,
	// and its allocation is released, and the program stopped.
	holdPID := filepath.Join(dir, "hold.pid")
	hold := exec.Command(bin, "alloc", "--url", url, "--gpus", fmt.Sprint(n), "--owner", "idler", "--keepalive", "5", "--", python, script, holdPID, "hold")
	holdOut, holdDone := startWatched(t, hold)
	started = time.Now()
	select {
	case <-holdDone:
	case <-time.After(90 * time.Second):
		t.Fatalf("the idle allocation was not reclaimed; arbiter alloc said:\n%s\n%s", holdOut.String(), dump())
	}
	as, err = c.Allocations(ctx, arbiter.AllocationFilter{Owner: "idler"})
	if err != nil || len(as) != 1 || as[0].State != arbiter.StateDestroyed || !strings.HasPrefix(arbiter.StrOr(as[0].Reason, ""), "idle: GPUs unused for ") {
		t.Fatalf("the idle allocation: %+v %v; arbiter alloc said:\n%s", as, err, holdOut.String())
	}
	hp := readPID(t, holdPID, time.Second) // written before the program went idle
	poll.Until(t, 20*time.Second, "the idle program stopped", func() bool { return !alive(hp) })
	t.Logf("idle allocation released %s after arbiter alloc started: %s", time.Since(started).Round(time.Millisecond), *as[0].Reason)
}

// startWatched starts cmd and returns what it says and a channel closed
// when it has exited; it is killed when the test ends.
func startWatched(t *testing.T, cmd *exec.Cmd) (*syncBuffer, <-chan struct{}) {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	return out, done
}

package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// gpuHost is one agent of the GPU ground truth tests: a real `arbiter
// agent` process whose fake nvidia-smi reports the real processes of this
// machine that carry its FAKE_GPU_HOST, with readings scripted in state and
// XIDs appended to xidLog.
type gpuHost struct {
	name, state, xidLog string
	// key is what its fake nvidia-smi looks for in FAKE_GPU_HOST: the name
	// and the test's own directory, so that processes another test (or a
	// crashed earlier run) left behind are never on these GPUs.
	key   string
	agent *exec.Cmd
	logs  *syncBuffer
}

// startGPUHost starts an agent named name with 8 fake H100s; args are
// more agent flags (a --token).
func startGPUHost(t *testing.T, bin, url, name string, args ...string) *gpuHost {
	t.Helper()
	smi := fakeSMI(t)
	h := &gpuHost{name: name, state: t.TempDir()}
	h.key = name + "@" + h.state
	h.xidLog = filepath.Join(h.state, "kmsg")
	if err := os.WriteFile(h.xidLog, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.agent, h.logs = startAgent(t, bin, url, name,
		[]string{"FAKE_NVIDIA_SMI=h100x8", "FAKE_GPU_HOST=" + h.key, "FAKE_GPU_STATE=" + h.state, "FAKE_GPU_UUID_TAG=" + name},
		append([]string{"--nvidia-smi", smi, "--xid-log", h.xidLog}, args...)...)
	return h
}

// env is the environment of a process that runs "on" this host's GPUs.
func (h *gpuHost) env(extra ...string) []string {
	return append(append(os.Environ(), "FAKE_GPU_HOST="+h.key), extra...)
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// startAllocCmd runs `arbiter alloc FLAGS -- sh -c 'exec sleep 300'` on
// host h's GPUs and returns it, CMD's pid and what it has said so far.
func startAllocCmd(t *testing.T, bin, url string, h *gpuHost, flags ...string) (*exec.Cmd, int, func() string) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	return startAlloc(t, bin, url, h.env(), pidFile, 30*time.Second, append(flags, "--", "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 300")...)
}

// startAlloc runs `arbiter alloc ARGS` with env, ARGS ending in a CMD
// that writes its pid to pidFile, and returns it, CMD's pid once written
// (waiting up to within) and what it has said so far. Its output is a
// file, not a pipe: CMD inherits it, and a pipe would keep Wait waiting
// for CMD after arbiter alloc is gone.
func startAlloc(t *testing.T, bin, url string, env []string, pidFile string, within time.Duration, args ...string) (*exec.Cmd, int, func() string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"alloc", "--url", url}, args...)...)
	cmd.Env = env
	out, err := os.Create(filepath.Join(t.TempDir(), "said"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	said := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := readPID(t, pidFile, within)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // should the test end before the agent stopped it
	return cmd, pid, said
}

// readPID waits up to within for a pid file.
func readPID(t *testing.T, path string, within time.Duration) int {
	t.Helper()
	var pid int
	poll.Until(t, within, "pid file "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

// gpuEvents lists the committed events of a kind.
func gpuEvents(t *testing.T, url, kind string) []arbiter.Event {
	t.Helper()
	resp, err := http.Get(url + "/api/v1/events?stream=false&since=0&limit=10000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Events []arbiter.Event `json:"events"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	var evs []arbiter.Event
	for _, ev := range out.Events {
		if ev.Kind == kind {
			evs = append(evs, ev)
		}
	}
	return evs
}

// noGrantWhileAlive polls until pid is gone, failing if allocation id is
// granted while pid still runs, and returns when pid was last seen alive.
// The allocation is read before the process each time, so a grant seen
// before a sign of life is a grant while it ran.
func noGrantWhileAlive(t *testing.T, c *client.Client, id int64, pid int, within time.Duration) time.Time {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	var lastAlive time.Time
	tick := time.NewTicker(5 * time.Millisecond) // watching, not waiting: every look must find it not granted
	defer tick.Stop()
	for ; ; <-tick.C {
		a, err := c.Allocation(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if !alive(pid) {
			return lastAlive
		}
		lastAlive = now
		if a.State == arbiter.StateReady {
			t.Fatalf("allocation %d was granted while pid %d of the GPU's last holder still ran", id, pid)
		}
		if now.After(deadline) {
			t.Fatalf("pid %d still runs after %s", pid, within)
		}
	}
}

const gpuManifest = `name = "gpu-e2e"

[[hosts]]
name = "host-a"

[[jobs]]
model = "train"
mode = "long"
gpus = 1
allowed_hosts = ["host-a"]
command = ["sh", "-c", "echo $$ > {PIDFILE}; exec sleep 300"]
`

// TestEndToEndGPUTruth runs the real server, two real agents (host-a and
// host-b, one machine) and the fake nvidia-smi reporting real processes:
// a cancelled task is killed within 2 s and its GPU granted to nobody
// before; an `arbiter alloc -- CMD` left to expire has CMD killed before
// its GPU is granted again; a process with no allocation is flagged and
// killed; an XID makes a GPU unhealthy and nothing is placed on it; the
// report's GPU-hours agree with the allocations' lives.
func TestEndToEndGPUTruth(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake nvidia-smi reads /proc")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	taskPID := filepath.Join(dir, "task.pid")
	manifest := filepath.Join(dir, "training.toml")
	if err := os.WriteFile(manifest, []byte(strings.ReplaceAll(gpuManifest, "{PIDFILE}", taskPID)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, url := startServer(t, gpuConfig(`sample_s = 0.2
kill_grace_s = 1
unmanaged = "kill"
unmanaged_grace_s = 1
[tasks]
manifest = "`+manifest+`"
`), nil)
	c := client.New(url, "")
	ctx := context.Background()
	a := startGPUHost(t, bin, url, "host-a")
	b := startGPUHost(t, bin, url, "host-b")
	machine := func(name string) arbiter.MachineStatus {
		m, err := c.Machine(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	poll.Until(t, 30*time.Second, "both agents reporting their GPUs", func() bool {
		for _, n := range []string{"host-a", "host-b"} {
			m, err := c.Machine(ctx, n)
			if err != nil || len(m.Devices) != 8 || m.Devices[0].Usage == nil {
				return false
			}
		}
		return true
	})

	// 1. A task cancelled while it runs is killed within 2 s, and its GPU
	// is granted to nobody before.
	var task arbiter.Task
	poll.Until(t, 30*time.Second, "the task running on host-a", func() bool {
		ts, err := c.Tasks(ctx, client.TaskFilter{})
		if err != nil || len(ts) != 1 {
			return false
		}
		task = ts[0]
		return task.Status == "running"
	})
	pid := readPID(t, taskPID, 30*time.Second)
	poll.Until(t, 10*time.Second, "the task's process reported on its GPU, attributed", func() bool {
		for _, d := range machine("host-a").Devices {
			if d.Usage != nil {
				for _, p := range d.Usage.Processes {
					if p.PID == pid && p.Allocation != nil && *p.Allocation == task.AllocationID {
						return true
					}
				}
			}
		}
		return false
	})
	waiter, err := c.Allocate(ctx, arbiter.Request{Owner: "waiter", GPUs: 8, Machine: "host-a", IdleExempt: true})
	if err != nil || waiter.State != arbiter.StateQueued {
		t.Fatalf("a request for all of host-a: %+v %v", waiter, err)
	}
	cancelled := time.Now()
	if _, errs, code := cmdline(t, url, "tasks", "cancel", task.ID[:12], "--reason", "e2e"); code != 0 {
		t.Fatalf("tasks cancel: %s", errs)
	}
	noGrantWhileAlive(t, c, waiter.ID, pid, 2*time.Second)
	if d := time.Since(cancelled); d > 2*time.Second {
		t.Fatalf("the cancelled task was killed after %s", d)
	}
	t.Logf("cancelled task killed %s after the cancel", time.Since(cancelled).Round(time.Millisecond))
	poll.Until(t, 10*time.Second, "the waiter granted once the GPU is clean", func() bool {
		w, err := c.Allocation(ctx, waiter.ID)
		return err == nil && w.State == arbiter.StateReady
	})
	rel := gpuEvents(t, url, arbiter.EventGPUReleased)
	if len(rel) == 0 || !strings.Contains(string(rel[len(rel)-1].Data), `"killed":true`) {
		t.Fatalf("gpu.released after the cancel: %+v", rel)
	}
	if _, err := c.Release(ctx, waiter.ID, "done"); err != nil {
		t.Fatal(err)
	}

	// 2. An `arbiter alloc -- CMD` left to expire has CMD killed before its
	// GPU is granted again.
	alloc, cpid, said := startAllocCmd(t, bin, url, b, "--machine", "host-b", "--gpus", "8", "--owner", "carol", "--keepalive", "2")
	var held arbiter.Allocation
	poll.Until(t, 10*time.Second, "carol's allocation ready with CMD on its GPUs", func() bool {
		as, err := c.Allocations(ctx, arbiter.AllocationFilter{Owner: "carol", State: "live"})
		if err != nil || len(as) != 1 || as[0].State != arbiter.StateReady {
			return false
		}
		held = as[0]
		d := machine("host-b").Devices[0]
		return d.Usage != nil && len(d.Usage.Processes) == 1 && d.Usage.Processes[0].Allocation != nil && *d.Usage.Processes[0].Allocation == held.ID
	})
	// The holder's client dies; its command does not.
	alloc.Process.Signal(syscall.SIGKILL)
	alloc.Wait()
	if !alive(cpid) {
		t.Fatalf("CMD died with arbiter alloc; it said:\n%s", said())
	}
	next, err := c.Allocate(ctx, arbiter.Request{Owner: "next", GPUs: 8, Machine: "host-b", IdleExempt: true})
	if err != nil || next.State != arbiter.StateQueued {
		t.Fatalf("next: %+v %v", next, err)
	}
	noGrantWhileAlive(t, c, next.ID, cpid, 10*time.Second)
	if got, _ := c.Allocation(ctx, held.ID); got.State != arbiter.StateDestroyed || arbiter.StrOr(got.Reason, "") != "keepalive expired" {
		t.Fatalf("carol's allocation: %s %q", got.State, arbiter.StrOr(got.Reason, ""))
	}
	poll.Until(t, 10*time.Second, "next granted once CMD is gone", func() bool {
		n, err := c.Allocation(ctx, next.ID)
		return err == nil && n.State == arbiter.StateReady
	})
	if _, err := c.Release(ctx, next.ID, "done"); err != nil {
		t.Fatal(err)
	}

	// 3. A process with no allocation is flagged, nothing is placed on its
	// GPU, and (unmanaged = "kill") it is killed after its grace.
	rogue := exec.Command("sleep", "300")
	rogue.Env = b.env("CUDA_VISIBLE_DEVICES=5")
	if err := rogue.Start(); err != nil {
		t.Fatal(err)
	}
	rogueDone := make(chan struct{})
	go func() { rogue.Wait(); close(rogueDone) }()
	t.Cleanup(func() { rogue.Process.Kill(); <-rogueDone })
	poll.Until(t, 10*time.Second, "the rogue process flagged", func() bool { return machine("host-b").Devices[5].Unmanaged })
	out, _, _ := cmdline(t, url, "status")
	if !strings.Contains(out, "UNMANAGED") || !strings.Contains(out, fmt.Sprintf("process %d", rogue.Process.Pid)) {
		t.Errorf("arbiter status does not show the unmanaged process:\n%s", out)
	}
	select {
	case <-rogueDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the unmanaged process was not killed")
	}
	um := gpuEvents(t, url, arbiter.EventGPUUnmanaged)
	var u arbiter.GPUUnmanagedEvent
	if len(um) == 0 || json.Unmarshal(um[len(um)-1].Data, &u) != nil || u.Machine != "host-b" || u.GPU != 5 ||
		u.PID != rogue.Process.Pid || u.User == "" || u.Action != "kill" {
		t.Fatalf("gpu.unmanaged: %+v", u)
	}
	if len(gpuEvents(t, url, arbiter.EventGPUKill)) == 0 {
		t.Fatal("no gpu.kill event")
	}
	poll.Until(t, 10*time.Second, "GPU 5 of host-b clean again", func() bool { return !machine("host-b").Devices[5].Unmanaged })

	// 4. An XID makes a GPU unhealthy; nothing is placed on it.
	f, err := os.OpenFile(a.xidLog, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "NVRM: Xid (PCI:0000:ab:00): 79, pid=0, GPU has fallen off the bus.")
	f.Close()
	poll.Until(t, 10*time.Second, "GPU 5 of host-a unhealthy", func() bool { return machine("host-a").Devices[5].State == arbiter.GPUUnhealthy })
	d5 := machine("host-a").Devices[5]
	if d5.Health == nil || d5.Health.OK || d5.Health.Reason != "XID 79: GPU has fallen off the bus" {
		t.Fatalf("GPU 5 health: %+v", d5.Health)
	}
	eight, _ := c.Allocate(ctx, arbiter.Request{Owner: "x", GPUs: 8, Machine: "host-a", IdleExempt: true})
	seven, _ := c.Allocate(ctx, arbiter.Request{Owner: "x", GPUs: 7, Machine: "host-a", IdleExempt: true})
	if eight.State != arbiter.StateQueued || seven.State != arbiter.StateReady {
		t.Fatalf("with GPU 5 unhealthy: 8 GPUs %s, 7 GPUs %s", eight.State, seven.State)
	}
	for _, d := range seven.Devices {
		if d.Index == 5 {
			t.Fatal("the unhealthy GPU was placed")
		}
	}
	c.Release(ctx, eight.ID, "done")
	c.Release(ctx, seven.ID, "done")
	if len(gpuEvents(t, url, arbiter.EventGPUUnhealthy)) != 1 {
		t.Fatal("want one gpu.unhealthy event")
	}

	// 5. The report's GPU-hours agree with the allocations' lives.
	poll.Until(t, 10*time.Second, "every allocation ended", func() bool {
		as, _ := c.Allocations(ctx, arbiter.AllocationFilter{State: "live"})
		return len(as) == 0
	})
	as, err := c.Allocations(ctx, arbiter.AllocationFilter{})
	if err != nil {
		t.Fatal(err)
	}
	lives := map[string]float64{}
	for _, al := range as {
		if al.ReadyAt != nil && al.DestroyedAt != nil {
			lives[al.Owner] += al.DestroyedAt.Sub(*al.ReadyAt).Hours() * float64(len(al.Devices))
		}
	}
	rep := cliJSON[arbiter.UsageReport](t, url, "report", "--by", "owner")
	if len(rep.Rows) != len(lives) {
		t.Fatalf("report rows %+v, allocations' lives %v", rep.Rows, lives)
	}
	onePeriod := 0.2 / 3600 * 8 // a sample period on all 8 GPUs, in GPU-hours
	for _, r := range rep.Rows {
		if math.Abs(r.GPUHours-lives[r.Key]) > onePeriod {
			t.Errorf("%s: report %.6f GPU-hours, allocations lived %.6f", r.Key, r.GPUHours, lives[r.Key])
		}
		if r.BusyGPUHours+r.IdleGPUHours > r.GPUHours+onePeriod {
			t.Errorf("%s: busy %.6f + idle %.6f exceed held %.6f", r.Key, r.BusyGPUHours, r.IdleGPUHours, r.GPUHours)
		}
	}
	out, errs, code := cmdline(t, url, "report", "--by", "machine", "-o", "csv")
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil || len(rows) != 3 || rows[0][0] != "key" || rows[1][0] != "host-a" || rows[2][0] != "host-b" {
		t.Fatalf("report -o csv: %d %s\n%s", code, errs, out)
	}
	t.Logf("report by owner: %+v", rep.Rows)
}

// TestEndToEndGPUIdle: an allocation whose GPUs stay idle is warned
// (allocation.idle, and `arbiter alloc -- CMD` says so), then released
// with the reason the contract names.
func TestEndToEndGPUIdle(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake nvidia-smi reads /proc")
	}
	bin := buildBinary(t)
	_, url := startServer(t, gpuConfig(`sample_s = 0.2
idle_after_s = 2
idle_grace_s = 2
idle_action = "release"
`), nil)
	c := client.New(url, "")
	ctx := context.Background()
	h := startGPUHost(t, bin, url, "host-a")
	startGPUHost(t, bin, url, "host-b")
	poll.Until(t, 30*time.Second, "host-a reporting", func() bool {
		m, err := c.Machine(ctx, "host-a")
		return err == nil && len(m.Devices) == 8 && m.Devices[0].Usage != nil
	})
	// Every GPU of host-a reads idle, processes or not.
	for i := 0; i < 8; i++ {
		os.WriteFile(filepath.Join(h.state, fmt.Sprintf("util.%d", i)), []byte("1"), 0o600)
	}
	// An exempt allocation is spared.
	exempt, _ := c.Allocate(ctx, arbiter.Request{Owner: "svc", GPUs: 1, Machine: "host-a", IdleExempt: true})
	started := time.Now()
	alloc, pid, said := startAllocCmd(t, bin, url, h, "--machine", "host-a", "--gpus", "2", "--owner", "dave", "--keepalive", "3")
	done := make(chan error, 1)
	go func() { done <- alloc.Wait() }()
	var got error
	select {
	case got = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the idle allocation was not reclaimed; alloc said:\n%s", said())
	}
	took := time.Since(started)
	as, _ := c.Allocations(ctx, arbiter.AllocationFilter{Owner: "dave"})
	if len(as) != 1 || as[0].State != arbiter.StateDestroyed || !strings.HasPrefix(arbiter.StrOr(as[0].Reason, ""), "idle: GPUs unused for ") || as[0].IdleSince == nil {
		t.Fatalf("dave's allocation: %+v", as)
	}
	if got == nil || !strings.Contains(said(), "is idle: its GPUs have been unused since") ||
		!strings.Contains(said(), "idle: GPUs unused for") {
		t.Fatalf("arbiter alloc exited %v after %s; it said:\n%s", got, took, said())
	}
	if took < 4*time.Second {
		t.Fatalf("reclaimed after %s, before idle_after_s + idle_grace_s", took)
	}
	poll.Until(t, 15*time.Second, "CMD stopped", func() bool { return !alive(pid) })
	if ev := gpuEvents(t, url, arbiter.EventAllocationIdle); len(ev) != 1 || ev[0].Subject != fmt.Sprintf("allocation/%d", as[0].ID) {
		t.Fatalf("allocation.idle events: %+v", ev)
	}
	if e, _ := c.Allocation(ctx, exempt.ID); e.State != arbiter.StateReady || e.IdleSince != nil {
		t.Fatalf("the exempt allocation: %s idle since %v", e.State, e.IdleSince)
	}
	out, _, _ := cmdline(t, url, "ps", "--all")
	if !strings.Contains(out, "idle: GPUs unused for") {
		t.Errorf("ps does not show the reason:\n%s", out)
	}
}

// TestEndToEndUnhealthyHolderIsTold: when a GPU an `arbiter alloc -- CMD`
// holds becomes unhealthy (an XID), the command's user is told, once.
func TestEndToEndUnhealthyHolderIsTold(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake nvidia-smi reads /proc")
	}
	bin := buildBinary(t)
	_, url := startServer(t, gpuConfig("sample_s = 0.2\n"), nil)
	h := startGPUHost(t, bin, url, "host-c")
	c := client.New(url, "")
	ctx := context.Background()
	poll.Until(t, 30*time.Second, "host-c reporting", func() bool {
		m, err := c.Machine(ctx, "host-c")
		return err == nil && len(m.Devices) == 8 && m.Devices[0].Usage != nil
	})
	_, _, said := startAllocCmd(t, bin, url, h, "--owner", "dana", "--machine", "host-c", "--gpus", "1", "--keepalive", "1")
	var held int
	poll.Until(t, 20*time.Second, "dana's command holding a GPU", func() bool {
		as, err := c.Allocations(ctx, arbiter.AllocationFilter{Owner: "dana", State: arbiter.StateReady})
		if err != nil || len(as) != 1 {
			return false
		}
		held = as[0].Devices[0].Index
		return true
	})
	// The kernel says the GPU fell off the bus, by its PCI address.
	rows, err := os.ReadFile(filepath.Join("..", "..", "gpu", "testdata", "h100x8.csv"))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Split(strings.Split(strings.TrimSpace(string(rows)), "\n")[held], ", ")
	pci := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(fields[len(fields)-1], "0000"), ".0"))
	f, err := os.OpenFile(h.xidLog, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "NVRM: Xid (PCI:%s): 79, pid=0, GPU has fallen off the bus.\n", pci)
	f.Close()
	poll.Until(t, 15*time.Second, "arbiter alloc telling dana", func() bool {
		return strings.Contains(said(), fmt.Sprintf("GPU %d of host-c, held by allocation", held)) && strings.Contains(said(), "is unhealthy (XID 79")
	})
	if n := strings.Count(said(), "is unhealthy"); n != 1 {
		t.Errorf("told %d times, want once:\n%s", n, said())
	}
}

// TestEndToEndAgentInAPIDNamespace runs the agent in a PID namespace of
// its own (unshare, as a container without --pid=host is) with a process
// on one of its GPUs that no allocation accounts for: the GPU is flagged,
// and with unmanaged = "kill" the server orders the kill, but the agent,
// unable to trust pids there, refuses it and says why, and reports the
// process by its pid alone. It needs
// unshare(1) and the right to make PID namespaces (root); it skips
// without them.
func TestEndToEndAgentInAPIDNamespace(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("PID namespaces are Linux's")
	}
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot make a PID namespace here: %v %s", err, out)
	}
	bin := buildBinary(t)
	_, url := startServer(t, gpuConfig(`sample_s = 0.2
unmanaged = "kill"
unmanaged_grace_s = 0
`), nil)
	smi := fakeSMI(t)
	dir := t.TempDir()
	key := "ns@" + dir
	// In the namespace: a process on GPU 5 (what the fake reports as one),
	// then the agent. When the namespace's first process (the shell) ends,
	// every process in it is killed.
	script := fmt.Sprintf(`CUDA_VISIBLE_DEVICES=5 sleep 300 & exec %s agent --url %s --name ns-host --heartbeat 1s --work-dir %s --no-nvml --nvidia-smi %s --xid-log none`,
		bin, url, t.TempDir(), smi)
	// --kill-child: unshare, killed at the end (it ignores SIGTERM while
	// it waits), passes SIGTERM on to the agent; the namespace (the sleep
	// too) ends with it.
	cmd := exec.Command("unshare", "--pid", "--mount-proc", "--kill-child=SIGTERM", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "FAKE_NVIDIA_SMI=h100x8", "FAKE_GPU_HOST="+key, "FAKE_GPU_STATE="+dir, "FAKE_GPU_UUID_TAG=ns")
	logs := runProcess(t, cmd, "agent in a PID namespace", 0)
	c := client.New(url, "")
	ctx := context.Background()
	poll.Until(t, 30*time.Second, "GPU 5 of ns-host flagged unmanaged", func() bool {
		m, err := c.Machine(ctx, "ns-host")
		return err == nil && len(m.Devices) == 8 && m.Devices[5].Unmanaged
	})
	poll.Until(t, 10*time.Second, "the server ordering the kill", func() bool { return len(gpuEvents(t, url, arbiter.EventGPUKill)) > 0 })
	poll.Until(t, 10*time.Second, "the agent refusing it", func() bool {
		return strings.Contains(logs.String(), "not stopping a process on a GPU: its pid cannot be trusted here")
	})
	if !strings.Contains(logs.String(), "runs in a PID namespace of its own") {
		t.Errorf("the agent did not say why at start:\n%s", logs.String())
	}
	// The process still runs, so its GPU is still flagged; it is reported
	// by its pid alone, nothing read of whatever has that pid here.
	m, err := c.Machine(ctx, "ns-host")
	if err != nil || !m.Devices[5].Unmanaged {
		t.Fatalf("GPU 5 no longer flagged: the process was stopped (%v)\n%s", err, logs.String())
	}
	if u := m.Devices[5].Usage; u == nil || len(u.Processes) != 1 || u.Processes[0].User != "" || u.Processes[0].Command != "" || u.Processes[0].Allocation != nil {
		t.Fatalf("GPU 5's process, reported from a PID namespace of its own: %+v", u)
	}
	if n := strings.Count(logs.String(), "not stopping a process on a GPU"); n != 1 {
		t.Errorf("refusal logged %d times, want once:\n%s", n, logs.String())
	}
}

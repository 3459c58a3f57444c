package gpu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/poll"
)

func TestParseSampleCSV(t *testing.T) {
	out := []byte(`0, GPU-a, 00000000:18:00.0, 87, 61230, 81559, 61, 512.34, 0
1, GPU-b, 00000000:2A:00.0, [N/A], [N/A], [N/A], [N/A], [Not Supported], [N/A]
Unable to determine the device handle for GPU00000000:3A:00.0: Unknown Error

`)
	gpus, notes, err := ParseSampleCSV(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 || len(notes) != 1 {
		t.Fatalf("got %d GPUs, %d notes", len(gpus), len(notes))
	}
	g := gpus[0]
	if g.Index != 0 || g.UUID != "GPU-a" || g.BusID != "0000:18:00" || *g.UtilPct != 87 || g.MemUsedMiB != 61230 ||
		g.MemTotalMiB != 81559 || *g.TempC != 61 || *g.PowerW != 512.34 || *g.ECCUncorrected != 0 {
		t.Fatalf("GPU 0: %+v", g)
	}
	if g := gpus[1]; g.UtilPct != nil || g.TempC != nil || g.PowerW != nil || g.ECCUncorrected != nil || g.MemTotalMiB != 0 {
		t.Fatalf("GPU 1, all [N/A]: %+v", g)
	}
	// Recorded on a real H200 running a PyTorch matrix product (2026-11-28).
	h200, _, err := ParseSampleCSV([]byte("0, GPU-a090fa8b-bae9-e7db-4515-3e967f32b204, 00000000:00:06.0, 100, 1395, 143771, 56, 684.78, 0\n"))
	if err != nil || len(h200) != 1 || *h200[0].UtilPct != 100 || h200[0].MemUsedMiB != 1395 || h200[0].BusID != "0000:00:06" || *h200[0].PowerW != 684.78 {
		t.Fatalf("the H200's sample: %+v %v", h200, err)
	}
	for _, s := range []string{"No devices were found\n", ""} {
		if gpus, _, err := ParseSampleCSV([]byte(s)); err != nil || len(gpus) != 0 {
			t.Errorf("%q: %v %v", s, gpus, err)
		}
	}
	for _, bad := range []string{
		"0, GPU-a, 0000:18:00, 101, 1, 1, 1, 1, 0", // utilization over 100
		"0, GPU-a, 0000:18:00, 5, x, 1, 1, 1, 0",   // memory
		"0, GPU-a, 0000:18:00, 5, 1, 1, 1, 1",      // a column short
		"x, GPU-a, 0000:18:00, 5, 1, 1, 1, 1, 0",   // index
		"0, GPU-a, 0000:18:00, 5, 1, 1, 1, -3, 0",  // power
		"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
		"0, GPU-a, b, 1, 1, 1, 1, 1, 0\n0, GPU-b, b, 1, 1, 1, 1, 1, 0", // index twice
	} {
		if _, _, err := ParseSampleCSV([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseComputeApps(t *testing.T) {
	apps, err := ParseComputeApps([]byte("GPU-a, 4242, 61000\nGPU-b, 17, [N/A]\n"))
	if err != nil || !reflect.DeepEqual(apps, []App{{"GPU-a", 4242, 61000}, {"GPU-b", 17, 0}}) {
		t.Fatalf("got %+v %v", apps, err)
	}
	// Recorded on a real H200 (2026-11-28).
	if apps, err := ParseComputeApps([]byte("GPU-a090fa8b-bae9-e7db-4515-3e967f32b204, 557, 1386\n")); err != nil || !reflect.DeepEqual(apps, []App{{"GPU-a090fa8b-bae9-e7db-4515-3e967f32b204", 557, 1386}}) {
		t.Fatalf("the H200's process: %+v %v", apps, err)
	}
	if apps, err := ParseComputeApps([]byte("No running processes found\n")); err != nil || len(apps) != 0 {
		t.Fatalf("none: %+v %v", apps, err)
	}
	for _, bad := range []string{"GPU-a, 0, 1", "GPU-a, x, 1", "GPU-a, 1", ", 1, 1", "GPU-a, 1, -1"} {
		if _, err := ParseComputeApps([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00",
		"0000:3b:00":       "0000:3b:00",
		"3B:00.0":          "0000:3b:00",
		"00000001:AB:1F.0": "0001:ab:1f",
		"garbage":          "garbage",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

func TestParseXIDLine(t *testing.T) {
	for line, want := range map[string]XIDEvent{
		"NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.":                          {"0000:3b:00", 79},
		"3,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE (0x1)": {"0000:18:00", 48},
		"[ 1234.5678] NVRM: Xid (PCI:0001:AB:00): 119, pid=2, Timeout after 6s of waiting for RPC":    {"0001:ab:00", 119},
		"kernel: [1.2] NVRM: Xid (PCI:0000:5d:00): 13 Graphics Exception: ESR 0x4041b0=0x3f20ffff":    {"0000:5d:00", 13},
	} {
		if got, ok := ParseXIDLine(line); !ok || got != want {
			t.Errorf("%q: got %+v %v, want %+v", line, got, ok, want)
		}
	}
	for _, line := range []string{"", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module", "NVRM: Xid (PCI:0000:3b:00): x, pid", "NVRM: Xid (PCI:): 79,", "NVRM: Xid (PCI:0000:3b:00): 0, pid"} {
		if ev, ok := ParseXIDLine(line); ok {
			t.Errorf("%q: got %+v", line, ev)
		}
	}
}

func TestXIDReaderFollowsAFile(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Unix only")
	}
	path := filepath.Join(t.TempDir(), "kmsg")
	os.WriteFile(path, []byte("NVRM: Xid (PCI:0000:3b:00): 79, old\n"), 0o600)
	x, err := OpenXIDLog(path)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if evs, err := x.Read(); err != nil || len(evs) != 0 {
		t.Fatalf("what was there before: %v %v", evs, err)
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("unrelated\nNVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE\nNVRM: Xid (PCI:0000:2a:00): 7")
	evs, err := x.Read()
	if err != nil || !reflect.DeepEqual(evs, []XIDEvent{{"0000:18:00", 48}}) {
		t.Fatalf("first read: %+v %v", evs, err)
	}
	f.WriteString("9, pid=0, off the bus\n")
	f.Close()
	if evs, _ := x.Read(); !reflect.DeepEqual(evs, []XIDEvent{{"0000:2a:00", 79}}) {
		t.Fatalf("a line finished later: %+v", evs)
	}
	if evs, _ := x.Read(); len(evs) != 0 {
		t.Fatalf("read twice: %+v", evs)
	}
}

func TestKmsgDoesNotBlock(t *testing.T) {
	x, err := OpenXIDLog("/dev/kmsg")
	if err != nil {
		t.Skipf("cannot read /dev/kmsg here: %v", err)
	}
	defer x.Close()
	done := make(chan struct{})
	go func() { x.Read(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reading /dev/kmsg blocked")
	}
}

func TestParseStatAndEnviron(t *testing.T) {
	stat := []byte("4242 (python (train) x) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 2\n")
	if comm, ppid, start, err := ParseStat(stat); err != nil || comm != "python (train) x" || ppid != 17 || start != "123456" {
		t.Fatalf("got %q %d %q %v", comm, ppid, start, err)
	}
	for _, bad := range []string{"", "1 (a) S", "1 (a) S x 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"} {
		if _, _, _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	env := []byte("HOME=/root\x00ARBITER_ALLOCATION_ID=17\x00PATH=/bin\x00")
	if id, ok := AllocationFromEnviron(env); !ok || id != 17 {
		t.Fatalf("got %d %v", id, ok)
	}
	for _, e := range []string{"", "ARBITER_ALLOCATION_ID=x", "ARBITER_ALLOCATION_ID=0", "XARBITER_ALLOCATION_ID=3", "ARBITER_ALLOCATION_ID="} {
		if id, ok := AllocationFromEnviron([]byte(e)); ok {
			t.Errorf("%q: got %d", e, id)
		}
	}
	if uid, ok := ParseStatusUID([]byte("Name:\tx\nUid:\t1000\t1000\t1000\t1000\n")); !ok || uid != "1000" {
		t.Fatalf("uid: %q %v", uid, ok)
	}
	if got := CommandLine([]byte("python\x00train.py\x00--lr\x000.1\x00")); got != "python train.py --lr 0.1" {
		t.Fatalf("command: %q", got)
	}
	if got := CommandLine([]byte(strings.Repeat("é", 300))); len(got) > 256 || !strings.HasSuffix(got, "…") {
		t.Fatalf("long command: %d bytes", len(got))
	}
}

// TestProcReaderAttributes starts real processes: a shell with
// ARBITER_ALLOCATION_ID and its child (attributed through its ancestor),
// and one without (unattributed).
func TestProcReaderAttributes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	parent := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	parent.Env = append(os.Environ(), AllocationEnv+"=42")
	out, _ := parent.StdoutPipe()
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Process.Kill()
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	child, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	defer syscall.Kill(child, syscall.SIGKILL)
	other := exec.Command("sleep", "30")
	other.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()

	r := NewProcReader("")
	// The child's pid is known before it has exec'd sleep, and even a
	// started process shows no command line for a moment (exec sets its
	// arguments last): wait until both show theirs.
	poll.Until(t, 10*time.Second, "the processes to exec sleep", func() bool {
		return r.Info(child).Command == "sleep 30" && r.Info(other.Process.Pid).Command == "sleep 30"
	})
	if got := r.Info(parent.Process.Pid); got.Allocation != 42 || !strings.HasPrefix(got.Command, "sh -c") || got.User == "" {
		t.Fatalf("parent: %+v", got)
	}
	if got := r.Info(child); got.Allocation != 42 || got.Command != "sleep 30" {
		t.Fatalf("child: %+v", got)
	}
	if got := r.Info(other.Process.Pid); got.Allocation != 0 || got.Command != "sleep 30" {
		t.Fatalf("other: %+v", got)
	}
	if _, got := r.Identity(child); got != 42 {
		t.Fatalf("Identity: allocation %d", got)
	}
	// A process that is gone is just its pid; so is one in a proc tree
	// that cannot be read.
	if got := r.Info(1 << 30); got != (ProcInfo{PID: 1 << 30}) {
		t.Fatalf("gone: %+v", got)
	}
	if got := NewProcReader(t.TempDir()).Info(child); got != (ProcInfo{PID: child}) {
		t.Fatalf("unreadable: %+v", got)
	}
	r.Prune()
	r.Info(child)
	r.Prune()
	if len(r.cache) != 1 {
		t.Fatalf("prune kept %d entries, want 1", len(r.cache))
	}
}

// TestProcReaderSeesExec: a process that execs keeps its pid and start
// time; what the reader cached of it before (its command, its
// allocation) must not outlive the exec.
func TestProcReaderSeesExec(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "100")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	become := func(comm, cmdline, environ string) {
		t.Helper()
		stat := "100 (" + comm + ") S 1 100 100 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"
		for name, data := range map[string]string{"stat": stat, "cmdline": cmdline, "environ": environ} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := NewProcReader(root)
	become("sh", "sh\x00-c\x00exec train\x00", "PATH=/bin\x00")
	if got := r.Info(100); got.Command != "sh -c exec train" || got.Allocation != 0 {
		t.Fatalf("before exec: %+v", got)
	}
	// Mid-exec: the new name is set before the new arguments and
	// environment are.
	become("train", "", "")
	if got := r.Info(100); got.Command != "" {
		t.Fatalf("mid-exec: %+v", got)
	}
	become("train", "train\x00--fast\x00", AllocationEnv+"=7\x00")
	if got := r.Info(100); got.Command != "train --fast" || got.Allocation != 7 {
		t.Fatalf("after exec: %+v, want the new command and allocation 7", got)
	}
}

// TestSamplerFakeSMI samples the fake nvidia-smi, which reports real
// processes: one on GPUs 1 and 3 for this host, one for another host.
func TestSamplerFakeSMI(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake reads /proc")
	}
	fakePATH(t, "h100x8")
	state := t.TempDir()
	t.Setenv("FAKE_GPU_STATE", state)
	t.Setenv("FAKE_GPU_HOST", "me-"+strconv.Itoa(os.Getpid()))
	mine := exec.Command("sleep", "30")
	mine.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES=1,3")
	theirs := exec.Command("sleep", "30")
	theirs.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES=2", "FAKE_GPU_HOST=someone-else")
	for _, c := range []*exec.Cmd{mine, theirs} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	poll.Execed(t, "sleep", mine.Process.Pid, theirs.Process.Pid) // the fake reads their environments
	os.WriteFile(filepath.Join(state, "util.3"), []byte("3"), 0o600)
	os.WriteFile(filepath.Join(state, "ecc.4"), []byte("2"), 0o600)
	os.WriteFile(filepath.Join(state, "gone.6"), nil, 0o600)
	xlog := filepath.Join(t.TempDir(), "kmsg")
	os.WriteFile(xlog, nil, 0o600)
	s, err := NewSampler(SampleOptions{DisableNVML: true, XIDLog: xlog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f, _ := os.OpenFile(xlog, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("NVRM: Xid (PCI:0000:9a:00): 79, pid=0, GPU has fallen off the bus.\n")
	f.Close()
	smp, err := s.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if smp.Source != SourceNvidiaSMI || len(smp.GPUs) != 7 {
		t.Fatalf("sample: source %s, %d GPUs (want 7: GPU 6 is gone)", smp.Source, len(smp.GPUs))
	}
	by := map[int]GPUSample{}
	for _, g := range smp.GPUs {
		by[g.Index] = g
	}
	pid := mine.Process.Pid
	if g := by[1]; *g.UtilPct != 80 || len(g.Processes) != 1 || g.Processes[0].PID != pid || g.MemUsedMiB != 1024 {
		t.Fatalf("GPU 1: %+v", g)
	}
	if g := by[3]; *g.UtilPct != 3 || len(g.Processes) != 1 {
		t.Fatalf("GPU 3: %+v", g)
	}
	if g := by[2]; len(g.Processes) != 0 || *g.UtilPct != 0 {
		t.Fatalf("GPU 2 (another host's process): %+v", g)
	}
	if g := by[4]; *g.ECCUncorrected != 2 || !reflect.DeepEqual(g.XIDs, []int{79}) {
		t.Fatalf("GPU 4: %+v", g)
	}
	if _, ok := by[6]; ok || len(smp.Notes) == 0 {
		t.Fatalf("GPU 6 is gone: %+v", smp.Notes)
	}
}

func TestNewSamplerWithoutTools(t *testing.T) {
	if _, err := NewSampler(SampleOptions{DisableNVML: true, NvidiaSMI: NoNvidiaSMI}); err != ErrNoGPUTool {
		t.Fatalf("got %v, want ErrNoGPUTool", err)
	}
	if _, err := NewSampler(SampleOptions{DisableNVML: true, NvidiaSMI: "/no/such/nvidia-smi"}); err == nil {
		t.Fatal("a missing nvidia-smi named explicitly is an error")
	}
}

func FuzzParseSampleCSV(f *testing.F) {
	f.Add("0, GPU-a, 00000000:18:00.0, 87, 61230, 81559, 61, 512.34, 0\n")
	f.Add("1, GPU-b, 00000000:2A:00.0, [N/A], [N/A], [N/A], [N/A], [Not Supported], [N/A]\n")
	f.Add("Unable to determine the device handle for GPU00000000:3A:00.0: Unknown Error\nNo devices were found\n")
	f.Fuzz(func(t *testing.T, s string) {
		gpus, _, err := ParseSampleCSV([]byte(s))
		if err != nil {
			return
		}
		for _, g := range gpus {
			if g.Index < 0 || g.UtilPct != nil && (*g.UtilPct < 0 || *g.UtilPct > 100) || g.MemUsedMiB < 0 {
				t.Fatalf("%q: out of range: %+v", s, g)
			}
		}
	})
}

func FuzzParseComputeApps(f *testing.F) {
	f.Add("GPU-a, 4242, 61000\nGPU-b, 17, [N/A]\n")
	f.Add("No running processes found\n")
	f.Fuzz(func(t *testing.T, s string) {
		apps, err := ParseComputeApps([]byte(s))
		if err != nil {
			return
		}
		for _, a := range apps {
			if a.PID <= 0 || a.MemMiB < 0 || a.UUID == "" {
				t.Fatalf("%q: %+v", s, a)
			}
		}
	})
}

func FuzzParseXIDLine(f *testing.F) {
	f.Add("3,1234,5678901,-;NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE (0x1)")
	f.Add("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.")
	f.Fuzz(func(t *testing.T, s string) {
		if ev, ok := ParseXIDLine(s); ok && (ev.XID <= 0 || ev.XID > 1000 || ev.BusID == "") {
			t.Fatalf("%q: %+v", s, ev)
		}
	})
}

func FuzzProcFiles(f *testing.F) {
	f.Add([]byte("4242 (python (train) x) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 2\n"))
	f.Add([]byte("A=1\x00ARBITER_ALLOCATION_ID=17\x00"))
	f.Add([]byte("Uid:\t1000\t1000\t1000\t1000\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, ppid, start, err := ParseStat(b); err == nil && (ppid < 0 || !isDigits(start)) {
			t.Fatalf("stat %q: %d %q", b, ppid, start)
		}
		if id, ok := AllocationFromEnviron(b); ok && id <= 0 {
			t.Fatalf("environ %q: %d", b, id)
		}
		ParseStatusUID(b)
		if c := CommandLine(b); len(c) > maxCommand {
			t.Fatalf("command %d bytes", len(c))
		}
	})
}

func TestForeignPIDNamespace(t *testing.T) {
	for _, tt := range []struct {
		link    string
		foreign bool
	}{{"pid:[4026531836]", false}, {"pid:[4026532178]", true}} {
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "self", "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(tt.link, filepath.Join(root, "self", "ns", "pid")); err != nil {
			t.Fatal(err)
		}
		if got, err := ForeignPIDNamespace(root); err != nil || got != tt.foreign {
			t.Errorf("%s: got %v %v, want %v", tt.link, got, err, tt.foreign)
		}
	}
	if _, err := ForeignPIDNamespace(t.TempDir()); !errors.Is(err, ErrUnknownPIDNamespace) {
		t.Errorf("no ns link: got %v, want ErrUnknownPIDNamespace", err)
	}
	if runtime.GOOS == "linux" {
		// This process, in whatever namespace the tests run: the call
		// reads it (a container's test run is foreign, a host's is not).
		if _, err := ForeignPIDNamespace(""); err != nil {
			t.Errorf("/proc: %v", err)
		}
	}
}

// TestSamplerComputeAppsFailed: a compute-apps query that fails without
// listing anything fails the sample, rather than saying each GPU runs
// nothing: the server would free a releasing GPU under a process still
// running.
func TestSamplerComputeAppsFailed(t *testing.T) {
	fakePATH(t, "h100x8")
	state := t.TempDir()
	t.Setenv("FAKE_GPU_STATE", state)
	os.WriteFile(filepath.Join(state, "apps-fail"), nil, 0o600)
	s, err := NewSampler(SampleOptions{DisableNVML: true, XIDLog: NoXIDLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	smp, err := s.Sample(context.Background())
	if err == nil || !strings.Contains(err.Error(), "compute apps") || !strings.Contains(err.Error(), "Unknown Error") {
		t.Fatalf("sample %+v, err %v: want the failed query's error", smp, err)
	}
}

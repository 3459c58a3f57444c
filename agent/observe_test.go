package agent

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/poll"
)

// gpuFake records reports and answers scripted orders; its long-poll
// answers when the test says so.
type gpuFake struct {
	mu      sync.Mutex
	reports []arbiter.GPUReport
	orders  arbiter.GPUOrders
	poll    chan arbiter.GPUOrders
	fail    error
}

func newGPUFake() *gpuFake {
	p := defaultAgentPolicy
	return &gpuFake{orders: arbiter.GPUOrders{Seq: 1, Policy: p}, poll: make(chan arbiter.GPUOrders, 4)}
}

func (f *gpuFake) ReportGPUs(_ context.Context, _ string, r arbiter.GPUReport) (arbiter.GPUOrders, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return arbiter.GPUOrders{}, f.fail
	}
	f.reports = append(f.reports, r)
	return f.orders, nil
}

func (f *gpuFake) WaitGPUOrders(ctx context.Context, _ string, since int64, wait time.Duration) (arbiter.GPUOrders, error) {
	select {
	case o := <-f.poll:
		return o, nil
	case <-ctx.Done():
		return arbiter.GPUOrders{}, ctx.Err()
	case <-time.After(wait):
		f.mu.Lock()
		defer f.mu.Unlock()
		o := f.orders
		o.Seq = max(since, 0)
		return o, nil
	}
}

func (f *gpuFake) got() []arbiter.GPUReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]arbiter.GPUReport(nil), f.reports...)
}

// scripted is a sampler that returns what the test sets.
type scripted struct {
	mu sync.Mutex
	s  gpu.Sample
}

func (s *scripted) Sample(context.Context) (gpu.Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.s
	out.At = time.Now()
	out.GPUs = append([]gpu.GPUSample(nil), s.s.GPUs...)
	for i := range s.s.GPUs {
		s.s.GPUs[i].XIDs = nil // reported once, as the real samplers do
	}
	return out, nil
}

func (s *scripted) set(f func(gs []gpu.GPUSample) []gpu.GPUSample) {
	s.mu.Lock()
	s.s.GPUs = f(s.s.GPUs)
	s.mu.Unlock()
}

func intp(v int) *int { return &v }

func twoGPUs() (*scripted, []arbiter.GPU) {
	return &scripted{s: gpu.Sample{GPUs: []gpu.GPUSample{
			{Index: 0, UUID: "GPU-0", UtilPct: intp(0), MemTotalMiB: 81559},
			{Index: 1, UUID: "GPU-1", UtilPct: intp(0), MemTotalMiB: 81559},
		}}}, []arbiter.GPU{
			{Index: 0, UUID: "GPU-0", Healthy: true}, {Index: 1, UUID: "GPU-1", Healthy: true},
		}
}

// testObserver observes through s, whose pids are this namespace's.
func testObserver(srv GPUServer, s GPUSampler, gs []arbiter.GPU, ended func([]int64)) *observer {
	return newObserver(ObserveConfig{Sampler: s, TrustPIDs: true}, srv, "box", slog.New(slog.DiscardHandler),
		func() []arbiter.GPU { return gs }, time.Second, 10*time.Millisecond, 50*time.Millisecond, ended)
}

func TestObserverReportsWhatChanged(t *testing.T) {
	f := newGPUFake()
	s, gs := twoGPUs()
	o := testObserver(f, s, gs, nil)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(o.once(ctx))
	must(o.once(ctx)) // nothing changed, the last report is recent: nothing sent
	rs := f.got()
	if len(rs) != 1 || !rs[0].Full || len(rs[0].GPUs) != 2 {
		t.Fatalf("first reports: %+v", rs)
	}
	// Small noise is no change; crossing the idle line, a process, an XID are.
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample { g[0].UtilPct = intp(3); return g })
	must(o.once(ctx))
	if n := len(f.got()); n != 1 {
		t.Fatalf("3%% utilization was reported (%d reports)", n)
	}
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample {
		g[1].UtilPct = intp(60)
		g[1].Processes = []gpu.Process{{PID: os.Getpid(), MemMiB: 500}}
		g[0].XIDs = []int{79}
		return g
	})
	must(o.once(ctx))
	rs = f.got()
	last := rs[len(rs)-1]
	if last.Full || len(last.GPUs) != 2 || last.GPUs[0].XIDs[0] != 79 || len(last.GPUs[1].Processes) != 1 {
		t.Fatalf("changed report: %+v", last)
	}
	p := last.GPUs[1].Processes[0]
	if p.PID != os.Getpid() || p.Command == "" || p.Allocation != nil {
		t.Fatalf("this test's process: %+v", p)
	}
	// The XID is reported once; GPU 1 vanishing is reported as missing.
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample { return g[:1] })
	must(o.once(ctx))
	last = f.got()[len(f.got())-1]
	if len(last.GPUs) != 1 || !last.GPUs[0].Missing || last.GPUs[0].Index != 1 {
		t.Fatalf("after GPU 1 vanished: %+v", last)
	}
	// A failed report keeps the XIDs and makes the next report full.
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample { g[0].XIDs = []int{48}; return g })
	f.mu.Lock()
	f.fail = arbiter.Errorf(arbiter.EUnavailable, "down")
	f.mu.Unlock()
	if err := o.once(ctx); err == nil {
		t.Fatal("no error from a failed report")
	}
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	must(o.once(ctx))
	last = f.got()[len(f.got())-1]
	if !last.Full || len(last.GPUs[0].XIDs) != 1 || last.GPUs[0].XIDs[0] != 48 {
		t.Fatalf("after a failure: %+v", last)
	}
	// Something learnt (a higher seq) is worth a report even without
	// change, while GPUs here are releasing.
	o.seen.Store(99)
	o.reportNow.Store(true)
	must(o.once(ctx))
	if last = f.got()[len(f.got())-1]; last.SeenSeq != 99 || len(last.GPUs) != 0 {
		t.Fatalf("after learning seq 99: %+v", last)
	}
}

func TestObserverAttributes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command("sleep", "30")
	cmd.Env = append(os.Environ(), gpu.AllocationEnv+"=17")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	poll.Execed(t, "sleep", cmd.Process.Pid)
	f := newGPUFake()
	s, gs := twoGPUs()
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample {
		g[0].Processes = []gpu.Process{{PID: cmd.Process.Pid, MemMiB: 1}}
		return g
	})
	o := testObserver(f, s, gs, nil)
	if err := o.once(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := f.got()[0].GPUs[0].Processes[0]
	if p.Allocation == nil || *p.Allocation != 17 || p.Command != "sleep 30" {
		t.Fatalf("got %+v", p)
	}
}

// TestEnforcerStops stops real processes: one that exits on SIGTERM, one
// that ignores it (killed after the grace), and spares one whose
// allocation is not the one the order names.
// seeNow records pids as the observer's last sample would: with the start
// times they have now.
func seeNow(e *enforcer, pids ...int) {
	started := map[int]string{}
	for _, pid := range pids {
		started[pid] = e.procs.StartOf(pid)
	}
	e.see(started)
}

// startSleep starts a process that sleeps for 30 s, killed at the end of
// the test, and returns it and a channel closed once it exited. It skips
// where there are no signals and /proc.
func startSleep(t *testing.T) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("signals and /proc")
	}
	c := exec.Command("sleep", "30")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { c.Wait(); close(exited) }()
	t.Cleanup(func() { c.Process.Kill(); <-exited })
	return c, exited
}

// TestEnforcerStopsOnlyWhatItSaw: an order for a process the last sample
// did not report, for one whose pid now names a process that started at
// another time (a reused pid), or for a pid that kill(2) would truncate
// to another process stops nothing.
func TestEnforcerStopsOnlyWhatItSaw(t *testing.T) {
	c, exited := startSleep(t)
	pid := c.Process.Pid
	e := newEnforcer(gpu.NewProcReader(""), slog.New(slog.DiscardHandler), nil)
	defer e.stop()
	pol := defaultAgentPolicy
	kill := func(pid int) {
		e.apply(arbiter.GPUOrders{Kill: []arbiter.GPUKill{{PID: pid, GraceS: 0.1, Reason: "unmanaged"}}}, &pol)
	}
	kill(pid) // never reported
	e.see(map[int]string{pid: "1"})
	kill(pid) // reported, but a process that started at another time had the pid
	seeNow(e, pid)
	kill(pid + 1<<32) // kill(2) takes a 32-bit pid: this is pid
	select {
	case <-exited:
		t.Fatal("an order stopped a process it does not name")
	case <-time.After(500 * time.Millisecond):
	}
	kill(pid) // reported, the same process: stopped
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("an order for a reported process did not stop it")
	}
}

func TestEnforcerStops(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("signals and /proc")
	}
	exited := map[*exec.Cmd]chan struct{}{}
	start := func(env string, script string) *exec.Cmd {
		c := exec.Command("sh", "-c", script)
		c.Env = append(os.Environ(), env)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		ch := make(chan struct{})
		exited[c] = ch
		go func() { c.Wait(); close(ch) }()
		t.Cleanup(func() { c.Process.Kill(); <-ch })
		return c
	}
	polite := start(gpu.AllocationEnv+"=5", "exec sleep 30")
	ready := filepath.Join(t.TempDir(), "trapped")
	stubborn := start(gpu.AllocationEnv+"=5", "trap '' TERM; touch "+ready+"; while true; do sleep 0.05; done")
	// SIGTERM must find the trap already set, or the shell dies of it.
	poll.Until(t, 10*time.Second, "the stubborn process to set its trap", func() bool { _, err := os.Stat(ready); return err == nil })
	other := start(gpu.AllocationEnv+"=6", "exec sleep 30")
	poll.Execed(t, "sleep", polite.Process.Pid, other.Process.Pid)
	var ended []int64
	var mu sync.Mutex
	e := newEnforcer(gpu.NewProcReader(""), slog.New(slog.DiscardHandler), func(ids []int64) {
		mu.Lock()
		ended = append(ended, ids...)
		mu.Unlock()
	})
	defer e.stop()
	seeNow(e, polite.Process.Pid, stubborn.Process.Pid, other.Process.Pid)
	five := int64(5)
	pol := defaultAgentPolicy
	o := arbiter.GPUOrders{Ended: []int64{5}, Kill: []arbiter.GPUKill{
		{PID: polite.Process.Pid, Allocation: &five, GraceS: 5, Reason: "allocation 5 ended"},
		{PID: stubborn.Process.Pid, Allocation: &five, GraceS: 0.3, Reason: "allocation 5 ended"},
		{PID: other.Process.Pid, Allocation: &five, GraceS: 0.1, Reason: "a reused pid"},
	}}
	began := time.Now()
	e.apply(o, &pol)
	e.apply(o, &pol) // the same orders again: nothing twice
	wait := func(c *exec.Cmd, what string, within time.Duration) {
		t.Helper()
		select {
		case <-exited[c]:
		case <-time.After(within):
			t.Fatalf("%s still runs after %s", what, within)
		}
	}
	wait(polite, "the polite process", 2*time.Second)
	wait(stubborn, "the process ignoring SIGTERM", 5*time.Second)
	if d := time.Since(began); d < 250*time.Millisecond {
		t.Fatalf("the stubborn process died after %s, before its grace", d)
	}
	select {
	case <-exited[other]:
		t.Fatal("a process of another allocation was stopped")
	case <-time.After(300 * time.Millisecond):
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 2 || ended[0] != 5 {
		t.Fatalf("ended told to the task runner: %v", ended)
	}
	// With enforce = "wait" the task runner is not told.
	ended = nil
	pol.Enforce = arbiter.EnforceWait
	mu.Unlock()
	e.apply(arbiter.GPUOrders{Ended: []int64{5}}, &pol)
	mu.Lock()
	if len(ended) != 0 {
		t.Fatalf("enforce=wait told the task runner: %v", ended)
	}
}

// TestEnforcerLetsAWithdrawnStopGo: a stop whose order is missing from the
// server's next orders (a preemption called off) sends no SIGKILL; orders
// whose policy is all zeroes (the server has not judged the machine since
// it started), or older than orders applied, withdraw nothing.
func TestEnforcerLetsAWithdrawnStopGo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("signals and /proc")
	}
	ready := filepath.Join(t.TempDir(), "trapped")
	c := exec.Command("sh", "-c", "trap '' TERM; touch "+ready+"; while true; do sleep 0.05; done")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { c.Wait(); close(exited) }()
	t.Cleanup(func() { c.Process.Kill(); <-exited })
	poll.Until(t, 10*time.Second, "the process to set its trap", func() bool { _, err := os.Stat(ready); return err == nil })
	pid := c.Process.Pid
	e := newEnforcer(gpu.NewProcReader(""), slog.New(slog.DiscardHandler), nil)
	defer e.stop()
	seeNow(e, pid)
	pol := defaultAgentPolicy
	kill := []arbiter.GPUKill{{PID: pid, GraceS: 0.3, Reason: "allocation 5 is preempted"}}
	e.apply(arbiter.GPUOrders{Policy: pol, Kill: kill}, &pol)
	e.apply(arbiter.GPUOrders{Policy: pol, Kill: []arbiter.GPUKill{}}, &pol)
	select {
	case <-exited:
		t.Fatal("a withdrawn stop killed the process")
	case <-time.After(time.Second):
	}
	// Ordered again, it is stopped: the withdrawn stop no longer holds the
	// pid, and neither orders not judged yet nor orders older than those
	// applied withdraw it.
	e.apply(arbiter.GPUOrders{Seq: 10, Policy: pol, Kill: kill}, &pol)
	e.apply(arbiter.GPUOrders{}, &pol)
	e.apply(arbiter.GPUOrders{Seq: 9, Policy: pol, Kill: []arbiter.GPUKill{}}, &pol)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("an order given again after a withdrawal did not stop the process")
	}
}

// TestEnforcerRefusesUntrustedPIDs: with its pids untrusted (a PID
// namespace of its own) the enforcer stops nothing, and logs each pid
// once; the task runner is still told of ended allocations.
func TestEnforcerRefusesUntrustedPIDs(t *testing.T) {
	c, exited := startSleep(t)
	var logs strings.Builder // the refusals are logged by apply, on this goroutine
	var ended []int64
	e := newEnforcer(gpu.NewProcReader(""), slog.New(slog.NewTextHandler(&logs, nil)), func(ids []int64) { ended = append(ended, ids...) })
	e.refuse = "pids untrusted"
	pol := defaultAgentPolicy
	o := arbiter.GPUOrders{Ended: []int64{5}, Kill: []arbiter.GPUKill{{PID: c.Process.Pid, GraceS: 0.1, Reason: "unmanaged"}}}
	e.apply(o, &pol)
	e.apply(o, &pol)
	e.stop() // waits for any stop under way: one would have sent SIGTERM at once
	select {
	case <-exited:
		t.Fatal("a process named by an untrusted pid was stopped")
	default:
	}
	if n := strings.Count(logs.String(), "not stopping a process on a GPU"); n != 1 {
		t.Errorf("refusal logged %d times, want once:\n%s", n, logs.String())
	}
	if len(ended) != 2 {
		t.Errorf("ended allocations told to the task runner: %v", ended)
	}
}

// TestWatchWakesTheSampler: an answer of the long-poll with a new seq
// makes the observer sample and report at once, with that seq.
func TestWatchWakesTheSampler(t *testing.T) {
	f := newGPUFake()
	s, gs := twoGPUs()
	o := testObserver(f, s, gs, nil)
	p := defaultAgentPolicy
	p.SampleS = 3600 // only a wake-up makes it report again
	f.orders.Policy = p
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitReports := func(n int) []arbiter.GPUReport {
		t.Helper()
		poll.Until(t, 5*time.Second, fmt.Sprintf("%d reports", n), func() bool { return len(f.got()) >= n })
		return f.got()
	}
	waitReports(1)
	woke := time.Now()
	f.poll <- arbiter.GPUOrders{Seq: 42, Policy: p, ReportNow: true}
	// Only the wake-up can bring a second report within waitReports' 5 s:
	// the next sample is an hour away, the next long-poll answer 25 s. How
	// soon is for a benchmark; a pass/fail bound a busy machine overruns.
	rs := waitReports(2)
	if rs[1].SeenSeq != 42 {
		t.Fatalf("woken report after %s: %+v", time.Since(woke), rs[1])
	}
}

// TestWorkerKillsATaskWhoseAllocationEnded: the task runner kills the
// process group of a task whose allocation ended at once, without a
// grace, and reports nothing: the server already took the task back.
func TestWorkerKillsATaskWhoseAllocationEnded(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	tk := shTask("gpu-task", []int{1}, `echo $ARBITER_ALLOCATION_ID > `+filepath.Join(dir, "alloc")+`; trap '' TERM; sleep 30 & echo $! > `+pidFile+`; wait`)
	tk.AllocationID = 77
	f := newTaskFake(tk)
	host := gpu.Host{Hostname: "box", Cores: 4, CUDA: "12.4", GPUs: []arbiter.GPU{{Index: 0, Healthy: true}, {Index: 1, Healthy: true}}}
	a := &agent{cfg: Config{Server: f, Tasks: &WorkerConfig{Dir: dir, KillGrace: time.Hour, Heartbeat: 20 * time.Millisecond, Poll: 20 * time.Millisecond}},
		log: slog.New(slog.DiscardHandler), machine: arbiter.Machine{Name: "box"}}
	a.cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	stop, err := a.startTasks(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	for _, fn := range a.onRegistered {
		fn()
	}
	f.waitFor(t, "a heartbeat", func() bool { return f.beats[tk.ID] >= 1 })
	var child int
	poll.Until(t, 10*time.Second, "the task's child to start", func() bool {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return child != 0
	})
	if b, _ := os.ReadFile(filepath.Join(dir, "alloc")); strings.TrimSpace(string(b)) != "77" {
		t.Fatalf("ARBITER_ALLOCATION_ID in the task: %q", b)
	}
	a.taskEnded([]int64{77})
	poll.Until(t, 2*time.Second, "the task's process group to end after its allocation ended", func() bool {
		return syscall.Kill(child, 0) != nil || processGone(child)
	})
	// Once the worker has stopped, whatever it would report has been.
	cancel()
	stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failed) != 0 || len(f.completed) != 0 {
		t.Errorf("a task whose allocation ended was reported: failed %v completed %v", f.failed, f.completed)
	}
}

// behindServer is a server whose event history ends at last: like the
// real one, its long-poll answers at once when since is ahead of it and
// otherwise waits.
type behindServer struct {
	*gpuFake
	last  int64
	mu    sync.Mutex
	since []int64
}

func (b *behindServer) WaitGPUOrders(ctx context.Context, _ string, since int64, wait time.Duration) (arbiter.GPUOrders, error) {
	b.mu.Lock()
	b.since = append(b.since, since)
	b.mu.Unlock()
	o := arbiter.GPUOrders{Seq: b.last, Policy: defaultAgentPolicy}
	if since >= 0 && since <= b.last {
		select {
		case <-ctx.Done():
			return arbiter.GPUOrders{}, ctx.Err()
		case <-time.After(wait):
		}
	}
	return o, nil
}

func (b *behindServer) polls() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.since...)
}

// TestWatchFollowsAServerWhoseHistoryIsBehind: an agent that learnt seq
// 3324 from a server whose database was then replaced (its history ends at
// 5) follows the new server's seq instead of long-polling with a since the
// server will never reach, which it answers at once, forever.
func TestWatchFollowsAServerWhoseHistoryIsBehind(t *testing.T) {
	f := newGPUFake()
	f.orders.Seq = 5
	srv := &behindServer{gpuFake: f, last: 5}
	s, gs := twoGPUs()
	o := testObserver(srv, s, gs, nil)
	o.seen.Store(3324)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	poll.Until(t, 5*time.Second, "a long-poll from the server's seq", func() bool {
		ps := srv.polls()
		return len(ps) > 0 && ps[len(ps)-1] == 5
	})
	if ps := srv.polls(); len(ps) > 3 {
		t.Fatalf("the agent polled %d times (since %v…): it spins on a server behind it", len(ps), ps[:3])
	}
	if got := o.seen.Load(); got != 5 {
		t.Fatalf("seen = %d, want the server's 5", got)
	}
}

// TestXIDFollowsTheUUID: an XID goes to the GPU that had it, matched by
// UUID as its reading is, though its index in the sample differs from the
// registered one (a GPU gone from the enumeration shifts the others down
// until the next re-detection), and never to another GPU later.
func TestXIDFollowsTheUUID(t *testing.T) {
	f := newGPUFake()
	gs := []arbiter.GPU{{Index: 0, UUID: "GPU-A", Healthy: true}, {Index: 1, UUID: "GPU-B", Healthy: true}}
	// GPU-A is gone from the enumeration; GPU-B now has index 0 and an XID.
	s := &scripted{s: gpu.Sample{GPUs: []gpu.GPUSample{
		{Index: 0, UUID: "GPU-B", UtilPct: intp(0), MemTotalMiB: 81559, XIDs: []int{48}},
	}}}
	o := testObserver(f, s, gs, nil)
	if err := o.once(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := f.got()[0]
	var b *arbiter.GPUReading
	for i := range r.GPUs {
		if r.GPUs[i].Index == 1 {
			b = &r.GPUs[i]
		}
	}
	if b == nil || b.Missing || len(b.XIDs) != 1 || b.XIDs[0] != 48 {
		t.Errorf("GPU 1 (GPU-B) reported as %+v; want XID 48 on it", b)
	}
	// GPU-A comes back as index 0, GPU-B as 1: the XID of GPU-B lands on GPU-A.
	s.set(func([]gpu.GPUSample) []gpu.GPUSample {
		return []gpu.GPUSample{
			{Index: 0, UUID: "GPU-A", UtilPct: intp(0), MemTotalMiB: 81559},
			{Index: 1, UUID: "GPU-B", UtilPct: intp(0), MemTotalMiB: 81559},
		}
	})
	if err := o.once(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, rep := range f.got()[1:] {
		for _, g := range rep.GPUs {
			if g.Index == 0 && len(g.XIDs) > 0 {
				t.Errorf("GPU 0 (GPU-A, which had no error) reported with XIDs %v", g.XIDs)
			}
		}
	}
}

// validating is a GPU server that refuses reports the real one refuses
// (arbiter.GPUReport.Validate), with 400.
type validating struct {
	*gpuFake
	m                 arbiter.Machine
	refused, accepted int
}

func (v *validating) ReportGPUs(ctx context.Context, name string, r arbiter.GPUReport) (arbiter.GPUOrders, error) {
	if err := r.Validate(&v.m, time.Now()); err != nil {
		v.refused++
		return arbiter.GPUOrders{}, err
	}
	v.accepted++
	return v.gpuFake.ReportGPUs(ctx, name, r)
}

// TestObserverSendsOnlyWhatTheContractTakes: a reading the report contract
// refuses (an XID out of range, a wrapped memory or ECC counter, a
// temperature from nowhere) is dropped or clamped by the agent, so the
// report goes through. Before, one bad XID stayed queued and got every
// later report of the machine refused.
func TestObserverSendsOnlyWhatTheContractTakes(t *testing.T) {
	s, gs := twoGPUs()
	v := &validating{gpuFake: newGPUFake(), m: arbiter.Machine{Name: "box", GPUs: gs}}
	o := testObserver(v, s, gs, nil)
	ctx := context.Background()
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample {
		ecc, hot, w := int64(-1), 5000, math.NaN()
		g[0].XIDs = []int{0, 1 << 40, 79}
		g[0].MemUsedMiB, g[0].ECCUncorrected, g[0].TempC, g[0].PowerW = 1<<44, &ecc, &hot, &w
		g[1].UtilPct = intp(400)
		return g
	})
	for range 3 {
		if err := o.once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if v.refused > 0 || v.accepted == 0 {
		t.Fatalf("%d reports refused, %d accepted", v.refused, v.accepted)
	}
	g0 := v.got()[0].GPUs[0]
	if !slices.Equal(g0.XIDs, []int{79}) || g0.MemUsedMiB != arbiter.MaxGPUMemMiB || g0.ECCUncorrected != nil || g0.TempC != nil || g0.PowerW != nil {
		t.Errorf("GPU 0 reported as %+v", g0)
	}
}

// TestObserverCriticalXIDNotHeldBehindAFlood: a faulting kernel logs one
// XID 13 per SM; queued once each, they cannot hold a critical XID that
// follows them out of the next report.
func TestObserverCriticalXIDNotHeldBehindAFlood(t *testing.T) {
	f := newGPUFake()
	s, gs := twoGPUs()
	o := testObserver(f, s, gs, nil)
	ctx := context.Background()
	flood := make([]int, 100)
	for i := range flood {
		flood[i] = 13
	}
	for range 10 {
		s.set(func(g []gpu.GPUSample) []gpu.GPUSample { g[0].XIDs = flood; return g })
		if err := o.once(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample { g[0].XIDs = []int{79}; return g })
	if err := o.once(ctx); err != nil {
		t.Fatal(err)
	}
	rs := f.got()
	if last := rs[len(rs)-1]; len(last.GPUs) == 0 || !slices.Equal(last.GPUs[0].XIDs, []int{79}) {
		t.Fatalf("the report of the sample that saw XID 79: %+v (%d still queued)", last.GPUs, len(o.xids[0]))
	}
}

// TestObserverReportsUnreadProcessesAsUnknown: a GPU whose processes could
// not be listed is reported with processes_unknown, not as running none,
// and with its other readings and XIDs (a critical XID must still reach
// the server); once they can be listed it is reported as usual.
func TestObserverReportsUnreadProcessesAsUnknown(t *testing.T) {
	f := newGPUFake()
	s, gs := twoGPUs()
	o := testObserver(f, s, gs, nil)
	ctx := context.Background()
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample {
		g[1].ProcessesUnread = "NVML cannot list its processes (ERROR_NO_PERMISSION)"
		g[1].XIDs = []int{79}
		return g
	})
	if err := o.once(ctx); err != nil {
		t.Fatal(err)
	}
	rs := f.got()
	if len(rs) != 1 || len(rs[0].GPUs) != 2 {
		t.Fatalf("with GPU 1's processes unread: %+v", rs)
	}
	if g1 := rs[0].GPUs[1]; !g1.ProcessesUnknown || len(g1.Processes) != 0 || !slices.Equal(g1.XIDs, []int{79}) || rs[0].GPUs[0].ProcessesUnknown {
		t.Fatalf("GPU 1 reported as %+v, GPU 0 as %+v", g1, rs[0].GPUs[0])
	}
	s.set(func(g []gpu.GPUSample) []gpu.GPUSample { g[1].ProcessesUnread = ""; return g })
	if err := o.once(ctx); err != nil {
		t.Fatal(err)
	}
	rs = f.got()
	if last := rs[len(rs)-1]; len(last.GPUs) != 1 || last.GPUs[0].Index != 1 || last.GPUs[0].ProcessesUnknown {
		t.Fatalf("once they can be listed: %+v", last.GPUs)
	}
}

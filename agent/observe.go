package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
)

// GPU observation (docs/reference/gpu-truth.md): the agent is the engine's eyes on
// this host. Every sample_s it samples the GPUs, attributes each compute
// process to an allocation (ARBITER_ALLOCATION_ID in its or an ancestor's
// environment), and reports what changed; the answer carries the engine's
// orders, which the enforcer (enforce.go) carries out. Beside it, a
// long-poll on the machine's orders wakes it within a second of an
// allocation ending here (a cancelled task, an expired keepalive): it then
// samples and reports at once, and the task runner kills a cancelled task's
// process group.

// GPUServer is what GPU observation needs of the server; *httpapi.Client
// implements it.
type GPUServer interface {
	ReportGPUs(ctx context.Context, machine string, r arbiter.GPUReport) (arbiter.GPUOrders, error)
	WaitGPUOrders(ctx context.Context, machine string, since int64, wait time.Duration) (arbiter.GPUOrders, error)
}

// GPUSampler samples the host's GPUs; *gpu.Sampler implements it.
type GPUSampler interface {
	Sample(ctx context.Context) (gpu.Sample, error)
}

// ObserveConfig configures GPU observation. Zero fields take defaults.
type ObserveConfig struct {
	// Sampler samples the GPUs; nil opens gpu.NewSampler with Config.GPU's
	// tool choices and XIDLog.
	Sampler GPUSampler
	// XIDLog is where XIDs are read when NVML does not report them
	// (gpu.SampleOptions.XIDLog).
	XIDLog string
	// ProcRoot is the proc file system ("" for /proc).
	ProcRoot string
	// TrustPIDs says the pids the GPU tool reports are those of the
	// agent's PID namespace even when that is not the host's (a recorded
	// nvidia-smi in a test, a container whose driver tools see its own
	// namespace). Without it an agent in a PID namespace of its own reports
	// a GPU's processes by pid alone and stops none of them
	// (gpu.ForeignPIDNamespace).
	TrustPIDs bool
	// Wait bounds one orders long-poll; default 25s.
	Wait time.Duration
}

// DefaultOrdersWait bounds one orders long-poll.
const DefaultOrdersWait = 25 * time.Second

// observer runs GPU observation for one agent.
type observer struct {
	cfg     ObserveConfig
	srv     GPUServer
	name    string
	log     *slog.Logger
	gpus    func() []arbiter.GPU // the machine's GPUs as registered
	procs   *gpu.ProcReader
	enforce *enforcer
	call    time.Duration // bound of one report
	backoff [2]time.Duration

	seen atomic.Int64 // the server's event seq as last learnt (learn)
	// reportNow: the last orders said releasing GPUs wait for a report.
	reportNow atomic.Bool
	wake      chan struct{}
	policy    atomic.Pointer[arbiter.GPUAgentPolicy]

	// Report state: only the sampling goroutine touches it.
	sent     map[int]string // the signature of each GPU as last reported
	xids     map[int][]int  // XIDs not yet reported, each once
	unread   map[int]string // GPUs whose processes could not be listed, and why (logged once)
	lastSent time.Time
	sentSeq  int64 // seen_seq of the last report that reached the server
	full     bool  // send every GPU next time
}

// defaultAgentPolicy is what the agent does before the server said.
var defaultAgentPolicy = func() arbiter.GPUAgentPolicy {
	p := arbiter.DefaultGPUPolicy()
	return arbiter.GPUAgentPolicy{SampleS: p.SampleS, ReportS: p.ReportS(), KillGraceS: p.KillGraceS, Enforce: p.Enforce, IdleUtilPct: p.IdleUtilPct}
}()

func newObserver(cfg ObserveConfig, srv GPUServer, name string, log *slog.Logger, gpus func() []arbiter.GPU, call, minB, maxB time.Duration, ended func([]int64)) *observer {
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultOrdersWait
	}
	o := &observer{
		cfg: cfg, srv: srv, name: name, log: log, gpus: gpus, call: call, backoff: [2]time.Duration{minB, maxB},
		procs: gpu.NewProcReader(cfg.ProcRoot), wake: make(chan struct{}, 1),
		sent: map[int]string{}, xids: map[int][]int{}, unread: map[int]string{}, full: true,
	}
	o.enforce = newEnforcer(gpu.NewProcReader(cfg.ProcRoot), log, ended)
	o.enforce.refuse = untrustedPIDs(cfg)
	p := defaultAgentPolicy
	o.policy.Store(&p)
	return o
}

// run samples and reports until ctx ends; watch (below) runs beside it.
func (o *observer) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		o.watch(ctx)
	}()
	defer wg.Wait()
	defer o.enforce.stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-o.wake:
		}
		err := o.once(ctx)
		every := secs(o.policy.Load().SampleS)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			fails++
			wait := min(o.backoff[0]<<min(fails, 10), o.backoff[1])
			wait = max(wait, every)
			if fails == 1 || fails%20 == 0 {
				o.log.Warn("GPU report failed; retrying", "machine", o.name, "err", err, "retry_in", wait.Round(time.Millisecond))
			}
			timer.Reset(wait)
		default:
			fails = 0
			timer.Reset(every)
		}
	}
}

// once samples, reports what changed and carries out the answer.
func (o *observer) once(ctx context.Context) error {
	seen := o.seen.Load() // what the agent knew before it looked
	s, err := o.cfg.Sampler.Sample(ctx)
	if err != nil {
		return fmt.Errorf("sample GPUs: %w", err)
	}
	for _, n := range s.Notes {
		o.log.Debug("gpu sample", "note", n)
	}
	r, send := o.build(s, seen, time.Now())
	if !send {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, o.call)
	orders, err := o.srv.ReportGPUs(cctx, o.name, r)
	cancel()
	if err != nil {
		o.full = true // the server may have missed what changed
		return err
	}
	o.commit(r)
	if o.learn(r.SeenSeq, orders.Seq) {
		o.sentSeq = orders.Seq
	}
	o.handle(orders)
	return nil
}

// build turns a sample into a report: the GPUs whose reading changed (all
// of them when full), each process attributed. send is false when nothing
// changed, nothing new was learnt, and the last report is recent.
func (o *observer) build(s gpu.Sample, seen int64, now time.Time) (arbiter.GPUReport, bool) {
	pol := o.policy.Load()
	r := arbiter.GPUReport{SeenSeq: seen, Full: o.full, SampledAt: s.At}
	byUUID := make(map[string]*gpu.GPUSample, len(s.GPUs))
	byIndex := make(map[int]*gpu.GPUSample, len(s.GPUs))
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if g.UUID != "" {
			byUUID[g.UUID] = g
		}
		byIndex[g.Index] = g
	}
	started := map[int]string{} // the sampled processes' start times, by pid (enforcer.see)
	for _, mg := range o.gpus() {
		g := byUUID[mg.UUID]
		if g == nil && mg.UUID == "" {
			g = byIndex[mg.Index]
		}
		rd := arbiter.GPUReading{Index: mg.Index}
		if g == nil {
			rd.Missing = true
		} else {
			// Kept by the index registered, which the sample's may not be
			// (a GPU left the enumeration, and the others moved down).
			o.queueXIDs(mg.Index, g.XIDs)
			rd = o.reading(mg.Index, g, started)
			if o.noteUnread(mg.Index, g.ProcessesUnread) {
				// Not "no processes": the server must not free a
				// releasing GPU on a list that could not be read.
				rd.Processes, rd.ProcessesUnknown = []arbiter.GPUProcess{}, true
			}
		}
		sig := signature(&rd, pol.IdleUtilPct)
		if r.Full || sig != o.sent[mg.Index] || len(rd.XIDs) > 0 {
			r.GPUs = append(r.GPUs, rd)
		}
	}
	o.procs.Prune()
	o.enforce.see(started)
	send := r.Full || len(r.GPUs) > 0 || (seen > o.sentSeq && o.reportNow.Load()) || now.Sub(o.lastSent) >= secs(pol.ReportS)
	return r, send
}

// queueXIDs queues a GPU's XIDs for the next report. What the contract
// refuses (not 1 to MaxXID) is dropped, lest one reading get every later
// report refused; an XID already queued is not queued again: the server
// asks only whether one is critical, and a faulting kernel logs one per
// SM, which would hold a critical XID behind the flood.
func (o *observer) queueXIDs(index int, xids []int) {
	for _, x := range xids {
		q := o.xids[index]
		if x >= 1 && x <= arbiter.MaxXID && !slices.Contains(q, x) && len(q) < arbiter.MaxGPUXIDs {
			o.xids[index] = append(q, x)
		}
	}
}

// noteUnread records whether a GPU's processes could be listed, logs a
// change, and reports whether they could not.
func (o *observer) noteUnread(index int, why string) bool {
	if why != o.unread[index] {
		if why != "" {
			o.log.Warn("GPU processes cannot be listed: reported as unknown until they can (its releasing allocations wait for releasing_timeout_s)", "machine", o.name, "gpu", index, "why", why)
			o.unread[index] = why
		} else {
			o.log.Info("GPU processes can be listed again", "machine", o.name, "gpu", index)
			delete(o.unread, index)
		}
	}
	return why != ""
}

// reading is one sampled GPU as reported, its processes attributed; it
// records each process's start time in started.
func (o *observer) reading(index int, g *gpu.GPUSample, started map[int]string) arbiter.GPUReading {
	rd := arbiter.GPUReading{Index: index, UtilPct: g.UtilPct, MemUsedMiB: g.MemUsedMiB, MemTotalMiB: g.MemTotalMiB,
		TempC: g.TempC, PowerW: g.PowerW, ECCUncorrected: g.ECCUncorrected, Processes: make([]arbiter.GPUProcess, 0, len(g.Processes))}
	inContract(&rd)
	if x := o.xids[index]; len(x) > 0 {
		rd.XIDs = x[:min(len(x), arbiter.MaxGPUXIDs)]
	}
	seen := map[int]bool{}
	for _, p := range g.Processes {
		if p.PID <= 0 || p.PID > arbiter.MaxPID || seen[p.PID] || len(rd.Processes) >= arbiter.MaxGPUProcesses {
			continue
		}
		seen[p.PID] = true
		info := gpu.ProcInfo{PID: p.PID} // a pid not to be trusted: nothing read of whatever has it here
		if o.enforce.refuse == "" {
			info = o.procs.Info(p.PID)
		}
		if info.Start != "" {
			started[p.PID] = info.Start
		}
		gp := arbiter.GPUProcess{PID: p.PID, User: info.User, MemMiB: min(max(p.MemMiB, 0), arbiter.MaxGPUMemMiB), Command: info.Command}
		if info.Allocation > 0 {
			id := info.Allocation
			gp.Allocation = &id
		}
		rd.Processes = append(rd.Processes, gp)
	}
	return rd
}

// inContract leaves out of a reading what the report contract refuses
// (arbiter.GPUReading's bounds), so that one garbled value from the
// driver — a wrapped counter, a huge memory figure — costs that value,
// not every report of the machine: a reading out of range is unknown,
// memory is clamped.
func inContract(rd *arbiter.GPUReading) {
	if u := rd.UtilPct; u != nil && (*u < 0 || *u > 100) {
		rd.UtilPct = nil
	}
	rd.MemUsedMiB = min(max(rd.MemUsedMiB, 0), arbiter.MaxGPUMemMiB)
	rd.MemTotalMiB = min(max(rd.MemTotalMiB, 0), arbiter.MaxGPUMemMiB)
	if t := rd.TempC; t != nil && (*t < -100 || *t > 300) {
		rd.TempC = nil
	}
	if p := rd.PowerW; p != nil && (math.IsNaN(*p) || *p < 0 || *p > arbiter.MaxGPUPowerW) {
		rd.PowerW = nil
	}
	if e := rd.ECCUncorrected; e != nil && *e < 0 {
		rd.ECCUncorrected = nil
	}
}

// commit records a report that reached the server.
func (o *observer) commit(r arbiter.GPUReport) {
	pol := o.policy.Load()
	for i := range r.GPUs {
		rd := &r.GPUs[i]
		o.sent[rd.Index] = signature(rd, pol.IdleUtilPct)
		if n := len(rd.XIDs); n > 0 {
			o.xids[rd.Index] = o.xids[rd.Index][n:]
			if len(o.xids[rd.Index]) == 0 {
				delete(o.xids, rd.Index)
			}
		}
	}
	if r.Full {
		o.full = false
	}
	o.lastSent = time.Now()
	o.sentSeq = r.SeenSeq
}

// handle takes in an answer's policy and orders (once took in its seq).
func (o *observer) handle(orders arbiter.GPUOrders) {
	if orders.Policy.SampleS > 0 {
		p := orders.Policy
		o.policy.Store(&p)
	}
	if orders.WantFull {
		o.full = true
	}
	o.reportNow.Store(orders.ReportNow)
	o.enforce.apply(orders, o.policy.Load())
}

// watch long-polls the machine's orders and wakes the sampler when
// something happened: it then samples and reports at once, with the
// allocation's end in its seen_seq.
func (o *observer) watch(ctx context.Context) {
	backoff := o.backoff[0]
	for ctx.Err() == nil {
		since := o.seen.Load()
		if since == 0 {
			since = -1 // nothing learnt yet: answer at once
		}
		orders, err := o.srv.WaitGPUOrders(ctx, o.name, since, o.cfg.Wait)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if arbiter.ErrorCode(err) != arbiter.ENotFound {
				o.log.Debug("orders long-poll failed; retrying", "machine", o.name, "err", err)
			}
			wait := backoff + time.Duration(rand.Int64N(int64(backoff)/5+1))
			backoff = min(2*backoff, o.backoff[1])
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			continue
		}
		backoff = o.backoff[0]
		if orders.Seq == since {
			continue // the wait ended with nothing new
		}
		o.reportNow.Store(orders.ReportNow)
		o.enforce.apply(orders, o.policy.Load()) // none may withdraw a stop under way
		if o.learn(since, orders.Seq) {
			o.log.Warn("the server's event history is behind this agent's (its database was restored or replaced); following the server's",
				"machine", o.name, "agent_seq", since, "server_seq", orders.Seq)
		}
		select {
		case o.wake <- struct{}{}:
		default:
		}
	}
}

// learn takes in the seq of an answer to a call that carried sent, and
// says whether it started over. The server's seq only grows, so an answer
// below what the call carried means the server's history is behind the
// agent's — its database was restored from a backup or replaced — and the
// server's number is the one to follow: kept, the agent's would be ahead
// of every event to come, the long-poll would answer at once forever
// (gpu-truth.md §9) and the agent would spin on it. Otherwise the highest
// seq learnt stands: the answers to a report and to the long-poll may
// arrive in either order.
func (o *observer) learn(sent, got int64) bool {
	if sent >= 0 && got < sent {
		o.seen.Store(got)
		return true
	}
	for {
		cur := o.seen.Load()
		if got <= cur || o.seen.CompareAndSwap(cur, got) {
			return false
		}
	}
}

// signature is a GPU's reading as far as a change of it is worth a report:
// utilization to 5 points and which side of the idle line, memory to 1%,
// temperature to 5°C, power to 25 W, the ECC count, and each process with
// its allocation and memory to 256 MiB.
func signature(r *arbiter.GPUReading, idlePct float64) string {
	if r.Missing {
		return "missing"
	}
	var b strings.Builder
	opt := func(p *int, q int) {
		if p == nil {
			b.WriteString("-,")
			return
		}
		b.WriteString(strconv.Itoa(*p / q))
		b.WriteByte(',')
	}
	opt(r.UtilPct, 5)
	if r.UtilPct != nil && float64(*r.UtilPct) < idlePct {
		b.WriteString("idle,")
	}
	step := max(r.MemTotalMiB/100, 1)
	fmt.Fprintf(&b, "%d,%d,", r.MemUsedMiB/step, r.MemTotalMiB)
	opt(r.TempC, 5)
	if r.PowerW != nil {
		fmt.Fprintf(&b, "%d,", int(*r.PowerW/25))
	} else {
		b.WriteString("-,")
	}
	if r.ECCUncorrected != nil {
		fmt.Fprintf(&b, "ecc%d,", *r.ECCUncorrected)
	}
	if r.ProcessesUnknown {
		b.WriteString("procs?,")
	}
	for _, p := range r.Processes {
		fmt.Fprintf(&b, "|%d:%d:%s", p.PID, p.MemMiB/256, allocText(p.Allocation))
	}
	return b.String()
}

func allocText(id *int64) string {
	if id == nil {
		return "-"
	}
	return strconv.FormatInt(*id, 10)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// SampleOnce samples the GPUs once through s and returns the report the
// agent would send for a machine with gpus (all of them, each process
// attributed as cfg's ProcRoot and TrustPIDs say), for `arbiter agent
// --sample-once`: a check of NVML, nvidia-smi and attribution on a real
// host without a server. Why the pids cannot be trusted here, if so, is
// among the sample's notes.
func SampleOnce(ctx context.Context, s GPUSampler, cfg ObserveConfig, gpus []arbiter.GPU) (arbiter.GPUReport, gpu.Sample, error) {
	smp, err := s.Sample(ctx)
	if err != nil {
		return arbiter.GPUReport{}, gpu.Sample{}, err
	}
	if len(gpus) == 0 {
		// No registration to compare with: every sampled GPU as it is.
		for _, g := range smp.GPUs {
			gpus = append(gpus, arbiter.GPU{Index: g.Index, UUID: g.UUID})
		}
	}
	cfg.Sampler = s
	o := newObserver(cfg, nil, "", slog.New(slog.DiscardHandler),
		func() []arbiter.GPU { return gpus }, time.Second, time.Second, time.Second, nil)
	if why := o.enforce.refuse; why != "" {
		smp.Notes = append(smp.Notes, why)
	}
	r, _ := o.build(smp, 0, time.Now())
	return r, smp, nil
}

// untrustedPIDs says why the pids a GPU tool reports cannot be acted on
// here ("" when they can): the agent runs in a PID namespace other than
// the host's, and cfg does not say the tool reports this namespace's.
// Where the namespace cannot be read (not Linux) the pids are trusted.
func untrustedPIDs(cfg ObserveConfig) string {
	if cfg.TrustPIDs {
		return ""
	}
	if foreign, err := gpu.ForeignPIDNamespace(cfg.ProcRoot); err != nil || !foreign {
		return ""
	}
	return "this agent runs in a PID namespace of its own (a container without --pid=host): the pids the GPU driver reports " +
		"may name other processes here, so it reports their pids alone (no user, command or allocation) and stops none of them; " +
		"run it in the host's PID namespace, or pass --trust-pids if its GPU tool reports this namespace's pids"
}

// startObserve starts GPU observation when configured, once the machine is
// registered, and returns a function that stops it and waits.
func (a *agent) startObserve(ctx context.Context) (stop func(), err error) {
	if a.cfg.Observe == nil {
		return func() {}, nil
	}
	srv, ok := a.cfg.Server.(GPUServer)
	if !ok {
		return nil, fmt.Errorf("agent: the server client cannot report GPUs (no GPUServer)")
	}
	cfg := *a.cfg.Observe
	var closeSampler func()
	if cfg.Sampler == nil {
		s, err := gpu.NewSampler(gpu.SampleOptions{NvidiaSMI: a.cfg.GPU.NvidiaSMI, DisableNVML: a.cfg.GPU.DisableNVML, XIDLog: cfg.XIDLog})
		if errors.Is(err, gpu.ErrNoGPUTool) {
			a.log.Info("no NVML or nvidia-smi: this host's GPUs are not observed", "machine", a.machine.Name)
			return func() {}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("gpu sampling: %w", err)
		}
		for _, n := range s.Notes() {
			a.log.Warn(n, "machine", a.machine.Name)
		}
		a.log.Info("observing GPUs", "machine", a.machine.Name, "source", s.Source())
		cfg.Sampler, closeSampler = s, s.Close
	}
	o := newObserver(cfg, srv, a.machine.Name, a.log, func() []arbiter.GPU {
		if p := a.gpus.Load(); p != nil {
			return *p
		}
		return nil
	}, a.cfg.CallTimeout, a.cfg.MinBackoff, a.cfg.MaxBackoff, a.taskEnded)
	if why := o.enforce.refuse; why != "" {
		a.log.Warn(why, "machine", a.machine.Name)
	}
	ctx, cancel := context.WithCancel(ctx)
	registered := make(chan struct{})
	a.onRegistered = append(a.onRegistered, func() { close(registered) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-registered:
			o.run(ctx)
		case <-ctx.Done():
		}
	}()
	return func() {
		cancel()
		<-done
		if closeSampler != nil {
			closeSampler()
		}
	}, nil
}

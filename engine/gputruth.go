package engine

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// gputruth is GPU ground truth (docs/reference/gpu-truth.md, docs/architecture.md §2.8): agents
// report what really runs on each GPU, and every decision on those facts is
// made here, on the reported facts and now:
//
//   - Clean handoff. When an allocation ends holding GPUs of an observed
//     machine (one whose agent reports its GPUs), they become releasing:
//     nothing is placed on them until a report sampled after the agent
//     learnt of the end (GPUReport.SeenSeq) shows no process of that
//     allocation, nor of any other ended one, on them. With enforce = "kill"
//     the agent is told to stop those processes. A machine whose agent is
//     silent for releasing_timeout_s has its releasing GPUs freed.
//     Declared machines with no agent free GPUs at once, as before.
//   - Unmanaged use. A process on a GPU is legitimate when it belongs to a
//     live allocation holding that GPU (itself, or as a slot of the backing
//     that does), or is unattributed on a GPU some live allocation holds.
//     Any other is unmanaged: flagged once (gpu.unmanaged), the GPU takes
//     nothing new while it is there, and with unmanaged = "kill" it is
//     ordered stopped after unmanaged_grace_s. A process of an ended
//     allocation is stopped per enforce wherever it is.
//   - Health. A critical XID, a rise of the uncorrectable ECC count, or a
//     GPU missing from the sample makes it unhealthy; it comes back after
//     healthy_after_s without a new error, or by an admin (FreeGPU).
//   - Drain. An admin drains single GPUs.
//
// A releasing, unhealthy, drained or unmanaged GPU that no allocation holds
// is blocked: its held entry is heldBlocked, which placement never takes.
//
// What is durable is small: the RecordGPUState record of a machine changes
// when a GPU starts or stops releasing, falls ill or heals, is drained, or
// the machine becomes observed. Samples, unmanaged flags and the agent's
// orders live in memory and reach the read view as a touched
// RecordGPUSample record: a report that changes nothing else writes
// nothing. Accounting and idle reclaim are in accounting.go.
type gputruth struct {
	policy arbiter.GPUPolicy
	ms     map[string]*gtMachine
	allocs map[int64]*gtAlloc // accounting.go
	days   map[string]*arbiter.UsageDay
	// trimmed is the day the day summaries were last trimmed (accounting.go).
	trimmed string
}

// heldBlocked in a machine's held list marks a GPU no allocation holds that
// must take nothing new (releasing, unhealthy, drained or unmanaged).
const heldBlocked = -1

// gtMachine is one machine's GPU ground truth.
type gtMachine struct {
	name     string
	observed bool
	gpus     map[int]*gtGPU // by GPU index
	// reportedAt is when the last report arrived (zero: none since start);
	// samples stand for the GPUs until reportedAt + FreshS.
	reportedAt time.Time
	// loadedAt is when the engine loaded the machine's state at start: a
	// silent agent's releasing timeout counts from it at the earliest, as
	// a keepalive gets a fresh interval after a restart.
	loadedAt   time.Time
	unmanaged  map[int]*gtUnmanaged // by pid
	ordered    map[int]bool         // pids the agent was told to stop
	orders     arbiter.GPUOrders
	wantFull   bool
	release    deadline // a silent agent's releasing GPUs are freed
	grace      deadline // the next unmanaged process whose grace ends
	heal       deadline // the next unhealthy GPU that may come back
	stateDirty bool     // the durable record must be saved with this batch
}

// gtGPU is one GPU of a machine.
type gtGPU struct {
	index int
	// usage is the latest reading; never modified once set, so the read
	// view may share it.
	usage     *arbiter.GPUUsage
	missing   bool
	releasing *arbiter.GPURelease
	unhealthy *arbiter.GPUFault
	lastFault time.Time // memory only: a restart gives healthy_after_s afresh
	drained   *arbiter.GPUDrain
	ecc       *int64
	unmanaged []int // pids, from the last evaluation
	// Accounting (accounting.go): the class of the latest reading, since
	// when it holds, and up to when its holder's time is accounted.
	cls      gtClass
	clsSince time.Time
	acctTo   time.Time
}

// gtClass says whether a GPU was busy, idle, or unknown (no reading).
type gtClass int8

const (
	clsUnknown gtClass = iota
	clsIdle
	clsBusy
)

// gtUnmanaged is an unmanaged process: flagged at since.
type gtUnmanaged struct {
	gpu   int
	since time.Time
}

func (g *gputruth) init() {
	if g.ms == nil {
		g.policy = arbiter.DefaultGPUPolicy()
		g.ms = map[string]*gtMachine{}
		g.allocs = map[int64]*gtAlloc{}
		g.days = map[string]*arbiter.UsageDay{}
	}
}

func (g *gputruth) kinds() []string {
	return []string{arbiter.RecordGPUState, arbiter.RecordGPUSample, arbiter.RecordUsageDay}
}

// load does nothing: New loads GPU ground truth (gtLoad) before the queue
// is reviewed, so that no request is placed on a drained or releasing GPU.
func (g *gputruth) load(*Engine, []arbiter.Record, time.Time) error { return nil }

func (g *gputruth) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	switch c := cmd.(type) {
	case arbiter.SetGPUPolicy:
		return nil, e.gtSetPolicy(c.Policy, now), true
	case arbiter.ReportGPUs:
		res, err := e.gtReport(c, now)
		return res, err, true
	case arbiter.SetGPUDrained:
		res, err := e.gtDrain(c, now)
		return res, err, true
	case arbiter.FreeGPU:
		res, err := e.gtFree(c, now)
		return res, err, true
	}
	return nil, nil, false
}

func (g *gputruth) records() []arbiter.Record {
	var out []arbiter.Record
	for _, name := range sortedKeys(g.ms) {
		gm := g.ms[name]
		if st := gm.state(); st.Observed || len(st.GPUs) > 0 {
			out = append(out, arbiter.Record{Kind: arbiter.RecordGPUState, Key: name, Value: st})
		}
	}
	for _, key := range sortedKeys(g.days) {
		d := *g.days[key]
		out = append(out, arbiter.Record{Kind: arbiter.RecordUsageDay, Key: key, Value: d})
	}
	return out
}

// gtLoad restores the durable GPU states and the day summaries. Releasing
// GPUs keep waiting for a report (or the timeout, counted from now).
func (e *Engine) gtLoad(recs []arbiter.Record, now time.Time) {
	g := &e.gt
	g.init()
	for _, r := range recs {
		switch r.Kind {
		case arbiter.RecordGPUState:
			var st arbiter.GPUMachineState
			if err := tasksDecode(r.Value, &st); err != nil || st.Machine != r.Key {
				e.emit(now, arbiter.EventEngineLoadError, "engine", map[string]string{"error": fmt.Sprintf("gpu state %q: %v", r.Key, err)})
				continue
			}
			if e.byName[st.Machine] == nil {
				e.removeRecord(arbiter.RecordGPUState, st.Machine)
				continue
			}
			gm := g.machine(st.Machine)
			gm.observed, gm.loadedAt = st.Observed, now
			for _, s := range st.GPUs {
				gg := gm.gpu(s.Index)
				gg.releasing, gg.unhealthy, gg.drained, gg.ecc = s.Releasing, s.Unhealthy, s.Drained, s.ECC
				if gg.unhealthy != nil {
					gg.lastFault = now
				}
			}
		case arbiter.RecordUsageDay:
			var d arbiter.UsageDay
			if err := tasksDecode(r.Value, &d); err != nil {
				e.emit(now, arbiter.EventEngineLoadError, "engine", map[string]string{"error": fmt.Sprintf("usage day %q: %v", r.Key, err)})
				continue
			}
			g.days[r.Key] = &d
		}
	}
	for _, name := range sortedKeys(g.ms) {
		gm := g.ms[name]
		mc := e.byName[name]
		e.gtBlock(mc)
		e.updateIndex(mc)
		e.gtArmRelease(gm, now)
		e.gtArmHeal(gm, now)
	}
}

func (g *gputruth) machine(name string) *gtMachine {
	gm := g.ms[name]
	if gm == nil {
		gm = &gtMachine{name: name, gpus: map[int]*gtGPU{}, unmanaged: map[int]*gtUnmanaged{}, ordered: map[int]bool{}}
		gm.release = newDeadline(func(e *Engine, now time.Time) { e.gtReleaseTimeout(gm, now) })
		gm.grace = newDeadline(func(e *Engine, now time.Time) { e.gtEvaluate(gm, now) })
		gm.heal = newDeadline(func(e *Engine, now time.Time) { e.gtHeal(gm, now) })
		g.ms[name] = gm
	}
	return gm
}

func (gm *gtMachine) gpu(index int) *gtGPU {
	gg := gm.gpus[index]
	if gg == nil {
		gg = &gtGPU{index: index}
		gm.gpus[index] = gg
	}
	return gg
}

// blocked reports whether a GPU must take nothing new.
func (gg *gtGPU) blocked() bool {
	return gg.releasing != nil || gg.unhealthy != nil || gg.drained != nil || len(gg.unmanaged) > 0
}

// gtBlock marks mc's free GPUs that must take nothing new as heldBlocked,
// and unblocks the others; a GPU it unblocks lets the queue move. The
// caller updates the placement index.
func (e *Engine) gtBlock(mc *machine) {
	gm := e.gt.ms[mc.m.Name]
	for p := range mc.held {
		if mc.held[p] > 0 {
			continue
		}
		want := int64(0)
		if gm != nil {
			if gg := gm.gpus[mc.m.GPUs[p].Index]; gg != nil && gg.blocked() {
				want = heldBlocked
			}
		}
		if mc.held[p] != want {
			if want == 0 {
				e.freed = true
			}
			mc.held[p] = want
		}
	}
}

// gtSetPolicy sets the policy and re-arms what depends on it.
func (e *Engine) gtSetPolicy(p arbiter.GPUPolicy, now time.Time) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p.CriticalXIDs = slices.Clone(p.CriticalXIDs)
	g := &e.gt
	g.policy = p
	for _, name := range sortedKeys(g.ms) {
		gm := g.ms[name]
		e.gtArmRelease(gm, now)
		e.gtArmHeal(gm, now)
		e.gtEvaluate(gm, now)
	}
	for _, id := range sortedKeys(g.allocs) {
		if ga := g.allocs[id]; !ga.idleFrom.IsZero() {
			e.gtArmIdle(ga, now)
		}
	}
	if e.freed {
		e.schedule(now)
	}
	return nil
}

// gtReport applies one agent report.
func (e *Engine) gtReport(c arbiter.ReportGPUs, now time.Time) (any, error) {
	mc := e.byName[c.Machine]
	if mc == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered; register it first", c.Machine)
	}
	r := &c.Report
	if err := r.Validate(&mc.m, now); err != nil {
		return nil, err
	}
	g := &e.gt
	gm := g.machine(mc.m.Name)
	seen := r.SeenSeq
	if seen > e.LastSeq() {
		seen = 0 // a number from another database: trust no release with it
		gm.wantFull = true
	}
	at := r.SampledAt.UTC()
	if at.After(now) {
		at = now // the host's clock is ahead; never decide on it
	}
	fresh := !gm.reportedAt.IsZero() && now.Sub(gm.reportedAt) <= secs(g.policy.FreshS())
	// Bring every holder's time up to now under what was known so far,
	// then take in the new readings.
	for _, p := range sortedKeys(gm.gpus) {
		e.gtAccrue(mc, gm, gm.gpus[p], now)
	}
	if !fresh {
		// A silence long enough that the last readings no longer stand:
		// what the report does not mention is unknown until it is.
		for _, gg := range gm.gpus {
			gg.cls, gg.clsSince = clsUnknown, now
		}
	}
	if r.Full {
		gm.wantFull = false
	}
	if !gm.observed {
		gm.observed = true
		gm.stateDirty = true
	}
	inReport := make(map[int]bool, len(r.GPUs))
	for i := range r.GPUs {
		inReport[r.GPUs[i].Index] = true
		e.gtReading(mc, gm, &r.GPUs[i], at, now)
	}
	if r.Full {
		for _, gpu := range mc.m.GPUs {
			if !inReport[gpu.Index] {
				e.gtReading(mc, gm, &arbiter.GPUReading{Index: gpu.Index, Missing: true}, at, now)
			}
		}
	}
	if !fresh && !r.Full {
		gm.wantFull = true
	}
	gm.reportedAt = now
	e.gtReleaseClean(mc, gm, seen, now)
	e.gtArmRelease(gm, now)
	e.gtEvaluate(gm, now)
	e.gtAccountMachine(mc, now) // accounting.go: flushes, idle
	if e.freed {
		e.schedule(now)
	}
	orders := gm.orders
	orders.Seq = e.LastSeq()
	orders.WantFull = gm.wantFull
	return orders, nil
}

// gtReading takes in one GPU's reading: its usage, class and health.
func (e *Engine) gtReading(mc *machine, gm *gtMachine, r *arbiter.GPUReading, at, now time.Time) {
	gg := gm.gpu(r.Index)
	if r.Missing {
		if !gg.missing || gg.usage != nil {
			gg.missing, gg.usage = true, nil
			gg.cls, gg.clsSince = clsUnknown, now
		}
		e.gtFault(mc, gm, gg, "the GPU vanished: it is not in the agent's sample (fallen off the bus?)", now)
		return
	}
	if gg.missing && gg.unhealthy != nil {
		// Missing until now: healthy_after_s counts from its return.
		gg.lastFault = now
		e.gtArmHeal(gm, now)
	}
	gg.missing = false
	u := &arbiter.GPUUsage{UtilPct: r.UtilPct, MemUsedMiB: r.MemUsedMiB, MemTotalMiB: r.MemTotalMiB, TempC: r.TempC,
		PowerW: r.PowerW, SampledAt: at, Processes: slices.Clone(r.Processes), ProcessesUnknown: r.ProcessesUnknown}
	if u.Processes == nil {
		u.Processes = []arbiter.GPUProcess{}
	}
	sort.Slice(u.Processes, func(i, j int) bool { return u.Processes[i].PID < u.Processes[j].PID })
	gg.usage = u
	cls := clsUnknown
	if r.UtilPct != nil {
		cls = clsBusy
		if float64(*r.UtilPct) < e.gt.policy.IdleUtilPct {
			cls = clsIdle
		}
	}
	if cls != gg.cls {
		gg.cls, gg.clsSince = cls, now
	}
	for _, x := range r.XIDs {
		if slices.Contains(e.gt.policy.CriticalXIDs, x) {
			e.gtFault(mc, gm, gg, xidReason(x), now)
		}
	}
	if r.ECCUncorrected != nil {
		n := *r.ECCUncorrected
		if (gg.ecc == nil && n > 0) || (gg.ecc != nil && n > *gg.ecc) {
			e.gtFault(mc, gm, gg, fmt.Sprintf("ECC double-bit error: %d uncorrectable error(s) since the driver loaded", n), now)
		}
		if gg.ecc == nil || *gg.ecc != n {
			gm.stateDirty = true // saved: a restart must not take an old count for a new error
		}
		gg.ecc = &n
	}
}

// gtFault records an error on a GPU: it becomes unhealthy if it was not,
// and stays so for healthy_after_s from now.
func (e *Engine) gtFault(mc *machine, gm *gtMachine, gg *gtGPU, reason string, now time.Time) {
	gg.lastFault = now
	if gg.unhealthy == nil {
		gg.unhealthy = &arbiter.GPUFault{Reason: reason, Since: now}
		gm.stateDirty = true
		e.emit(now, arbiter.EventGPUUnhealthy, gpuSubject(gm.name, gg.index),
			arbiter.GPUHealthEvent{Machine: gm.name, GPU: gg.index, Reason: reason, Allocation: holderOf(mc, gg.index)})
	}
	e.gtArmHeal(gm, now)
}

// gtHeal brings back the unhealthy GPUs that went healthy_after_s without
// an error. A GPU still missing from the samples is an error still going
// on (the agent reports it missing once, not in every report): its time
// starts again.
func (e *Engine) gtHeal(gm *gtMachine, now time.Time) {
	mc := e.byName[gm.name]
	if mc == nil {
		return
	}
	after := secs(e.gt.policy.HealthyAfterS)
	for _, idx := range sortedKeys(gm.gpus) {
		gg := gm.gpus[idx]
		if gg.unhealthy == nil || now.Before(gg.lastFault.Add(after)) {
			continue
		}
		if gg.missing {
			gg.lastFault = now
			continue
		}
		reason := gg.unhealthy.Reason
		gg.unhealthy = nil
		gm.stateDirty = true
		e.emit(now, arbiter.EventGPUHealthy, gpuSubject(gm.name, idx), arbiter.GPUHealthEvent{Machine: gm.name, GPU: idx,
			Reason: fmt.Sprintf("no error for %s since: %s", arbiter.HumanDuration(after), reason), Allocation: holderOf(mc, idx)})
	}
	e.gtArmHeal(gm, now)
	e.gtBlock(mc)
	e.updateIndex(mc)
	e.gtPublish(mc, gm, now)
}

func (e *Engine) gtArmHeal(gm *gtMachine, now time.Time) {
	var next time.Time
	for _, gg := range gm.gpus {
		if gg.unhealthy != nil {
			at := gg.lastFault.Add(secs(e.gt.policy.HealthyAfterS))
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	if next.IsZero() {
		e.dl.clear(&gm.heal)
		return
	}
	e.dl.set(&gm.heal, next)
}

// gtEnding is called by destroy before an allocation lets go of its GPUs:
// its accounting is brought up to its end, and on an observed machine its
// GPUs start releasing.
func (e *Engine) gtEnding(a *alloc, reason string, now time.Time) {
	e.gtAllocEnding(a, now) // accounting.go
	mc := a.mach
	if mc == nil {
		return
	}
	gm := e.gt.ms[mc.m.Name]
	if gm == nil || !gm.observed || len(a.gpus) == 0 {
		return
	}
	if reason == "" {
		reason = "ended"
	}
	e.emit(now, arbiter.EventGPUReleasing, "machine/"+gm.name,
		arbiter.GPUReleasingEvent{Machine: gm.name, GPUs: slices.Clone(a.gpus), Allocation: a.a.ID, Reason: reason})
	seq := e.LastSeq()
	for _, idx := range a.gpus {
		gg := gm.gpu(idx)
		gg.releasing = &arbiter.GPURelease{Allocation: a.a.ID, Reason: reason, Since: now, Seq: seq}
	}
	gm.stateDirty = true
	e.gtArmRelease(gm, now)
}

// gtEnded is called by destroy once the allocation is no longer live: the
// processes left of it are judged again (a pool slot's, on its backing's
// GPUs).
func (e *Engine) gtEnded(a *alloc, now time.Time) {
	if mc, _ := e.gtGPUsOf(a); mc != nil {
		if gm := e.gt.ms[mc.m.Name]; gm != nil {
			e.gtEvaluate(gm, now)
		}
	}
}

// gtReleaseClean frees the releasing GPUs that a sample taken after their
// release (seen) shows clean: no process of the ended allocation, nor of
// any other ended one.
func (e *Engine) gtReleaseClean(mc *machine, gm *gtMachine, seen int64, now time.Time) {
	freed := map[int64][]int{}
	for _, idx := range sortedKeys(gm.gpus) {
		gg := gm.gpus[idx]
		rel := gg.releasing
		if rel == nil || seen < rel.Seq || gg.usage == nil || gg.usage.ProcessesUnknown {
			continue // unknown processes are not none: releasing_timeout_s frees it
		}
		clean := true
		for _, p := range gg.usage.Processes {
			if p.Allocation != nil && (*p.Allocation == rel.Allocation || e.allocs[*p.Allocation] == nil) {
				clean = false
				break
			}
		}
		if clean {
			freed[rel.Allocation] = append(freed[rel.Allocation], idx)
		}
	}
	e.gtRelease(mc, gm, freed, "clean", now)
}

// gtRelease ends the releasing state of GPUs, by allocation, saying how.
func (e *Engine) gtRelease(mc *machine, gm *gtMachine, freed map[int64][]int, how string, now time.Time) {
	for _, id := range sortedKeys(freed) {
		idxs := freed[id]
		rel := gm.gpus[idxs[0]].releasing
		killed := false
		for _, idx := range idxs {
			killed = killed || gm.gpus[idx].releasing.Killed
			gm.gpus[idx].releasing = nil
		}
		gm.stateDirty = true
		e.emit(now, arbiter.EventGPUReleased, "machine/"+gm.name, arbiter.GPUReleasedEvent{Machine: gm.name, GPUs: idxs,
			Allocation: id, AfterS: now.Sub(rel.Since).Seconds(), Killed: killed, How: how})
	}
	if len(freed) > 0 && mc != nil {
		e.gtBlock(mc)
		e.updateIndex(mc)
	}
}

// gtArmRelease sets when a silent agent's releasing GPUs are freed:
// releasing_timeout_s after both the release and the last report.
func (e *Engine) gtArmRelease(gm *gtMachine, now time.Time) {
	var first time.Time
	for _, gg := range gm.gpus {
		if r := gg.releasing; r != nil && (first.IsZero() || r.Since.Before(first)) {
			first = r.Since
		}
	}
	if first.IsZero() {
		e.dl.clear(&gm.release)
		return
	}
	from := first
	for _, t := range []time.Time{gm.reportedAt, gm.loadedAt} {
		if t.After(from) {
			from = t
		}
	}
	e.dl.set(&gm.release, from.Add(secs(e.gt.policy.ReleasingTimeoutS)))
}

// gtReleaseTimeout frees the releasing GPUs of a machine whose agent has
// been silent for releasing_timeout_s.
func (e *Engine) gtReleaseTimeout(gm *gtMachine, now time.Time) {
	timeout := secs(e.gt.policy.ReleasingTimeoutS)
	last := gm.reportedAt
	if gm.loadedAt.After(last) {
		last = gm.loadedAt
	}
	if !last.IsZero() && now.Sub(last) < timeout {
		e.gtArmRelease(gm, now) // it spoke since: wait for its reports
		return
	}
	freed := map[int64][]int{}
	for _, idx := range sortedKeys(gm.gpus) {
		if r := gm.gpus[idx].releasing; r != nil && now.Sub(r.Since) >= timeout {
			freed[r.Allocation] = append(freed[r.Allocation], idx)
		}
	}
	mc := e.byName[gm.name]
	e.gtRelease(mc, gm, freed, "timeout", now)
	e.gtArmRelease(gm, now)
	e.gtEvaluate(gm, now)
}

// gtEvaluate judges every process on the machine's GPUs against the
// allocations: it flags new unmanaged processes, decides the agent's
// orders, blocks or unblocks GPUs, and publishes the machine.
func (e *Engine) gtEvaluate(gm *gtMachine, now time.Time) {
	mc := e.byName[gm.name]
	if mc == nil {
		return
	}
	pol := &e.gt.policy
	grace := secs(pol.UnmanagedGraceS)
	present := map[int]bool{}
	var kill []arbiter.GPUKill
	ordered := map[int]bool{}
	endedSet := map[int64]bool{}
	releasing := false
	var nextGrace time.Time
	for _, idx := range sortedKeys(gm.gpus) {
		gg := gm.gpus[idx]
		gg.unmanaged = gg.unmanaged[:0]
		if gg.releasing != nil {
			releasing = true
			if pol.Enforce == arbiter.EnforceKill {
				endedSet[gg.releasing.Allocation] = true
			}
		}
		if gg.usage == nil {
			continue
		}
		holder := e.holderAlloc(mc, idx)
		for _, p := range gg.usage.Processes {
			leftover, unmanaged := e.gtJudge(p, holder, gg)
			if !leftover && !unmanaged && p.Allocation != nil && !ordered[p.PID] {
				// An allocation being preempted: SIGTERM now, SIGKILL at its end (preempt.go).
				if k, ok := preemptKill(p, e.allocs[*p.Allocation], idx, now); ok {
					ordered[p.PID] = true
					kill = append(kill, k)
				}
			}
			if unmanaged {
				gg.unmanaged = append(gg.unmanaged, p.PID)
				present[p.PID] = true
				u := gm.unmanaged[p.PID]
				if u == nil {
					u = &gtUnmanaged{gpu: idx, since: now}
					gm.unmanaged[p.PID] = u
					e.emit(now, arbiter.EventGPUUnmanaged, gpuSubject(gm.name, idx), arbiter.GPUUnmanagedEvent{Machine: gm.name,
						GPU: idx, PID: p.PID, User: p.User, MemMiB: p.MemMiB, Command: p.Command, Allocation: p.Allocation, Action: pol.Unmanaged})
				}
				if pol.Unmanaged == arbiter.UnmanagedKill && !ordered[p.PID] {
					if due := u.since.Add(grace); !now.Before(due) {
						ordered[p.PID] = true
						kill = append(kill, arbiter.GPUKill{PID: p.PID, GPU: idx, Allocation: p.Allocation, GraceS: pol.KillGraceS,
							Reason: fmt.Sprintf("unmanaged: %s on GPU %d of %s for %s", gtWhyUnmanaged(p, holder), idx, gm.name, arbiter.HumanDuration(now.Sub(u.since)))})
					} else if nextGrace.IsZero() || due.Before(nextGrace) {
						nextGrace = due
					}
				}
			}
			if leftover && pol.Enforce == arbiter.EnforceKill && !ordered[p.PID] {
				ordered[p.PID] = true
				reason := fmt.Sprintf("allocation %d ended", *p.Allocation)
				if rec := e.retired[*p.Allocation]; rec != nil && rec.Reason != nil {
					reason += ": " + *rec.Reason
				}
				kill = append(kill, arbiter.GPUKill{PID: p.PID, GPU: idx, Allocation: p.Allocation, Reason: reason, GraceS: pol.KillGraceS})
				for _, g2 := range gm.gpus {
					if r := g2.releasing; r != nil && r.Allocation == *p.Allocation && !r.Killed {
						r.Killed = true
						gm.stateDirty = true
					}
				}
			}
		}
	}
	for pid := range gm.unmanaged {
		if !present[pid] {
			delete(gm.unmanaged, pid)
		}
	}
	for _, k := range kill {
		if !gm.ordered[k.PID] {
			e.emit(now, arbiter.EventGPUKill, gpuSubject(gm.name, k.GPU), arbiter.GPUKillEvent{Machine: gm.name, GPUKill: k})
		}
	}
	gm.ordered = ordered
	ended := make([]int64, 0, len(endedSet))
	for id := range endedSet {
		ended = append(ended, id)
	}
	slices.Sort(ended)
	if kill == nil {
		kill = []arbiter.GPUKill{}
	}
	gm.orders = arbiter.GPUOrders{Policy: e.gtAgentPolicy(), Ended: ended, Kill: kill, ReportNow: releasing}
	if nextGrace.IsZero() {
		e.dl.clear(&gm.grace)
	} else {
		e.dl.set(&gm.grace, nextGrace)
	}
	e.gtBlock(mc)
	e.updateIndex(mc)
	e.gtPublish(mc, gm, now)
}

// gtJudge says whether a process on GPU gg (held by holder, nil when no
// live allocation holds it) is a leftover of an ended allocation, to be
// stopped per enforce, and whether it is unmanaged, to be flagged. A
// process of the allocation gg is releasing for is a leftover only.
func (e *Engine) gtJudge(p arbiter.GPUProcess, holder *alloc, gg *gtGPU) (leftover, unmanaged bool) {
	if p.Allocation == nil {
		return false, holder == nil
	}
	id := *p.Allocation
	if x := e.allocs[id]; x != nil {
		if holder != nil && (x == holder || x.a.Backing != nil && *x.a.Backing == holder.a.ID) {
			return false, false
		}
		return false, true // belongs to an allocation that does not hold this GPU
	}
	if id >= e.nextID {
		return false, true // names no allocation that ever was
	}
	return true, gg.releasing == nil || gg.releasing.Allocation != id
}

func gtWhyUnmanaged(p arbiter.GPUProcess, holder *alloc) string {
	who := fmt.Sprintf("pid %d", p.PID)
	if p.User != "" {
		who += " (" + p.User + ")"
	}
	switch {
	case p.Allocation == nil:
		return who + ", with no allocation,"
	case holder == nil:
		return fmt.Sprintf("%s, of allocation %d, on a GPU it does not hold,", who, *p.Allocation)
	}
	return fmt.Sprintf("%s, of allocation %d, on a GPU of allocation %d,", who, *p.Allocation, holder.a.ID)
}

// holderAlloc returns the live allocation holding GPU index of mc, or nil.
func (e *Engine) holderAlloc(mc *machine, index int) *alloc {
	p := gpuPos(&mc.m, index)
	if p < 0 || mc.held[p] <= 0 {
		return nil
	}
	return e.allocs[mc.held[p]]
}

func holderOf(mc *machine, index int) *int64 {
	if mc == nil {
		return nil
	}
	p := gpuPos(&mc.m, index)
	if p < 0 || mc.held[p] <= 0 {
		return nil
	}
	id := mc.held[p]
	return &id
}

func (e *Engine) gtAgentPolicy() arbiter.GPUAgentPolicy {
	p := &e.gt.policy
	return arbiter.GPUAgentPolicy{SampleS: p.SampleS, ReportS: p.ReportS(), KillGraceS: p.KillGraceS, Enforce: p.Enforce, IdleUtilPct: p.IdleUtilPct}
}

// gtPublish shows the machine's GPUs in the read view: the sample as a
// touched record, the durable state as a saved one when it changed.
func (e *Engine) gtPublish(mc *machine, gm *gtMachine, now time.Time) {
	s := arbiter.GPUMachineSample{Machine: gm.name, ReportedAt: gm.reportedAt, Orders: gm.orders,
		GPUs: make([]arbiter.GPUSampleEntry, 0, len(mc.m.GPUs))}
	s.Orders.Ended = slices.Clone(s.Orders.Ended)
	s.Orders.Kill = slices.Clone(s.Orders.Kill)
	for _, gpu := range mc.m.GPUs {
		gg := gm.gpus[gpu.Index]
		if gg == nil {
			continue
		}
		s.GPUs = append(s.GPUs, arbiter.GPUSampleEntry{Index: gg.index, Usage: gg.usage, Missing: gg.missing, Unmanaged: slices.Clone(gg.unmanaged)})
	}
	e.touchRecord(arbiter.RecordGPUSample, gm.name, s)
	if gm.stateDirty {
		gm.stateDirty = false
		e.putRecord(arbiter.RecordGPUState, gm.name, gm.state())
	}
}

// state is the machine's durable record.
func (gm *gtMachine) state() arbiter.GPUMachineState {
	st := arbiter.GPUMachineState{Machine: gm.name, Observed: gm.observed, GPUs: []arbiter.GPUStateEntry{}}
	for _, idx := range sortedKeys(gm.gpus) {
		gg := gm.gpus[idx]
		if gg.releasing == nil && gg.unhealthy == nil && gg.drained == nil && gg.ecc == nil {
			continue
		}
		ent := arbiter.GPUStateEntry{Index: idx, ECC: gg.ecc}
		if gg.releasing != nil {
			r := *gg.releasing
			ent.Releasing = &r
		}
		if gg.unhealthy != nil {
			f := *gg.unhealthy
			ent.Unhealthy = &f
		}
		if gg.drained != nil {
			d := *gg.drained
			ent.Drained = &d
		}
		st.GPUs = append(st.GPUs, ent)
	}
	return st
}

// gtGPUOf finds GPU index of machine name for an admin command.
func (e *Engine) gtGPUOf(name string, index int) (*machine, *gtMachine, *gtGPU, error) {
	mc := e.byName[name]
	if mc == nil {
		return nil, nil, nil, arbiter.Errorf(arbiter.ENotFound, "machine %q does not exist", name)
	}
	if gpuPos(&mc.m, index) < 0 {
		return nil, nil, nil, arbiter.Errorf(arbiter.ENotFound, "machine %s has no GPU %d", name, index)
	}
	e.gt.init()
	gm := e.gt.machine(name)
	return mc, gm, gm.gpu(index), nil
}

func (e *Engine) gtDrain(c arbiter.SetGPUDrained, now time.Time) (any, error) {
	if len(c.Reason) > 1024 {
		return nil, arbiter.Errorf(arbiter.EInvalid, "reason is longer than 1024 bytes")
	}
	mc, gm, gg, err := e.gtGPUOf(c.Machine, c.Index)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Drained && gg.drained == nil:
		gg.drained = &arbiter.GPUDrain{Reason: c.Reason, By: c.By, Since: now}
		e.emit(now, arbiter.EventGPUDrained, gpuSubject(gm.name, c.Index), arbiter.GPUDrainEvent{Machine: gm.name, GPU: c.Index, Reason: c.Reason, By: c.By})
	case !c.Drained && gg.drained != nil:
		gg.drained = nil
		e.emit(now, arbiter.EventGPUUndrained, gpuSubject(gm.name, c.Index), arbiter.GPUDrainEvent{Machine: gm.name, GPU: c.Index, Reason: c.Reason, By: c.By})
	default:
		return mc.m, nil
	}
	gm.stateDirty = true
	e.gtBlock(mc)
	e.updateIndex(mc)
	e.gtPublish(mc, gm, now)
	e.explainAll()
	if e.freed {
		e.schedule(now)
	}
	return mc.m, nil
}

func (e *Engine) gtFree(c arbiter.FreeGPU, now time.Time) (any, error) {
	mc, gm, gg, err := e.gtGPUOf(c.Machine, c.Index)
	if err != nil {
		return nil, err
	}
	if gg.unhealthy != nil {
		reason := gg.unhealthy.Reason
		gg.unhealthy = nil
		gm.stateDirty = true
		e.emit(now, arbiter.EventGPUHealthy, gpuSubject(gm.name, c.Index), arbiter.GPUHealthEvent{Machine: gm.name, GPU: c.Index,
			Reason: fmt.Sprintf("declared healthy by %s (was: %s)", orWho(c.By), reason), Allocation: holderOf(mc, c.Index)})
		e.gtArmHeal(gm, now)
	}
	if r := gg.releasing; r != nil {
		e.gtRelease(mc, gm, map[int64][]int{r.Allocation: {c.Index}}, "admin", now)
		e.gtArmRelease(gm, now)
	}
	e.gtEvaluate(gm, now)
	if e.freed {
		e.schedule(now)
	}
	return mc.m, nil
}

// gtRemoveMachine forgets a machine that is gone.
func (e *Engine) gtRemoveMachine(name string) {
	gm := e.gt.ms[name]
	if gm == nil {
		return
	}
	e.dl.clear(&gm.release)
	e.dl.clear(&gm.grace)
	e.dl.clear(&gm.heal)
	delete(e.gt.ms, name)
	e.removeRecord(arbiter.RecordGPUState, name)
	e.removeRecord(arbiter.RecordGPUSample, name)
}

func orWho(s string) string {
	if s == "" {
		return "an admin"
	}
	return s
}

func gpuSubject(machine string, index int) string {
	return "machine/" + machine + "/gpu/" + strconv.Itoa(index)
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// xidNames are the critical XIDs of the default list, named as NVIDIA's
// XID catalog names them.
var xidNames = map[int]string{
	48:  "double-bit ECC error",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping event",
	64:  "ECC page retirement or row remapper recording failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

func xidReason(x int) string {
	if n, ok := xidNames[x]; ok {
		return fmt.Sprintf("XID %d: %s", x, n)
	}
	return fmt.Sprintf("XID %d", x)
}

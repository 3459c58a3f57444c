package agent

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
)

// The enforcer is the engine's hands on this host: it stops the processes
// the engine's orders name — SIGTERM, then SIGKILL after the order's grace —
// and tells the task runner of allocations that ended, whose tasks it
// kills at once. Before signalling it checks the process again: it stops
// only a process the observer reported in its last sample, still the same
// one (the same start time: not a later process given the pid) and still
// in the allocation the order names; it checks the start time again before
// the SIGKILL. It signals through a handle taken before the first check
// (openProcess), so a pid reused between a check and a signal is not hit
// either. A pid out of range, its own or its parent's, is never
// signalled. A process of another user it may not signal is logged: the
// GPU stays releasing, or flagged, for an admin to see. In a PID namespace
// whose pids the driver's may not match (refuse) it stops nothing: a pid
// there could be another process.
type enforcer struct {
	procs *gpu.ProcReader // its own: the observer's is not shared
	log   *slog.Logger
	ended func([]int64) // the task runner's; nil without one
	// refuse, when set, is why no process named by pid is stopped, nor
	// read by the observer (the pids may not be this PID namespace's:
	// untrustedPIDs); set by newObserver.
	refuse string

	mu      sync.Mutex
	killing map[int]chan struct{} // pids being stopped → closed when the server withdraws the order
	refused map[int]bool          // pids whose order was refused and logged
	seen    map[int]string        // the start time of each process of the last sample, by pid (see)
	latest  int64                 // the newest orders' Seq
	done    chan struct{}
	wg      sync.WaitGroup
}

// maxRefused bounds the pids remembered as refused and logged.
const maxRefused = 4096

func newEnforcer(procs *gpu.ProcReader, log *slog.Logger, ended func([]int64)) *enforcer {
	return &enforcer{procs: procs, log: log, ended: ended, killing: map[int]chan struct{}{}, refused: map[int]bool{}, done: make(chan struct{})}
}

// see records the processes of a sample, pid → start time (gpu.ProcInfo):
// the only ones an order may stop.
func (e *enforcer) see(started map[int]string) {
	e.mu.Lock()
	e.seen = started
	e.mu.Unlock()
}

// apply carries out orders: safe to call with the same orders again. The
// orders are the server's whole judgement of this machine (unless their
// policy is all zeroes: the server has not judged it since it started), so
// a stop under way whose order is gone was withdrawn — a preemption
// called off, a process the server no longer minds — and sends no SIGKILL.
func (e *enforcer) apply(o arbiter.GPUOrders, pol *arbiter.GPUAgentPolicy) {
	if len(o.Ended) > 0 && e.ended != nil && pol.Enforce == arbiter.EnforceKill {
		e.ended(o.Ended)
	}
	e.mu.Lock()
	// The observer's two loops answer orders concurrently: a set older
	// than one applied already must neither withdraw nor order a stop.
	stale := o.Seq > 0 && o.Seq < e.latest
	e.latest = max(e.latest, o.Seq)
	e.mu.Unlock()
	if stale {
		return
	}
	if o.Policy.SampleS > 0 {
		e.withdraw(o.Kill)
	}
	for _, k := range o.Kill {
		switch {
		case e.refuse != "":
			e.refuseOnce(k, "its pid cannot be trusted here")
			continue
		case k.PID < 2 || k.PID > arbiter.MaxPID || k.PID == os.Getpid() || k.PID == os.Getppid():
			e.refuseOnce(k, "the pid is out of range, the agent's own or its parent's")
			continue
		}
		e.mu.Lock()
		_, busy := e.killing[k.PID]
		var withdrawn chan struct{}
		if !busy {
			withdrawn = make(chan struct{})
			e.killing[k.PID] = withdrawn
		}
		e.mu.Unlock()
		if busy {
			continue
		}
		// The handle is taken before the check, so the process checked is
		// the one it names (or a later one the check tells apart).
		p, err := openProcess(k.PID)
		if err != nil {
			e.log.Warn("cannot stop a process on a GPU", "pid", k.PID, "err", err)
			e.forget(k.PID, withdrawn)
			continue
		}
		start, ok := e.named(k)
		if !ok {
			p.Release()
			e.forget(k.PID, withdrawn)
			continue
		}
		e.wg.Add(1)
		go func(k arbiter.GPUKill) {
			defer e.wg.Done()
			defer e.forget(k.PID, withdrawn)
			defer p.Release()
			e.stopProcess(p, k, start, withdrawn)
		}(k)
	}
}

// named reports whether k's pid is still the process k names — reported
// in the last sample, started then, in the allocation named — and when it
// started. A process gone (or unreadable) is passed over quietly; another
// one is logged.
func (e *enforcer) named(k arbiter.GPUKill) (start string, ok bool) {
	e.mu.Lock()
	seen := e.seen[k.PID]
	start, now := e.procs.Identity(k.PID)
	e.mu.Unlock()
	want := int64(0)
	if k.Allocation != nil {
		want = *k.Allocation
	}
	if start == "" {
		return "", false
	}
	if start != seen || now != want {
		e.log.Warn("not stopping a process: it is no longer the one the server named", "pid", k.PID,
			"allocation_named", want, "allocation_now", now, "reported", seen != "", "same_process", start == seen, "reason", k.Reason)
		return "", false
	}
	return start, true
}

// openProcess returns a handle on the process that has pid now. Where the
// system has them (Linux 5.3 and later: a pidfd; Windows: a process
// handle) the handle keeps naming that process: a signal sent through it
// after the process ended fails with os.ErrProcessDone and never reaches a
// later process given the pid. Elsewhere it holds the pid, and the checks
// of the start time are all that stand between a kill and a reused pid.
func openProcess(pid int) (*os.Process, error) {
	return os.FindProcess(pid)
}

// refuseOnce logs, once per pid, that k is not carried out and why.
func (e *enforcer) refuseOnce(k arbiter.GPUKill, why string) {
	e.mu.Lock()
	if len(e.refused) >= maxRefused {
		clear(e.refused) // a pid may be logged again
	}
	logged := e.refused[k.PID]
	e.refused[k.PID] = true
	e.mu.Unlock()
	if !logged {
		e.log.Warn("not stopping a process on a GPU: "+why, "pid", k.PID, "gpu", k.GPU, "reason", k.Reason)
	}
}

// goneOrReplaced reports whether the process that started at start no
// longer has pid: it is gone, or the pid is another process's now.
func (e *enforcer) goneOrReplaced(pid int, start string) bool {
	if processGone(pid) {
		return true
	}
	e.mu.Lock()
	now := e.procs.StartOf(pid)
	e.mu.Unlock()
	return now != start
}

// forget ends the stop of pid whose withdrawal channel is withdrawn (not a
// later stop of the pid, begun after this one was withdrawn).
func (e *enforcer) forget(pid int, withdrawn chan struct{}) {
	e.mu.Lock()
	if e.killing[pid] == withdrawn {
		delete(e.killing, pid)
	}
	e.mu.Unlock()
}

// withdraw calls off the stops under way of the pids not in kill.
func (e *enforcer) withdraw(kill []arbiter.GPUKill) {
	keep := make(map[int]bool, len(kill))
	for _, k := range kill {
		keep[k.PID] = true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for pid, withdrawn := range e.killing {
		if !keep[pid] {
			close(withdrawn)
			delete(e.killing, pid)
		}
	}
}

// stopProcess sends SIGTERM to p, the process that started at start, waits
// up to the grace for it to go, then sends SIGKILL, unless its pid is
// another process's by then or the order was withdrawn.
func (e *enforcer) stopProcess(p *os.Process, k arbiter.GPUKill, start string, withdrawn <-chan struct{}) {
	log := e.log.With("pid", k.PID, "gpu", k.GPU, "reason", k.Reason)
	select {
	case <-withdrawn: // by orders applied meanwhile
		return
	default:
	}
	if err := signalProcess(p, false); err != nil {
		if !errors.Is(err, os.ErrProcessDone) && !processGone(k.PID) {
			log.Warn("cannot stop the process", "err", err)
		}
		return
	}
	log.Info("stopping a process on a GPU (SIGTERM)", "grace", secs(k.GraceS))
	deadline := time.Now().Add(secs(k.GraceS))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if e.goneOrReplaced(k.PID, start) {
			return
		}
		select {
		case <-e.done:
			return
		case <-withdrawn:
			log.Info("the server withdrew its order to stop a process on a GPU: not killing it")
			return
		case <-tick.C:
		}
	}
	if e.goneOrReplaced(k.PID, start) {
		return
	}
	if err := signalProcess(p, true); err != nil && !errors.Is(err, os.ErrProcessDone) && !processGone(k.PID) {
		log.Warn("cannot kill the process", "err", err)
		return
	}
	log.Info("killed a process on a GPU (SIGKILL) after its grace")
}

// stop abandons the stops in progress (the agent is stopping).
func (e *enforcer) stop() {
	select {
	case <-e.done:
	default:
		close(e.done)
	}
	e.wg.Wait()
}

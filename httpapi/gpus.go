package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// GPU ground truth (docs/reference/gpu-truth.md): agents' reports and their orders
// long-poll, single-GPU administration, and the usage report.

// Limits of the GPU routes.
const (
	// A machine's agent reports every sample_s, and at once when woken;
	// beyond this rate (with bursts of gpuReportBurst) reports are refused, so
	// a runaway agent cannot flood the control loop.
	gpuReportRate  = 5.0 // reports a second, per machine
	gpuReportBurst = 20.0
	// maxUsageDays bounds a usage report's range.
	maxUsageDays = 3660
)

// gpuReports is the server's state for the agents' GPU routes.
type gpuReports struct {
	limit gpuLimiter
}

// gpuLimiter is a token bucket per machine.
type gpuLimiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// allow takes a token of machine's bucket, or says it has none.
func (l *gpuLimiter) allow(machine string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil {
		l.buckets = map[string]*bucket{}
	}
	b := l.buckets[machine]
	if b == nil {
		if len(l.buckets) > 100000 {
			clear(l.buckets) // bounded: machine names come from outside
		}
		b = &bucket{tokens: gpuReportBurst, at: now}
		l.buckets[machine] = b
	}
	b.tokens = min(gpuReportBurst, b.tokens+now.Sub(b.at).Seconds()*gpuReportRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (s *Server) handleGPUReport(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	if !s.gpus.limit.allow(name, time.Now()) {
		return arbiter.Errorf(arbiter.EUnavailable, "machine %s sends GPU reports faster than %g a second; its agent should report every sample_s", name, gpuReportRate)
	}
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	var rep arbiter.GPUReport
	if err := decodeJSON(buf.Bytes(), &rep); err != nil {
		return err
	}
	res, err := s.plane.Do(r.Context(), arbiter.ReportGPUs{Machine: name, Report: rep})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, res)
	return nil
}

// handleGPUOrders answers the agent's orders: at once, or — with since
// and wait — as soon as an event concerning the machine comes after since
// (an allocation ended on it, a process ordered stopped), at the latest
// after wait.
func (s *Server) handleGPUOrders(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := machineName(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "since", "wait"); err != nil {
		return err
	}
	var wait time.Duration
	if q.Has("wait") {
		if wait, err = parseWait(q.Get("wait")); err != nil {
			return err
		}
	}
	since := int64(-1)
	if v := q.Get("since"); v != "" {
		if since, err = strconv.ParseInt(v, 10, 64); err != nil || since < 0 {
			return arbiter.Errorf(arbiter.EInvalid, "since %q must be an event sequence number, 0 or more", arbiter.Clip(v, 40))
		}
	}
	if _, ok := s.plane.Machine(name); !ok {
		return arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered; register it first", name)
	}
	if wait > 0 && since >= 0 && since <= s.plane.LastSeq() {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		s.ordersWake.wait(ctx, s.plane, name, since)
		cancel()
		if err := r.Context().Err(); err != nil {
			return httpio.ContextError(r.Context(), err) // refused meanwhile, or the client went
		}
	}
	httpio.WriteJSON(w, http.StatusOK, s.gpuOrders(name))
	return nil
}

// gpuOrders reads a machine's orders from the view. Seq is read first, so
// that the orders are at least as new as it.
func (s *Server) gpuOrders(name string) arbiter.GPUOrders {
	seq := s.plane.LastSeq()
	v, ok := s.plane.Record(arbiter.RecordGPUSample, name)
	sm, isSample := v.(arbiter.GPUMachineSample)
	if !ok || !isSample {
		// No report since the server started: ask for every GPU.
		return arbiter.GPUOrders{Seq: seq, Ended: []int64{}, Kill: []arbiter.GPUKill{}, WantFull: true}
	}
	o := sm.Orders
	o.Seq = seq
	return o
}

// gpuIndex returns the {index} path value, checked.
func gpuIndex(r *http.Request) (int, error) {
	v := r.PathValue("index")
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 || i > 1<<16 || v[0] < '0' || v[0] > '9' {
		return 0, arbiter.Errorf(arbiter.EInvalid, "GPU index %q is not a whole number, 0 or more", arbiter.Clip(v, 20))
	}
	return i, nil
}

// gpuCommand parses a single-GPU admin route: machine, index and ?reason=.
func (s *Server) gpuCommand(r *http.Request, withReason bool) (name string, index int, reason string, err error) {
	if name, err = machineName(r); err != nil {
		return
	}
	if index, err = gpuIndex(r); err != nil {
		return
	}
	q := r.URL.Query()
	if withReason {
		err = httpio.OnlyParams(q, "reason")
	} else {
		err = httpio.OnlyParams(q)
	}
	if err != nil {
		return
	}
	reason = q.Get("reason")
	if len(reason) > maxReasonBytes {
		err = arbiter.Errorf(arbiter.EInvalid, "reason is longer than %d bytes", maxReasonBytes)
	}
	return
}

func (s *Server) handleGPUDrain(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, idx, reason, err := s.gpuCommand(r, true)
	if err != nil {
		return err
	}
	if reason == "" {
		reason = "drained by " + srvWho(c)
	}
	return s.doMachine(w, r, arbiter.SetGPUDrained{Machine: name, Index: idx, Drained: true, Reason: reason, By: srvWho(c)})
}

func (s *Server) handleGPUUndrain(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, idx, reason, err := s.gpuCommand(r, true)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.SetGPUDrained{Machine: name, Index: idx, Drained: false, Reason: reason, By: srvWho(c)})
}

func (s *Server) handleGPUFree(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, idx, _, err := s.gpuCommand(r, false)
	if err != nil {
		return err
	}
	return s.doMachine(w, r, arbiter.FreeGPU{Machine: name, Index: idx, By: srvWho(c)})
}

func srvWho(c arbiter.Caller) string {
	if c.Name == "" {
		return "an admin"
	}
	return c.Name
}

// handleUsage answers the usage report (docs/reference/gpu-truth.md): the saved
// day summaries of the range, plus what live allocations add that is not
// saved yet, grouped by owner (default), machine, model or day.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "since", "until", "by"); err != nil {
		return err
	}
	now := s.now()
	rep, err := ParseUsageRange(q.Get("since"), q.Get("until"), q.Get("by"), now)
	if err != nil {
		return err
	}
	days := arbiter.CollectUsageDays(s.plane.Records(arbiter.RecordUsageDay),
		s.plane.Allocations(arbiter.AllocationFilter{State: arbiter.StateReady}), rep.Since, rep.Until, now)
	if rep.Rows, err = arbiter.SummarizeUsage(days, rep.By); err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, rep)
	return nil
}

// now is the plane's clock when it has one (the control loop's, which
// tests drive), else the wall clock.
func (s *Server) now() time.Time {
	if c, ok := s.plane.(interface{ Now() time.Time }); ok {
		return c.Now()
	}
	return time.Now()
}

// ParseUsageRange checks a usage report's parameters and returns the
// report without rows: since and until are days (YYYY-MM-DD) or RFC 3339
// times (their UTC day), both included; until defaults to now's day,
// since to 29 days before until; by defaults to owner. Errors: invalid.
func ParseUsageRange(since, until, by string, now time.Time) (arbiter.UsageReport, error) {
	// Days are written YYYY-MM-DD: none before the year 1 (time.Parse
	// takes the year 0, and a time zone can move its first day back).
	first := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	day := func(what, v string) (time.Time, error) {
		t, err := time.Parse(arbiter.DayLayout, v)
		if err != nil {
			if t, err = time.Parse(time.RFC3339, v); err == nil {
				t = t.UTC()
				t = time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
			}
		}
		switch {
		case err != nil:
			return time.Time{}, arbiter.Errorf(arbiter.EInvalid, "%s %q is not a day (2026-11-25) or an RFC 3339 time", what, arbiter.Clip(v, 40))
		case t.Before(first):
			return time.Time{}, arbiter.Errorf(arbiter.EInvalid, "%s %q is before the year 1", what, arbiter.Clip(v, 40))
		}
		return t, nil
	}
	if by == "" {
		by = arbiter.UsageByOwner
	}
	switch by {
	case arbiter.UsageByOwner, arbiter.UsageByMachine, arbiter.UsageByModel, arbiter.UsageByDay:
	default:
		return arbiter.UsageReport{}, arbiter.Errorf(arbiter.EInvalid, "by %q: want owner, machine, model or day", arbiter.Clip(by, 40))
	}
	now = now.UTC()
	u := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	var err error
	if until != "" {
		if u, err = day("until", until); err != nil {
			return arbiter.UsageReport{}, err
		}
	}
	sn := u.AddDate(0, 0, -29)
	if sn.Before(first) {
		sn = first
	}
	if since != "" {
		if sn, err = day("since", since); err != nil {
			return arbiter.UsageReport{}, err
		}
	}
	switch {
	case sn.After(u):
		return arbiter.UsageReport{}, arbiter.Errorf(arbiter.EInvalid, "since %s is after until %s", sn.Format(arbiter.DayLayout), u.Format(arbiter.DayLayout))
	case u.Sub(sn) >= maxUsageDays*24*time.Hour: // both days count: since..until spans one day more than their difference
		return arbiter.UsageReport{}, arbiter.Errorf(arbiter.EInvalid, "the range is longer than %d days", maxUsageDays)
	}
	return arbiter.UsageReport{Since: sn.Format(arbiter.DayLayout), Until: u.Format(arbiter.DayLayout), By: by, Rows: []arbiter.UsageRow{}}, nil
}

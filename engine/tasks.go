package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

// tasks is the work queue (docs/reference/fleet.md): tasks declared by a manifest,
// claimed by workers whose host may run them, kept alive by heartbeats and
// finished with an artifact. A claimed task that needs GPUs holds an
// Allocation of them on its worker's machine, taken in the same step as the
// claim and ended with the attempt, so batch work and people never share a
// device.
//
// Records: KindTask (*arbiter.Task) per task, KindWorker (arbiter.Worker)
// per worker, KindArtifact (arbiter.Artifact) per artifact and one
// KindTaskManifest. Heartbeats (the time, and claimed → running) and a
// worker's last-seen time move in memory only; every other change is saved.
type tasks struct {
	byID     map[string]*task
	q        taskQueue
	byAlloc  map[int64]*task // allocation id → the claimed task holding it
	workers  map[string]arbiter.Worker
	shown    map[string]time.Time // each worker's LastSeen as the read view last got it
	arts     map[string]arbiter.Artifact
	policies map[string]*arbiter.HostPolicy
	info     *arbiter.TaskManifestInfo
	nextSeq  int64
}

type task struct {
	t     arbiter.Task
	saved *arbiter.Task // the copy last handed to the read view; never modified
	gen   uint32        // bumped whenever the task leaves or re-enters the queue
	stale deadline      // claimed or running: when it goes stale
}

func (ts *tasks) init() {
	if ts.byID == nil {
		ts.byID = make(map[string]*task)
		ts.byAlloc = make(map[int64]*task)
		ts.workers = make(map[string]arbiter.Worker)
		ts.shown = make(map[string]time.Time)
		ts.arts = make(map[string]arbiter.Artifact)
		ts.policies = make(map[string]*arbiter.HostPolicy)
		ts.nextSeq = 1
	}
}

func (ts *tasks) kinds() []string {
	return []string{arbiter.KindTask, arbiter.KindWorker, arbiter.KindArtifact, arbiter.KindTaskManifest}
}

// load restores the queue. A claimed or running task gets a fresh stale
// interval from now; one whose allocation did not survive is retried.
func (ts *tasks) load(e *Engine, recs []arbiter.Record, now time.Time) error {
	ts.init()
	recs = append([]arbiter.Record(nil), recs...)
	sortRecords(recs)
	var errs []error
	var pend []*task
	var live []*task
	for _, r := range recs {
		var err error
		switch r.Kind {
		case arbiter.KindTask:
			var t arbiter.Task
			if err = tasksDecode(r.Value, &t); err == nil && t.Spec == nil {
				err = errors.New("the task has no spec")
			}
			if err == nil {
				tk := &task{t: t}
				cp := t
				tk.saved = &cp
				tk.stale = tasksStaleDeadline(tk)
				ts.byID[t.ID] = tk
				ts.nextSeq = max(ts.nextSeq, t.Seq+1)
				switch t.Status {
				case arbiter.TaskPending:
					pend = append(pend, tk)
				case arbiter.TaskClaimed, arbiter.TaskRunning:
					live = append(live, tk)
				}
			}
		case arbiter.KindWorker:
			var w arbiter.Worker
			if err = tasksDecode(r.Value, &w); err == nil {
				ts.workers[w.Name] = w
			}
		case arbiter.KindArtifact:
			var a arbiter.Artifact
			if err = tasksDecode(r.Value, &a); err == nil {
				ts.arts[a.ID] = a
			}
		case arbiter.KindTaskManifest:
			var m arbiter.TaskManifestInfo
			if err = tasksDecode(r.Value, &m); err == nil {
				ts.setInfo(&m)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s record %q: %w", r.Kind, r.Key, err))
		}
	}
	ts.q.pushMany(pend)
	for _, tk := range live {
		if id := tk.t.AllocationID; id != 0 {
			if a := e.allocs[id]; a == nil || a.a.Owner != arbiter.TaskOwnerPrefix+tk.t.ID {
				ts.endAttempt(e, tk, fmt.Sprintf("its allocation %d did not survive a server restart", id), now)
				continue
			}
			ts.byAlloc[id] = tk
		}
		e.dl.set(&tk.stale, now.Add(tasksSeconds(tk.t.Spec.StaleAfterS)))
	}
	return errors.Join(errs...)
}

// tasksDecode reads a record value: JSON from a store, or the value itself.
func tasksDecode(v any, dst any) error {
	if t, ok := v.(*arbiter.Task); ok { // decoded already (control decodes a large load on every core)
		if d, ok := dst.(*arbiter.Task); ok {
			*d = *t
			return nil
		}
	}
	raw, ok := v.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		raw = b
	}
	return json.Unmarshal(raw, dst)
}

func (ts *tasks) records() []arbiter.Record {
	out := make([]arbiter.Record, 0, len(ts.byID)+len(ts.workers)+len(ts.arts)+1)
	for id, tk := range ts.byID {
		t := tk.t
		out = append(out, arbiter.Record{Kind: arbiter.KindTask, Key: id, Value: &t})
	}
	for n, w := range ts.workers {
		out = append(out, arbiter.Record{Kind: arbiter.KindWorker, Key: n, Value: w})
	}
	for id, a := range ts.arts {
		out = append(out, arbiter.Record{Kind: arbiter.KindArtifact, Key: id, Value: a})
	}
	if ts.info != nil {
		out = append(out, arbiter.Record{Kind: arbiter.KindTaskManifest, Key: arbiter.TaskManifestKey, Value: *ts.info})
	}
	return out
}

func (ts *tasks) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	ts.init()
	switch c := cmd.(type) {
	case arbiter.ClaimTask:
		res, err := ts.claim(e, c, now)
		return res, err, true
	case arbiter.TaskHeartbeat:
		res, err := ts.heartbeat(e, c, now)
		return res, err, true
	case arbiter.CompleteTask:
		res, err := ts.complete(e, c, now)
		return res, err, true
	case arbiter.FailTask:
		res, err := ts.fail(e, c, now)
		return res, err, true
	case arbiter.CancelTask:
		res, err := ts.cancel(e, c, now)
		return res, err, true
	case arbiter.RequeueTask:
		res, err := ts.requeue(e, c, now)
		return res, err, true
	case arbiter.AddArtifact:
		res, err := ts.addArtifact(e, c, now)
		return res, err, true
	case arbiter.SyncTasks:
		res, err := ts.sync(e, c.Manifest, now)
		return res, err, true
	}
	return nil, nil, false
}

// allocationDestroyed retries (or fails) a task whose GPUs were taken back
// by someone else: an admin's release, its machine removed or changed.
func (ts *tasks) allocationDestroyed(e *Engine, a *arbiter.Allocation, now time.Time) {
	tk := ts.byAlloc[a.ID]
	if tk == nil {
		return
	}
	delete(ts.byAlloc, a.ID)
	if strings.HasPrefix(arbiter.StrOr(a.Reason, ""), arbiter.ReasonPreemptedBy) {
		tk.t.Attempts = max(tk.t.Attempts-1, 0) // a preempted attempt does not count (preempt.go)
	}
	ts.endAttempt(e, tk, fmt.Sprintf("its GPUs were taken back: allocation %d was destroyed (%s)", a.ID, arbiter.StrOr(a.Reason, "")), now)
}

// Claims.

// tasksHost is what a claim knows of the claiming worker's host.
type tasksHost struct {
	name    string
	mc      *machine // nil when the server has no machine of that name
	cuda    bool
	ramGiB  float64
	maxVRAM float64
	policy  *arbiter.HostPolicy
}

func (ts *tasks) claim(e *Engine, c arbiter.ClaimTask, now time.Time) (any, error) {
	if err := arbiter.ValidateName("worker", c.Worker); err != nil {
		return nil, err
	}
	if err := c.Capability.Validate(); err != nil {
		return nil, err
	}
	if err := ts.see(e, c.Worker, &c.Capability, c.RegisterHost, now); err != nil {
		return nil, err
	}
	h := ts.host(e, c.Worker, &c.Capability)
	if h.mc != nil && h.mc.m.Draining {
		return arbiter.TaskClaim{}, nil // an admin is emptying the host: no new work
	}
	tk := ts.pick(e, &h, &c, now)
	if tk == nil {
		return arbiter.TaskClaim{}, nil
	}
	return arbiter.TaskClaim{Task: tk.saved}, nil
}

func (ts *tasks) host(e *Engine, name string, cp *arbiter.Capability) tasksHost {
	h := tasksHost{name: name, mc: e.byName[name], cuda: cp.CUDA, ramGiB: cp.RAMGiB, maxVRAM: cp.VRAMGiB, policy: ts.policies[name]}
	for _, g := range cp.GPUs {
		h.maxVRAM = max(h.maxVRAM, g.VRAMGiB)
	}
	if mc := h.mc; mc != nil {
		h.cuda = h.cuda || mc.m.CUDA != ""
		h.ramGiB = max(h.ramGiB, mc.m.RAMGiB)
		for _, g := range mc.m.GPUs {
			h.maxVRAM = max(h.maxVRAM, g.VRAMGiB)
		}
	}
	return h
}

// pick claims the first eligible pending task in queue order; for a host
// without CUDA, prefer_cuda tasks only when nothing else is eligible.
func (ts *tasks) pick(e *Engine, h *tasksHost, c *arbiter.ClaimTask, now time.Time) *task {
	q := &ts.q
	q.advance()
	var deferred []*task
	for i := q.head; i < len(q.ents); i++ {
		en := q.ents[i]
		if !en.live() {
			continue
		}
		tk := en.t
		if !ts.eligible(e, tk, h, c) {
			continue
		}
		if tk.t.Spec.PreferCUDA && !h.cuda {
			deferred = append(deferred, tk)
			continue
		}
		if ts.take(e, tk, h, now) {
			return tk
		}
	}
	for _, tk := range deferred {
		if ts.take(e, tk, h, now) {
			return tk
		}
	}
	return nil
}

func (ts *tasks) eligible(e *Engine, tk *task, h *tasksHost, c *arbiter.ClaimTask) bool {
	s := tk.t.Spec
	switch {
	case s.GPUs == 0 && c.NoCPU, s.GPUs > 0 && c.NoGPU:
		return false
	case h.policy != nil && !h.policy.Allows(s.Model):
		return false
	case len(s.AllowedHosts) > 0 && !tasksMatchAny(s.AllowedHosts, h.name):
		return false
	case s.RequireCUDA && !h.cuda, s.MinRAMGiB > h.ramGiB:
		return false
	case s.GPUs == 0:
		return s.MinVRAMGiB <= h.maxVRAM
	case h.mc == nil:
		return false
	}
	r := tasksRequest(tk, h.name)
	return e.cluster.On(h.mc.pos, &r, nil) != nil
}

func tasksRequest(tk *task, machine string) arbiter.Request {
	s := tk.t.Spec
	return arbiter.Request{Owner: arbiter.TaskOwnerPrefix + tk.t.ID, GPUs: s.GPUs, MinVRAMGiB: s.MinVRAMGiB,
		RequireCUDA: s.RequireCUDA, Machine: machine}
}

func tasksMatchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if p == name {
			return true
		}
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// take claims tk for host h, with its GPUs; false when they cannot be had
// (held for a starving request).
func (ts *tasks) take(e *Engine, tk *task, h *tasksHost, now time.Time) bool {
	t := tk.t
	t.AllocationID, t.Machine, t.GPUs = 0, "", []int{}
	if t.Spec.GPUs > 0 {
		r := tasksRequest(tk, h.name)
		id, err := e.grantNow(arbiter.Caller{Name: r.Owner, Role: arbiter.RoleAdmin}, r, now)
		if err != nil {
			return false
		}
		a := e.allocs[id]
		gpus := append([]int(nil), a.gpus...)
		sort.Ints(gpus)
		t.AllocationID, t.Machine, t.GPUs = id, h.name, gpus
		ts.byAlloc[id] = tk
	}
	ts.q.remove(tk)
	at := now
	t.Status = arbiter.TaskClaimed
	t.Attempts++
	t.Claim++
	t.ClaimedBy = h.name
	t.ClaimedAt, t.HeartbeatAt = &at, &at
	t.CompletedAt = nil
	t.ArtifactID = ""
	t.UpdatedAt = now
	tk.t = t
	e.dl.set(&tk.stale, now.Add(tasksSeconds(t.Spec.StaleAfterS)))
	ts.save(e, tk, arbiter.EventTaskClaimed, now)
	return true
}

// see records that worker name called now, with the capability it
// presented (nil when it presented none). With register, a worker without
// `arbiter agent` whose capability lists GPUs gets its host registered as a
// machine.
func (ts *tasks) see(e *Engine, name string, cp *arbiter.Capability, register bool, now time.Time) error {
	w, known := ts.workers[name]
	changed := !known || (cp != nil && !w.Capability.Equal(cp))
	if !known {
		w = arbiter.Worker{Name: name, FirstSeen: now}
	}
	w.LastSeen = now
	if cp != nil && register && (changed || e.byName[name] == nil) {
		before := w.Machine
		if err := ts.registerFromCapability(e, &w, cp, now); err != nil {
			return err
		}
		changed = changed || w.Machine != before
	}
	if changed && cp != nil {
		w.Capability = *cp
	}
	ts.workers[name] = w
	if w.Machine != "" {
		if mc := e.byName[w.Machine]; mc != nil && mc.m.Source == arbiter.SourceAgent {
			_, _ = e.heartbeat(w.Machine, now) // its task calls are its signs of life
		}
	}
	if changed {
		ts.shown[name] = now
		e.putRecord(arbiter.KindWorker, name, w)
		e.emit(now, arbiter.EventWorkerUpdated, "worker/"+name, w)
		return nil
	}
	// Readers see last-seen times to the second; a busy worker does not
	// need a new copy of its record for every call.
	if now.Sub(ts.shown[name]) >= time.Second {
		ts.shown[name] = now
		e.touchRecord(arbiter.KindWorker, name, w)
	}
	return nil
}

// registerFromCapability registers (or updates) w's host as a machine from
// cp when the server does not know it or registered it itself from the
// previous capability and nobody changed it since. A host without GPUs is
// registered too (docs/reference/fleet.md): it is listed with its cores and
// RAM, and an admin can drain it.
func (ts *tasks) registerFromCapability(e *Engine, w *arbiter.Worker, cp *arbiter.Capability, now time.Time) error {
	mc := e.byName[w.Name]
	switch {
	case mc == nil:
	case w.Machine == w.Name && mc.m.Source == arbiter.SourceAgent && tasksSameMachine(&mc.m, tasksMachine(w.Name, &w.Capability)):
	default:
		return nil
	}
	m := tasksMachine(w.Name, cp)
	if _, err := e.register(m, now); err != nil {
		return arbiter.Errorf(arbiter.EInvalid, "capability: cannot register host %s as a machine: %s", w.Name, arbiter.ErrorMessage(err))
	}
	w.Machine = w.Name
	return nil
}

// tasksMachine is the machine a capability describes.
func tasksMachine(name string, cp *arbiter.Capability) arbiter.Machine {
	m := arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, Tags: []string{},
		Cores: cp.Cores, RAMGiB: cp.RAMGiB, GPUs: make([]arbiter.GPU, 0, len(cp.GPUs))}
	if cp.CUDA {
		m.CUDA = "unknown"
		var v string
		if raw, ok := cp.Extra["cuda_version"]; ok && json.Unmarshal(raw, &v) == nil && v != "" && len(v) <= 16 {
			m.CUDA = v
		}
	}
	for _, g := range cp.GPUs {
		m.GPUs = append(m.GPUs, arbiter.GPU{Index: g.Index, UUID: g.UUID, Model: g.Name, VRAMGiB: g.VRAMGiB, Healthy: true})
	}
	return m
}

func tasksSameMachine(a *arbiter.Machine, b arbiter.Machine) bool {
	if a.Cores != b.Cores || a.RAMGiB != b.RAMGiB || a.CUDA != b.CUDA || len(a.GPUs) != len(b.GPUs) {
		return false
	}
	for i := range a.GPUs {
		if a.GPUs[i] != b.GPUs[i] {
			return false
		}
	}
	return true
}

// The claiming worker's calls.

// owned returns task id when it is claimed or running by worker, under
// claim (unless 0). Errors: invalid id or worker, not_found, conflict.
func (ts *tasks) owned(id, worker string, claim int64) (*task, error) {
	if err := arbiter.ValidateSHA256("task id", id); err != nil {
		return nil, err
	}
	if err := arbiter.ValidateName("worker", worker); err != nil {
		return nil, err
	}
	tk := ts.byID[id]
	if tk == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "task %s does not exist", id)
	}
	if (tk.t.Status != arbiter.TaskClaimed && tk.t.Status != arbiter.TaskRunning) || tk.t.ClaimedBy != worker {
		why := "it is " + tk.t.Status
		if tk.t.ClaimedBy != "" && tk.t.ClaimedBy != worker && !arbiter.TaskFinal(tk.t.Status) && tk.t.Status != arbiter.TaskPending {
			why = "it is " + tk.t.Status + " by " + tk.t.ClaimedBy
		}
		return nil, arbiter.Errorf(arbiter.EConflict, "task %s is no longer claimed by %s (%s); stop working on it", tk.t.Name, worker, why)
	}
	if claim != 0 && claim != tk.t.Claim {
		return nil, arbiter.Errorf(arbiter.EConflict, "task %s was claimed again since claim %d (it is claim %d now); stop working on that one", tk.t.Name, claim, tk.t.Claim)
	}
	return tk, nil
}

func (ts *tasks) heartbeat(e *Engine, c arbiter.TaskHeartbeat, now time.Time) (any, error) {
	tk, err := ts.owned(c.ID, c.Worker, c.Claim)
	if err != nil {
		return nil, err
	}
	_ = ts.see(e, c.Worker, nil, false, now)
	t := tk.t
	at := now
	t.HeartbeatAt = &at
	e.dl.set(&tk.stale, now.Add(tasksSeconds(t.Spec.StaleAfterS)))
	// The first heartbeat makes the task running. Like the heartbeat time,
	// that lives in memory only (docs/architecture.md §2.2): it costs no write, and after
	// a restart the task reads claimed until its next heartbeat.
	t.Status = arbiter.TaskRunning
	tk.t = t
	tk.saved = &t
	e.touchRecord(arbiter.KindTask, t.ID, tk.saved)
	return tk.saved, nil
}

func (ts *tasks) complete(e *Engine, c arbiter.CompleteTask, now time.Time) (any, error) {
	tk, err := ts.owned(c.ID, c.Worker, c.Claim)
	if err != nil {
		return nil, err
	}
	if err := arbiter.ValidateSHA256("artifact_id", c.ArtifactID); err != nil {
		return nil, err
	}
	if _, ok := ts.arts[c.ArtifactID]; !ok {
		return nil, arbiter.Errorf(arbiter.EInvalid, "artifact %s was not uploaded: upload it (PUT /v1/model/%s) before completing", c.ArtifactID, c.ID)
	}
	_ = ts.see(e, c.Worker, nil, false, now)
	ts.release(e, tk, "task "+tk.t.Name+" completed", now)
	t := tk.t
	at := now
	t.Status = arbiter.TaskCompleted
	t.CompletedAt = &at
	t.ArtifactID = c.ArtifactID
	t.UpdatedAt = now
	tk.t = t
	ts.save(e, tk, arbiter.EventTaskCompleted, now)
	return tk.saved, nil
}

func (ts *tasks) fail(e *Engine, c arbiter.FailTask, now time.Time) (any, error) {
	// Several lines (a log's tail) are fine; what could drive a terminal
	// is not. The message is clipped to MaxTaskErrorBytes when kept.
	if err := arbiter.ValidateLines("error", c.Error, arbiter.MaxTaskErrorInBytes); err != nil {
		return nil, err
	}
	tk, err := ts.owned(c.ID, c.Worker, c.Claim)
	if err != nil {
		return nil, err
	}
	_ = ts.see(e, c.Worker, nil, false, now)
	msg := c.Error
	if strings.TrimSpace(msg) == "" {
		msg = "no error message"
	}
	if a := e.allocs[tk.t.AllocationID]; a != nil && a.a.Preempting != nil {
		// It failed because it was being preempted (the agent stopped it):
		// the attempt does not count (preempt.go).
		msg = a.a.EndReason + ": " + msg
		tk.t.Attempts = max(tk.t.Attempts-1, 0)
	} else if c.Interrupted {
		tk.t.Attempts = max(tk.t.Attempts-1, 0)
	}
	ts.release(e, tk, "task "+tk.t.Name+" failed", now)
	ts.endAttempt(e, tk, msg, now)
	return tk.saved, nil
}

// release ends the allocation a task holds and its stale deadline.
func (ts *tasks) release(e *Engine, tk *task, reason string, now time.Time) {
	e.dl.clear(&tk.stale)
	if id := tk.t.AllocationID; id != 0 && ts.byAlloc[id] == tk {
		delete(ts.byAlloc, id)
		e.end(id, reason, now)
	}
}

// endAttempt ends a claimed or running attempt that did not complete: the
// task is pending again while attempts remain, failed otherwise.
func (ts *tasks) endAttempt(e *Engine, tk *task, msg string, now time.Time) {
	ts.release(e, tk, "task "+tk.t.Name+" attempt ended", now)
	t := tk.t
	t.LastError = tasksClipError(msg)
	t.UpdatedAt = now
	if t.Attempts >= t.Spec.MaxAttempts {
		t.Status = arbiter.TaskFailed
		tk.t = t
		ts.save(e, tk, arbiter.EventTaskFailed, now)
		return
	}
	t.Status = arbiter.TaskPending
	t.AllocationID, t.Machine, t.GPUs = 0, "", []int{}
	tk.t = t
	ts.q.push(tk)
	ts.save(e, tk, arbiter.EventTaskRetry, now)
}

func tasksStaleDeadline(tk *task) deadline {
	return newDeadline(func(e *Engine, now time.Time) { e.tasks.staleFire(e, tk, now) })
}

func (ts *tasks) staleFire(e *Engine, tk *task, now time.Time) {
	t := &tk.t
	if t.Status != arbiter.TaskClaimed && t.Status != arbiter.TaskRunning {
		return
	}
	msg := fmt.Sprintf("stale: worker %s stopped heartbeating (attempt %d of %d)", t.ClaimedBy, t.Attempts, t.Spec.MaxAttempts)
	if t.Attempts >= t.Spec.MaxAttempts {
		msg = fmt.Sprintf("stale: worker %s stopped heartbeating after %d attempts", t.ClaimedBy, t.Attempts)
	}
	ts.endAttempt(e, tk, msg, now)
}

// Operator commands.

func (ts *tasks) get(id string) (*task, error) {
	if err := arbiter.ValidateSHA256("task id", id); err != nil {
		return nil, err
	}
	tk := ts.byID[id]
	if tk == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "task %s does not exist", id)
	}
	return tk, nil
}

func (ts *tasks) cancel(e *Engine, c arbiter.CancelTask, now time.Time) (any, error) {
	if err := arbiter.ValidateText("reason", c.Reason, arbiter.MaxReasonBytes); err != nil {
		return nil, err
	}
	tk, err := ts.get(c.ID)
	if err != nil {
		return nil, err
	}
	t := tk.t
	if arbiter.TaskFinal(t.Status) {
		return nil, arbiter.Errorf(arbiter.EConflict, "task %s is already %s", t.Name, t.Status)
	}
	if t.Status == arbiter.TaskPending {
		ts.q.remove(tk)
	}
	reason := c.Reason
	if reason == "" {
		reason = "by the operator"
	}
	ts.release(e, tk, "task "+t.Name+" cancelled", now)
	t = tk.t
	t.Status = arbiter.TaskCancelled
	t.LastError = tasksClipError("cancelled " + reason)
	t.UpdatedAt = now
	tk.t = t
	ts.save(e, tk, arbiter.EventTaskCancelled, now)
	return tk.saved, nil
}

func (ts *tasks) requeue(e *Engine, c arbiter.RequeueTask, now time.Time) (any, error) {
	tk, err := ts.get(c.ID)
	if err != nil {
		return nil, err
	}
	t := tk.t
	if t.Status != arbiter.TaskFailed && t.Status != arbiter.TaskCancelled {
		return nil, arbiter.Errorf(arbiter.EConflict, "task %s is %s; only a failed or cancelled task can be requeued", t.Name, t.Status)
	}
	t.Status = arbiter.TaskPending
	t.Attempts = 0
	t.ClaimedBy, t.ClaimedAt, t.HeartbeatAt, t.CompletedAt = "", nil, nil, nil
	t.AllocationID, t.Machine, t.GPUs = 0, "", []int{}
	t.UpdatedAt = now
	tk.t = t
	ts.q.push(tk)
	ts.save(e, tk, arbiter.EventTaskRequeued, now)
	return tk.saved, nil
}

func (ts *tasks) addArtifact(e *Engine, c arbiter.AddArtifact, now time.Time) (any, error) {
	a := c.Artifact
	if err := arbiter.ValidateSHA256("artifact id", a.ID); err != nil {
		return nil, err
	}
	if err := arbiter.ValidateName("worker", a.Worker); err != nil {
		return nil, err
	}
	if a.SizeBytes < 0 {
		return nil, arbiter.Errorf(arbiter.EInvalid, "size_bytes must not be negative")
	}
	tk, err := ts.get(a.TaskID)
	if err != nil {
		return nil, err
	}
	if c.Data != nil {
		// The artifact store left the bytes' durability to this commit:
		// carried even when the record exists, whose own commit may not
		// have carried them.
		e.p.blobs = append(e.p.blobs, arbiter.BlobBytes{ID: a.ID, Data: c.Data})
	}
	if old, ok := ts.arts[a.ID]; ok {
		return arbiter.ArtifactAdded{Artifact: old, Existed: true}, nil
	}
	a.TaskName, a.Model, a.Mode, a.CreatedAt = tk.t.Name, tk.t.Spec.Model, tk.t.Spec.Mode, now
	ts.arts[a.ID] = a
	e.putRecord(arbiter.KindArtifact, a.ID, a)
	e.emit(now, arbiter.EventArtifactAdded, "artifact/"+a.ID, a)
	return arbiter.ArtifactAdded{Artifact: a}, nil
}

// Manifest sync.

func (ts *tasks) sync(e *Engine, m arbiter.TaskManifest, now time.Time) (any, error) {
	if err := tasksCheckManifest(&m); err != nil {
		return nil, err
	}
	rep := arbiter.TaskSyncReport{Manifest: m.Name, Tasks: len(m.Tasks),
		AddedNames: []string{}, UpdatedNames: []string{}, RemovedNames: []string{}}
	note := func(list *[]string, name string) {
		if len(*list) < arbiter.MaxSyncNames {
			*list = append(*list, name)
		}
	}
	listed := make(map[string]bool, len(m.Tasks))
	var added []*task
	for i := range m.Tasks {
		d := &m.Tasks[i]
		listed[d.ID] = true
		tk := ts.byID[d.ID]
		if tk == nil {
			spec := d.Spec
			tk = &task{t: arbiter.Task{ID: d.ID, Name: d.Name, Spec: &spec, Status: arbiter.TaskPending,
				GPUs: []int{}, CreatedAt: now, UpdatedAt: now, Seq: ts.nextSeq, InManifest: true}}
			tk.stale = tasksStaleDeadline(tk)
			ts.nextSeq++
			ts.byID[d.ID] = tk
			added = append(added, tk)
			rep.Added++
			note(&rep.AddedNames, d.Name)
			ts.save(e, tk, arbiter.EventTaskAdded, now)
			continue
		}
		t := tk.t
		if t.InManifest && t.Name == d.Name && t.Spec.ScheduleEqual(&d.Spec) {
			rep.Unchanged++
			continue
		}
		requeue := t.Status == arbiter.TaskPending && t.Spec.Priority != d.Spec.Priority
		if requeue {
			ts.q.remove(tk)
		}
		spec := d.Spec
		staleBefore := tasksSeconds(t.Spec.StaleAfterS)
		t.Name, t.Spec, t.InManifest, t.UpdatedAt = d.Name, &spec, true, now
		tk.t = t
		if requeue {
			ts.q.push(tk)
		}
		if (t.Status == arbiter.TaskClaimed || t.Status == arbiter.TaskRunning) && tk.stale.pos >= 0 {
			// Moved by the change of stale_after_s only: the deadline, not
			// HeartbeatAt, holds the last sign of life (a start gives
			// every claim a fresh interval, and HeartbeatAt is stored only
			// with the claim).
			e.dl.set(&tk.stale, tk.stale.at.Add(tasksSeconds(t.Spec.StaleAfterS)-staleBefore))
		}
		rep.Updated++
		note(&rep.UpdatedNames, d.Name)
		ts.save(e, tk, arbiter.EventTaskUpdated, now)
	}
	ts.q.pushMany(added)
	for _, id := range tasksSortedIDs(ts.byID) {
		tk := ts.byID[id]
		if listed[id] {
			continue
		}
		if tk.t.InManifest {
			t := tk.t
			t.InManifest, t.UpdatedAt = false, now
			tk.t = t
			ts.save(e, tk, arbiter.EventTaskUpdated, now)
		}
		rep.Removed++
		note(&rep.RemovedNames, tk.t.Name)
	}
	info := arbiter.TaskManifestInfo{Name: m.Name, Source: m.Source, SHA256: m.SHA256, LoadedAt: now, Tasks: len(m.Tasks), Hosts: m.Hosts}
	if info.Hosts == nil {
		info.Hosts = []arbiter.HostPolicy{}
	}
	if ts.info == nil || !tasksSameInfo(ts.info, &info) {
		ts.setInfo(&info)
		e.putRecord(arbiter.KindTaskManifest, arbiter.TaskManifestKey, info)
	}
	return rep, nil
}

func (ts *tasks) setInfo(m *arbiter.TaskManifestInfo) {
	ts.info = m
	ts.policies = make(map[string]*arbiter.HostPolicy, len(m.Hosts))
	for i := range m.Hosts {
		ts.policies[m.Hosts[i].Name] = &m.Hosts[i]
	}
}

func tasksSameInfo(a, b *arbiter.TaskManifestInfo) bool {
	if a.Name != b.Name || a.Source != b.Source || a.SHA256 != b.SHA256 || a.Tasks != b.Tasks || len(a.Hosts) != len(b.Hosts) {
		return false
	}
	for i := range a.Hosts {
		x, y := &a.Hosts[i], &b.Hosts[i]
		if x.Name != y.Name || strings.Join(x.AllowJobs, "\x00") != strings.Join(y.AllowJobs, "\x00") ||
			strings.Join(x.DenyJobs, "\x00") != strings.Join(y.DenyJobs, "\x00") {
			return false
		}
	}
	return true
}

// tasksCheckManifest validates a whole manifest before anything changes.
func tasksCheckManifest(m *arbiter.TaskManifest) error {
	hosts := make(map[string]bool, len(m.Hosts))
	for _, h := range m.Hosts {
		if err := arbiter.ValidateName("host", h.Name); err != nil {
			return err
		}
		if hosts[h.Name] {
			return arbiter.Errorf(arbiter.EInvalid, "host %q has two policies", h.Name)
		}
		hosts[h.Name] = true
		for _, p := range append(append([]string(nil), h.AllowJobs...), h.DenyJobs...) {
			if _, err := path.Match(p, ""); err != nil {
				return arbiter.Errorf(arbiter.EInvalid, "host %s: %q is not a shell pattern", h.Name, p)
			}
		}
	}
	ids := make(map[string]bool, len(m.Tasks))
	for i := range m.Tasks {
		d := &m.Tasks[i]
		if err := arbiter.ValidateSHA256("task id", d.ID); err != nil {
			return err
		}
		if ids[d.ID] {
			return arbiter.Errorf(arbiter.EInvalid, "task %s (%s) is declared twice", d.ID, d.Name)
		}
		ids[d.ID] = true
		if err := arbiter.ValidateName("task name", d.Name); err != nil {
			return err
		}
		if err := d.Spec.Validate(); err != nil {
			return arbiter.Errorf(arbiter.EInvalid, "task %s: %s", d.Name, arbiter.ErrorMessage(err))
		}
	}
	return nil
}

// save makes tk's record durable with the next batch and emits kind. The
// copy saved is also what commands return: one copy per change.
func (ts *tasks) save(e *Engine, tk *task, kind string, now time.Time) {
	cp := tk.t
	t := &cp
	tk.saved = t
	e.putRecord(arbiter.KindTask, t.ID, t)
	ev := arbiter.TaskEvent{ID: t.ID, Name: t.Name, Status: t.Status, Worker: t.ClaimedBy,
		Attempts: t.Attempts, Error: t.LastError, ArtifactID: t.ArtifactID, AllocationID: t.AllocationID}
	raw, _ := ev.MarshalJSON() // cannot fail
	e.tasksEmit(now, kind, "task/"+t.ID, raw)
}

// tasksEmit is emit for data already in JSON: task events are the most
// frequent of all, and encoding/json would copy and re-check them.
func (e *Engine) tasksEmit(now time.Time, kind, subject string, raw json.RawMessage) {
	if cap(e.p.events) == 0 {
		e.p.events = make([]arbiter.Event, 0, 64) // a batch of claims emits many
	}
	e.appendEvent(now, kind, subject, raw)
	e.notifyTask(now, kind, subject, raw) // notify.go
}

func tasksSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// tasksClipError bounds a failure message to about MaxTaskErrorBytes: its
// first line, which says what happened, and its end, where a log's tail
// has the cause (a traceback's last lines); valid UTF-8 stays valid.
func tasksClipError(s string) string {
	if len(s) <= arbiter.MaxTaskErrorBytes {
		return s
	}
	first, _, _ := strings.Cut(s, "\n")
	cut := min(len(first), 256)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + arbiter.ClipStart(s[cut:], arbiter.MaxTaskErrorBytes-cut-len("…"))
}

func tasksSortedIDs(m map[string]*task) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// taskQueue holds the pending tasks in claim order — higher priority first,
// then older (lower Seq) — as a sorted slice. Entries are invalidated in
// place rather than removed (a claim is then O(1) at the head); dead entries
// are dropped as the head passes them and by compaction.
type taskQueue struct {
	ents []taskEnt
	head int // ents[:head] are dropped
	dead int // invalidated entries in ents[head:]
}

type taskEnt struct {
	t    *task
	gen  uint32
	prio int
	seq  int64
}

func (en taskEnt) live() bool { return en.gen == en.t.gen && en.t.t.Status == arbiter.TaskPending }

func tasksBefore(a, b taskEnt) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return a.seq < b.seq
}

func newTaskEnt(tk *task) taskEnt {
	tk.gen++
	return taskEnt{t: tk, gen: tk.gen, prio: tk.t.Spec.Priority, seq: tk.t.Seq}
}

// push adds a task that just became pending.
func (q *taskQueue) push(tk *task) {
	en := newTaskEnt(tk)
	n := len(q.ents)
	if n == q.head || tasksBefore(q.ents[n-1], en) {
		q.ents = append(q.ents, en)
		return
	}
	i := q.head + sort.Search(n-q.head, func(k int) bool { return tasksBefore(en, q.ents[q.head+k]) })
	q.ents = append(q.ents, taskEnt{})
	copy(q.ents[i+1:], q.ents[i:])
	q.ents[i] = en
}

// pushMany adds many tasks that just became pending, sorting once.
func (q *taskQueue) pushMany(tks []*task) {
	if len(tks) == 0 {
		return
	}
	out := make([]taskEnt, 0, len(q.ents)-q.head-q.dead+len(tks))
	for _, en := range q.ents[q.head:] {
		if en.live() {
			out = append(out, en)
		}
	}
	for _, tk := range tks {
		out = append(out, newTaskEnt(tk))
	}
	sort.Slice(out, func(i, j int) bool { return tasksBefore(out[i], out[j]) })
	q.ents, q.head, q.dead = out, 0, 0
}

// remove takes a pending task out (claimed, cancelled, or re-sorted).
func (q *taskQueue) remove(tk *task) {
	tk.gen++
	q.dead++
	q.advance()
	if q.dead > 256 && q.dead*2 > len(q.ents)-q.head {
		q.compact()
	}
}

// advance drops the dead entries at the head.
func (q *taskQueue) advance() {
	for q.head < len(q.ents) && !q.ents[q.head].live() {
		q.ents[q.head] = taskEnt{}
		q.head++
		q.dead--
	}
	switch {
	case q.head == len(q.ents):
		q.ents, q.head, q.dead = q.ents[:0], 0, 0
	case q.head > 4096 && q.head*2 > len(q.ents):
		q.compact()
	}
}

// compact rebuilds the slice with the live entries only.
func (q *taskQueue) compact() {
	out := make([]taskEnt, 0, len(q.ents)-q.head-q.dead)
	for _, en := range q.ents[q.head:] {
		if en.live() {
			out = append(out, en)
		}
	}
	q.ents, q.head, q.dead = out, 0, 0
}

// len is the number of live entries.
func (q *taskQueue) len() int { return len(q.ents) - q.head - q.dead }

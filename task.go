package arbiter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Task statuses (docs/reference/fleet.md §2): pending → claimed → running →
// completed | failed, and cancelled from any state that is not final.
const (
	TaskPending   = "pending"
	TaskClaimed   = "claimed"
	TaskRunning   = "running"
	TaskCompleted = "completed"
	TaskFailed    = "failed"
	TaskCancelled = "cancelled"
)

// TaskStatuses lists every task status, in life-cycle order.
var TaskStatuses = []string{TaskPending, TaskClaimed, TaskRunning, TaskCompleted, TaskFailed, TaskCancelled}

// TaskFinal reports whether a status is final (completed, failed, cancelled).
func TaskFinal(status string) bool {
	return status == TaskCompleted || status == TaskFailed || status == TaskCancelled
}

// Record kinds of the work queue. Values are Task, Worker, Artifact and
// TaskManifestInfo.
const (
	KindTask         = "task"
	KindWorker       = "worker"
	KindArtifact     = "artifact"
	KindTaskManifest = "task_manifest"
)

// TaskManifestKey is the key of the one KindTaskManifest record.
const TaskManifestKey = "current"

// Events of the work queue. Their subject is "task/ID", "worker/NAME" or
// "artifact/SHA256"; task events carry a TaskEvent.
const (
	EventTaskAdded     = "task.added"     // a manifest reload declared a new task
	EventTaskUpdated   = "task.updated"   // a reload changed a task's schedule (priority, constraints, command)
	EventTaskClaimed   = "task.claimed"   // a worker claimed it (attempt N)
	EventTaskCompleted = "task.completed" // finished with an artifact
	EventTaskRetry     = "task.retry"     // failed, went stale or lost its GPUs; pending again
	EventTaskFailed    = "task.failed"    // failed for good (attempts used up)
	EventTaskCancelled = "task.cancelled" // an operator cancelled it
	EventTaskRequeued  = "task.requeued"  // an operator made a failed or cancelled task pending again
	EventWorkerUpdated = "worker.updated" // a worker was first seen or presented a new capability
	EventArtifactAdded = "artifact.added" // an artifact was stored
)

// TaskOwnerPrefix starts the owner of the allocation a claimed task holds:
// "task:" followed by the task id.
const TaskOwnerPrefix = "task:"

// ShortID is the first 12 hex digits of a task or artifact id, as tables
// show it and as commands accept it.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// ShortOwner is an owner as tables and the dashboard show it: a task's
// allocation as "task:" and the task's short id, anyone else as they are.
func ShortOwner(owner string) string {
	if id, ok := strings.CutPrefix(owner, TaskOwnerPrefix); ok {
		return TaskOwnerPrefix + ShortID(id)
	}
	return owner
}

// Limits of the work queue.
const (
	MaxTaskGPUs       = MaxGPUsPerMachine
	MaxTaskAttempts   = 1000
	MaxStaleAfterS    = 7 * 24 * 3600
	MaxTaskErrorBytes = 8 << 10 // a failure message (the log's tail) is clipped to this
	// MaxTaskErrorInBytes bounds a failure message as sent; longer is refused.
	MaxTaskErrorInBytes = 64 << 10
	MaxCapabilityBytes  = 16 << 10 // the JSON of a worker's capability
	MaxCommandArgs      = 256
)

// TaskSpec is a task as the manifest declares it. The identity fields
// (Model, Mode, Hyper, SplitRecipe, TrainHosts, Seed) make its id; the rest
// schedule it and may change on a reload without changing the id.
type TaskSpec struct {
	Model string `json:"model"`
	Mode  string `json:"mode"`
	// Hyper is the hyper-parameters as canonical JSON (an object).
	Hyper       json.RawMessage `json:"hyper"`
	SplitRecipe string          `json:"split_recipe"`
	TrainHosts  []string        `json:"train_hosts"`
	Seed        int64           `json:"seed"`

	Priority     int      `json:"priority"`
	RequireCUDA  bool     `json:"require_cuda"`
	PreferCUDA   bool     `json:"prefer_cuda"`
	MinVRAMGiB   float64  `json:"min_vram_gib"` // per GPU
	MinRAMGiB    float64  `json:"min_ram_gib"`
	GPUs         int      `json:"gpus"`          // held while it runs
	AllowedHosts []string `json:"allowed_hosts"` // names or shell patterns; empty = any
	// Command is the argument vector with the manifest's placeholders
	// already substituted.
	Command     []string `json:"command"`
	MaxAttempts int      `json:"max_attempts"`
	StaleAfterS float64  `json:"stale_after_s"`
}

// Validate checks the fields the engine relies on. The manifest package
// gives more precise messages; this is the last word.
func (s *TaskSpec) Validate() error {
	switch {
	case s.Model == "":
		return Errorf(EInvalid, "model must not be empty")
	case len(s.Hyper) > 0 && (!json.Valid(s.Hyper) || s.Hyper[0] != '{'):
		return Errorf(EInvalid, "hyper must be a JSON object")
	case s.Priority < -MaxPriority || s.Priority > MaxPriority:
		return Errorf(EInvalid, "priority must be between %d and %d", -MaxPriority, MaxPriority)
	case s.GPUs < 0 || s.GPUs > MaxTaskGPUs:
		return Errorf(EInvalid, "gpus must be 0 to %d, got %d", MaxTaskGPUs, s.GPUs)
	case taskBadGiB(s.MinVRAMGiB):
		return Errorf(EInvalid, "min_vram_gib must be a number of GiB, at least 0")
	case taskBadGiB(s.MinRAMGiB):
		return Errorf(EInvalid, "min_ram_gib must be a number of GiB, at least 0")
	case len(s.Command) == 0 || s.Command[0] == "":
		return Errorf(EInvalid, "command must name a program to run")
	case len(s.Command) > MaxCommandArgs:
		return Errorf(EInvalid, "command has %d arguments; at most %d", len(s.Command), MaxCommandArgs)
	case s.MaxAttempts < 1 || s.MaxAttempts > MaxTaskAttempts:
		return Errorf(EInvalid, "max_attempts must be 1 to %d, got %d", MaxTaskAttempts, s.MaxAttempts)
	case math.IsNaN(s.StaleAfterS) || s.StaleAfterS < 1 || s.StaleAfterS > MaxStaleAfterS:
		return Errorf(EInvalid, "stale_after_s must be 1 to %d seconds, got %v", MaxStaleAfterS, s.StaleAfterS)
	}
	for _, p := range s.AllowedHosts {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return Errorf(EInvalid, "allowed_hosts: %q is not a host name or pattern", p)
		}
	}
	return nil
}

func taskBadGiB(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }

// ScheduleEqual reports whether two specs of the same task schedule it the
// same way: every field but the identity fields (which the id already
// fixes) is equal.
func (s *TaskSpec) ScheduleEqual(o *TaskSpec) bool {
	return s.Priority == o.Priority && s.RequireCUDA == o.RequireCUDA && s.PreferCUDA == o.PreferCUDA &&
		s.MinVRAMGiB == o.MinVRAMGiB && s.MinRAMGiB == o.MinRAMGiB && s.GPUs == o.GPUs &&
		s.MaxAttempts == o.MaxAttempts && s.StaleAfterS == o.StaleAfterS &&
		taskEqualStrings(s.AllowedHosts, o.AllowedHosts) && taskEqualStrings(s.Command, o.Command)
}

func taskEqualStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Task is a unit of batch work and where it is in its life cycle. Pointer
// fields are nil until they happen.
type Task struct {
	ID   string `json:"id"` // sha256 (hex) of the canonical identity
	Name string `json:"name"`
	// Spec is shared by every copy of the record and never modified: a
	// reload that changes it sets a new one. Never nil.
	Spec   *TaskSpec `json:"spec"`
	Status string    `json:"status"`
	// Attempts counts claims since it was declared or last requeued.
	Attempts int `json:"attempts"`
	// Claim numbers its claims, 1 for the first, never reset (a requeue
	// keeps it): a worker's calls name the claim they are about, so that
	// one of an earlier claim (a run the server took back, the task since
	// claimed again, perhaps by the same worker) is refused.
	Claim       int64      `json:"claim"`
	ClaimedBy   string     `json:"claimed_by"` // the worker of the last claim
	ClaimedAt   *time.Time `json:"claimed_at"`
	HeartbeatAt *time.Time `json:"heartbeat_at"`
	CompletedAt *time.Time `json:"completed_at"`
	LastError   string     `json:"last_error"`
	ArtifactID  string     `json:"artifact_id"`
	// The allocation of the GPUs it holds while claimed or running (0 when
	// it holds none), on Machine, GPU indices GPUs.
	AllocationID int64     `json:"allocation_id"`
	Machine      string    `json:"machine"`
	GPUs         []int     `json:"gpus"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	// Seq orders tasks by age: declaration order.
	Seq int64 `json:"seq"`
	// InManifest is false once a reload no longer lists the task; it stays
	// (and may still run) until cancelled.
	InManifest bool `json:"in_manifest"`
}

// TaskEvent is the data of a task event: what changed, without the spec.
type TaskEvent struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Status       string `json:"status"`
	Worker       string `json:"worker,omitempty"`
	Attempts     int    `json:"attempts"`
	Error        string `json:"error,omitempty"`
	ArtifactID   string `json:"artifact_id,omitempty"`
	AllocationID int64  `json:"allocation_id,omitempty"`
}

// MarshalJSON writes the event without reflection: task events are the
// most frequent of all.
func (ev TaskEvent) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 320+len(ev.Error)+len(ev.Name))
	b = append(b, `{"id":`...)
	b = taskAppendString(b, ev.ID)
	b = append(b, `,"name":`...)
	b = taskAppendString(b, ev.Name)
	b = append(b, `,"status":`...)
	b = taskAppendString(b, ev.Status)
	if ev.Worker != "" {
		b = append(b, `,"worker":`...)
		b = taskAppendString(b, ev.Worker)
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(ev.Attempts), 10)
	if ev.Error != "" {
		b = append(b, `,"error":`...)
		b = taskAppendString(b, ev.Error)
	}
	if ev.ArtifactID != "" {
		b = append(b, `,"artifact_id":`...)
		b = taskAppendString(b, ev.ArtifactID)
	}
	if ev.AllocationID != 0 {
		b = append(b, `,"allocation_id":`...)
		b = strconv.AppendInt(b, ev.AllocationID, 10)
	}
	return append(b, '}'), nil
}

// taskAppendString appends s as a JSON string: plain ASCII directly,
// anything else through encoding/json.
func taskAppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// HostPolicy is a manifest's [[hosts]] entry: which models a host may run.
// Patterns are shell patterns over the model name.
type HostPolicy struct {
	Name      string   `json:"name"`
	AllowJobs []string `json:"allow_jobs"` // empty = all
	DenyJobs  []string `json:"deny_jobs"`
}

// Allows reports whether the policy lets its host run model.
func (p *HostPolicy) Allows(model string) bool {
	for _, d := range p.DenyJobs {
		if ok, _ := path.Match(d, model); ok {
			return false
		}
	}
	if len(p.AllowJobs) == 0 {
		return true
	}
	for _, a := range p.AllowJobs {
		if ok, _ := path.Match(a, model); ok {
			return true
		}
	}
	return false
}

// TaskDef is one task of a loaded manifest.
type TaskDef struct {
	ID   string
	Name string
	Spec TaskSpec
}

// TaskManifest is a loaded, validated manifest as the engine takes it.
type TaskManifest struct {
	Name   string
	Source string // where it was read from (a path), for people
	SHA256 string // of the file's bytes
	Hosts  []HostPolicy
	Tasks  []TaskDef
}

// TaskManifestInfo is the KindTaskManifest record: the manifest in force.
type TaskManifestInfo struct {
	Name     string       `json:"name"`
	Source   string       `json:"source"`
	SHA256   string       `json:"sha256"`
	LoadedAt time.Time    `json:"loaded_at"`
	Tasks    int          `json:"tasks"`
	Hosts    []HostPolicy `json:"hosts"`
}

// TaskSyncReport says what a manifest sync changed. The name lists are
// clipped to MaxSyncNames; the counts are complete.
type TaskSyncReport struct {
	Manifest  string `json:"manifest"`
	Tasks     int    `json:"n_jobs"`    // tasks the manifest declares
	Added     int    `json:"added"`     // new, now pending
	Updated   int    `json:"updated"`   // schedule changed, or listed again after a removal
	Unchanged int    `json:"unchanged"` // listed and the same
	Removed   int    `json:"removed"`   // no longer listed; they stay until cancelled
	// The names of the tasks added, updated and removed.
	AddedNames   []string `json:"added_names"`
	UpdatedNames []string `json:"updated_names"`
	RemovedNames []string `json:"removed_names"`
}

// MaxSyncNames bounds each name list of a TaskSyncReport.
const MaxSyncNames = 100

// Capability is what a worker says about its host when it claims
// (docs/reference/fleet.md §2). Keys other than the known ones are kept in Extra as
// they were sent and written back out beside the known ones.
type Capability struct {
	Hostname  string          `json:"hostname"`
	Cores     int             `json:"cores"`
	RAMGiB    float64         `json:"ram_gib"`
	CUDA      bool            `json:"cuda"`
	VRAMGiB   float64         `json:"vram_gib"` // of the largest GPU
	GPUs      []CapabilityGPU `json:"gpus"`
	Torch     string          `json:"torch"`
	GitCommit string          `json:"git_commit"`
	Extra     map[string]json.RawMessage
}

// CapabilityGPU is one GPU as a worker presents it.
type CapabilityGPU struct {
	Index   int     `json:"index"`
	Name    string  `json:"name"`
	VRAMGiB float64 `json:"vram_gib"`
	UUID    string  `json:"uuid"`
}

// taskCapKnown are the keys Capability decodes itself.
var taskCapKnown = map[string]bool{
	"hostname": true, "cores": true, "ram_gib": true, "cuda": true, "vram_gib": true,
	"gpus": true, "torch": true, "git_commit": true,
}

// UnmarshalJSON decodes a capability leniently: null is the zero value of
// a known key, unknown keys are kept. Errors: invalid for a known key of
// the wrong type, a bad GPU list or a capability over MaxCapabilityBytes.
func (c *Capability) UnmarshalJSON(b []byte) error {
	if len(b) > MaxCapabilityBytes {
		return Errorf(EInvalid, "capability is %d bytes of JSON; at most %d", len(b), MaxCapabilityBytes)
	}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*c = Capability{}
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return Errorf(EInvalid, "capability must be a JSON object")
	}
	out := Capability{}
	for k, v := range m {
		if !taskCapKnown[k] {
			if out.Extra == nil {
				out.Extra = make(map[string]json.RawMessage)
			}
			out.Extra[k] = v
			continue
		}
		if bytes.Equal(v, []byte("null")) {
			continue
		}
		var dst any
		switch k {
		case "hostname":
			dst = &out.Hostname
		case "cores":
			dst = &out.Cores
		case "ram_gib":
			dst = &out.RAMGiB
		case "cuda":
			dst = &out.CUDA
		case "vram_gib":
			dst = &out.VRAMGiB
		case "gpus":
			dst = &out.GPUs
		case "torch":
			dst = &out.Torch
		case "git_commit":
			dst = &out.GitCommit
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return Errorf(EInvalid, "capability.%s: %s", k, taskCapWant[k])
		}
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*c = out
	return nil
}

var taskCapWant = map[string]string{
	"hostname": "want a string", "cores": "want a whole number", "ram_gib": "want a number of GiB",
	"cuda": "want true or false", "vram_gib": "want a number of GiB",
	"gpus":  `want a list of {"index", "name", "vram_gib", "uuid"}`,
	"torch": "want a string", "git_commit": "want a string",
}

// MarshalJSON writes the known keys and the kept ones, keys sorted.
func (c Capability) MarshalJSON() ([]byte, error) {
	gpus := c.GPUs
	if gpus == nil {
		gpus = []CapabilityGPU{}
	}
	known := map[string]any{
		"hostname": c.Hostname, "cores": c.Cores, "ram_gib": c.RAMGiB, "cuda": c.CUDA,
		"vram_gib": c.VRAMGiB, "gpus": gpus, "torch": c.Torch, "git_commit": c.GitCommit,
	}
	keys := make([]string, 0, len(known)+len(c.Extra))
	for k := range known {
		keys = append(keys, k)
	}
	for k := range c.Extra {
		if !taskCapKnown[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		if v, ok := known[k]; ok {
			vb, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			b.Write(vb)
		} else {
			var cb bytes.Buffer
			if err := json.Compact(&cb, c.Extra[k]); err != nil {
				return nil, fmt.Errorf("capability %s: %w", k, err)
			}
			b.Write(cb.Bytes())
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Validate checks the numbers of a capability.
func (c *Capability) Validate() error {
	switch {
	case c.Cores < 0:
		return Errorf(EInvalid, "capability.cores must not be negative")
	case taskBadGiB(c.RAMGiB):
		return Errorf(EInvalid, "capability.ram_gib must be a number of GiB, at least 0")
	case taskBadGiB(c.VRAMGiB):
		return Errorf(EInvalid, "capability.vram_gib must be a number of GiB, at least 0")
	case len(c.GPUs) > MaxGPUsPerMachine:
		return Errorf(EInvalid, "capability.gpus lists %d GPUs; at most %d", len(c.GPUs), MaxGPUsPerMachine)
	}
	seen := map[int]bool{}
	for i, g := range c.GPUs {
		if g.Index < 0 || seen[g.Index] {
			return Errorf(EInvalid, "capability.gpus[%d]: index %d is negative or repeated", i, g.Index)
		}
		seen[g.Index] = true
		if taskBadGiB(g.VRAMGiB) {
			return Errorf(EInvalid, "capability.gpus[%d].vram_gib must be a number of GiB, at least 0", i)
		}
		if err := ValidateText(fmt.Sprintf("capability.gpus[%d].name", i), g.Name, MaxModelBytes); err != nil {
			return err
		}
		if err := ValidateText(fmt.Sprintf("capability.gpus[%d].uuid", i), g.UUID, MaxUUIDBytes); err != nil {
			return err
		}
	}
	// The text rule for what workers report: a host name (up to a DNS
	// name's 253 bytes), versions; extra keys are kept as JSON, which
	// escapes whatever they hold, but their names are shown as they are.
	if err := ValidateText("capability.hostname", c.Hostname, 253); err != nil {
		return err
	}
	if err := ValidateText("capability.torch", c.Torch, MaxVersionBytes); err != nil {
		return err
	}
	if err := ValidateText("capability.git_commit", c.GitCommit, MaxVersionBytes); err != nil {
		return err
	}
	for k := range c.Extra {
		if err := ValidateText("a capability key", k, MaxVersionBytes); err != nil {
			return err
		}
	}
	return nil
}

// Equal reports whether two capabilities say the same.
func (c *Capability) Equal(o *Capability) bool {
	if c.Hostname != o.Hostname || c.Cores != o.Cores || c.RAMGiB != o.RAMGiB || c.CUDA != o.CUDA ||
		c.VRAMGiB != o.VRAMGiB || c.Torch != o.Torch || c.GitCommit != o.GitCommit ||
		len(c.GPUs) != len(o.GPUs) || len(c.Extra) != len(o.Extra) {
		return false
	}
	for i := range c.GPUs {
		if c.GPUs[i] != o.GPUs[i] {
			return false
		}
	}
	for k, v := range c.Extra {
		if w, ok := o.Extra[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// Worker is a host that claims tasks, as the server last saw it.
type Worker struct {
	Name       string     `json:"name"`
	Capability Capability `json:"capability"`
	FirstSeen  time.Time  `json:"first_seen"`
	// LastSeen is the last claim or task call; between saves it moves in
	// memory only, so after a restart it may be a little older than it was.
	LastSeen time.Time `json:"last_seen"`
	// Machine is set when the server registered the worker's host as a
	// machine from its capability (a worker without `arbiter agent`).
	Machine string `json:"machine,omitempty"`
}

// Artifact is the metadata of an uploaded blob, stored under its id (the
// sha256 of its bytes); the bytes are in the artifact store.
type Artifact struct {
	ID        string    `json:"id"`
	SizeBytes int64     `json:"size_bytes"`
	TaskID    string    `json:"task_id"`
	TaskName  string    `json:"task_name"`
	Model     string    `json:"model"`
	Mode      string    `json:"mode"`
	Worker    string    `json:"worker"`
	CreatedAt time.Time `json:"created_at"`
}

// ValidateSHA256 checks a task or artifact id: 64 lowercase hex digits.
func ValidateSHA256(what, s string) error {
	if len(s) != 64 {
		return Errorf(EInvalid, "%s %q is not 64 hex digits (a sha256)", what, Clip(s, 80))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return Errorf(EInvalid, "%s %q is not 64 lowercase hex digits (a sha256)", what, Clip(s, 80))
		}
	}
	return nil
}

// SyncTasks makes the work queue follow a manifest (docs/reference/fleet.md §1):
// tasks it declares that are new become pending, existing ones keep their
// status and history (their schedule follows the manifest), tasks it no
// longer declares stay until cancelled. Host policies are replaced. Syncing
// the same manifest twice changes nothing. Result: TaskSyncReport. Errors:
// invalid for a bad id, a duplicate or an invalid spec (nothing changes).
type SyncTasks struct {
	Manifest TaskManifest
}

// ClaimTask gives Worker the best pending task its host may run now:
// highest priority, then oldest, among those its host policy, the task's
// allowed_hosts and constraints allow, with the task's GPUs free on the
// host; a host without CUDA gets prefer_cuda tasks only when nothing else
// fits. A task with GPUs takes an Allocation of them on the worker's
// machine. The worker's capability is recorded and, with RegisterHost, when
// the server does not know the host and the capability lists GPUs, it is
// registered as a machine. Result: TaskClaim (Task nil when nothing fits).
// Errors: invalid for a bad worker name or capability.
type ClaimTask struct {
	Worker     string
	Capability Capability
	// RegisterHost lets the claim register the worker's host as a machine
	// from its capability: for callers trusted with that (an agent or admin
	// token, or a server open on loopback).
	RegisterHost bool
	// NoCPU skips tasks that need no GPU; NoGPU skips tasks that need one.
	// A worker uses them to run one CPU-only task beside its GPU tasks.
	NoCPU, NoGPU bool
}

// TaskClaim is the result of ClaimTask.
//
// Task results (*Task here and of the other task commands) are shared with
// the read view, whose KindTask records are *Task too: never modify one.
type TaskClaim struct {
	Task *Task `json:"task"`
}

// TaskHeartbeat keeps a claimed task alive and marks it running; both in
// memory only (no write, no event). Claim, when not 0, is the claim the
// call is about (Task.Claim). Result: *Task. Errors: not_found for an
// unknown id, conflict when the task is not claimed or running by Worker,
// or is under another claim (it was reclaimed, cancelled or finished).
type TaskHeartbeat struct {
	ID, Worker string
	Claim      int64
}

// CompleteTask finishes a task with its artifact (which must have been
// uploaded) and ends its allocation. Result: *Task. Errors: not_found,
// conflict as TaskHeartbeat, invalid for an artifact not uploaded.
type CompleteTask struct {
	ID, Worker, ArtifactID string
	Claim                  int64 // as TaskHeartbeat's
}

// FailTask reports that an attempt failed: the task is pending again while
// attempts remain, failed otherwise; its allocation ends. Result: *Task.
// Errors: not_found, conflict as TaskHeartbeat.
type FailTask struct {
	ID, Worker, Error string
	Claim             int64 // as TaskHeartbeat's
	// Interrupted says the worker stopped the attempt itself, through no
	// fault of the task (its agent was stopped): the attempt does not
	// count, as a preempted one does not.
	Interrupted bool
}

// CancelTask cancels a task that is not final; a worker running it learns
// at its next heartbeat. Result: *Task. Errors: not_found, conflict for a
// final task.
type CancelTask struct {
	ID, Reason string
}

// RequeueTask makes a failed or cancelled task pending again with its
// attempts reset. Result: *Task. Errors: not_found, conflict in any other
// status.
type RequeueTask struct {
	ID string
}

// AddArtifact records an artifact's metadata once its bytes are in place.
// Recording an id already known changes nothing. Result: ArtifactAdded.
// Errors: invalid for a bad id or worker, not_found for an unknown task.
type AddArtifact struct {
	Artifact Artifact
	// Data is the blob's bytes when the artifact store left their
	// durability to this commit (Blob.Data): they go into the change set
	// (Changes.Blobs) and a store that logs its batches keeps them until
	// the artifact store has them durably. Not part of the command's
	// JSON: only a single server on SQLite carries blobs so.
	Data []byte `json:"-"`
}

// ArtifactAdded is the result of AddArtifact.
type ArtifactAdded struct {
	Artifact Artifact `json:"artifact"`
	Existed  bool     `json:"existed"` // it was already recorded: nothing changed
}

func (SyncTasks) isCommand()              {}
func (SyncTasks) result() TaskSyncReport  { return TaskSyncReport{} }
func (ClaimTask) isCommand()              {}
func (ClaimTask) result() TaskClaim       { return TaskClaim{} }
func (TaskHeartbeat) isCommand()          {}
func (TaskHeartbeat) result() *Task       { return nil }
func (CompleteTask) isCommand()           {}
func (CompleteTask) result() *Task        { return nil }
func (FailTask) isCommand()               {}
func (FailTask) result() *Task            { return nil }
func (CancelTask) isCommand()             {}
func (CancelTask) result() *Task          { return nil }
func (RequeueTask) isCommand()            {}
func (RequeueTask) result() *Task         { return nil }
func (AddArtifact) isCommand()            {}
func (AddArtifact) result() ArtifactAdded { return ArtifactAdded{} }

// Blob is an artifact's bytes as stored: content-addressed by sha256.
type Blob struct {
	ID   string `json:"id"`
	Size int64  `json:"size_bytes"`
	// Existed is true when the store already had these bytes.
	Existed bool `json:"-"`
	// Data is set when the store left making the bytes durable to the
	// caller: they must travel in the commit that records the blob
	// (AddArtifact.Data). Nil otherwise.
	Data []byte `json:"-"`
}

// ChecksumError says that uploaded bytes do not hash to the announced
// sha256. Its code (ErrorCode) is invalid.
type ChecksumError struct {
	Expected, Actual string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("the upload's sha256 is %s, not %s as announced: it was corrupted or the wrong file; nothing was stored", e.Actual, e.Expected)
}

// Unwrap gives the error its code.
func (e *ChecksumError) Unwrap() error {
	return &Error{Code: EInvalid, Message: e.Error()}
}

// TaskSummary is the answer of GET /api/v1/tasks/summary.
type TaskSummary struct {
	// Manifest is the manifest in force; nil before the first one loads.
	Manifest *TaskManifestInfo `json:"manifest"`
	// Counts has every status, with 0 for those no task is in.
	Counts  map[string]int `json:"counts"`
	Total   int            `json:"total"`
	Workers int            `json:"workers"`
	// Failed are the failed tasks, most recent first (at most 20).
	Failed []Task `json:"failed"`
}

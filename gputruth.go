package arbiter

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// GPU ground truth (docs/reference/gpu-truth.md, docs/architecture.md §2.8): the agent samples each
// GPU and reports what really runs on it; the engine decides on those facts.

// GPU device states, as readers see them in DeviceStatus.State.
const (
	GPUFree      = "free"      // placeable
	GPUHeld      = "held"      // held by a live allocation
	GPUReleasing = "releasing" // its allocation ended; waiting for its processes to go
	GPUUnhealthy = "unhealthy" // a critical XID, an ECC double-bit error, or gone
	GPUDrained   = "drained"   // an admin took it out of service
)

// Events of GPU ground truth. Their subject is "machine/NAME/gpu/INDEX" for
// one GPU and "machine/NAME" for several at once, so that an agent waits for
// what concerns its machine alone.
const (
	// EventGPUUnmanaged: a process no live allocation accounts for is on a
	// GPU (data: GPUUnmanagedEvent).
	EventGPUUnmanaged = "gpu.unmanaged"
	// EventGPUUnhealthy and EventGPUHealthy: a GPU's health changed (data:
	// GPUHealthEvent).
	EventGPUUnhealthy = "gpu.unhealthy"
	EventGPUHealthy   = "gpu.healthy"
	// EventGPUReleasing: an allocation ended holding GPUs of an observed
	// machine; they take nothing new until its processes are gone (data:
	// GPUReleasingEvent). It is also the agent's wake-up.
	EventGPUReleasing = "gpu.releasing"
	// EventGPUReleased: releasing GPUs became free (data: GPUReleasedEvent).
	EventGPUReleased = "gpu.released"
	// EventGPUDrained and EventGPUUndrained: an admin drained or undrained
	// one GPU (data: GPUDrainEvent).
	EventGPUDrained   = "gpu.drained"
	EventGPUUndrained = "gpu.undrained"
	// EventGPUKill: the engine ordered the agent to stop a process (data:
	// GPUKill with the machine).
	EventGPUKill = "gpu.kill"
	// EventAllocationIdle: every GPU of an allocation stayed idle for
	// idle_after_s (data: the Allocation, idle_since set).
	EventAllocationIdle = "allocation.idle"
)

// Record kinds of GPU ground truth and accounting.
const (
	// RecordGPUState holds, per machine, what is durable about its GPUs
	// (GPUMachineState): releasing, unhealthy, drained.
	RecordGPUState = "gpu.state"
	// RecordGPUSample holds, per machine, the latest sample of its GPUs and
	// the agent's orders (GPUMachineSample). Memory only: never stored.
	RecordGPUSample = "gpu.sample"
	// RecordUsageDay holds GPU time per day, owner, machine and model
	// (UsageDay), keyed UsageDayKey.
	RecordUsageDay = "usage.day"
)

// Values of GPUPolicy.Enforce, .Unmanaged and .IdleAction.
const (
	EnforceKill     = "kill"
	EnforceWait     = "wait"
	UnmanagedReport = "report"
	UnmanagedKill   = "kill"
	IdleWarn        = "warn"
	IdleRelease     = "release"
)

// GPUPolicy is how the engine treats what agents see on GPUs: the [gpus]
// section of the configuration (docs/reference/gpu-truth.md). Times are in seconds.
type GPUPolicy struct {
	SampleS           float64 `json:"sample_s"`
	Enforce           string  `json:"enforce"`
	KillGraceS        float64 `json:"kill_grace_s"`
	ReleasingTimeoutS float64 `json:"releasing_timeout_s"`
	Unmanaged         string  `json:"unmanaged"`
	UnmanagedGraceS   float64 `json:"unmanaged_grace_s"`
	IdleUtilPct       float64 `json:"idle_util_pct"`
	IdleAfterS        float64 `json:"idle_after_s"`
	IdleGraceS        float64 `json:"idle_grace_s"`
	IdleAction        string  `json:"idle_action"`
	HealthyAfterS     float64 `json:"healthy_after_s"`
	CriticalXIDs      []int   `json:"critical_xids"`
}

// DefaultGPUPolicy returns the contract's defaults. Each call returns a new
// value.
func DefaultGPUPolicy() GPUPolicy {
	return GPUPolicy{
		SampleS:           5,
		Enforce:           EnforceKill,
		KillGraceS:        10,
		ReleasingTimeoutS: 300,
		Unmanaged:         UnmanagedReport,
		UnmanagedGraceS:   60,
		IdleUtilPct:       5,
		IdleAfterS:        3600,
		IdleGraceS:        900,
		IdleAction:        IdleWarn,
		HealthyAfterS:     600,
		CriticalXIDs:      []int{48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120},
	}
}

// Bounds of a GPU policy's times, in seconds.
const (
	MinGPUSampleS = 0.1
	MaxGPUSampleS = 3600
	MaxGPUPolicyS = 30 * 24 * 3600
)

// Validate checks a policy. Errors name the configuration key.
func (p *GPUPolicy) Validate() error {
	check := func(key string, v, lo, hi float64) error {
		if math.IsNaN(v) || v < lo || v > hi {
			return Errorf(EInvalid, "gpus.%s must be %v to %v, got %v", key, lo, hi, v)
		}
		return nil
	}
	for _, c := range []struct {
		key       string
		v, lo, hi float64
	}{
		{"sample_s", p.SampleS, MinGPUSampleS, MaxGPUSampleS},
		{"kill_grace_s", p.KillGraceS, 0, MaxGPUPolicyS},
		{"releasing_timeout_s", p.ReleasingTimeoutS, 0, MaxGPUPolicyS},
		{"unmanaged_grace_s", p.UnmanagedGraceS, 0, MaxGPUPolicyS},
		{"idle_util_pct", p.IdleUtilPct, 0, 100},
		{"idle_after_s", p.IdleAfterS, 1, MaxGPUPolicyS},
		{"idle_grace_s", p.IdleGraceS, 0, MaxGPUPolicyS},
		{"healthy_after_s", p.HealthyAfterS, 0, MaxGPUPolicyS},
	} {
		if err := check(c.key, c.v, c.lo, c.hi); err != nil {
			return err
		}
	}
	if p.Enforce != EnforceKill && p.Enforce != EnforceWait {
		return Errorf(EInvalid, "gpus.enforce %q: want %q or %q", p.Enforce, EnforceKill, EnforceWait)
	}
	if p.Unmanaged != UnmanagedReport && p.Unmanaged != UnmanagedKill {
		return Errorf(EInvalid, "gpus.unmanaged %q: want %q or %q", p.Unmanaged, UnmanagedReport, UnmanagedKill)
	}
	if p.IdleAction != IdleWarn && p.IdleAction != IdleRelease {
		return Errorf(EInvalid, "gpus.idle_action %q: want %q or %q", p.IdleAction, IdleWarn, IdleRelease)
	}
	if len(p.CriticalXIDs) > MaxGPUXIDs {
		return Errorf(EInvalid, "gpus.critical_xids lists %d XIDs; at most %d", len(p.CriticalXIDs), MaxGPUXIDs)
	}
	for _, x := range p.CriticalXIDs {
		if x <= 0 || x > MaxXID {
			return Errorf(EInvalid, "gpus.critical_xids: %d is not an XID (1 to %d)", x, MaxXID)
		}
	}
	return nil
}

// ReportS is how long an agent may go without reporting although nothing
// changed: its report then says the GPUs are as before, and proves it is
// still looking. Six samples, at least 5 seconds.
func (p *GPUPolicy) ReportS() float64 { return max(6*p.SampleS, 5) }

// FreshS is how long after an agent's last report its samples still stand
// for the GPUs: three report periods. Past it a GPU's usage is unknown, and
// unknown is active (never idle).
func (p *GPUPolicy) FreshS() float64 { return 3 * p.ReportS() }

// SetGPUPolicy sets the engine's GPU policy (at start and on every
// configuration reload). Result: nil. Errors: invalid.
type SetGPUPolicy struct {
	Policy GPUPolicy
}

// GPUUsage is the latest sample of one GPU (docs/reference/gpu-truth.md). A field
// the GPU could not report (nvidia-smi's "[N/A]") is null.
type GPUUsage struct {
	UtilPct     *int         `json:"util_pct"`
	MemUsedMiB  int64        `json:"mem_used_mib"`
	MemTotalMiB int64        `json:"mem_total_mib"`
	TempC       *int         `json:"temp_c"`
	PowerW      *float64     `json:"power_w"`
	SampledAt   time.Time    `json:"sampled_at"`
	Processes   []GPUProcess `json:"processes"`
	// ProcessesUnknown: the agent could not list the GPU's processes (NVML
	// refuses it in MIG mode without privileges); Processes is empty and
	// means nothing. Such a reading frees no releasing GPU.
	ProcessesUnknown bool `json:"processes_unknown,omitempty"`
}

// GPUProcess is one compute process on a GPU. Allocation is the allocation
// it belongs to by ARBITER_ALLOCATION_ID in its (or an ancestor's)
// environment, null when unattributed.
type GPUProcess struct {
	PID        int    `json:"pid"`
	User       string `json:"user"`
	MemMiB     int64  `json:"mem_mib"`
	Command    string `json:"command"`
	Allocation *int64 `json:"allocation"`
}

// GPUHealth is a GPU's health as readers see it.
type GPUHealth struct {
	OK     bool       `json:"ok"`
	Reason string     `json:"reason,omitempty"`
	Since  *time.Time `json:"since,omitempty"`
}

// Limits of a GPU report; beyond them it is invalid.
const (
	MaxGPUProcesses = 256 // per GPU
	// MaxPID is the highest process id Linux gives (PID_MAX_LIMIT): a
	// larger one would reach kill(2) truncated to another process.
	MaxPID           = 4194304
	MaxGPUXIDs       = 64 // XID events per GPU per report
	MaxXID           = 1000
	MaxGPUCommand    = 256 // bytes of a process's command line (agents clip)
	MaxGPUUser       = 64
	MaxGPUMemMiB     = 1 << 30 // a TiB-scale bound that no GPU reaches
	MaxGPUPowerW     = 100000
	maxFutureReportS = 24 * 3600
)

// GPUReport is what an agent sends after sampling its GPUs (POST
// /api/v1/machines/{name}/gpus/report). It carries only the GPUs whose
// reading changed since its last report unless Full is set; a GPU that is
// not in it stays as last reported, as of this report.
type GPUReport struct {
	// SeenSeq is the highest event sequence number the agent had learnt
	// (from an answer, or the orders long-poll) before it sampled: a
	// releasing GPU is freed only by a sample taken after its release event.
	SeenSeq int64 `json:"seen_seq"`
	// Full says every GPU of the machine is in GPUs; one missing vanished.
	Full bool `json:"full"`
	// SampledAt is the agent's clock when it sampled; shown, never decided
	// on (see ValidateReport).
	SampledAt time.Time    `json:"sampled_at"`
	GPUs      []GPUReading `json:"gpus"`
}

// GPUReading is one GPU in a report.
type GPUReading struct {
	Index int `json:"index"`
	// Missing: the GPU was not in the sample at all (it vanished, e.g. fell
	// off the bus); the other fields are empty.
	Missing     bool     `json:"missing,omitempty"`
	UtilPct     *int     `json:"util_pct"`
	MemUsedMiB  int64    `json:"mem_used_mib"`
	MemTotalMiB int64    `json:"mem_total_mib"`
	TempC       *int     `json:"temp_c"`
	PowerW      *float64 `json:"power_w"`
	// XIDs are the XID errors seen since the last report that reached the
	// server, oldest first.
	XIDs []int `json:"xids,omitempty"`
	// ECCUncorrected is the volatile count of uncorrectable (double-bit)
	// ECC errors since the driver loaded; null when the GPU has no ECC.
	ECCUncorrected *int64       `json:"ecc_uncorrected,omitempty"`
	Processes      []GPUProcess `json:"processes"`
	// ProcessesUnknown: the processes could not be listed (GPUUsage); then
	// Processes is empty.
	ProcessesUnknown bool `json:"processes_unknown,omitempty"`
}

// Validate checks a report's own fields against m, the machine it names,
// and returns a description of the first problem as an invalid error. A
// report dated after now is refused only when it is more than a day ahead:
// a small skew of the host's clock must not blind the server to it (the
// engine clamps the date to now).
func (r *GPUReport) Validate(m *Machine, now time.Time) error {
	if r.SampledAt.IsZero() {
		return Errorf(EInvalid, "sampled_at is missing: say when the GPUs were sampled")
	}
	if r.SampledAt.Sub(now) > maxFutureReportS*time.Second {
		return Errorf(EInvalid, "sampled_at %s is more than a day after the server's clock (%s); fix the clock of %s",
			r.SampledAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), m.Name)
	}
	if r.SeenSeq < 0 {
		return Errorf(EInvalid, "seen_seq must not be negative")
	}
	if len(r.GPUs) > MaxGPUsPerMachine {
		return Errorf(EInvalid, "the report has %d GPUs; a machine has at most %d", len(r.GPUs), MaxGPUsPerMachine)
	}
	seen := make(map[int]bool, len(r.GPUs))
	for i := range r.GPUs {
		g := &r.GPUs[i]
		if gpuPosition(m, g.Index) < 0 {
			return Errorf(EInvalid, "machine %s has no GPU %d (it has %s); register the machine again if its GPUs changed", m.Name, g.Index, gpuIndexList(m))
		}
		if seen[g.Index] {
			return Errorf(EInvalid, "GPU %d is in the report twice", g.Index)
		}
		seen[g.Index] = true
		if err := g.validate(); err != nil {
			return Errorf(EInvalid, "GPU %d: %s", g.Index, ErrorMessage(err))
		}
	}
	return nil
}

func (g *GPUReading) validate() error {
	if g.Missing {
		if g.UtilPct != nil || g.MemUsedMiB != 0 || g.MemTotalMiB != 0 || g.TempC != nil || g.PowerW != nil ||
			len(g.XIDs) > 0 || g.ECCUncorrected != nil || len(g.Processes) > 0 || g.ProcessesUnknown {
			return Errorf(EInvalid, "a missing GPU carries no reading")
		}
		return nil
	}
	if u := g.UtilPct; u != nil && (*u < 0 || *u > 100) {
		return Errorf(EInvalid, "util_pct %d is not a percentage", *u)
	}
	if g.MemUsedMiB < 0 || g.MemTotalMiB < 0 || g.MemUsedMiB > MaxGPUMemMiB || g.MemTotalMiB > MaxGPUMemMiB {
		return Errorf(EInvalid, "mem_used_mib and mem_total_mib must be 0 to %d", MaxGPUMemMiB)
	}
	if t := g.TempC; t != nil && (*t < -100 || *t > 300) {
		return Errorf(EInvalid, "temp_c %d is not a GPU temperature", *t)
	}
	if p := g.PowerW; p != nil && (math.IsNaN(*p) || *p < 0 || *p > MaxGPUPowerW) {
		return Errorf(EInvalid, "power_w %v is not a GPU's power draw", *p)
	}
	if len(g.XIDs) > MaxGPUXIDs {
		return Errorf(EInvalid, "%d XIDs in one report; at most %d", len(g.XIDs), MaxGPUXIDs)
	}
	for _, x := range g.XIDs {
		if x <= 0 || x > MaxXID {
			return Errorf(EInvalid, "XID %d is not an XID (1 to %d)", x, MaxXID)
		}
	}
	if e := g.ECCUncorrected; e != nil && *e < 0 {
		return Errorf(EInvalid, "ecc_uncorrected must not be negative")
	}
	if g.ProcessesUnknown && len(g.Processes) > 0 {
		return Errorf(EInvalid, "processes_unknown with %d processes listed: list none", len(g.Processes))
	}
	if len(g.Processes) > MaxGPUProcesses {
		return Errorf(EInvalid, "%d processes; at most %d per GPU", len(g.Processes), MaxGPUProcesses)
	}
	pids := make(map[int]bool, len(g.Processes))
	for _, p := range g.Processes {
		switch {
		case p.PID <= 0 || p.PID > MaxPID:
			return Errorf(EInvalid, "pid %d is not a process id (1 to %d)", p.PID, MaxPID)
		case pids[p.PID]:
			return Errorf(EInvalid, "pid %d is listed twice", p.PID)
		case p.MemMiB < 0 || p.MemMiB > MaxGPUMemMiB:
			return Errorf(EInvalid, "pid %d: mem_mib must be 0 to %d", p.PID, MaxGPUMemMiB)
		case len(p.Command) > MaxGPUCommand:
			return Errorf(EInvalid, "pid %d: command is longer than %d bytes (clip it)", p.PID, MaxGPUCommand)
		case len(p.User) > MaxGPUUser:
			return Errorf(EInvalid, "pid %d: user is longer than %d bytes", p.PID, MaxGPUUser)
		case ValidateText("command", p.Command, MaxGPUCommand) != nil: // the text rule (text.go)
			return Errorf(EInvalid, "pid %d: %s (the agent escapes it)", p.PID, ErrorMessage(ValidateText("command", p.Command, MaxGPUCommand)))
		case ValidateText("user", p.User, MaxGPUUser) != nil:
			return Errorf(EInvalid, "pid %d: %s", p.PID, ErrorMessage(ValidateText("user", p.User, MaxGPUUser)))
		case p.Allocation != nil && *p.Allocation <= 0:
			return Errorf(EInvalid, "pid %d: allocation %d is not an allocation id", p.PID, *p.Allocation)
		}
		pids[p.PID] = true
	}
	return nil
}

func gpuPosition(m *Machine, index int) int {
	for p := range m.GPUs {
		if m.GPUs[p].Index == index {
			return p
		}
	}
	return -1
}

func gpuIndexList(m *Machine) string {
	if len(m.GPUs) == 0 {
		return "none"
	}
	parts := make([]string, len(m.GPUs))
	for i, g := range m.GPUs {
		parts[i] = fmt.Sprint(g.Index)
	}
	return strings.Join(parts, ",")
}

// ReportGPUs applies an agent's GPU report. Result: GPUOrders. Errors:
// not_found for an unknown machine, invalid for a report that breaks
// GPUReport.Validate.
type ReportGPUs struct {
	Machine string
	Report  GPUReport
}

// GPUOrders is what the engine tells an agent: the answer of a report and
// of the orders long-poll.
type GPUOrders struct {
	// Seq is the last event sequence number the answer reflects; the agent
	// sends it back as GPUReport.SeenSeq of the samples it takes after.
	Seq    int64          `json:"seq"`
	Policy GPUAgentPolicy `json:"policy"`
	// Ended are the allocations that ended holding GPUs of this machine and
	// whose processes must stop now (empty with enforce = "wait"): the task
	// runner kills the process group of a task holding one at once.
	Ended []int64 `json:"ended"`
	// Kill are the processes to stop: SIGTERM, then SIGKILL after GraceS.
	Kill []GPUKill `json:"kill"`
	// WantFull asks the agent to send every GPU in its next report: the
	// server's knowledge of the machine is incomplete (after a restart).
	WantFull bool `json:"want_full,omitempty"`
	// ReportNow: GPUs here are releasing, and a report sampled after this
	// answer may free them; the agent reports at once, changed or not.
	ReportNow bool `json:"report_now,omitempty"`
}

// GPUAgentPolicy is the part of the policy an agent acts on: how often it
// samples and reports at the latest, how it stops processes, and the
// utilization below which a GPU is idle (a reading crossing it is a change
// worth reporting at once).
type GPUAgentPolicy struct {
	SampleS     float64 `json:"sample_s"`
	ReportS     float64 `json:"report_s"`
	KillGraceS  float64 `json:"kill_grace_s"`
	Enforce     string  `json:"enforce"`
	IdleUtilPct float64 `json:"idle_util_pct"`
}

// GPUKill orders the agent to stop one process. Allocation is the
// allocation the process was attributed to (null when unattributed): the
// agent checks it again before signalling, so that a reused pid is spared.
type GPUKill struct {
	PID        int     `json:"pid"`
	GPU        int     `json:"gpu"`
	Allocation *int64  `json:"allocation"`
	Reason     string  `json:"reason"`
	GraceS     float64 `json:"grace_s"`
}

// SetGPUDrained drains or undrains one GPU (admin): a drained GPU takes
// nothing new; its holder keeps it until it ends. Result: Machine.
// Errors: not_found for an unknown machine or GPU.
type SetGPUDrained struct {
	Machine string
	Index   int
	Drained bool
	Reason  string
	By      string
}

// FreeGPU is an admin's word that a GPU is clean and well: it ends its
// releasing and unhealthy states at once. Result: Machine. Errors:
// not_found for an unknown machine or GPU.
type FreeGPU struct {
	Machine string
	Index   int
	By      string
}

func (SetGPUPolicy) isCommand()  {}
func (ReportGPUs) isCommand()    {}
func (SetGPUDrained) isCommand() {}
func (FreeGPU) isCommand()       {}

func (SetGPUPolicy) result() None     { return None{} }
func (ReportGPUs) result() GPUOrders  { return GPUOrders{} }
func (SetGPUDrained) result() Machine { return Machine{} }
func (FreeGPU) result() Machine       { return Machine{} }

// GPUMachineState is the durable part of a machine's GPU ground truth (the
// RecordGPUState record, keyed by machine name): whether an agent observes
// its GPUs, and each GPU that is not simply free or held.
type GPUMachineState struct {
	Machine string `json:"machine"`
	// Observed: an agent reports this machine's GPUs, so an ended
	// allocation's GPUs are released only once its processes are gone.
	// Declared machines with no agent free them at once.
	Observed bool            `json:"observed"`
	GPUs     []GPUStateEntry `json:"gpus"`
}

// GPUStateEntry is one GPU's durable state.
type GPUStateEntry struct {
	Index     int         `json:"index"`
	Releasing *GPURelease `json:"releasing,omitempty"`
	Unhealthy *GPUFault   `json:"unhealthy,omitempty"`
	Drained   *GPUDrain   `json:"drained,omitempty"`
	// ECC is the uncorrectable ECC count the last reading gave, so that
	// after a restart only a count that grew again is a new error.
	ECC *int64 `json:"ecc,omitempty"`
}

// GPURelease is a GPU whose allocation ended, waiting for its processes.
type GPURelease struct {
	Allocation int64     `json:"allocation"`
	Reason     string    `json:"reason"` // why the allocation ended
	Since      time.Time `json:"since"`
	// Seq is the sequence number of the gpu.releasing event: only a sample
	// taken after the agent learnt it may free the GPU.
	Seq int64 `json:"seq"`
	// Killed: the engine ordered at least one of its processes stopped.
	Killed bool `json:"killed"`
}

// GPUFault is why a GPU is unhealthy.
type GPUFault struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// GPUDrain is an admin's drain of one GPU.
type GPUDrain struct {
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	Since  time.Time `json:"since"`
}

// GPUMachineSample is the memory-only part (the RecordGPUSample record):
// the latest reading of each GPU, the unmanaged processes and the orders.
type GPUMachineSample struct {
	Machine    string           `json:"machine"`
	ReportedAt time.Time        `json:"reported_at"`
	GPUs       []GPUSampleEntry `json:"gpus"`
	Orders     GPUOrders        `json:"orders"`
}

// GPUSampleEntry is one GPU's latest reading. Usage is nil before the
// first reading and while the GPU is missing.
type GPUSampleEntry struct {
	Index     int       `json:"index"`
	Usage     *GPUUsage `json:"usage"`
	Missing   bool      `json:"missing,omitempty"`
	Unmanaged []int     `json:"unmanaged,omitempty"` // pids
}

// GPUUnmanagedEvent is the data of gpu.unmanaged.
type GPUUnmanagedEvent struct {
	Machine    string `json:"machine"`
	GPU        int    `json:"gpu"`
	PID        int    `json:"pid"`
	User       string `json:"user"`
	MemMiB     int64  `json:"mem_mib"`
	Command    string `json:"command"`
	Allocation *int64 `json:"allocation"` // set when it belongs to an allocation not holding this GPU
	Action     string `json:"action"`     // the policy: "report" or "kill" after unmanaged_grace_s
}

// GPUHealthEvent is the data of gpu.unhealthy and gpu.healthy.
type GPUHealthEvent struct {
	Machine    string `json:"machine"`
	GPU        int    `json:"gpu"`
	Reason     string `json:"reason"`
	Allocation *int64 `json:"allocation"` // the holder, told through this event
}

// GPUReleasingEvent is the data of gpu.releasing.
type GPUReleasingEvent struct {
	Machine    string `json:"machine"`
	GPUs       []int  `json:"gpus"`
	Allocation int64  `json:"allocation"`
	Reason     string `json:"reason"`
}

// GPUReleasedEvent is the data of gpu.released.
type GPUReleasedEvent struct {
	Machine    string  `json:"machine"`
	GPUs       []int   `json:"gpus"`
	Allocation int64   `json:"allocation"`
	AfterS     float64 `json:"after_s"` // how long the GPUs were releasing
	Killed     bool    `json:"killed"`  // whether processes were ordered stopped
	// How: "clean" (the agent saw no process left), "timeout" (the agent
	// was silent for releasing_timeout_s) or "admin".
	How string `json:"how"`
}

// GPUDrainEvent is the data of gpu.drained and gpu.undrained.
type GPUDrainEvent struct {
	Machine string `json:"machine"`
	GPU     int    `json:"gpu"`
	Reason  string `json:"reason"`
	By      string `json:"by"`
}

// GPUKillEvent is the data of gpu.kill.
type GPUKillEvent struct {
	Machine string `json:"machine"`
	GPUKill
}

// AllocationUsage is an allocation's accounting (docs/reference/gpu-truth.md):
// seconds of GPU time held, held while busy (sampled utilization at or
// above idle_util_pct), held while idle (below it); held time with no
// recent sample is neither. PeakMemMiB is the most memory its GPUs used
// together in one sample.
type AllocationUsage struct {
	GPUS       float64 `json:"gpu_s"`
	BusyGPUS   float64 `json:"busy_gpu_s"`
	IdleGPUS   float64 `json:"idle_gpu_s"`
	PeakMemMiB int64   `json:"peak_mem_mib"`
	// WaitS is how long it was queued before it was granted.
	WaitS float64 `json:"wait_s"`
	// AccountedAt is when the usage was last brought up to date.
	AccountedAt time.Time `json:"accounted_at"`
}

// UsageDay is GPU time of one owner on one machine and GPU model on one
// UTC day (the RecordUsageDay record). An allocation is counted, with its
// queue wait, on the day it was granted.
type UsageDay struct {
	Day         string  `json:"day"` // YYYY-MM-DD
	Owner       string  `json:"owner"`
	Machine     string  `json:"machine"`
	Model       string  `json:"model"`
	GPUS        float64 `json:"gpu_s"`
	BusyGPUS    float64 `json:"busy_gpu_s"`
	IdleGPUS    float64 `json:"idle_gpu_s"`
	Allocations int     `json:"allocations"`
	WaitS       float64 `json:"wait_s"` // total queue wait of those allocations
}

// UsageDayKey is the record key of a UsageDay: the day first, so that keys
// sort by day, then the escaped owner, machine and model.
func UsageDayKey(day, owner, machine, model string) string {
	return day + "/" + keyPart(owner) + "/" + keyPart(machine) + "/" + keyPart(model)
}

// keyPart escapes '/' and '%' so that a key splits back into its parts.
func keyPart(s string) string {
	if !strings.ContainsAny(s, "/%") {
		return s
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(s)
}

// UsageDayRetention is how long day summaries are kept: at least 400 days.
const UsageDayRetention = 400 * 24 * time.Hour

// Usage report groupings (GET /api/v1/usage?by=).
const (
	UsageByOwner   = "owner"
	UsageByMachine = "machine"
	UsageByModel   = "model"
	UsageByDay     = "day"
)

// UsageReport is the answer of GET /api/v1/usage and `arbiter report -o
// json` (docs/reference/gpu-truth.md): whole UTC days from Since to Until, both
// included.
type UsageReport struct {
	Since string     `json:"since"`
	Until string     `json:"until"`
	By    string     `json:"by"`
	Rows  []UsageRow `json:"rows"`
}

// UsageRow is one group of a usage report.
type UsageRow struct {
	Key          string  `json:"key"`
	GPUHours     float64 `json:"gpu_hours"`
	BusyGPUHours float64 `json:"busy_gpu_hours"`
	IdleGPUHours float64 `json:"idle_gpu_hours"`
	Allocations  int     `json:"allocations"`
	MeanWaitS    float64 `json:"mean_wait_s"`
}

// CollectUsageDays gathers the day summaries of the days since to until
// (YYYY-MM-DD, both included): the saved RecordUsageDay records among recs
// and, for the live allocations, the GPU time they have not saved yet
// (UnsavedUsage at now), so that a report is exact without a write per
// sample.
func CollectUsageDays(recs []Record, live []Allocation, since, until string, now time.Time) []UsageDay {
	var days []UsageDay
	for _, rec := range recs {
		day, _, _ := strings.Cut(rec.Key, "/")
		if day < since || day > until {
			continue
		}
		if d, ok := rec.Value.(UsageDay); ok {
			days = append(days, d)
		}
	}
	for i := range live {
		for _, d := range UnsavedUsage(&live[i], now) {
			if d.Day >= since && d.Day <= until {
				days = append(days, d)
			}
		}
	}
	return days
}

// SummarizeUsage groups day summaries into a report's rows, in key order.
// days must already be those of the report's range. Errors: invalid for
// an unknown grouping.
func SummarizeUsage(days []UsageDay, by string) ([]UsageRow, error) {
	key := func(d *UsageDay) string { return d.Owner }
	switch by {
	case UsageByOwner:
	case UsageByMachine:
		key = func(d *UsageDay) string { return d.Machine }
	case UsageByModel:
		key = func(d *UsageDay) string { return d.Model }
	case UsageByDay:
		key = func(d *UsageDay) string { return d.Day }
	default:
		return nil, Errorf(EInvalid, "by %q: want owner, machine, model or day", by)
	}
	type acc struct {
		row  UsageRow
		wait float64
	}
	groups := map[string]*acc{}
	var keys []string
	for i := range days {
		d := &days[i]
		k := key(d)
		g := groups[k]
		if g == nil {
			g = &acc{row: UsageRow{Key: k}}
			groups[k] = g
			keys = append(keys, k)
		}
		g.row.GPUHours += d.GPUS / 3600
		g.row.BusyGPUHours += d.BusyGPUS / 3600
		g.row.IdleGPUHours += d.IdleGPUS / 3600
		g.row.Allocations += d.Allocations
		g.wait += d.WaitS
	}
	sort.Strings(keys)
	rows := make([]UsageRow, 0, len(keys))
	for _, k := range keys {
		g := groups[k]
		if g.row.Allocations > 0 {
			g.row.MeanWaitS = g.wait / float64(g.row.Allocations)
		}
		rows = append(rows, g.row)
	}
	return rows, nil
}

// IdleReason is the reason of an allocation ended for idleness.
func IdleReason(idle time.Duration) string {
	return "idle: GPUs unused for " + HumanDuration(idle)
}

// HumanDuration writes d for people, in at most two units: "2h", "1h15m",
// "45m", "30s".
func HumanDuration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		m, s := int(d/time.Minute), int(d%time.Minute/time.Second)
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%ds", m, s)
	case d < 48*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	}
	days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
	if h == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, h)
}

// DayLayout is how day summaries write a day.
const DayLayout = "2006-01-02"

// SplitDays calls f with each UTC day that [start, end) touches, in order,
// and the seconds of it inside.
func SplitDays(start, end time.Time, f func(day string, s float64)) {
	start, end = start.UTC(), end.UTC()
	for start.Before(end) {
		y, m, d := start.Date()
		next := time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
		seg := end
		if next.Before(seg) {
			seg = next
		}
		f(start.Format(DayLayout), seg.Sub(start).Seconds())
		start = seg
	}
}

// UnsavedUsage returns what a live allocation adds to the day summaries
// that is not saved in them yet, up to now: its held time since its usage
// was last saved (since it was granted, before that), and, never saved
// yet, the allocation itself with its queue wait on the day it was
// granted. Readers add it to the saved summaries for reports that are
// exact up to now. Busy and idle time not yet saved (at most a minute of
// it) is not included.
func UnsavedUsage(a *Allocation, now time.Time) []UsageDay {
	if a.State != StateReady || a.Backing != nil || a.ReadyAt == nil || a.Machine == nil || len(a.Devices) == 0 {
		return nil
	}
	byKey := map[string]*UsageDay{}
	var keys []string
	row := func(day, model string) *UsageDay {
		k := UsageDayKey(day, a.Owner, *a.Machine, model)
		r := byKey[k]
		if r == nil {
			r = &UsageDay{Day: day, Owner: a.Owner, Machine: *a.Machine, Model: model}
			byKey[k] = r
			keys = append(keys, k)
		}
		return r
	}
	from := *a.ReadyAt
	if a.Usage == nil {
		r := row(a.ReadyAt.UTC().Format(DayLayout), a.Devices[0].Model)
		r.Allocations++
		r.WaitS += max(a.ReadyAt.Sub(a.CreatedAt).Seconds(), 0)
	} else if a.Usage.AccountedAt.After(from) {
		from = a.Usage.AccountedAt
	}
	for _, d := range a.Devices {
		SplitDays(from, now, func(day string, s float64) { row(day, d.Model).GPUS += s })
	}
	sort.Strings(keys)
	out := make([]UsageDay, len(keys))
	for i, k := range keys {
		out[i] = *byKey[k]
	}
	return out
}

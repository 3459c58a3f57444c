package arbiter

import (
	"fmt"
	"strings"
	"time"
)

// Machine kinds.
const (
	KindGPU  = "gpu"
	KindGrid = "grid"
)

// Machine states as users see them. A machine is down when its agent stopped
// heartbeating, draining when an admin asked that nothing new be placed on it.
const (
	MachineUp       = "up"
	MachineDown     = "down"
	MachineDraining = "draining"
)

// Where a machine came from. Configured and local machines never go down for
// lack of heartbeats; agent machines do.
const (
	SourceConfig = "config" // [[machines]] in the configuration file
	SourceAgent  = "agent"  // registered by `arbiter agent`
	SourceLocal  = "local"  // the server's own host, registered when none are configured
)

// Machine is a host with GPUs (or, later, a grid of boards).
type Machine struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	Source   string   `json:"source"`
	Tags     []string `json:"tags"`
	Cores    int      `json:"cores"`
	RAMGiB   float64  `json:"ram_gib"`
	CUDA     string   `json:"cuda"`   // CUDA version the driver supports; "" = no CUDA
	Driver   string   `json:"driver"` // GPU driver version
	GPUs     []GPU    `json:"gpus"`
	Draining bool     `json:"draining"`
	Down     bool     `json:"down"`
	// LastSeen is the last heartbeat. It lives in memory only (docs/architecture.md §2.2):
	// stores neither save nor load it.
	LastSeen time.Time `json:"last_seen"`
}

// GPU is one allocatable GPU of a machine, identified by its index there.
type GPU struct {
	Index   int     `json:"index"`
	UUID    string  `json:"uuid"`
	Model   string  `json:"model"`
	VRAMGiB float64 `json:"vram_gib"`
	Compute string  `json:"compute"` // compute capability "major.minor", "" if unknown
	Healthy bool    `json:"healthy"`
}

// State is the state users see: down, draining or up.
func (m *Machine) State() string {
	switch {
	case m.Down:
		return MachineDown
	case m.Draining:
		return MachineDraining
	}
	return MachineUp
}

// HasTags reports whether m carries every tag in tags.
func (m *Machine) HasTags(tags []string) bool {
	for _, t := range tags {
		found := false
		for _, mt := range m.Tags {
			if mt == t {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Validate checks a machine description for what the engine relies on:
// a name usable in paths, unique GPU indices, sane numbers.
func (m *Machine) Validate() error {
	if err := ValidateName("machine name", m.Name); err != nil {
		return err
	}
	if m.Kind != KindGPU {
		return Errorf(EInvalid, "machine %q: kind %q is not supported (want %q)", m.Name, m.Kind, KindGPU)
	}
	if m.Cores < 0 || m.RAMGiB < 0 {
		return Errorf(EInvalid, "machine %q: cores and ram_gib must not be negative", m.Name)
	}
	if len(m.GPUs) > MaxGPUsPerMachine {
		return Errorf(EInvalid, "machine %q: %d GPUs is more than the %d a machine may have", m.Name, len(m.GPUs), MaxGPUsPerMachine)
	}
	seen := make(map[int]bool, len(m.GPUs))
	uuids := make(map[string]int, len(m.GPUs))
	for i, g := range m.GPUs {
		if g.Index < 0 || seen[g.Index] {
			return Errorf(EInvalid, "machine %q: gpu %d has a negative or repeated index %d", m.Name, i, g.Index)
		}
		seen[g.Index] = true
		if j, dup := uuids[g.UUID]; dup && g.UUID != "" {
			return Errorf(EInvalid, "machine %q: gpus[%d] and gpus[%d] have the same UUID %q", m.Name, j, i, Clip(g.UUID, 80))
		}
		uuids[g.UUID] = i
		if g.VRAMGiB < 0 {
			return Errorf(EInvalid, "machine %q: gpu %d has negative vram_gib", m.Name, g.Index)
		}
		if g.Compute != "" {
			if _, _, ok := ParseCompute(g.Compute); !ok {
				return Errorf(EInvalid, "machine %q: gpu %d: compute capability %q is not of the form 8.6", m.Name, g.Index, Clip(g.Compute, 40))
			}
		}
		if err := ValidateText(fmt.Sprintf("machine %q: gpus[%d].model", m.Name, i), g.Model, MaxModelBytes); err != nil {
			return err
		}
		if err := ValidateText(fmt.Sprintf("machine %q: gpus[%d].uuid", m.Name, i), g.UUID, MaxUUIDBytes); err != nil {
			return err
		}
	}
	for i, t := range m.Tags {
		if err := ValidateText(fmt.Sprintf("machine %q: tags[%d]", m.Name, i), t, MaxTagBytes); err != nil {
			return err
		}
		if t == "" || strings.ContainsAny(t, " ,") {
			return Errorf(EInvalid, "machine %q: tag %q must be non-empty without spaces or commas", m.Name, t)
		}
	}
	if err := ValidateText(fmt.Sprintf("machine %q: cuda", m.Name), m.CUDA, MaxVersionBytes); err != nil {
		return err
	}
	if err := ValidateText(fmt.Sprintf("machine %q: driver", m.Name), m.Driver, MaxVersionBytes); err != nil {
		return err
	}
	return nil
}

// MaxGPUsPerMachine bounds a machine's GPU count; placement indexes machines
// by free GPUs and needs a bound.
const MaxGPUsPerMachine = 64

// ValidateName checks an identifier that may reach URLs, file names and logs:
// 1 to 64 characters of letters, digits, '.', '_', '-', not starting with '.'
// or '-'.
func ValidateName(what, s string) error {
	if s == "" {
		return Errorf(EInvalid, "%s must not be empty", what)
	}
	if len(s) > 64 {
		return Errorf(EInvalid, "%s %q is longer than 64 characters", what, Clip(s, 64))
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' ||
			(i > 0 && (r == '.' || r == '-'))
		if !ok {
			return Errorf(EInvalid, "%s %q may only hold letters, digits, '.', '_' and '-' (not first)", what, Clip(s, 80))
		}
	}
	return nil
}

// ParseCompute parses a compute capability "major.minor" ("9.0", "8.6").
func ParseCompute(s string) (major, minor int, ok bool) {
	a, b, found := strings.Cut(s, ".")
	if !found {
		b = "0"
	}
	if _, err := fmt.Sscanf(a, "%d", &major); err != nil || major < 0 || major > 99 || len(a) > 2 {
		return 0, 0, false
	}
	if _, err := fmt.Sscanf(b, "%d", &minor); err != nil || minor < 0 || minor > 99 || len(b) > 2 {
		return 0, 0, false
	}
	for _, r := range a + b {
		if r < '0' || r > '9' {
			return 0, 0, false
		}
	}
	return major, minor, true
}

// CompareCompute compares two valid compute capabilities like strings.Compare.
func CompareCompute(x, y string) int {
	xa, xb, _ := ParseCompute(x)
	ya, yb, _ := ParseCompute(y)
	switch {
	case xa != ya:
		return cmpInt(xa, ya)
	default:
		return cmpInt(xb, yb)
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

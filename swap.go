package arbiter

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"
)

// Service kinds (docs/reference/coordination.md §2).
const (
	ServiceVLLM    = "vllm"    // an OpenAI-compatible vLLM server: GET {endpoint}/v1/models lists what it serves
	ServiceCommand = "command" // any server swapped by a command; ready when the command exits 0 (and the endpoint, if any, answers 2xx)
)

// Swap states.
const (
	SwapPending  = "pending"  // recorded, waiting for the agent on the service's machine
	SwapRunning  = "running"  // the agent runs the command or waits for the endpoint
	SwapComplete = "complete" // the command exited 0 and the endpoint serves the model
	SwapFailed   = "failed"   // see Reason
)

// Record kinds of services, catalog entries and swaps.
const (
	RecordService = "service" // key: service name
	RecordCatalog = "catalog" // key: "SERVICE/KEY"
	RecordSwap    = "swap"    // key: swap id
)

// Event kinds of services and swaps. Swap events have subject "swap/ID" and
// a Swap without its log as data, except swap.log, whose data is a SwapLog.
const (
	EventServiceUpdated = "service.updated"
	// EventServiceGPUsUnavailable: the GPUs a service occupies could not be
	// held for it (data: {"service", "reason"}); they are held as soon as
	// they can be (its machine registers, GPUs come free), before queued
	// requests get them.
	EventServiceGPUsUnavailable = "service.gpus_unavailable"
	EventServiceRemoved         = "service.removed"
	EventCatalogUpdated         = "catalog.updated"
	EventCatalogRemoved         = "catalog.removed"
	EventSwapPending            = "swap.pending"
	EventSwapRunning            = "swap.running"
	EventSwapLog                = "swap.log"
	EventSwapComplete           = "swap.complete"
	EventSwapFailed             = "swap.failed"
)

// Limits of services, catalog entries and swaps.
const (
	MaxSwapCommandArgs = 64
	MaxArgBytes        = 4096
	MaxSwapLogLines    = 5000 // lines kept per swap; older ones are dropped (LogDropped counts them)
	MaxSwapLogLine     = 4096 // bytes of one line; longer lines are cut
	MaxSwapLogBatch    = 1000 // lines of one AppendSwapLog
	// SwapLockPrefix + service name is the lock guarding a service's swaps
	// natively; CompatSwapLock also guards the default service.
	SwapLockPrefix = "swap:"
	CompatSwapLock = "swap"
)

// Service is an inference server on a machine whose served model arbiter
// swaps. The configuration declares it; Model and Swap are its state.
type Service struct {
	Name     string `json:"name"`
	Machine  string `json:"machine"`
	Kind     string `json:"kind"`
	Endpoint string `json:"endpoint"`
	// SwapCommand is the argv template of a swap: see SwapCommandFor.
	SwapCommand    []string `json:"swap_command"`
	LocalPathRoots []string `json:"local_path_roots"`
	// Default marks the service the compatible /api/swap endpoints act on.
	Default bool `json:"default"`
	// ReadyTimeoutS bounds the wait, after the command exits 0, for the
	// endpoint to serve the new model; SwapTimeoutS bounds a whole swap,
	// from request to end (a swap still unfinished then fails).
	ReadyTimeoutS float64 `json:"ready_timeout_s"`
	SwapTimeoutS  float64 `json:"swap_timeout_s"`
	// GPUs is how many GPUs of its machine the server occupies. arbiter
	// holds them as an allocation owned by "service:NAME" (Allocation, 0
	// while it could not be had), so nobody else is given them.
	GPUs       int   `json:"gpus,omitempty"`
	Allocation int64 `json:"allocation,omitempty"`

	// Model is the catalog key the service serves since its last complete
	// swap ("" when unknown); Swap the id of the swap in progress ("" none).
	Model string `json:"model"`
	Swap  string `json:"swap"`
}

// ServiceOwnerPrefix starts the owner of the allocation holding a service's
// GPUs.
const ServiceOwnerPrefix = "service:"

// Default timeouts of a service.
const (
	DefaultReadyTimeoutS = 600
	DefaultSwapTimeoutS  = 3600
)

// SwapLocks returns the names of the locks that guard s's swaps: swap:NAME,
// and "swap" too for the default service (the lock of the compatible API).
func (s *Service) SwapLocks() []string {
	if s.Default {
		return []string{CompatSwapLock, SwapLockPrefix + s.Name}
	}
	return []string{SwapLockPrefix + s.Name}
}

// swapPlaceholderRE finds {name} placeholders in a swap command template.
var swapPlaceholderRE = regexp.MustCompile(`\{[A-Za-z_]*\}`)

// swapPlaceholders are the placeholders a template element may hold.
var swapPlaceholders = map[string]bool{
	"{model}": true, "{key}": true, "{repo}": true, "{local_path}": true,
	"{service}": true, "{served_name}": true, "{args}": true,
}

// Validate checks a service's configuration. Errors: invalid, naming the field.
func (s *Service) Validate() error {
	if err := ValidateName("service name", s.Name); err != nil {
		return err
	}
	if s.GPUs < 0 || s.GPUs > MaxGPUsPerMachine {
		return Errorf(EInvalid, "service %q: gpus must be between 0 and %d", s.Name, MaxGPUsPerMachine)
	}
	if err := ValidateName("machine", s.Machine); err != nil {
		return Errorf(EInvalid, "service %s: %s", s.Name, err.Error())
	}
	switch s.Kind {
	case ServiceVLLM, ServiceCommand:
	default:
		return Errorf(EInvalid, "service %s: kind %q is not vllm or command", s.Name, s.Kind)
	}
	if s.Endpoint == "" && s.Kind == ServiceVLLM {
		return Errorf(EInvalid, "service %s: a vllm service needs an endpoint URL such as http://127.0.0.1:8000", s.Name)
	}
	if s.Endpoint != "" {
		u, err := url.Parse(s.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return Errorf(EInvalid, "service %s: endpoint %q is not an http:// or https:// URL such as http://127.0.0.1:8000", s.Name, s.Endpoint)
		}
	}
	if err := ValidateSwapTemplate(s.SwapCommand); err != nil {
		return Errorf(EInvalid, "service %s: swap_command: %s", s.Name, err.Error())
	}
	for _, r := range s.LocalPathRoots {
		if !path.IsAbs(r) || swapHasDotDot(r) || strings.ContainsRune(r, 0) {
			return Errorf(EInvalid, "service %s: local_path_roots: %q must be an absolute path without '..'", s.Name, r)
		}
	}
	if !(s.ReadyTimeoutS > 0 && s.ReadyTimeoutS <= 86400) {
		return Errorf(EInvalid, "service %s: ready_timeout_s must be more than 0 and at most 86400, got %v", s.Name, s.ReadyTimeoutS)
	}
	if !(s.SwapTimeoutS > 0 && s.SwapTimeoutS <= 7*86400) {
		return Errorf(EInvalid, "service %s: swap_timeout_s must be more than 0 and at most 604800, got %v", s.Name, s.SwapTimeoutS)
	}
	return nil
}

// ValidateSwapTemplate checks a swap command template: 1 to 64 elements, the
// first an absolute path or a program name (run directly, never through a
// shell), placeholders only among {model} (the repo or local path),
// {key}, {repo}, {local_path}, {service}, {served_name}, and {args} alone
// as a whole element (it expands to the catalog entry's arguments).
func ValidateSwapTemplate(tmpl []string) error {
	if len(tmpl) == 0 {
		return Errorf(EInvalid, "must name the program to run, e.g. [\"/opt/vllm/launch.sh\", \"{model}\"]")
	}
	if len(tmpl) > MaxSwapCommandArgs {
		return Errorf(EInvalid, "has more than %d elements", MaxSwapCommandArgs)
	}
	if tmpl[0] == "" || strings.Contains(tmpl[0], "{") {
		return Errorf(EInvalid, "the first element must name the program, without placeholders")
	}
	if strings.Contains(tmpl[0], "/") && !path.IsAbs(tmpl[0]) {
		return Errorf(EInvalid, "program %q must be an absolute path or a name on PATH", tmpl[0])
	}
	for i, a := range tmpl {
		if len(a) > MaxArgBytes || strings.ContainsRune(a, 0) {
			return Errorf(EInvalid, "element %d is longer than %d bytes or holds a NUL", i, MaxArgBytes)
		}
		for _, p := range swapPlaceholderRE.FindAllString(a, -1) {
			if !swapPlaceholders[p] {
				return Errorf(EInvalid, "element %d: unknown placeholder %s; use {model}, {key}, {repo}, {local_path}, {service}, {served_name} or {args}", i, p)
			}
			if p == "{args}" && a != "{args}" {
				return Errorf(EInvalid, "element %d: {args} must be a whole element: it expands to several", i)
			}
		}
	}
	return nil
}

// CatalogEntry is a model a service may serve: exactly one of Repo (a hub
// id such as "google/gemma-3-27b-it") and LocalPath (an absolute directory
// on the service's host, inside one of its LocalPathRoots), plus launch
// arguments. ServedName is the name the endpoint lists the model under, when
// it is neither the repo nor the local path (vLLM's --served-model-name).
type CatalogEntry struct {
	Service    string    `json:"service"`
	Key        string    `json:"key"`
	Repo       string    `json:"repo,omitempty"`
	LocalPath  string    `json:"local_path,omitempty"`
	Args       []string  `json:"args"`
	ServedName string    `json:"served_name,omitempty"`
	Source     string    `json:"source"` // "config" or "api"
	UpdatedAt  time.Time `json:"updated_at"`
}

// CatalogKey is the record key of a catalog entry.
func CatalogKey(service, key string) string { return service + "/" + key }

// Catalog entry sources.
const (
	CatalogFromConfig = "config"
	CatalogFromAPI    = "api"
)

// swapRepoRE is a hub id: "name" or "owner/name".
var swapRepoRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?$`)

// Validate checks the entry against its service s (for the allowed local
// path roots). Errors: invalid, saying what is wrong and what to do.
func (c *CatalogEntry) Validate(s *Service) error {
	if err := ValidateName("model key", c.Key); err != nil {
		return err
	}
	switch {
	case c.Repo != "" && c.LocalPath != "":
		return Errorf(EInvalid, "model %s: give repo or local_path, not both", c.Key)
	case c.Repo == "" && c.LocalPath == "":
		return Errorf(EInvalid, "model %s: give repo (a hub id such as google/gemma-3-27b-it) or local_path (an absolute directory)", c.Key)
	case c.Repo != "":
		if len(c.Repo) > 200 || !swapRepoRE.MatchString(c.Repo) || strings.Contains(c.Repo, "..") {
			return Errorf(EInvalid, "model %s: repo %q is not a hub id such as google/gemma-3-27b-it", c.Key, Clip(c.Repo, 80))
		}
	default:
		if err := CheckLocalPath(c.LocalPath, s.LocalPathRoots); err != nil {
			return Errorf(EInvalid, "model %s: %s", c.Key, err.Error())
		}
	}
	if len(c.Args) > MaxSwapCommandArgs {
		return Errorf(EInvalid, "model %s: more than %d args", c.Key, MaxSwapCommandArgs)
	}
	for i, a := range c.Args {
		if len(a) > MaxArgBytes || strings.ContainsFunc(a, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return Errorf(EInvalid, "model %s: args[%d] is longer than %d bytes or holds control characters", c.Key, i, MaxArgBytes)
		}
	}
	if c.ServedName != "" {
		if err := ValidateText("served_name", c.ServedName, 200); err != nil {
			return Errorf(EInvalid, "model %s: %s", c.Key, err.Error())
		}
	}
	return nil
}

// CheckLocalPath checks that p is an absolute path with no '..' element,
// inside one of roots. It looks at the text only; the agent checks the
// directory itself (existence, symbolic links) on the host. Errors: invalid.
func CheckLocalPath(p string, roots []string) error {
	switch {
	case p == "":
		return Errorf(EInvalid, "local_path is empty")
	case len(p) > 1024 || strings.ContainsFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return Errorf(EInvalid, "local_path is longer than 1024 bytes or holds control characters")
	case !path.IsAbs(p):
		return Errorf(EInvalid, "local_path %q is relative: give an absolute path", Clip(p, 80))
	case swapHasDotDot(p):
		return Errorf(EInvalid, "local_path %q holds '..': give the directory's real path", Clip(p, 80))
	}
	if len(roots) == 0 {
		return Errorf(EInvalid, "local_path %q: the service allows no local paths (set local_path_roots)", Clip(p, 80))
	}
	clean := path.Clean(p)
	for _, r := range roots {
		r = path.Clean(r)
		if clean == r || strings.HasPrefix(clean, strings.TrimSuffix(r, "/")+"/") {
			return nil
		}
	}
	return Errorf(EInvalid, "local_path %q is outside the allowed roots %s", Clip(p, 80), strings.Join(roots, ", "))
}

func swapHasDotDot(p string) bool {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return true
		}
	}
	return false
}

// Model returns what the entry serves: its repo or its local path.
func (c *CatalogEntry) Model() string {
	if c.Repo != "" {
		return c.Repo
	}
	return c.LocalPath
}

// ServedNames are the names under which an endpoint may list the entry's
// model: the served name if set, else the repo or local path; the key too.
func (c *CatalogEntry) ServedNames() []string {
	if c.ServedName != "" {
		return []string{c.ServedName}
	}
	return []string{c.Model(), c.Key}
}

// SwapCommandFor fills s's swap command template from catalog entry c:
// {model} is the repo or local path, {key} the entry's key, {repo} and
// {local_path} those fields ("" when unset), {service} the service's name,
// {served_name} the served name (default: the model), and an element
// "{args}" is replaced by the entry's args. Values are inserted verbatim in
// one pass (never re-expanded) and the result is an argv: no shell sees it.
func SwapCommandFor(s *Service, c *CatalogEntry) ([]string, error) {
	if err := ValidateSwapTemplate(s.SwapCommand); err != nil {
		return nil, Errorf(EInvalid, "service %s: swap_command: %s", s.Name, err.Error())
	}
	served := c.ServedName
	if served == "" {
		served = c.Model()
	}
	r := strings.NewReplacer("{model}", c.Model(), "{key}", c.Key, "{repo}", c.Repo, "{local_path}", c.LocalPath,
		"{service}", s.Name, "{served_name}", served)
	out := make([]string, 0, len(s.SwapCommand)+len(c.Args))
	for _, a := range s.SwapCommand {
		if a == "{args}" {
			out = append(out, c.Args...)
			continue
		}
		out = append(out, r.Replace(a))
	}
	if len(out) > 2*MaxSwapCommandArgs {
		return nil, Errorf(EInvalid, "the swap command would have more than %d arguments", 2*MaxSwapCommandArgs)
	}
	return out, nil
}

// SwapValidation is the answer of a validation: whether a swap to the entry
// could run, what is wrong if not, and the command it would run.
type SwapValidation struct {
	OK       bool     `json:"ok"`
	Service  string   `json:"service"`
	ModelKey string   `json:"model_key"`
	Errors   []string `json:"errors"`
	Command  []string `json:"command"`
}

// ValidateSwap checks that a swap of s to entry c could run: the entry is
// valid for s and the command can be built. c may be nil (unknown key).
func ValidateSwap(s *Service, key string, c *CatalogEntry) SwapValidation {
	v := SwapValidation{Service: s.Name, ModelKey: key, Errors: []string{}, Command: []string{}}
	if c == nil {
		v.Errors = append(v.Errors, fmt.Sprintf("model key %q is not in the catalog of service %s (see arbiter catalog list %s)", Clip(key, 64), s.Name, s.Name))
		return v
	}
	if err := c.Validate(s); err != nil {
		v.Errors = append(v.Errors, ErrorMessage(err))
	}
	if cmd, err := SwapCommandFor(s, c); err != nil {
		v.Errors = append(v.Errors, ErrorMessage(err))
	} else {
		v.Command = cmd
	}
	v.OK = len(v.Errors) == 0
	return v
}

// SwapIDLess orders swap ids (decimal numbers as strings) by number.
func SwapIDLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// Swap is a recorded change of the model a service serves. The server
// assigns it to the agent on the service's machine, which runs Command,
// streams its output into Log, and reports the end: complete when the
// command exited 0 and the endpoint serves the model within the ready
// timeout, failed otherwise (Reason says why).
type Swap struct {
	ID       string `json:"id"`
	Service  string `json:"service"`
	Machine  string `json:"machine"`
	ModelKey string `json:"model_key"`
	State    string `json:"state"`
	DryRun   bool   `json:"dry_run"`
	// What the agent needs to run and check it.
	Command     []string `json:"command"`
	Kind        string   `json:"kind"`
	Endpoint    string   `json:"endpoint"`
	LocalPath   string   `json:"local_path,omitempty"`
	LocalRoots  []string `json:"local_path_roots,omitempty"`
	ServedNames []string `json:"served_names"`
	// Repo is the catalog entry's repo ("" for a local path only): with
	// LocalPath, what the endpoint's model list must name as a model's
	// root, when it gives one, besides one of ServedNames.
	Repo          string  `json:"repo,omitempty"`
	ReadyTimeoutS float64 `json:"ready_timeout_s"`
	TimeoutS      float64 `json:"timeout_s"`

	ReturnCode  *int       `json:"returncode"`
	Reason      string     `json:"reason,omitempty"`
	RequestedBy string     `json:"requested_by"`
	Fence       int64      `json:"fence,omitempty"` // the fencing number of the lock whose token authorised it
	Forced      bool       `json:"forced,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	StartedAt   *time.Time `json:"started_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	// Instance is the agent process that claimed it (ClaimSwap.Instance).
	Instance   string   `json:"agent_instance,omitempty"`
	Log        []string `json:"log"`
	LogDropped int      `json:"log_dropped,omitempty"` // oldest lines dropped beyond MaxSwapLogLines
}

// Done reports whether the swap has ended.
func (s *Swap) Done() bool { return s.State == SwapComplete || s.State == SwapFailed }

// SwapLog is the data of a swap.log event: lines appended to a swap's log,
// the first of them being line number Offset (counting from 0 across the
// whole log, dropped lines included).
type SwapLog struct {
	ID     string   `json:"id"`
	Offset int      `json:"offset"`
	Lines  []string `json:"lines"`
}

// SyncServices makes the configured services exactly Services and puts the
// configured catalog entries (Source "config"); services no longer listed are
// removed with their catalog. Entries added through the API stay. Result: nil.
// Errors: invalid for a service or entry that does not validate.
type SyncServices struct {
	Services []Service
	Catalog  []CatalogEntry
}

// PutCatalogEntry adds or replaces a catalog entry (admin). Result:
// CatalogEntry. Errors: not_found for an unknown service, invalid for an
// entry that does not validate.
type PutCatalogEntry struct {
	Caller Caller
	Entry  CatalogEntry
}

// DeleteCatalogEntry removes a catalog entry (admin). Result: CatalogEntry
// (as it was). Errors: not_found.
type DeleteCatalogEntry struct {
	Caller  Caller
	Service string
	Key     string
}

// RequestSwap asks for a swap of Service ("" = the default service) to the
// catalog entry ModelKey. Result: Swap — pending for the agent, or, for a
// dry run, already complete with the command it would run in its log.
//
// A real swap is refused with a *LockHeldError (locked) when a lock guarding
// the service (Service.SwapLocks) is held and LockToken is not its token,
// unless Force (admins only). Errors: not_found for an unknown service,
// invalid for an unknown or invalid model key, conflict while another swap
// of the service is pending or running, forbidden for Force from a
// non-admin.
type RequestSwap struct {
	Caller    Caller
	Service   string
	ModelKey  string
	DryRun    bool
	LockToken string
	Force     bool
}

// ClaimSwap gives the agent of Machine the oldest pending swap of a service
// on it, now running. Result: *Swap, nil when there is none. The agent runs
// one swap at a time, so a claim also ends as failed any swap still marked
// running on the machine (its agent restarted in the middle).
type ClaimSwap struct {
	Caller  Caller
	Machine string
	// Instance names the agent process: a claim from the instance running
	// a swap on Machine gets that swap again (the answer of its claim was
	// lost); from another, or none, the running swap fails (that agent
	// restarted). At most 64 name characters; "" is none.
	Instance string
}

// AppendSwapLog adds output lines to a running swap's log (lines longer
// than MaxSwapLogLine are cut). Result: nil. Errors: not_found, conflict
// when the swap is not running on Machine, invalid for more than
// MaxSwapLogBatch lines.
type AppendSwapLog struct {
	Caller  Caller
	ID      string
	Machine string
	Lines   []string
}

// CancelSwap ends a pending or running swap as failed, "cancelled by"
// the caller with Reason (the admin's, or the requester's own). A running
// swap's agent stops its command when it next hears from the server.
// Result: Swap. Errors: not_found, forbidden for another's swap without
// the admin role, conflict for a swap that has ended.
type CancelSwap struct {
	Caller Caller
	ID     string
	Reason string
}

// FinishSwap ends a running swap: complete when OK (the service now serves
// its model), failed otherwise with Reason. Result: Swap. Errors: not_found,
// conflict when the swap is not running on Machine.
type FinishSwap struct {
	Caller     Caller
	ID         string
	Machine    string
	ReturnCode *int
	OK         bool
	Reason     string
}

func (SyncServices) isCommand()                 {}
func (SyncServices) result() None               { return None{} }
func (PutCatalogEntry) isCommand()              {}
func (PutCatalogEntry) result() CatalogEntry    { return CatalogEntry{} }
func (DeleteCatalogEntry) isCommand()           {}
func (DeleteCatalogEntry) result() CatalogEntry { return CatalogEntry{} }
func (RequestSwap) isCommand()                  {}
func (RequestSwap) result() Swap                { return Swap{} }
func (ClaimSwap) isCommand()                    {}
func (ClaimSwap) result() *Swap                 { return nil }
func (AppendSwapLog) isCommand()                {}
func (AppendSwapLog) result() None              { return None{} }
func (FinishSwap) isCommand()                   {}
func (FinishSwap) result() Swap                 { return Swap{} }
func (CancelSwap) isCommand()                   {}
func (CancelSwap) result() Swap                 { return Swap{} }

// Package manifest loads the work queue's manifest (docs/reference/fleet.md §1): one
// TOML file declaring per-host policy ([[hosts]]) and every task ([[jobs]],
// with [defaults] applied to each), validated whole.
//
// Decoding is strict: an unknown key is an error. Every error names the file,
// the line, the entry and the key, e.g.
//
//	training.toml:31: jobs[2] (gbt/realistic): gpus: must be 0 to 64, got 99
//
// A task's id is the sha256 (hex) of the canonical JSON of its identity
// fields (see Identity), so the same entry always has the same id and a
// reload is idempotent. The package is pure: it parses the bytes it is
// given and touches nothing else (the caller opens the file).
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/tomlpos"
)

// Defaults of a job that neither it nor [defaults] sets.
const (
	DefaultMaxAttempts = 3
	DefaultStaleAfterS = 600
)

// Limits of a manifest.
const (
	MaxFileBytes = 16 << 20
	MaxJobs      = 100000
)

// Manifest is a loaded, validated manifest.
type Manifest struct {
	Name   string
	Source string // the file name it was parsed as
	SHA256 string // of the file's bytes
	Hosts  []arbiter.HostPolicy
	Jobs   []Job // in file order
}

// Job is one [[jobs]] entry with [defaults] applied and its placeholders
// substituted.
type Job struct {
	ID   string
	Name string
	Spec arbiter.TaskSpec
}

// TaskManifest returns the manifest as the engine's SyncTasks takes it.
func (m *Manifest) TaskManifest() arbiter.TaskManifest {
	tm := arbiter.TaskManifest{Name: m.Name, Source: m.Source, SHA256: m.SHA256, Hosts: m.Hosts,
		Tasks: make([]arbiter.TaskDef, len(m.Jobs))}
	for i, j := range m.Jobs {
		tm.Tasks[i] = arbiter.TaskDef{ID: j.ID, Name: j.Name, Spec: j.Spec}
	}
	return tm
}

// Read reads a manifest from r (at most MaxFileBytes) and parses it; name
// is used in messages (the file's path). Errors: r fails, or whatever
// Parse reports.
func Read(name string, r io.Reader) (*Manifest, error) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(r, MaxFileBytes+1)); err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", name, err)
	}
	return Parse(name, buf.Bytes())
}

// Parse parses and validates a manifest document; name is used in messages.
// On failure it returns no Manifest and one *Error per problem (joined with
// errors.Join when more than one), in file order.
func Parse(name string, data []byte) (*Manifest, error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{File: name, Message: fmt.Sprintf("the manifest is larger than %d bytes", MaxFileBytes)}
	}
	// Where keys are written is needed only to report a problem: the index
	// is built then, not for every manifest read (a third of reading a
	// large one).
	ix := sync.OnceValue(func() *tomlpos.Index { return tomlpos.NewIndex(data) })
	var doc fileDoc
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, decodeError(name, ix(), &doc, err)
	}
	p := &parser{ix: ix, errs: tomlpos.List{File: name}}
	m := p.build(&doc)
	sum := sha256.Sum256(data)
	if p.errs.Len() > 0 {
		return nil, p.errs.Err()
	}
	m.Source = name
	m.SHA256 = hex.EncodeToString(sum[:])
	return m, nil
}

// fileDoc is the document as written.
type fileDoc struct {
	Name     string      `toml:"name"`
	Defaults defaults    `toml:"defaults"`
	Hosts    []hostEntry `toml:"hosts"`
	Jobs     []jobEntry  `toml:"jobs"`
}

type hostEntry struct {
	Name      string   `toml:"name"`
	AllowJobs []string `toml:"allow_jobs"`
	DenyJobs  []string `toml:"deny_jobs"`
}

// defaults are the keys [defaults] may set: every job key but model and name.
type defaults struct {
	Mode         *string        `toml:"mode"`
	Hyper        map[string]any `toml:"hyper" want:"a table, such as { lr = 0.1, depth = 6 }"`
	SplitRecipe  *string        `toml:"split_recipe"`
	TrainHosts   *[]string      `toml:"train_hosts"`
	Seed         *int64         `toml:"seed"`
	Priority     *int           `toml:"priority"`
	RequireCUDA  *bool          `toml:"require_cuda"`
	PreferCUDA   *bool          `toml:"prefer_cuda"`
	MinVRAMGiB   *float64       `toml:"min_vram_gib"`
	MinRAMGiB    *float64       `toml:"min_ram_gib"`
	GPUs         *int           `toml:"gpus"`
	AllowedHosts *[]string      `toml:"allowed_hosts"`
	Command      *[]string      `toml:"command"`
	MaxAttempts  *int           `toml:"max_attempts"`
	StaleAfterS  *float64       `toml:"stale_after_s"`
}

type jobEntry struct {
	Name  *string `toml:"name"`
	Model *string `toml:"model"`
	defaults
}

// parser collects problems while building the manifest.
type parser struct {
	ix   func() *tomlpos.Index // built on first use
	errs tomlpos.List          // of the file being parsed
	// inDefaults holds the problems of [defaults] values already reported
	// (once, at [defaults], not at every job that takes them).
	inDefaults map[string]bool
}

// add records a problem of entry (written at path) at key within it.
func (p *parser) add(entry, path, key, msg string) {
	at := path
	if key != "" {
		at = tomlpos.Join(path, key)
	}
	line, _ := p.ix().Line(at)
	p.errs.Add(&Error{File: p.errs.File, Line: line, Entry: entry, Key: key, Message: msg})
}

func (p *parser) build(doc *fileDoc) *Manifest {
	m := &Manifest{Name: doc.Name, Hosts: []arbiter.HostPolicy{}, Jobs: []Job{}}
	if len(doc.Name) > 128 || strings.ContainsFunc(doc.Name, isControl) {
		p.add("", "", "name", "must be at most 128 printable characters")
	}
	hostSeen := map[string]int{}
	for i, h := range doc.Hosts {
		path := fmt.Sprintf("hosts[%d]", i)
		entry := fmt.Sprintf("hosts[%d]", i)
		if h.Name != "" {
			entry += " (" + arbiter.Clip(h.Name, 40) + ")"
		}
		if err := arbiter.ValidateName("host name", h.Name); err != nil {
			p.add(entry, path, "name", arbiter.ErrorMessage(err))
		} else if j, dup := hostSeen[h.Name]; dup {
			p.add(entry, path, "name", fmt.Sprintf("host %q is already declared by hosts[%d]; merge the two", h.Name, j))
		} else {
			hostSeen[h.Name] = i
		}
		p.patterns(entry, path, "allow_jobs", h.AllowJobs)
		p.patterns(entry, path, "deny_jobs", h.DenyJobs)
		m.Hosts = append(m.Hosts, arbiter.HostPolicy{Name: h.Name, AllowJobs: orEmpty(h.AllowJobs), DenyJobs: orEmpty(h.DenyJobs)})
	}
	if len(doc.Jobs) > MaxJobs {
		p.add("", "jobs", "", fmt.Sprintf("%d jobs; a manifest may declare at most %d", len(doc.Jobs), MaxJobs))
		return m
	}
	p.checkDefaults(&doc.Defaults)
	byID := map[string]int{}
	names := map[string]int{}
	for i := range doc.Jobs {
		j, ok := p.job(i, &doc.Jobs[i], &doc.Defaults)
		if !ok {
			continue
		}
		if k, dup := byID[j.ID]; dup {
			p.add(jobEntryName(i, &doc.Jobs[i]), fmt.Sprintf("jobs[%d]", i), "",
				fmt.Sprintf("declares the same task as jobs[%d] (model, mode, hyper, split_recipe, train_hosts and seed give the same id %s…); change one or remove it", k, j.ID[:12]))
			continue
		}
		byID[j.ID] = i
		if k, dup := names[j.Name]; dup && doc.Jobs[i].Name != nil {
			p.add(jobEntryName(i, &doc.Jobs[i]), fmt.Sprintf("jobs[%d]", i), "name", fmt.Sprintf("name %q is already used by jobs[%d]", j.Name, k))
			continue
		}
		names[j.Name] = i
		m.Jobs = append(m.Jobs, j)
	}
	return m
}

// checkDefaults reports problems of [defaults] once, at its own lines.
func (p *parser) checkDefaults(d *defaults) {
	if _, err := canonicalHyper(d.Hyper); err != nil {
		p.add("defaults", "defaults", "hyper", err.Error())
	}
}

func jobEntryName(i int, e *jobEntry) string {
	s := fmt.Sprintf("jobs[%d]", i)
	switch {
	case e.Name != nil && *e.Name != "":
		s += " (" + arbiter.Clip(*e.Name, 40) + ")"
	case e.Model != nil && e.Mode != nil:
		s += " (" + arbiter.Clip(*e.Model, 30) + "/" + arbiter.Clip(*e.Mode, 30) + ")"
	case e.Model != nil:
		s += " (" + arbiter.Clip(*e.Model, 40) + ")"
	}
	return s
}

// job builds jobs[i] with the defaults applied; ok is false when it has a
// problem (already reported).
func (p *parser) job(i int, e *jobEntry, d *defaults) (Job, bool) {
	path := fmt.Sprintf("jobs[%d]", i)
	entry := jobEntryName(i, e)
	n := p.errs.Len()
	failed := false
	bad := func(key, msg string) {
		failed = true
		base, _, _ := strings.Cut(key, "[")
		if !p.ix().Has(tomlpos.Join(path, base)) && p.ix().Has(tomlpos.Join("defaults", base)) {
			// The job took it from [defaults]: said once, where it is written.
			if p.inDefaults == nil {
				p.inDefaults = map[string]bool{}
			}
			if !p.inDefaults[key+"\x00"+msg] {
				p.inDefaults[key+"\x00"+msg] = true
				p.add("defaults", "defaults", key, msg)
			}
			return
		}
		p.add(entry, path, key, msg)
	}

	s := arbiter.TaskSpec{
		Mode:        pick(e.Mode, d.Mode, ""),
		SplitRecipe: pick(e.SplitRecipe, d.SplitRecipe, ""),
		TrainHosts:  orEmpty(pick(e.TrainHosts, d.TrainHosts, nil)),
		Seed:        pick(e.Seed, d.Seed, 0),
		Priority:    pick(e.Priority, d.Priority, 0),
		RequireCUDA: pick(e.RequireCUDA, d.RequireCUDA, false),
		PreferCUDA:  pick(e.PreferCUDA, d.PreferCUDA, false),
		MinVRAMGiB:  pick(e.MinVRAMGiB, d.MinVRAMGiB, 0),
		MinRAMGiB:   pick(e.MinRAMGiB, d.MinRAMGiB, 0),
		GPUs:        pick(e.GPUs, d.GPUs, 0),
		MaxAttempts: pick(e.MaxAttempts, d.MaxAttempts, DefaultMaxAttempts),
		StaleAfterS: pick(e.StaleAfterS, d.StaleAfterS, DefaultStaleAfterS),
	}
	if e.Model == nil || *e.Model == "" {
		bad("model", "missing: every job names the model it trains")
	} else {
		s.Model = *e.Model
		if err := checkIdent(s.Model); err != nil {
			bad("model", err.Error())
		}
	}
	if err := checkIdent(s.Mode); err != nil && s.Mode != "" {
		bad("mode", err.Error())
	}
	if len(s.SplitRecipe) > 128 || strings.ContainsFunc(s.SplitRecipe, isControl) {
		bad("split_recipe", "must be at most 128 printable characters")
	}
	for k, h := range s.TrainHosts {
		if h == "" || len(h) > 128 || strings.ContainsFunc(h, isControl) {
			bad(fmt.Sprintf("train_hosts[%d]", k), "must be a non-empty host name of at most 128 printable characters")
		}
	}
	hyper := mergeHyper(d.Hyper, e.Hyper)
	canon, err := canonicalHyper(hyper)
	if err != nil {
		if e.Hyper != nil {
			bad("hyper", err.Error())
		}
	} else {
		s.Hyper = canon
	}
	if s.Priority < -arbiter.MaxPriority || s.Priority > arbiter.MaxPriority {
		bad("priority", fmt.Sprintf("must be between %d and %d, got %d", -arbiter.MaxPriority, arbiter.MaxPriority, s.Priority))
	}
	if s.GPUs < 0 || s.GPUs > arbiter.MaxTaskGPUs {
		bad("gpus", fmt.Sprintf("must be 0 to %d, got %d", arbiter.MaxTaskGPUs, s.GPUs))
	}
	if badGiB(s.MinVRAMGiB) {
		bad("min_vram_gib", fmt.Sprintf("must be a number of GiB, at least 0, got %v", s.MinVRAMGiB))
	}
	if badGiB(s.MinRAMGiB) {
		bad("min_ram_gib", fmt.Sprintf("must be a number of GiB, at least 0, got %v", s.MinRAMGiB))
	}
	if s.MaxAttempts < 1 || s.MaxAttempts > arbiter.MaxTaskAttempts {
		bad("max_attempts", fmt.Sprintf("must be 1 to %d, got %d", arbiter.MaxTaskAttempts, s.MaxAttempts))
	}
	if math.IsNaN(s.StaleAfterS) || s.StaleAfterS < 1 || s.StaleAfterS > arbiter.MaxStaleAfterS {
		bad("stale_after_s", fmt.Sprintf("must be 1 to %d seconds, got %v", arbiter.MaxStaleAfterS, s.StaleAfterS))
	}
	allowed := orEmpty(pick(e.AllowedHosts, d.AllowedHosts, nil))
	p.patterns(entry, path, "allowed_hosts", allowed)
	s.AllowedHosts = allowed
	if failed || p.errs.Len() > n {
		return Job{}, false
	}

	id := identityID(&s)
	name := s.Model
	if s.Mode != "" {
		name += "-" + s.Mode
	}
	name += "-" + id[:8]
	if e.Name != nil {
		if err := arbiter.ValidateName("name", *e.Name); err != nil {
			bad("name", arbiter.ErrorMessage(err))
			return Job{}, false
		}
		name = *e.Name
	}

	cmd := pick(e.Command, d.Command, nil)
	if len(cmd) == 0 {
		bad("command", "missing: set command (the program and its arguments) in the job or in [defaults]")
		return Job{}, false
	}
	if len(cmd) > arbiter.MaxCommandArgs {
		bad("command", fmt.Sprintf("has %d arguments; at most %d", len(cmd), arbiter.MaxCommandArgs))
		return Job{}, false
	}
	vars := map[string]string{
		"model": s.Model, "mode": s.Mode, "seed": strconv.FormatInt(s.Seed, 10),
		"split_recipe": s.SplitRecipe, "task_id": id, "name": name,
	}
	hyperVals, hyperKeys := hyperStrings(hyper)
	s.Command = make([]string, len(cmd))
	for k, arg := range cmd {
		out, err := substitute(arg, vars, hyperVals, hyperKeys)
		if err != nil {
			bad(fmt.Sprintf("command[%d]", k), err.Error())
			return Job{}, false
		}
		s.Command[k] = out
	}
	if s.Command[0] == "" {
		bad("command[0]", "must name the program to run")
		return Job{}, false
	}
	if err := s.Validate(); err != nil {
		bad("", arbiter.ErrorMessage(err))
		return Job{}, false
	}
	return Job{ID: id, Name: name, Spec: s}, true
}

func (p *parser) patterns(entry, path, key string, ps []string) {
	for k, pat := range ps {
		if _, err := pathMatch(pat); err != nil || pat == "" || len(pat) > 128 {
			p.add(entry, path, fmt.Sprintf("%s[%d]", key, k), fmt.Sprintf("%q is not a name or shell pattern such as \"gbt*\"", arbiter.Clip(pat, 40)))
		}
	}
}

func pathMatch(pat string) (bool, error) { return path.Match(pat, "") }

// Identity is the canonical JSON of a task's identity fields: an object
// with the keys hyper, mode, model, seed, split_recipe and train_hosts,
// keys sorted at every level, no white space, strings ASCII-only and
// numbers as Python writes them (see canonical.go): Python's
// json.dumps(sort_keys=True, separators=(",", ":")) of the same values gives
// the same bytes. The task id is the sha256 of it, in lowercase hex.
func Identity(s *arbiter.TaskSpec) []byte {
	hyper := s.Hyper
	if len(hyper) == 0 {
		hyper = json.RawMessage("{}")
	}
	th := s.TrainHosts
	if th == nil {
		th = []string{}
	}
	var b bytes.Buffer
	b.WriteString(`{"hyper":`)
	b.Write(hyper)
	b.WriteString(`,"mode":`)
	writeString(&b, s.Mode)
	b.WriteString(`,"model":`)
	writeString(&b, s.Model)
	b.WriteString(`,"seed":`)
	b.WriteString(strconv.FormatInt(s.Seed, 10))
	b.WriteString(`,"split_recipe":`)
	writeString(&b, s.SplitRecipe)
	b.WriteString(`,"train_hosts":[`)
	for i, h := range th {
		if i > 0 {
			b.WriteByte(',')
		}
		writeString(&b, h)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// identityID is the task id of a spec whose Hyper is canonical.
func identityID(s *arbiter.TaskSpec) string {
	sum := sha256.Sum256(Identity(s))
	return hex.EncodeToString(sum[:])
}

// TaskID returns the id of a spec: sha256 of Identity, hex. s.Hyper must
// be canonical (as Parse leaves it).
func TaskID(s *arbiter.TaskSpec) string { return identityID(s) }

// canonicalHyper encodes hyper-parameters as canonical JSON. Errors name
// the key: dates and times, NaN and infinities have no canonical form.
func canonicalHyper(h map[string]any) (json.RawMessage, error) {
	if h == nil {
		return json.RawMessage("{}"), nil
	}
	v, err := plain(h, "")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, v); err != nil {
		return nil, fmt.Errorf("cannot encode: %v", err)
	}
	return json.RawMessage(b.Bytes()), nil
}

// plain turns a decoded TOML value into plain JSON values, refusing what
// has no canonical form.
func plain(v any, key string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			p, err := plain(e, tomlpos.Join(key, k))
			if err != nil {
				return nil, err
			}
			out[k] = p
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			p, err := plain(e, fmt.Sprintf("%s[%d]", key, i))
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%s: nan and inf have no JSON form; use a number", key)
		}
		return x, nil
	case int64, string, bool:
		return x, nil
	case time.Time, toml.LocalDate, toml.LocalDateTime, toml.LocalTime:
		return nil, fmt.Errorf("%s: dates and times are not supported; write it as a string", key)
	}
	return nil, fmt.Errorf("%s: unsupported value of type %T", key, v)
}

// mergeHyper returns the defaults' hyper-parameters overridden key by key
// by the job's.
func mergeHyper(d, j map[string]any) map[string]any {
	if d == nil {
		return j
	}
	out := make(map[string]any, len(d)+len(j))
	for k, v := range d {
		out[k] = v
	}
	for k, v := range j {
		out[k] = v
	}
	return out
}

// hyperStrings returns each top-level hyper-parameter as it is substituted
// into a command ({hyper.NAME}): strings as they are, other values as
// canonical JSON; and the sorted names, for messages.
func hyperStrings(h map[string]any) (map[string]string, []string) {
	vals := make(map[string]string, len(h))
	keys := make([]string, 0, len(h))
	for k, v := range h {
		keys = append(keys, k)
		if s, ok := v.(string); ok {
			vals[k] = s
			continue
		}
		p, err := plain(v, k)
		if err != nil {
			continue
		}
		var b bytes.Buffer
		if writeCanonical(&b, p) == nil {
			vals[k] = b.String()
		}
	}
	sort.Strings(keys)
	return vals, keys
}

// substitute replaces {model}, {mode}, {seed}, {split_recipe}, {task_id},
// {name} and {hyper.NAME} in arg; {{ and }} stand for { and }.
func substitute(arg string, vars, hyper map[string]string, hyperKeys []string) (string, error) {
	if !strings.ContainsAny(arg, "{}") {
		return arg, nil
	}
	var b strings.Builder
	for i := 0; i < len(arg); i++ {
		c := arg[i]
		switch {
		case c == '{' && i+1 < len(arg) && arg[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(arg) && arg[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '}':
			return "", fmt.Errorf("unmatched } in %q; write }} for a literal brace", arbiter.Clip(arg, 60))
		case c == '{':
			end := strings.IndexByte(arg[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("unclosed { in %q; write {{ for a literal brace", arbiter.Clip(arg, 60))
			}
			name := arg[i+1 : i+end]
			if hk, ok := strings.CutPrefix(name, "hyper."); ok {
				v, ok := hyper[hk]
				if !ok {
					known := "it has none"
					if len(hyperKeys) > 0 {
						known = "it has " + strings.Join(hyperKeys, ", ")
					}
					return "", fmt.Errorf("placeholder {%s} names no hyper-parameter of this job (%s)", arbiter.Clip(name, 40), known)
				}
				b.WriteString(v)
			} else if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				return "", fmt.Errorf("unknown placeholder {%s}; the placeholders are {model}, {mode}, {seed}, {split_recipe}, {task_id}, {name} and {hyper.NAME}", arbiter.Clip(name, 40))
			}
			i += end
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// checkIdent checks a model or mode: a name usable in file names and logs.
func checkIdent(s string) error {
	if err := arbiter.ValidateName("value", s); err != nil {
		return errors.New(strings.TrimPrefix(arbiter.ErrorMessage(err), "value "))
	}
	return nil
}

func pick[T any](job, def *T, zero T) T {
	if job != nil {
		return *job
	}
	if def != nil {
		return *def
	}
	return zero
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func badGiB(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) || v < 0 }

func isControl(r rune) bool { return r < ' ' || r == 0x7f }

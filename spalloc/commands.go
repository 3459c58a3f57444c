package spalloc

import (
	"bytes"
	"encoding/json"
	"slices"
	"sort"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// command is one protocol command: its parameters and what it does.
type command struct {
	name string
	// params can be given by position or by name, in this order; the first
	// required of them must be given (null counts as not given).
	params   []string
	required int
	// kwonly are names only accepted as keywords (create_job's).
	kwonly []string
	// varargs: positional arguments are all collected (create_job's *args).
	varargs bool
	// anyKw: only keyword arguments, any names, checked by run (where_is).
	anyKw bool
	run   func(s *Session, b Backend, a *bound) ([]byte, error)
}

// bound holds a call's arguments by parameter name (null ones dropped),
// plus create_job's positional arguments.
type bound struct {
	named map[string]json.RawMessage
	args  []json.RawMessage
	// given lists the keyword names the client sent, null or not, sorted
	// (create_job echoes them).
	given []string
	raw   map[string]json.RawMessage
}

func (a *bound) has(name string) bool { _, ok := a.named[name]; return ok }

// commands are the seventeen commands of docs/reference/spalloc.md §2.
var commands = map[string]*command{}

func init() {
	for _, c := range []*command{
		{name: "version", run: runVersion},
		{name: "create_job", varargs: true, kwonly: []string{"owner", "keepalive", "machine", "tags", "min_ratio", "max_dead_boards", "max_dead_links", "require_torus"}, run: runCreateJob},
		{name: "job_keepalive", params: []string{"job_id"}, required: 1, run: runJobKeepalive},
		{name: "get_job_state", params: []string{"job_id"}, required: 1, run: runGetJobState},
		{name: "get_job_machine_info", params: []string{"job_id"}, required: 1, run: runGetJobMachineInfo},
		{name: "power_on_job_boards", params: []string{"job_id"}, required: 1, run: runPowerOn},
		{name: "power_off_job_boards", params: []string{"job_id"}, required: 1, run: runPowerOff},
		{name: "destroy_job", params: []string{"job_id", "reason"}, required: 1, run: runDestroyJob},
		{name: "notify_job", params: []string{"job_id"}, run: runNotifyJob},
		{name: "no_notify_job", params: []string{"job_id"}, run: runNoNotifyJob},
		{name: "notify_machine", params: []string{"machine_name"}, run: runNotifyMachine},
		{name: "no_notify_machine", params: []string{"machine_name"}, run: runNoNotifyMachine},
		{name: "list_jobs", run: runListJobs},
		{name: "list_machines", run: runListMachines},
		{name: "get_board_position", params: []string{"machine_name", "x", "y", "z"}, required: 4, run: runGetBoardPosition},
		{name: "get_board_at_position", params: []string{"machine_name", "x", "y", "z"}, required: 4, run: runGetBoardAtPosition},
		{name: "where_is", anyKw: true, run: runWhereIs},
	} {
		commands[c.name] = c
	}
}

// Commands lists the protocol's command names, sorted.
func Commands() []string {
	out := make([]string, 0, len(commands))
	for n := range commands {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// bind matches a call's arguments to the command's parameters, with the
// messages Python gives for a bad call.
func (c *command) bind(cl *call) (*bound, error) {
	a := &bound{named: map[string]json.RawMessage{}, raw: cl.kwargs}
	switch {
	case c.varargs:
		a.args = cl.args
	case c.anyKw:
		if len(cl.args) > 0 {
			return nil, argErrorf("%s() takes keyword arguments only (%d positional given)", c.name, len(cl.args))
		}
	case len(cl.args) > len(c.params):
		return nil, argErrorf("%s() takes %s (%d given)", c.name, countArgs(c), len(cl.args))
	}
	if !c.varargs {
		for i, v := range cl.args {
			if !isNull(v) {
				a.named[c.params[i]] = v
			}
		}
	}
	for k := range cl.kwargs {
		a.given = append(a.given, k)
	}
	sort.Strings(a.given)
	for _, k := range a.given {
		v := cl.kwargs[k]
		switch {
		case c.anyKw:
		case slices.Contains(c.kwonly, k):
		case slices.Contains(c.params, k):
			if i := slices.Index(c.params, k); i < len(cl.args) {
				return nil, argErrorf("%s() got multiple values for argument '%s'", c.name, k)
			}
		default:
			return nil, argErrorf("%s() got an unexpected keyword argument '%s'", c.name, arbiter.Clip(k, 40))
		}
		if !isNull(v) {
			a.named[k] = v
		}
	}
	for _, p := range c.params[:c.required] {
		if !a.has(p) {
			return nil, argErrorf("%s() missing required argument '%s'", c.name, p)
		}
	}
	return a, nil
}

func countArgs(c *command) string {
	n := len(c.params)
	switch {
	case n == 0:
		return "no arguments"
	case c.required == n && n == 1:
		return "1 argument"
	case c.required == n:
		return itoa(n) + " arguments"
	}
	return "at most " + itoa(n) + " arguments"
}

func runVersion(s *Session, b Backend, a *bound) ([]byte, error) {
	return appendString(s.start(), Version), nil
}

func jobID(a *bound) (int64, error) { return asInt("job_id", a.named["job_id"]) }

// Errors create_job's clients know (docs/reference/spalloc.md §2).
const (
	ErrNoOwner        = "owner must be specified for all jobs"
	ErrMachineAndTags = "Only one of machine and tags may be specified for a job."
)

// Bounds of create_job's strings.
const (
	maxOwner   = 128
	maxTags    = 32
	maxTagName = 64
)

// parseCreateJob validates a create_job completely, so that a failing one
// creates nothing.
func parseCreateJob(a *bound, peer string) (*CreateJob, error) {
	c := &CreateJob{Peer: peer}
	args := make([]int, 0, len(a.args))
	for i, v := range a.args {
		n, err := asSmallInt("create_job() positional argument "+itoa(i+1), v)
		if err != nil {
			return nil, err
		}
		args = append(args, n)
	}
	r := arbiter.GridRequest{KeepaliveHost: peer}
	if err := r.ParseGridArgs(args); err != nil {
		return nil, &ArgError{Message: arbiter.ErrorMessage(err)}
	}
	var err error

	if !a.has("owner") {
		return nil, &ArgError{Message: ErrNoOwner}
	}
	if c.Owner, err = asString("owner", a.named["owner"]); err != nil {
		return nil, err
	}
	if c.Owner == "" {
		return nil, &ArgError{Message: ErrNoOwner}
	}
	if len(c.Owner) > maxOwner {
		return nil, argErrorf("owner is longer than %d characters", maxOwner)
	}

	// keepalive: absent is the default; null (alone among the kwargs) is
	// "never expires".
	k := DefaultKeepalive
	c.Keepalive = &k
	if raw, ok := a.raw["keepalive"]; ok {
		if isNull(raw) {
			c.Keepalive = nil
		} else {
			if k, err = asFloat("keepalive", raw); err != nil {
				return nil, err
			}
			if k <= 0 || k > MaxKeepalive {
				return nil, argErrorf("keepalive must be more than 0 and at most %g seconds, or null for never", MaxKeepalive)
			}
		}
	}

	if a.has("machine") {
		if c.Machine, err = asString("machine", a.named["machine"]); err != nil {
			return nil, err
		}
		if c.Machine == "" {
			// Not "any machine": no machine is named "", and a job that
			// asked for none could only be destroyed.
			return nil, argErrorf("machine must name a machine (see list_machines), not be empty")
		}
	}
	if a.has("tags") {
		if a.has("machine") {
			return nil, &ArgError{Message: ErrMachineAndTags}
		}
		if c.Tags, err = asStrings("tags", a.named["tags"]); err != nil {
			return nil, err
		}
		if len(c.Tags) > maxTags {
			return nil, argErrorf("tags may hold at most %d tags", maxTags)
		}
		for _, t := range c.Tags {
			if t == "" || len(t) > maxTagName {
				return nil, argErrorf("a tag must be 1 to %d characters, not %q", maxTagName, arbiter.Clip(t, 40))
			}
		}
	} else if !a.has("machine") {
		c.Tags = []string{"default"}
	}

	if a.has("min_ratio") {
		if r.MinRatio, err = asFloat("min_ratio", a.named["min_ratio"]); err != nil {
			return nil, err
		}
	}
	for _, p := range []struct {
		name string
		dst  **int
	}{{"max_dead_boards", &r.MaxDeadBoards}, {"max_dead_links", &r.MaxDeadLinks}} {
		if a.has(p.name) {
			n, err := asSmallInt(p.name, a.named[p.name])
			if err != nil {
				return nil, err
			}
			*p.dst = &n
		}
	}
	if a.has("require_torus") {
		if r.RequireTorus, err = asBool("require_torus", a.named["require_torus"]); err != nil {
			return nil, err
		}
	}
	if err := r.Validate(); err != nil {
		return nil, &ArgError{Message: arbiter.ErrorMessage(err)}
	}

	// Echo the kwargs as sent, but for owner and keepalive.
	var kw bytes.Buffer
	kw.WriteByte('{')
	n := 0
	for _, k := range a.given {
		if k == "owner" || k == "keepalive" {
			continue
		}
		if n > 0 {
			kw.WriteByte(',')
		}
		n++
		kw.Write(appendString(nil, k))
		kw.WriteByte(':')
		if err := json.Compact(&kw, a.raw[k]); err != nil {
			return nil, argErrorf("%s is not valid JSON", k)
		}
	}
	kw.WriteByte('}')
	r.Kwargs = kw.Bytes()
	c.Request = r
	return c, nil
}

func runCreateJob(s *Session, b Backend, a *bound) ([]byte, error) {
	c, err := parseCreateJob(a, s.peer)
	if err != nil {
		return nil, err
	}
	id, err := b.CreateJob(c)
	if err != nil {
		return nil, err
	}
	return appendInt(s.start(), id), nil
}

func runJobKeepalive(s *Session, b Backend, a *bound) ([]byte, error) {
	id, err := jobID(a)
	if err != nil {
		return nil, err
	}
	if _, err := b.Job(id, true, s.peer); err != nil {
		return nil, err
	}
	return appendNull(s.start()), nil
}

func runGetJobState(s *Session, b Backend, a *bound) ([]byte, error) {
	id, err := jobID(a)
	if err != nil {
		return nil, err
	}
	j, err := b.Job(id, true, s.peer)
	if err != nil {
		return nil, err
	}
	return appendJobState(s.start(), &j), nil
}

func runGetJobMachineInfo(s *Session, b Backend, a *bound) ([]byte, error) {
	id, err := jobID(a)
	if err != nil {
		return nil, err
	}
	j, err := b.Job(id, true, s.peer)
	if err != nil {
		return nil, err
	}
	var m *arbiter.GridMachine
	if j.Placement != nil && (j.State == StatePower || j.State == StateReady) {
		ms, err := b.Machines()
		if err != nil {
			return nil, err
		}
		m = findMachine(ms, j.Machine)
	}
	return appendMachineInfo(s.start(), &j, m), nil
}

func runPowerOn(s *Session, b Backend, a *bound) ([]byte, error)  { return runPower(s, b, a, true) }
func runPowerOff(s *Session, b Backend, a *bound) ([]byte, error) { return runPower(s, b, a, false) }

func runPower(s *Session, b Backend, a *bound, on bool) ([]byte, error) {
	id, err := jobID(a)
	if err != nil {
		return nil, err
	}
	if err := b.PowerJob(id, on, s.peer); err != nil {
		return nil, err
	}
	return appendNull(s.start()), nil
}

func runDestroyJob(s *Session, b Backend, a *bound) ([]byte, error) {
	id, err := jobID(a)
	if err != nil {
		return nil, err
	}
	var reason *string
	if a.has("reason") {
		r, err := asString("reason", a.named["reason"])
		if err != nil {
			return nil, err
		}
		// The reference keeps any text; arbiter keeps text that drives
		// no terminal (a reason is shown by the CLI and the dashboard),
		// so what could is escaped, and a long one is cut between
		// characters.
		r = arbiter.Clip(arbiter.EscapeText(r, false), maxReason)
		reason = &r
	}
	if err := b.DestroyJob(id, reason); err != nil {
		return nil, err
	}
	return appendNull(s.start()), nil
}

// maxReason bounds a kept destroy reason; longer ones are cut.
const maxReason = 1024

func runNotifyJob(s *Session, b Backend, a *bound) ([]byte, error) {
	if !a.has("job_id") {
		s.mu.Lock()
		s.jobs.watchAll()
		s.mu.Unlock()
	} else {
		id, err := jobID(a)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.jobs.watch(id)
		s.mu.Unlock()
	}
	return appendNull(s.start()), nil
}

func runNoNotifyJob(s *Session, b Backend, a *bound) ([]byte, error) {
	if !a.has("job_id") {
		s.mu.Lock()
		s.jobs.stop()
		s.mu.Unlock()
	} else {
		id, err := jobID(a)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.jobs.unwatch(id)
		s.mu.Unlock()
	}
	return appendNull(s.start()), nil
}

func runNotifyMachine(s *Session, b Backend, a *bound) ([]byte, error) {
	if !a.has("machine_name") {
		s.mu.Lock()
		s.machines.watchAll()
		s.mu.Unlock()
	} else {
		name, err := asString("machine_name", a.named["machine_name"])
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.machines.watch(name)
		s.mu.Unlock()
	}
	return appendNull(s.start()), nil
}

func runNoNotifyMachine(s *Session, b Backend, a *bound) ([]byte, error) {
	if !a.has("machine_name") {
		s.mu.Lock()
		s.machines.stop()
		s.mu.Unlock()
	} else {
		name, err := asString("machine_name", a.named["machine_name"])
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.machines.unwatch(name)
		s.mu.Unlock()
	}
	return appendNull(s.start()), nil
}

func runListJobs(s *Session, b Backend, a *bound) ([]byte, error) {
	jobs, err := b.ListJobs()
	if err != nil {
		return nil, err
	}
	out := append(s.start(), '[')
	for i := range jobs {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = appendJobEntry(out, &jobs[i])
	}
	return append(out, ']'), nil
}

func runListMachines(s *Session, b Backend, a *bound) ([]byte, error) {
	ms, err := b.Machines()
	if err != nil {
		return nil, err
	}
	out := append(s.start(), '[')
	for i, m := range ms {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = appendMachineEntry(out, m)
	}
	return append(out, ']'), nil
}

// boardArgs reads machine_name, x, y, z.
func boardArgs(a *bound) (string, [3]int, error) {
	var xyz [3]int
	name, err := asString("machine_name", a.named["machine_name"])
	if err != nil {
		return "", xyz, err
	}
	for i, p := range []string{"x", "y", "z"} {
		if xyz[i], err = asSmallInt(p, a.named[p]); err != nil {
			return "", xyz, err
		}
	}
	return name, xyz, nil
}

func runGetBoardPosition(s *Session, b Backend, a *bound) ([]byte, error) {
	name, xyz, err := boardArgs(a)
	if err != nil {
		return nil, err
	}
	ms, err := b.Machines()
	if err != nil {
		return nil, err
	}
	out := s.start()
	if m := findMachine(ms, name); m != nil {
		if bi, ok := m.Info(arbiter.Board{X: xyz[0], Y: xyz[1], Z: xyz[2]}); ok {
			return appendInts(out, bi.Location.Cabinet, bi.Location.Frame, bi.Location.Board), nil
		}
	}
	return appendNull(out), nil
}

func runGetBoardAtPosition(s *Session, b Backend, a *bound) ([]byte, error) {
	name, cfb, err := boardArgs(a)
	if err != nil {
		return nil, err
	}
	ms, err := b.Machines()
	if err != nil {
		return nil, err
	}
	out := s.start()
	if m := findMachine(ms, name); m != nil {
		if bd, ok := m.At(arbiter.BoardLocation{Cabinet: cfb[0], Frame: cfb[1], Board: cfb[2]}); ok {
			return appendInts(out, bd.X, bd.Y, bd.Z), nil
		}
	}
	return appendNull(out), nil
}

func findMachine(ms []*arbiter.GridMachine, name string) *arbiter.GridMachine {
	for _, m := range ms {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// whereIsForms are the key sets where_is accepts (docs/reference/spalloc.md §2).
var whereIsForms = [][]string{
	{"machine", "x", "y", "z"},
	{"board", "cabinet", "frame", "machine"},
	{"chip_x", "chip_y", "machine"},
	{"chip_x", "chip_y", "job_id"},
}

func runWhereIs(s *Session, b Backend, a *bound) ([]byte, error) {
	// Every key sent counts, null or not, as the reference's set(kwargs):
	// a null one of a form then fails as missing, below.
	keys := a.given
	form := -1
	for i, f := range whereIsForms {
		sorted := slices.Clone(f)
		sort.Strings(sorted)
		if slices.Equal(keys, sorted) {
			form = i
		}
	}
	if form < 0 {
		shown := make([]string, len(keys))
		for i, k := range keys {
			shown[i] = arbiter.Clip(k, 40)
		}
		return nil, argErrorf("Invalid arguments: %s", strings.Join(shown, ", "))
	}
	ints := map[string]int{}
	for _, k := range keys {
		if k == "machine" {
			continue
		}
		n, err := asSmallInt(k, a.named[k])
		if err != nil {
			return nil, err
		}
		ints[k] = n
	}
	var name string
	if form != 3 {
		var err error
		if name, err = asString("machine", a.named["machine"]); err != nil {
			return nil, err
		}
	}
	w, err := whereIs(b, form, name, ints)
	if err != nil {
		return nil, err
	}
	out := s.start()
	if w == nil {
		return appendNull(out), nil
	}
	return appendWhereIs(out, w), nil
}

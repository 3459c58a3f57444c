package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

// Attribution (docs/reference/gpu-truth.md): a process belongs to allocation N when
// it, or an ancestor, has ARBITER_ALLOCATION_ID=N in its environment.
// ProcReader reads that, with the process's user and command line, from
// /proc. A process it may not look into (another user's environment) or
// that has gone is unattributed, never an error.

// AllocationEnv is the environment variable that ties a process to its
// allocation; `arbiter alloc -- CMD` and the agent's task runner set it.
const AllocationEnv = "ARBITER_ALLOCATION_ID"

// maxAncestors bounds the walk up the process tree.
const maxAncestors = 64

// maxCommand bounds a command line as reported (arbiter.MaxGPUCommand).
const maxCommand = 256

// ProcInfo is what the agent knows of a process on a GPU.
type ProcInfo struct {
	PID     int
	User    string // "" when unknown
	Command string // its command line, clipped; "" when unreadable
	// Allocation is the allocation it belongs to, 0 when unattributed.
	Allocation int64
	// Start is when it started (clock ticks since boot, /proc/PID/stat),
	// "" when unknown: with the pid, it names this process and not a
	// later one given the same pid.
	Start string
}

// ProcReader reads processes from a proc file system. It caches what it
// learnt of each process by its start time, so a process sampled again
// costs one small read. It is not safe for concurrent use.
type ProcReader struct {
	root  string
	cache map[int]procEntry
	users map[string]string // uid → name
	seen  map[int]bool      // pids looked at since the last Prune
}

type procEntry struct {
	start string // field 22 of stat: the process's start time
	comm  string // its command name, which exec changes (the start time stays)
	info  ProcInfo
}

// NewProcReader reads from root ("" means /proc).
func NewProcReader(root string) *ProcReader {
	if root == "" {
		root = "/proc"
	}
	return &ProcReader{root: root, cache: map[int]procEntry{}, users: map[string]string{}, seen: map[int]bool{}}
}

// Info returns what is known of pid. A process that is gone, or whose
// details cannot be read, comes back with only its pid.
func (r *ProcReader) Info(pid int) ProcInfo {
	r.seen[pid] = true
	st, err := r.stat(pid)
	if err != nil {
		delete(r.cache, pid)
		return ProcInfo{PID: pid}
	}
	if e, ok := r.cache[pid]; ok && e.start == st.start && e.comm == st.comm {
		return e.info
	}
	info := ProcInfo{PID: pid, User: r.user(pid), Command: r.command(pid), Start: st.start}
	info.Allocation = r.attribute(pid, st.ppid)
	// No command line: a process in the middle of an exec (its new
	// name is set before its new arguments and environment are), a
	// zombie or a kernel thread. Read it again next time.
	if info.Command != "" {
		r.cache[pid] = procEntry{start: st.start, comm: st.comm, info: info}
	}
	return info
}

// Prune forgets the processes not looked at since the last Prune.
func (r *ProcReader) Prune() {
	for pid := range r.cache {
		if !r.seen[pid] {
			delete(r.cache, pid)
		}
	}
	clear(r.seen)
}

// Identity returns when pid started ("" when it is gone or cannot be
// read) and the allocation it belongs to now (0 when none): read afresh,
// to check an order to stop it just before acting on it.
func (r *ProcReader) Identity(pid int) (start string, allocation int64) {
	st, err := r.stat(pid)
	if err != nil {
		return "", 0
	}
	return st.start, r.attribute(pid, st.ppid)
}

// StartOf returns when pid started, read afresh ("" when it is gone or
// cannot be read): to tell, just before signalling it, whether pid is
// still the process seen.
func (r *ProcReader) StartOf(pid int) string {
	st, err := r.stat(pid)
	if err != nil {
		return ""
	}
	return st.start
}

// attribute walks from pid up its ancestors for AllocationEnv.
func (r *ProcReader) attribute(pid, ppid int) int64 {
	for depth := 0; depth < maxAncestors && pid > 1; depth++ {
		if b, err := os.ReadFile(filepath.Join(r.root, strconv.Itoa(pid), "environ")); err == nil {
			if id, ok := AllocationFromEnviron(b); ok {
				return id
			}
		}
		pid = ppid
		if pid <= 1 {
			break
		}
		st, err := r.stat(pid)
		if err != nil {
			break
		}
		ppid = st.ppid
	}
	return 0
}

type procStat struct {
	ppid        int
	start, comm string
}

func (r *ProcReader) stat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(r.root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// A process that execs keeps its pid and start time but not its
	// command (nor, often, its environment): the command name tells the
	// cache apart from what the process was before, e.g. a shell that
	// had not exec'd its job yet when first seen.
	comm, ppid, start, err := ParseStat(b)
	return procStat{ppid: ppid, start: start, comm: comm}, err
}

// ParseStat reads the command name, the parent pid and the start time
// from /proc/PID/stat: "PID (COMM) STATE PPID … STARTTIME …", where COMM
// may hold spaces and parentheses (it ends at the last ')').
func ParseStat(b []byte) (comm string, ppid int, start string, err error) {
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "", 0, "", errors.New("stat: no command")
	}
	f := strings.Fields(string(b[j+1:]))
	// After COMM: state(3) ppid(4) … starttime(22), i.e. f[0] … f[19].
	if len(f) < 20 {
		return "", 0, "", errors.New("stat: too few fields")
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil || ppid < 0 {
		return "", 0, "", errors.New("stat: bad ppid")
	}
	if !isDigits(f[19]) {
		return "", 0, "", errors.New("stat: bad start time")
	}
	return string(b[i+1 : j]), ppid, f[19], nil
}

// AllocationFromEnviron finds AllocationEnv in a NUL-separated environment
// (/proc/PID/environ). ok is false without it or with a value that is not
// a positive allocation id.
func AllocationFromEnviron(b []byte) (int64, bool) {
	prefix := []byte(AllocationEnv + "=")
	for len(b) > 0 {
		var kv []byte
		if i := bytes.IndexByte(b, 0); i >= 0 {
			kv, b = b[:i], b[i+1:]
		} else {
			kv, b = b, nil
		}
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			id, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || id <= 0 {
				return 0, false
			}
			return id, true
		}
	}
	return 0, false
}

// user names the real user of pid, from the Uid line of its status.
func (r *ProcReader) user(pid int) string {
	b, err := os.ReadFile(filepath.Join(r.root, strconv.Itoa(pid), "status"))
	if err != nil {
		return ""
	}
	uid, ok := ParseStatusUID(b)
	if !ok {
		return ""
	}
	if name, ok := r.users[uid]; ok {
		return name
	}
	name := uid
	if u, err := user.LookupId(uid); err == nil && u.Username != "" {
		name = u.Username
	}
	name = reportedUser(name)
	if len(r.users) > 4096 {
		clear(r.users)
	}
	r.users[uid] = name
	return name
}

// ParseStatusUID reads the real uid from /proc/PID/status ("Uid:\t1000\t…").
func ParseStatusUID(b []byte) (string, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 || !isDigits(f[0]) || len(f[0]) > 10 {
			return "", false
		}
		return f[0], true
	}
	return "", false
}

// command reads pid's command line, arguments joined by spaces.
func (r *ProcReader) command(pid int) string {
	b, err := os.ReadFile(filepath.Join(r.root, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return ""
	}
	return CommandLine(b)
}

// CommandLine turns a NUL-separated /proc/PID/cmdline into one line of at
// most 256 bytes of valid UTF-8.
func CommandLine(b []byte) string {
	b = bytes.TrimRight(b, "\x00")
	s := strings.ReplaceAll(string(b), "\x00", " ")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	// What else could drive a terminal or reorder the line (C1 controls,
	// direction overrides) is escaped: the server takes only text that
	// passes the text rule (arbiter.ValidateText).
	s = arbiter.EscapeText(s, false)
	if len(s) > maxCommand {
		cut := maxCommand - len("…")
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// hostPIDNamespace is the inode of Linux's initial PID namespace
// (PROC_PID_INIT_INO), the same on every Linux since 3.8.
const hostPIDNamespace = "pid:[4026531836]"

// ErrUnknownPIDNamespace is what ForeignPIDNamespace returns where the
// process's PID namespace cannot be read (no /proc, or not Linux).
var ErrUnknownPIDNamespace = errors.New("the PID namespace cannot be read")

// ForeignPIDNamespace reports whether this process runs in a PID
// namespace other than the host's (a container without --pid=host), as
// the proc file system at root ("" means /proc) shows it. There the pids
// the driver reports can name other processes than the ones this
// namespace's /proc shows under the same numbers, so neither attribution
// nor a kill by pid can be trusted. It returns ErrUnknownPIDNamespace
// (wrapped) when it cannot tell.
func ForeignPIDNamespace(root string) (bool, error) {
	if root == "" {
		root = "/proc"
	}
	ns, err := os.Readlink(filepath.Join(root, "self", "ns", "pid"))
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrUnknownPIDNamespace, err)
	}
	return ns != hostPIDNamespace, nil
}

// reportedUser is a user name as the server takes it (arbiter.GPUProcess:
// text, at most 64 bytes): escaped, and clipped on a character's edge.
func reportedUser(name string) string {
	name = arbiter.EscapeText(name, false)
	if len(name) > 64 {
		name = arbiter.Clip(name, 64-len("…"))
	}
	return name
}

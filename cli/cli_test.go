package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	osuser "os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
)

// oneJSONDocument fails unless s is exactly one JSON document.
func oneJSONDocument(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, s)
	}
	if err := dec.Decode(new(any)); err != io.EOF {
		t.Fatalf("got more than one JSON document (%v):\n%s", err, s)
	}
	return v
}

func TestCLIJSONIsOneDocument(t *testing.T) {
	f := newFakeArbiter(t)
	// Allocation 1 is held for keepalive and release below.
	if code, _, stderr := runCLI(t, f.srv.URL, "alloc", "-o", "json"); code != 0 {
		t.Fatalf("alloc: exit %d: %s", code, stderr)
	}
	tests := []struct {
		name string
		args []string
		kind string // "list" or "object"
	}{
		{"status", []string{"status", "-o", "json"}, "list"},
		{"ps", []string{"ps", "-o", "json"}, "list"},
		{"ps-all", []string{"ps", "--all", "-o", "json", "--owner", "nobody"}, "list"},
		{"alloc-no-wait", []string{"alloc", "--no-wait", "-o", "json"}, "object"},
		{"keepalive", []string{"keepalive", "1", "-o", "json"}, "object"},
		{"release", []string{"release", "-o", "json", "1", "--reason", "done"}, "object"},
		{"drain", []string{"drain", "gpu1", "-o", "json"}, "object"},
		{"undrain", []string{"undrain", "-o", "json", "gpu1"}, "object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, f.srv.URL, tt.args...)
			if code != 0 {
				t.Fatalf("got exit %d, want 0; stderr: %s", code, stderr)
			}
			v := oneJSONDocument(t, stdout)
			switch v.(type) {
			case []any:
				if tt.kind != "list" {
					t.Errorf("got a list, want an object")
				}
			case map[string]any:
				if tt.kind != "object" {
					t.Errorf("got an object, want a list")
				}
			default:
				t.Errorf("got %T, want a %s", v, tt.kind)
			}
		})
	}
}

func TestCLIUsageErrors(t *testing.T) {
	f := newFakeArbiter(t)
	tests := []struct {
		name string
		args []string
	}{
		{"unknown-flag", []string{"status", "--bogus"}},
		{"extra-arg", []string{"status", "now"}},
		{"bad-output", []string{"status", "-o", "yaml"}},
		{"bad-url", []string{"status", "--url", "localhost:7070"}},
		{"bad-state", []string{"ps", "--state", "running"}},
		{"zero-gpus", []string{"alloc", "--gpus", "0"}},
		{"bad-keepalive", []string{"alloc", "--keepalive", "soon"}},
		{"short-keepalive", []string{"alloc", "--keepalive", "0.1"}},
		{"no-wait-cmd", []string{"alloc", "--no-wait", "--", "true"}},
		{"release-no-id", []string{"release"}},
		{"release-bad-id", []string{"release", "abc"}},
		{"keepalive-two-ids", []string{"keepalive", "1", "2"}},
		{"drain-no-name", []string{"drain"}},
		{"drain-bad-name", []string{"drain", "../etc"}},
		{"events-bad-since", []string{"events", "--since", "-5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, f.srv.URL, tt.args...)
			if code != 2 {
				t.Errorf("got exit %d, want 2; stderr: %s", code, stderr)
			}
			if stdout != "" {
				t.Errorf("got stdout %q, want nothing", stdout)
			}
			if !strings.Contains(stderr, "arbiter "+tt.args[0]) {
				t.Errorf("got stderr %q, want it to name the command", stderr)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) != 0 {
		t.Errorf("got %d allocations sent, want none for usage errors", len(f.requests))
	}
}

func TestCLIHelpExitsZero(t *testing.T) {
	for _, cmd := range []string{"status", "ps", "alloc", "keepalive", "release", "drain", "undrain", "events"} {
		code, _, stderr := runCLI(t, "http://127.0.0.1:1", cmd, "-h")
		if code != 0 || !strings.Contains(stderr, "usage: arbiter "+cmd) {
			t.Errorf("%s -h: got exit %d and %q, want 0 and the usage", cmd, code, stderr)
		}
		if strings.Contains(stderr, "ARBITER_TOKEN=") {
			t.Errorf("%s -h leaks a token default", cmd)
		}
	}
}

func TestCLIShowsServerMessage(t *testing.T) {
	f := newFakeArbiter(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"release", []string{"release", "999"}, "allocation 999 does not exist"},
		{"keepalive", []string{"keepalive", "-o", "json", "999"}, "allocation 999 does not exist"},
		{"drain", []string{"drain", "gpu9"}, `machine "gpu9" does not exist`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, f.srv.URL, tt.args...)
			if code != 1 || stdout != "" {
				t.Errorf("got exit %d and stdout %q, want 1 and nothing", code, stdout)
			}
			if want := "arbiter " + tt.args[0] + ": " + tt.want; !strings.Contains(stderr, want) {
				t.Errorf("got stderr %q, want %q", stderr, want)
			}
		})
	}
}

func TestCLIUnreachable(t *testing.T) {
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close()
	code, _, stderr := runCLI(t, url, "status")
	if code != 1 || !strings.Contains(stderr, "cannot reach arbiter at "+url) {
		t.Errorf("got exit %d and %q, want 1 and a cannot-reach message", code, stderr)
	}
}

func TestCLIURLAndTokenFromEnv(t *testing.T) {
	f := newFakeArbiter(t)
	env, stdout, _ := testEnv(f.srv.URL)
	if code := run(context.Background(), env, []string{"status"}); code != 0 {
		t.Fatalf("got exit %d, want 0", code)
	}
	if !strings.Contains(stdout.String(), "gpu1") {
		t.Errorf("got %q, want the machine from $ARBITER_URL", stdout.String())
	}
	// --url overrides the environment.
	code, _, stderr := runCLI(t, f.srv.URL, "status", "--url", "http://127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("got exit %d and %q, want the flag's URL to be used", code, stderr)
	}
}

func TestCLIStatusTable(t *testing.T) {
	f := newFakeArbiter(t)
	runCLI(t, f.srv.URL, "alloc", "--owner", "alice")
	code, stdout, stderr := runCLI(t, f.srv.URL, "status")
	if code != 0 {
		t.Fatalf("got exit %d: %s", code, stderr)
	}
	for _, want := range []string{"gpu1", "up", "default,h100", "1/2", "3m ago", "NVIDIA H100 80GB HBM3", "80GiB", "alice"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("got:\n%s\nwant it to contain %q", stdout, want)
		}
	}
}

func TestCLIPsFilters(t *testing.T) {
	f := newFakeArbiter(t)
	runCLI(t, f.srv.URL, "alloc", "--owner", "alice")
	// An id cut out of another command's output, spaces and all.
	if code, _, stderr := runCLI(t, f.srv.URL, "release", " 1\n"); code != 0 {
		t.Fatalf("release: exit %d: %s", code, stderr)
	}
	runCLI(t, f.srv.URL, "alloc", "--owner", "bob", "--keepalive", "5m")
	tests := []struct {
		name  string
		args  []string
		query string
		has   []string
		not   []string
	}{
		{"live", nil, "state=live", []string{"bob", "ready", "0", "5m, expires in"}, []string{"alice"}},
		{"all", []string{"--all"}, "", []string{"alice", "destroyed", "released by tester@", "bob"}, nil},
		{"owner", []string{"--all", "--owner", "alice", "--machine", "gpu1"}, "machine=gpu1&owner=alice", []string{"alice", "never"}, []string{"bob"}},
		{"state", []string{"--state", "queued"}, "state=queued", []string{"no allocations"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, f.srv.URL, append([]string{"ps"}, tt.args...)...)
			if code != 0 {
				t.Fatalf("got exit %d: %s", code, stderr)
			}
			f.mu.Lock()
			q := f.lastQuery
			f.mu.Unlock()
			if q != tt.query {
				t.Errorf("got query %q, want %q", q, tt.query)
			}
			for _, s := range tt.has {
				if !strings.Contains(stdout, s) {
					t.Errorf("got:\n%s\nwant %q", stdout, s)
				}
			}
			for _, s := range tt.not {
				if strings.Contains(stdout, s) {
					t.Errorf("got:\n%s\nwant no %q", stdout, s)
				}
			}
		})
	}
}

// An allocation with a time limit says when it ends, not "held until
// released".
func TestCLIAllocSaysWhenItEnds(t *testing.T) {
	f := newFakeArbiter(t)
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "1", "--time-limit", "5", "--keepalive", "never", "--no-wait")
	if code != 0 {
		t.Fatalf("got exit %d: %s", code, stderr)
	}
	for _, want := range []string{"allocation 1 is held until ", "(time limit reached; arbiter extend 1 --by DURATION) unless released first"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("got stderr %q, want %q", stderr, want)
		}
	}
}

func TestCLIAllocHeldWithoutCommand(t *testing.T) {
	f := newFakeArbiter(t)
	f.queueAll, f.readyOnPoll = true, true
	code, stdout, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "2", "--tag", "h100", "--tag", "default", "-o", "json")
	if code != 0 {
		t.Fatalf("got exit %d: %s", code, stderr)
	}
	var a arbiter.Allocation
	if err := json.Unmarshal([]byte(stdout), &a); err != nil {
		t.Fatal(err)
	}
	if a.State != arbiter.StateReady || len(a.Devices) != 2 {
		t.Errorf("got %s with %d devices, want ready with 2", a.State, len(a.Devices))
	}
	for _, want := range []string{"is queued", "arbiter release 1", "CUDA_VISIBLE_DEVICES=0,1"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("got stderr %q, want %q", stderr, want)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.requests[0]
	if r.KeepaliveS != nil || r.Owner == "" || !strings.HasPrefix(r.Owner, "tester@") || strings.Join(r.Tags, ",") != "h100,default" {
		t.Errorf("got request %+v, want keepalive null, owner tester@host, both tags", r)
	}
}

func TestCLIAllocImpossible(t *testing.T) {
	f := newFakeArbiter(t)
	code, stdout, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "16", "-o", "json")
	if code != 1 || stdout != "" {
		t.Errorf("got exit %d and stdout %q, want 1 and nothing", code, stdout)
	}
	if !strings.Contains(stderr, "no machine has 16 GPUs") {
		t.Errorf("got %q, want the server's reason", stderr)
	}
}

func TestCLIAllocTimeoutReleases(t *testing.T) {
	f := newFakeArbiter(t)
	f.queueAll = true
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--timeout", "100ms")
	if code != 1 || !strings.Contains(stderr, "timed out after 100ms") || !strings.Contains(stderr, "released it") {
		t.Errorf("got exit %d and %q, want 1 and a timeout that released it", code, stderr)
	}
	if a := f.alloc(1); a.State != arbiter.StateDestroyed || *a.Reason != "gave up waiting after 100ms" {
		t.Errorf("got %s (%v), want it released for giving up", a.State, a.Reason)
	}
}

func TestCLIAllocRunsCommand(t *testing.T) {
	f := newFakeArbiter(t)
	out := filepath.Join(t.TempDir(), "out")
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "2", "--",
		"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES $ARBITER_ALLOCATION_ID" > "$0"; exit 3`, out)
	if code != 3 {
		t.Fatalf("got exit %d, want the command's 3; stderr: %s", code, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "0,1 1" {
		t.Errorf("got env %q, want %q", got, "0,1 1")
	}
	a := f.alloc(1)
	if a.State != arbiter.StateDestroyed || *a.Reason != "command exited with status 3" {
		t.Errorf("got %s (%v), want released with the command's status", a.State, a.Reason)
	}
	if ka := a.Request.KeepaliveS; ka == nil || *ka != 60 {
		t.Errorf("got keepalive %v, want 60 with a command", ka)
	}
}

func TestCLIAllocCommandSuccess(t *testing.T) {
	f := newFakeArbiter(t)
	code, stdout, stderr := runCLI(t, f.srv.URL, "alloc", "--", "sh", "-c", "echo hi")
	if code != 0 || stdout != "hi\n" {
		t.Errorf("got exit %d and %q, want 0 and the command's output; stderr: %s", code, stdout, stderr)
	}
	if a := f.alloc(1); *a.Reason != "command exited with status 0" {
		t.Errorf("got reason %v, want status 0", *a.Reason)
	}
}

func TestCLIAllocCommandNotFound(t *testing.T) {
	f := newFakeArbiter(t)
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--", "/nonexistent/arbiter-test-cmd")
	if code != 1 || !strings.Contains(stderr, "cannot run /nonexistent/arbiter-test-cmd") {
		t.Errorf("got exit %d and %q, want 1 and cannot run", code, stderr)
	}
	if a := f.alloc(1); a.State != arbiter.StateDestroyed {
		t.Errorf("got %s, want released", a.State)
	}
}

// TestCLIAllocLostStopsCommand: an allocation lost under the command stops
// it and what it started (its process group, even a child that ignores
// SIGTERM), says so, and exits with the command's status.
func TestCLIAllocLostStopsCommand(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("process groups")
	}
	f := newFakeArbiter(t)
	f.loseOnKeepalive = true
	env, _, stderr := testEnv(f.srv.URL)
	ac := &allocCmd{env: env, notify: func(chan<- os.Signal) {}, stop: func(chan<- os.Signal) {}, killGrace: 300 * time.Millisecond}
	pidFile := filepath.Join(t.TempDir(), "child")
	err := ac.run(context.Background(), []string{"--keepalive", "1", "--", "sh", "-c",
		"(trap '' TERM; exec sleep 30) & echo $! > " + pidFile + "; wait"})
	var ee ExitError
	if !errors.As(err, &ee) || ee.Code != 143 || !strings.Contains(ee.Msg, "allocation 1 was lost while the command ran (keepalive expired)") {
		t.Errorf("got %v (%q) and %q, want the command's status (143) and the loss explained", err, ee.Msg, stderr)
	}
	b, _ := os.ReadFile(pidFile)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if perr != nil {
		t.Fatalf("no child pid: %q", b)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// Gone, or a zombie about to be reaped by init.
	poll.Until(t, 5*time.Second, "the command's child to be gone", func() bool {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return syscall.Kill(pid, 0) != nil || err == nil && strings.Contains(string(st), ") Z ")
	})
}

func TestCLIAllocForwardsSignals(t *testing.T) {
	f := newFakeArbiter(t)
	env, _, stderr := testEnv(f.srv.URL)
	sigs := make(chan chan<- os.Signal, 1)
	ac := &allocCmd{
		env:       env,
		notify:    func(c chan<- os.Signal) { sigs <- c },
		stop:      func(chan<- os.Signal) {},
		killGrace: 5 * time.Second,
	}
	started := filepath.Join(t.TempDir(), "started")
	done := make(chan error, 1)
	go func() {
		done <- ac.run(context.Background(), []string{"--", "sh", "-c",
			`trap 'exit 42' TERM; touch "$0"; while :; do sleep 0.05; done`, started})
	}()
	var c chan<- os.Signal
	select {
	case c = <-sigs:
	case err := <-done:
		t.Fatalf("alloc ended early: %v; stderr: %s", err, stderr)
	}
	// Wait (with a deadline) until the shell has set its trap.
	poll.Until(t, 10*time.Second, "the command to start", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	c <- syscall.SIGTERM
	err := <-done
	var ee ExitError
	if !errors.As(err, &ee) || ee.Code != 42 {
		t.Fatalf("got %v, want exit status 42", err)
	}
	if a := f.alloc(1); *a.Reason != "command exited with status 42" {
		t.Errorf("got reason %q, want status 42", *a.Reason)
	}
}

func TestCLIEventsStreams(t *testing.T) {
	f := newFakeArbiter(t)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, line string)
	}{
		{"json", []string{"events", "-o", "json", "--since", "10"}, func(t *testing.T, line string) {
			var ev arbiter.Event
			if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Seq < 11 || ev.Kind != arbiter.EventAllocationReady {
				t.Errorf("got line %q (%v), want an event after 10", line, err)
			}
		}},
		{"table", []string{"events"}, func(t *testing.T, line string) {
			for _, want := range []string{"allocation.ready", "allocation/", "alice · gpu1: 1"} {
				if !strings.Contains(line, want) {
					t.Errorf("got line %q, want %q", line, want)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, stdout, stderr := testEnv(f.srv.URL)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() { done <- run(ctx, env, tt.args) }()
			err := poll.Try(10*time.Second, func() error {
				if out := stdout.String(); strings.Count(out, "\n") < 2 {
					return fmt.Errorf("got %q, want two events; stderr: %s", out, stderr.String())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("got exit %d after interrupt, want 0", code)
			}
			for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
				tt.check(t, line)
			}
		})
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		t    time.Time
		want string
	}{
		{"zero", time.Time{}, "-"},
		{"now", now, "just now"},
		{"secs", now.Add(-12 * time.Second), "12s ago"},
		{"mins", now.Add(-3 * time.Minute), "3m ago"},
		{"hours", now.Add(-5 * time.Hour), "5h ago"},
		{"days", now.Add(-72 * time.Hour), "3d ago"},
		{"future", now.Add(40 * time.Second), "in 40s"},
	}
	for _, tt := range tests {
		if got := ago(tt.t, now); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// run runs one command line of the client commands in-process.
func run(ctx context.Context, env *Env, args []string) int {
	return Run(ctx, env, args, Commands("test"))
}

func TestCLIDefaultURL(t *testing.T) {
	cf := &ClientFlags{env: &Env{Getenv: func(string) string { return "" }}, output: outTable}
	if err := cf.Resolve(); err != nil || cf.url != "http://127.0.0.1:7070" || cf.token != "" {
		t.Errorf("no environment: got %q %q (%v), want http://127.0.0.1:7070 and no token", cf.url, cf.token, err)
	}
}

// TestCLITokenFromEnv: every client command sends $ARBITER_TOKEN as a bearer
// token; --token overrides it.
func TestCLITokenFromEnv(t *testing.T) {
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		fakeJSON(w, http.StatusOK, map[string]any{"machines": []any{}, "pools": []any{}, "allocations": []any{}})
	}))
	defer srv.Close()
	vars := map[string]string{"ARBITER_URL": srv.URL, "ARBITER_TOKEN": "env-secret"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"status"}, "Bearer env-secret"},
		{[]string{"ps", "-o", "json"}, "Bearer env-secret"},
		{[]string{"pools", "-o", "json"}, "Bearer env-secret"},
		{[]string{"status", "--token", "flag-secret"}, "Bearer flag-secret"},
	} {
		var stdout, stderr bytes.Buffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return vars[k] }}
		if code := run(context.Background(), env, tt.args); code != 0 {
			t.Fatalf("%v: exit %d: %s", tt.args, code, stderr.String())
		}
		mu.Lock()
		got := auth[len(auth)-1]
		mu.Unlock()
		if got != tt.want {
			t.Errorf("%v: got Authorization %q, want %q", tt.args, got, tt.want)
		}
		if len(tt.args) > 1 && tt.args[1] == "-o" {
			oneJSONDocument(t, stdout.String())
		}
	}
}

// TestCLILockTTLMustBePositive: a --ttl of 0 or less is a usage error
// (exit 2), not a silent default.
func TestCLILockTTLMustBePositive(t *testing.T) {
	f := newFakeArbiter(t)
	for _, ttl := range []string{"-5", "0", "0s"} {
		if code, _, stderr := runCLI(t, f.srv.URL, "lock", "extend", "L", "--ttl", ttl); code != 2 || !strings.Contains(stderr, "want more than 0") {
			t.Errorf("--ttl %s: exit %d, %q", ttl, code, stderr)
		}
	}
}

// TestDefaultOwnerWithoutUSER: under cron, systemd or docker exec, with
// neither $USER nor $LOGNAME, the owner is the account the process runs
// as, not "unknown".
func TestDefaultOwnerWithoutUSER(t *testing.T) {
	u, err := osuser.Current()
	if err != nil || u.Username == "" {
		t.Skipf("no account to compare with: %v", err)
	}
	got := defaultOwner(&Env{Getenv: func(string) string { return "" }})
	if !strings.HasPrefix(got, u.Username+"@") && got != u.Username {
		t.Fatalf("owner without $USER: %q, want %s@host", got, u.Username)
	}
	if got := defaultOwner(&Env{Getenv: func(k string) string { return map[string]string{"USER": "ann"}[k] }}); !strings.HasPrefix(got, "ann") {
		t.Fatalf("owner with $USER=ann: %q", got)
	}
}

// TestCLIAllocEndedUnderACommandThatFinished: an allocation that ended
// while its command ran (a time limit), the command then exiting on its
// own before anything stopped it, is not reported as stopped.
func TestCLIAllocEndedUnderACommandThatFinished(t *testing.T) {
	f := newFakeArbiter(t)
	// The command runs until the allocation has ended, then exits on its
	// own: with a fixed sleep, a busy machine could let it finish before
	// the allocation ended, or the allocation end after a bounded wait.
	ended := filepath.Join(t.TempDir(), "ended")
	go func() {
		defer os.WriteFile(ended, nil, 0o600)
		poll.Try(30*time.Second, func() error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if a := f.allocs[1]; a != nil && a.State == arbiter.StateReady {
				f.destroy(a, "time limit (3s) reached")
				return nil
			}
			return errors.New("not ready yet")
		})
	}()
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--", "sh", "-c", "until [ -e "+ended+" ]; do sleep 0.01; done")
	if code != 0 || !strings.Contains(stderr, "time limit (3s) reached") || !strings.Contains(stderr, "the command exited with status 0") || strings.Contains(stderr, "stopped") {
		t.Fatalf("exit %d, stderr %q: want 0 and the command said to have exited on its own", code, stderr)
	}
}

// Duration flags take seconds as well as Go durations, as --ttl does, and
// say what they want otherwise.
func TestCLIDurationFlagsTakeSeconds(t *testing.T) {
	f := newFakeArbiter(t)
	if code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "1", "--timeout", "5", "--keepalive", "never"); code != 0 {
		t.Fatalf("--timeout 5: exit %d: %s", code, stderr)
	}
	code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "1", "--timeout", "5 min")
	if code != 2 || !strings.Contains(stderr, `invalid value "5 min" for flag -timeout: want a duration such as 15m or a number of seconds`) {
		t.Fatalf("--timeout '5 min': exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "1", "--timeout", "-5"); code != 2 || !strings.Contains(stderr, "want 0 or more") {
		t.Fatalf("--timeout -5: exit %d: %s", code, stderr)
	}
}

// Releasing an allocation that had ended says so, with how it ended.
func TestCLIReleaseOfAnEndedAllocation(t *testing.T) {
	f := newFakeArbiter(t)
	if code, _, stderr := runCLI(t, f.srv.URL, "alloc", "--gpus", "1", "--keepalive", "never"); code != 0 {
		t.Fatalf("alloc: exit %d: %s", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, f.srv.URL, "release", "1", "--reason", "done"); code != 0 || stdout != "allocation 1 released (done)\n" {
		t.Fatalf("release: exit %d: %q %s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, f.srv.URL, "release", "1"); code != 0 || stdout != "allocation 1 had already ended (done)\n" {
		t.Fatalf("release again: exit %d: %q %s", code, stdout, stderr)
	}
}

// A malformed URL is blamed on where it came from.
func TestCLIURLFromTheEnvironment(t *testing.T) {
	code, _, stderr := runCLI(t, "127.0.0.1:7070", "status")
	if code != 2 || !strings.Contains(stderr, `ARBITER_URL "127.0.0.1:7070" is not an http://`) {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, _, stderr = runCLI(t, "", "status", "--url", "127.0.0.1:7070")
	if code != 2 || !strings.Contains(stderr, `--url "127.0.0.1:7070" is not an http://`) {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

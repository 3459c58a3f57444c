package agent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// fakeSwapServer records what the runner sends.
type fakeSwapServer struct {
	mu     sync.Mutex
	lines  []string
	result *client.SwapResult
	done   chan struct{}
}

func (f *fakeSwapServer) ClaimSwap(context.Context, string, time.Duration) (*arbiter.Swap, error) {
	return nil, nil
}

func (f *fakeSwapServer) AppendSwapLog(_ context.Context, _, machine string, lines []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, lines...)
	return nil
}

func (f *fakeSwapServer) FinishSwap(_ context.Context, id string, r client.SwapResult) (arbiter.Swap, error) {
	f.mu.Lock()
	f.result = &r
	f.mu.Unlock()
	close(f.done)
	return arbiter.Swap{ID: id}, nil
}

func (f *fakeSwapServer) log() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.lines, "\n")
}

// fakeVLLM serves GET /v1/models listing the model named in file.
func fakeVLLM(t *testing.T, file string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		b, _ := os.ReadFile(file)
		json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]any{{"id": strings.TrimSpace(string(b)), "object": "model"}}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "swap.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func runSwapT(t *testing.T, sw *arbiter.Swap, ctx context.Context) (*fakeSwapServer, client.SwapResult) {
	t.Helper()
	f := &fakeSwapServer{done: make(chan struct{})}
	r := &swapRunner{srv: f, machine: "gpu1", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		minBackoff: 10 * time.Millisecond, maxBackoff: 50 * time.Millisecond, callTimeout: 5 * time.Second,
		http: probeClient(time.Second), dir: t.TempDir()}
	r.runSwap(ctx, sw)
	select {
	case <-f.done:
	case <-time.After(30 * time.Second):
		t.Fatal("no FinishSwap")
	}
	return f, *f.result
}

func vllmSwap(cmd []string, endpoint string) *arbiter.Swap {
	return &arbiter.Swap{ID: "7", Service: "vllm", Machine: "gpu1", ModelKey: "gemma", Command: cmd, Kind: arbiter.ServiceVLLM,
		Endpoint: endpoint, ServedNames: []string{"google/gemma-3-27b-it", "gemma"}, ReadyTimeoutS: 5, TimeoutS: 30}
}

func TestSwapRunsCommandAndChecksEndpoint(t *testing.T) {
	dir := t.TempDir()
	served := filepath.Join(dir, "served")
	os.WriteFile(served, []byte("old/model"), 0o644)
	vllm := fakeVLLM(t, served)
	// The script prints, then "restarts" the server with the new model
	// a little later, as a real launch script returns before vLLM is up.
	sh := script(t, `echo "loading $1"; echo "to stderr" >&2; printf 'no newline'; (sleep 0.3; echo "$1" > "$2") &`)
	f, res := runSwapT(t, vllmSwap([]string{sh, "google/gemma-3-27b-it", served}, vllm.URL), context.Background())
	if !res.OK || res.ReturnCode == nil || *res.ReturnCode != 0 || res.Machine != "gpu1" {
		t.Fatalf("result %+v\nlog:\n%s", res, f.log())
	}
	log := f.log()
	for _, want := range []string{"loading google/gemma-3-27b-it", "to stderr", "no newline", "not ready yet: it serves [old/model]", "serves gemma"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestSwapFailures(t *testing.T) {
	dir := t.TempDir()
	served := filepath.Join(dir, "served")
	os.WriteFile(served, []byte("old/model"), 0o644)
	vllm := fakeVLLM(t, served)
	roots := filepath.Join(dir, "models")
	os.MkdirAll(filepath.Join(roots, "ok"), 0o755)
	os.Symlink("/etc", filepath.Join(roots, "escape"))
	cases := []struct {
		name string
		sw   *arbiter.Swap
		want string
	}{
		{"exit 3", vllmSwap([]string{script(t, "echo boom; exit 3")}, vllm.URL), "exited with status 3"},
		{"not found", vllmSwap([]string{filepath.Join(dir, "nope")}, vllm.URL), "cannot start"},
		{"never served", func() *arbiter.Swap {
			s := vllmSwap([]string{"/bin/true"}, vllm.URL)
			s.ReadyTimeoutS = 1
			return s
		}(), "did not serve the model within 1s: it serves [old/model]"},
		{"endpoint down", func() *arbiter.Swap {
			s := vllmSwap([]string{"/bin/true"}, "http://127.0.0.1:1")
			s.ReadyTimeoutS = 1
			return s
		}(), "connection refused"},
		{"missing dir", func() *arbiter.Swap {
			s := vllmSwap([]string{"/bin/true"}, vllm.URL)
			s.LocalPath, s.LocalRoots = filepath.Join(roots, "gone"), []string{roots}
			return s
		}(), "no such file"},
		{"symlink escape", func() *arbiter.Swap {
			s := vllmSwap([]string{"/bin/true"}, vllm.URL)
			s.LocalPath, s.LocalRoots = filepath.Join(roots, "escape"), []string{roots}
			return s
		}(), "outside the allowed roots"},
		{"timeout", func() *arbiter.Swap {
			s := vllmSwap([]string{script(t, "sleep 30")}, vllm.URL)
			s.TimeoutS = 0.3
			return s
		}(), "did not finish within"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, res := runSwapT(t, c.sw, context.Background())
			if res.OK || !strings.Contains(res.Reason, c.want) {
				t.Fatalf("got %+v, want a failure with %q\nlog:\n%s", res, c.want, f.log())
			}
		})
	}
}

// TestSwapArgvNeverAShell passes shell syntax as an argument: it must reach
// the program as one literal argument.
func TestSwapArgvNeverAShell(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	sh := script(t, `echo "arg=[$1] n=$#"`)
	sw := vllmSwap([]string{sh, "x; touch " + marker + " $(touch " + marker + ")"}, "")
	f, res := runSwapT(t, sw, context.Background())
	if !res.OK {
		t.Fatalf("%+v", res)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the argument was run by a shell")
	}
	if !strings.Contains(f.log(), "n=1") {
		t.Fatalf("log:\n%s", f.log())
	}
}

func TestSwapAgentStopKillsCommand(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child")
	sh := script(t, `sleep 60 & echo $! > `+pidFile+`; echo started; wait`)
	ctx, cancel := context.WithCancel(context.Background())
	var f *fakeSwapServer
	var res client.SwapResult
	done := make(chan struct{})
	go func() {
		f, res = runSwapT(t, vllmSwap([]string{sh}, ""), ctx)
		close(done)
	}()
	poll.Until(t, 10*time.Second, "the command to start", func() bool {
		b, err := os.ReadFile(pidFile)
		return err == nil && len(strings.TrimSpace(string(b))) > 0
	})
	cancel()
	<-done
	if res.OK || !strings.Contains(res.Reason, "agent stopped") {
		t.Fatalf("got %+v", res)
	}
	// The whole process group went: the script's child too.
	b, _ := os.ReadFile(pidFile)
	pid := strings.TrimSpace(string(b))
	poll.Until(t, 10*time.Second, "the script's child "+pid+" to die", func() bool {
		if _, err := os.Stat("/proc/" + pid); err != nil {
			return true
		}
		st, _ := os.ReadFile("/proc/" + pid + "/stat")
		return strings.Contains(string(st), ") Z ") // a zombie waiting for init: dead
	})
	_ = f
}

func TestReadLinesCutsLongLines(t *testing.T) {
	var got []string
	readLines(strings.NewReader("a\r\n"+strings.Repeat("x", 10000)+"\nb\xff\nlast"), func(l string) { got = append(got, l) })
	if len(got) != 4 || got[0] != "a" || len(got[1]) != arbiter.MaxSwapLogLine || got[2] != "b\uFFFD" || got[3] != "last" {
		t.Fatalf("got %d lines: %q", len(got), got)
	}
}

// TestSwapLeavesBackgroundServerRunning: a launch script that leaves a
// server running in the background (nohup … &) ends the command; the
// server goes on writing without being killed or blocked.
func TestSwapLeavesBackgroundServerRunning(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "still-running")
	sh := script(t, `(sleep 0.3; i=0; while [ $i -lt 2000 ]; do echo "server log line $i"; i=$((i+1)); done; touch `+marker+`) & echo launched`)
	f, res := runSwapT(t, vllmSwap([]string{sh}, ""), context.Background())
	if !res.OK {
		t.Fatalf("%+v", res)
	}
	poll.Until(t, 10*time.Second, "the background server to write its marker (was it killed or blocked?)", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	if log := f.log(); !strings.Contains(log, "launched") || strings.Contains(log, "server log line") {
		t.Fatalf("log:\n%s", log)
	}
}

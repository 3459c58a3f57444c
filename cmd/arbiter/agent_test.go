package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/poll"
)

// agentFakeServer answers the two routes the agent uses.
type agentFakeServer struct {
	mu         sync.Mutex
	registered []arbiter.Machine
	heartbeats int
	auth       string // the last Authorization header
}

func (f *agentFakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.auth = r.Header.Get("Authorization")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/machines":
		var m arbiter.Machine
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.registered = append(f.registered, m)
		json.NewEncoder(w).Encode(arbiter.MachineStatus{Name: m.Name, State: arbiter.MachineUp})
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/heartbeat"):
		f.heartbeats++
		json.NewEncoder(w).Encode(arbiter.MachineStatus{State: arbiter.MachineUp})
	default:
		http.NotFound(w, r)
	}
}

func (f *agentFakeServer) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.registered), f.heartbeats
}

func TestAgentCommand(t *testing.T) {
	script := fakeSMI(t)
	f := &agentFakeServer{}
	srv := httptest.NewServer(f)
	defer srv.Close()

	t.Setenv("FAKE_NVIDIA_SMI", "mixed")
	var stderr bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: new(bytes.Buffer), Stderr: &stderr, Getenv: func(k string) string {
		return map[string]string{"ARBITER_URL": srv.URL, "ARBITER_TOKEN": "s3cret"}[k]
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, env, []string{"agent", "--name", "gpu9", "--tag", "a", "--tag", "b",
			"--heartbeat", "5ms", "--nvidia-smi", script, "--no-nvml", "--work-dir", t.TempDir()})
	}()

	poll.Until(t, 10*time.Second, "two heartbeats", func() bool {
		select {
		case code := <-done:
			t.Fatalf("agent exited early with %d: %s", code, stderr.String())
		default:
		}
		_, hb := f.counts()
		return hb >= 2
	})
	cancel() // what SIGTERM does through signal.NotifyContext
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("got exit %d after cancel, want 0; stderr: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not stop after cancel")
	}

	f.mu.Lock()
	m, auth := f.registered[0], f.auth
	f.mu.Unlock()
	if m.Name != "gpu9" || strings.Join(m.Tags, ",") != "a,b" || len(m.GPUs) != 3 || m.Source != arbiter.SourceAgent {
		t.Errorf("got machine %+v, want gpu9 tagged a,b with the 3 GPUs of the fixture", m)
	}
	if auth != "Bearer s3cret" {
		t.Errorf("got Authorization %q, want the token from ARBITER_TOKEN", auth)
	}
	first, _, _ := strings.Cut(stderr.String(), "\n")
	if !strings.Contains(first, "agent starting") || !strings.Contains(first, "Tesla T4") {
		t.Errorf("got first log line %q, want the start message with the GPUs", first)
	}
	if strings.Contains(stderr.String(), "s3cret") {
		t.Errorf("the token appears in the log")
	}
}

func TestAgentUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"extra arg", []string{"agent", "now"}, "unexpected argument"},
		{"bad url", []string{"agent", "--url", "localhost:7070"}, "--url"},
		{"bad heartbeat", []string{"agent", "--heartbeat", "0s"}, "--heartbeat"},
		{"unknown flag", []string{"agent", "--gpus", "2"}, "gpus"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			env := &cli.Env{Stdin: strings.NewReader(""), Stdout: new(bytes.Buffer), Stderr: &stderr, Getenv: func(string) string { return "" }}
			if code := run(context.Background(), env, tt.args); code != 2 {
				t.Errorf("got exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("got stderr %q, want it to mention %q", stderr.String(), tt.want)
			}
		})
	}
}

func TestAgentHelp(t *testing.T) {
	var stderr bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: new(bytes.Buffer), Stderr: &stderr, Getenv: func(k string) string {
		return map[string]string{"ARBITER_TOKEN": "s3cret"}[k]
	}}
	if code := run(context.Background(), env, []string{"agent", "-h"}); code != 0 {
		t.Errorf("got exit %d, want 0", code)
	}
	if s := stderr.String(); !strings.Contains(s, "--nvidia-smi") && !strings.Contains(s, "-nvidia-smi") || strings.Contains(s, "s3cret") {
		t.Errorf("got help %q, want the flags and no token", s)
	}
}

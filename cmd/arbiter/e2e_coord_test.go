package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

// coordRig is what the coordination end-to-end tests share: a fake vLLM
// endpoint that serves whatever model the swap script last started, the
// swap script itself (a real shell script), and a configuration naming
// them.
type coordRig struct {
	dir, state, script string
	vllm               *httptest.Server
	config             string
}

func newCoordRig(t *testing.T, extra string) *coordRig {
	t.Helper()
	r := &coordRig{dir: t.TempDir()}
	r.state = filepath.Join(r.dir, "served")
	os.WriteFile(r.state, []byte("none"), 0o644)
	os.MkdirAll(filepath.Join(r.dir, "models", "ten31-v2"), 0o755)
	r.vllm = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/models" {
			http.NotFound(w, req)
			return
		}
		b, _ := os.ReadFile(r.state)
		json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]any{{"id": strings.TrimSpace(string(b)), "object": "model"}}})
	}))
	t.Cleanup(r.vllm.Close)
	// The launch script: prints progress on stdout and stderr, fails for
	// the "broken" model, and "starts" the server in the background, which
	// serves the new model a moment after the script has returned.
	r.script = filepath.Join(r.dir, "launch.sh")
	os.WriteFile(r.script, []byte(`#!/bin/sh
echo "stopping the old server"
echo "starting vllm serve $1 $3 $4" >&2
case "$1" in *broken*) echo "cannot load $1"; exit 4;; esac
(sleep 0.2; echo "$1" > "$2") &
echo "launched"
`), 0o755)
	r.config = fmt.Sprintf(`
[[services]]
name = "vllm"
machine = "node1"
kind = "vllm"
endpoint = %q
swap_command = [%q, "{model}", %q, "{args}"]
local_path_roots = [%q]
ready_timeout_s = 10
swap_timeout_s = 60

[[services.catalog]]
key = "gemma"
repo = "google/gemma-3-27b-it"
args = ["--max-model-len", "8192"]

[[services.catalog]]
key = "ten31"
local_path = %q

[[services.catalog]]
key = "broken"
repo = "acme/broken"

[webhooks]
retry_min_s = 0.05
retry_max_s = 0.2
`, r.vllm.URL, r.script, r.state, filepath.Join(r.dir, "models"), filepath.Join(r.dir, "models", "ten31-v2")) + extra
	return r
}

// coordStartAgentProc runs the real `arbiter agent` binary as machine name, with
// a fake nvidia-smi on PATH.
func coordStartAgentProc(t *testing.T, url, name string) *exec.Cmd {
	t.Helper()
	bin := buildBinary(t)
	pathDir := fakeSMIDir(t)
	cmd := exec.Command(bin, "agent", "--url", url, "--name", name, "--heartbeat", "200ms", "--no-nvml", "--work-dir", t.TempDir())
	// TMPDIR: the swaps' output directories stay with the test.
	cmd.Env = append(os.Environ(), "PATH="+pathDir+":"+os.Getenv("PATH"), "FAKE_NVIDIA_SMI=h100x8", "TMPDIR="+t.TempDir())
	runProcess(t, cmd, "agent", 10*time.Second)
	c := client.New(url, "")
	poll.Until(t, 30*time.Second, "the agent to register its machine", func() bool { _, err := c.Machine(context.Background(), name); return err == nil })
	return cmd
}

// coordHookReceiver records webhook requests.
type coordHookReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []coordHookRequest
	status atomic.Int32
}

type coordHookRequest struct {
	h    http.Header
	body []byte
	at   time.Time
}

func coordNewHookReceiver(t *testing.T) *coordHookReceiver {
	r := &coordHookReceiver{}
	r.status.Store(200)
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, coordHookRequest{req.Header.Clone(), b, time.Now()})
		r.mu.Unlock()
		w.WriteHeader(int(r.status.Load()))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *coordHookReceiver) requests() []coordHookRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]coordHookRequest(nil), r.got...)
}

// find returns the requests whose body contains s.
func (r *coordHookReceiver) find(s string) []coordHookRequest {
	var out []coordHookRequest
	for _, q := range r.requests() {
		if bytes.Contains(q.body, []byte(s)) {
			out = append(out, q)
		}
	}
	return out
}

// coordCompat sends one request to a compatible endpoint, as an external
// scheduler does: raw HTTP and JSON.
func coordCompat(t *testing.T, method, url string, body any, hdr ...string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// coordWaitSwap waits for a swap to end and returns it.
func coordWaitSwap(t *testing.T, url, id string) arbiter.Swap {
	t.Helper()
	c := client.New(url, "")
	var sw arbiter.Swap
	err := poll.Try(30*time.Second, func() error {
		var err error
		if sw, err = c.Swap(context.Background(), id); err != nil {
			return err
		}
		if !sw.Done() {
			return fmt.Errorf("swap %s did not end: %+v", id, sw)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sw
}

// TestEndToEndCompatLockFlow is an external scheduler's lock flow through
// the compatible paths — acquire, swap with the token, extend, release —
// with a person's manual swap refused (423) meanwhile, then allowed after
// the release, and again after an expiry driven by the fake clock. The
// swaps run on a real agent.
func TestEndToEndCompatLockFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// The fake clock jumps minutes: the agent's heartbeats must not lapse.
	rig := newCoordRig(t, "\n[agents]\nheartbeat_timeout_s = 86400\n")
	clk := clock.NewFake(time.Now().UTC())
	m, url := startServer(t, rig.config, clk, "--no-local")
	coordStartAgentProc(t, url, "node1")

	// The scheduler acquires the lock and keeps its token.
	st, lock := coordCompat(t, "POST", url+"/api/swap/lock", map[string]any{"holder": "daily-vol", "ttl_seconds": 300, "note": "nightly eval"})
	token, _ := lock["token"].(string)
	if st != 200 || token == "" || lock["holder"] != "daily-vol" || lock["held"] != true {
		t.Fatalf("acquire: %d %v", st, lock)
	}
	// A person's manual swap is refused with the lock's state.
	st, body := coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "ten31"})
	if held, _ := body["lock"].(map[string]any); st != 423 || held["holder"] != "daily-vol" || body["detail"] == nil || held["token"] != nil {
		t.Fatalf("manual swap under the lock: %d %v", st, body)
	}
	// The same holder name is not a credential.
	if st, _ := coordCompat(t, "POST", url+"/api/swap/lock", map[string]any{"holder": "daily-vol"}); st != 409 {
		t.Fatalf("re-acquire without the token: %d, want 409", st)
	}
	// The scheduler swaps with its token; the agent runs it.
	st, job := coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "gemma"}, "X-Swap-Lock-Token: "+token)
	if st != 202 || job["job_id"] == nil {
		t.Fatalf("scheduler swap: %d %v", st, job)
	}
	sw := coordWaitSwap(t, url, job["job_id"].(string))
	if sw.State != arbiter.SwapComplete || sw.Fence != int64(lock["fence"].(float64)) {
		t.Fatalf("scheduler swap ended %s (%s), fence %d", sw.State, sw.Reason, sw.Fence)
	}
	st, got := coordCompat(t, "GET", url+"/api/swap/"+sw.ID, nil)
	if st != 200 || got["job_id"] != sw.ID || got["state"] != "complete" || got["returncode"] != float64(0) {
		t.Fatalf("GET swap: %d %v", st, got)
	}
	// Extend (acquire with the token), then release with it.
	clk.Advance(200 * time.Second)
	st, ext := coordCompat(t, "POST", url+"/api/swap/lock", map[string]any{"holder": "daily-vol", "ttl_seconds": 600, "token": token})
	if st != 200 || ext["token"] != token || ext["seconds_remaining"] != float64(600) || ext["fence"] != lock["fence"] {
		t.Fatalf("extend: %d %v", st, ext)
	}
	if st, _ := coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "ten31"}); st != 423 {
		t.Fatalf("manual swap after the extension: %d, want 423", st)
	}
	if st, rel := coordCompat(t, "DELETE", url+"/api/swap/lock", nil, "X-Swap-Lock-Token: "+token); st != 200 || rel["released"] != true {
		t.Fatalf("release: %d %v", st, rel)
	}
	// Released: the manual swap goes through.
	st, job = coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "ten31"})
	if st != 202 {
		t.Fatalf("manual swap after release: %d %v", st, job)
	}
	if sw := coordWaitSwap(t, url, job["job_id"].(string)); sw.State != arbiter.SwapComplete {
		t.Fatalf("manual swap: %s (%s)\n%s", sw.State, sw.Reason, strings.Join(sw.Log, "\n"))
	}

	// Another scheduler run forgets to release: the lock expires (fake
	// clock) and the manual swap is allowed again.
	st, lock2 := coordCompat(t, "POST", url+"/api/swap/lock", map[string]any{"holder": "weekly", "ttl_seconds": "60"})
	if st != 200 || lock2["fence"].(float64) <= lock["fence"].(float64) {
		t.Fatalf("second acquire: %d %v (fence must grow)", st, lock2)
	}
	if st, _ := coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "gemma"}); st != 423 {
		t.Fatalf("manual swap under the second lock: %d", st)
	}
	clk.Advance(61 * time.Second)
	m.loop.Wake()
	poll.Until(t, 30*time.Second, "the lock to expire", func() bool { _, s := coordCompat(t, "GET", url+"/api/swap/lock", nil); return s["held"] == false })
	st, job = coordCompat(t, "POST", url+"/api/swap", map[string]any{"model_key": "gemma"})
	if st != 202 {
		t.Fatalf("manual swap after expiry: %d %v", st, job)
	}
	coordWaitSwap(t, url, job["job_id"].(string))
	// The expiry is an event like every change.
	resp, err := http.Get(url + "/api/v1/events?stream=false&since=0&limit=10000")
	if err != nil {
		t.Fatal(err)
	}
	var evs struct{ Events []arbiter.Event }
	json.NewDecoder(resp.Body).Decode(&evs)
	resp.Body.Close()
	kinds := map[string]int{}
	for _, e := range evs.Events {
		kinds[e.Kind]++
	}
	if kinds["lock.acquired"] != 2 || kinds["lock.extended"] != 1 || kinds["lock.released"] != 1 || kinds["lock.expired"] != 1 || kinds["swap.complete"] != 3 {
		t.Fatalf("events: %v", kinds)
	}
}

// TestEndToEndSwapOnAgent swaps through the CLI on a real agent with a fake
// vLLM endpoint and a real script: the log streams, the endpoint is
// checked, and webhooks arrive in both formats with signatures that verify.
func TestEndToEndSwapOnAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	rig := newCoordRig(t, "")
	_, url := startServer(t, rig.config, nil, "--no-local")
	coordStartAgentProc(t, url, "node1")
	std := coordNewHookReceiver(t)
	spark := coordNewHookReceiver(t)

	w := cliJSON[arbiter.Webhook](t, url, "webhooks", "add", std.URL+"/hooks", "--kind", "swap.complete", "--kind", "swap.failed")
	if !strings.HasPrefix(w.Secret, "whsec_") {
		t.Fatalf("webhook: %+v", w)
	}
	cliJSON[arbiter.Webhook](t, url, "webhooks", "add", spark.URL, "--format", "spark", "--secret", "s3cret-s3cret")

	// Dry run: shows the command, runs nothing, fires nothing.
	out, errs, code := cmdline(t, url, "swap", "gemma", "--dry-run")
	if code != 0 || !strings.Contains(out, rig.script+" google/gemma-3-27b-it "+rig.state+" --max-model-len 8192") {
		t.Fatalf("dry run: %d %s %s", code, out, errs)
	}
	// The real swap, followed: the script's lines, then the endpoint check.
	out, errs, code = cmdline(t, url, "swap", "gemma", "--follow")
	if code != 0 {
		t.Fatalf("swap: exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{"stopping the old server", "starting vllm serve google/gemma-3-27b-it --max-model-len 8192", "launched",
		"exited with status 0", "serves gemma", "swap 2 complete"} {
		if !strings.Contains(out, want) {
			t.Errorf("followed log lacks %q:\n%s", want, out)
		}
	}
	if b, _ := os.ReadFile(rig.state); strings.TrimSpace(string(b)) != "google/gemma-3-27b-it" {
		t.Fatalf("the endpoint serves %q", b)
	}
	svcs := cliJSON[[]arbiter.Service](t, url, "services")
	if len(svcs) != 1 || svcs[0].Model != "gemma" {
		t.Fatalf("services: %+v", svcs)
	}
	// A failing swap: the script exits 4.
	out, _, code = cmdline(t, url, "swap", "broken", "--follow")
	if code != 1 || !strings.Contains(out, "cannot load acme/broken") || !strings.Contains(out, "exited with status 4") {
		t.Fatalf("broken swap: exit %d\n%s", code, out)
	}

	// Webhooks: standard for both ends, verified by the official library.
	poll.Until(t, 30*time.Second, "two webhooks at each receiver", func() bool { return len(std.requests()) >= 2 && len(spark.requests()) >= 2 })
	verifier, _ := standardwebhooks.NewWebhook(w.Secret)
	for _, r := range std.requests() {
		if err := verifier.Verify(r.body, r.h); err != nil {
			t.Fatalf("standard webhook does not verify: %v\n%s", err, r.body)
		}
	}
	if c := std.find(`"type":"swap.complete"`); len(c) != 1 || !bytes.Contains(c[0].body, []byte(`"model_key":"gemma"`)) {
		t.Fatalf("standard swap.complete: %d", len(c))
	}
	if f := std.find(`"type":"swap.failed"`); len(f) != 1 || !bytes.Contains(f[0].body, []byte("exited with status 4")) {
		t.Fatalf("standard swap.failed: %d", len(f))
	}
	// Spark form: the seed's fields, HMAC over the exact body.
	for _, r := range spark.requests() {
		mac := hmac.New(sha256.New, []byte("s3cret-s3cret"))
		mac.Write(r.body)
		if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); r.h.Get("X-Spark-Signature") != want {
			t.Fatalf("spark signature %q, want %q", r.h.Get("X-Spark-Signature"), want)
		}
		var b map[string]any
		json.Unmarshal(r.body, &b)
		for _, k := range []string{"event", "job_id", "model_key", "state", "returncode", "started_at", "finished_at", "dry_run"} {
			if _, ok := b[k]; !ok {
				t.Fatalf("spark body lacks %s: %s", k, r.body)
			}
		}
		if ev := r.h.Get("X-Spark-Event"); ev != b["event"] || (ev != "swap_complete" && ev != "swap_failed") || b["dry_run"] != false {
			t.Fatalf("spark event %q body %s", ev, r.body)
		}
	}
	// Every attempt is recorded and visible (the record follows the answer).
	var ds []arbiter.Delivery
	poll.Until(t, 30*time.Second, "four delivered webhooks in the log", func() bool {
		ds = cliJSON[[]arbiter.Delivery](t, url, "webhooks", "deliveries", "--state", "delivered")
		return len(ds) == 4
	})
	for _, d := range ds {
		if d.State != arbiter.DeliveryDelivered || len(d.History) != 1 || d.History[0].Status != 200 {
			t.Fatalf("delivery %+v", d)
		}
	}
	out, _, _ = cmdline(t, url, "webhooks", "deliveries", "--attempts")
	if !strings.Contains(out, "delivered") || !strings.Contains(out, "#1") {
		t.Fatalf("deliveries table:\n%s", out)
	}
}

// TestEndToEndDeliveriesSurviveKill9 kills the server with SIGKILL while a
// delivery is pending (its receiver answers 500) and another event was
// committed; after a restart on the same data both are delivered.
func TestEndToEndDeliveriesSurviveKill9(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "arbiter.toml")
	os.WriteFile(cfg, []byte("[webhooks]\nretry_min_s = 0.1\nretry_max_s = 0.2\n"), 0o600)
	port := freePort(t)
	url := "http://127.0.0.1:" + port
	start := func() *exec.Cmd {
		return serverProcess(t, bin, url, "--config", cfg, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:"+port, "--no-local")
	}
	rcv := coordNewHookReceiver(t)
	rcv.status.Store(500)
	srv := start()
	c := client.New(url, "")
	ctx := context.Background()
	w, err := c.CreateWebhook(ctx, arbiter.Webhook{URL: rcv.URL, Kinds: []string{"lock.acquired"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := coordCompat(t, "POST", url+"/api/swap/lock", map[string]any{"holder": "a"}); st != 200 {
		t.Fatal(st)
	}
	// The receiver fails: the delivery is pending, retried.
	poll.Until(t, 30*time.Second, "the failing delivery to be retried", func() bool {
		ds, err := c.Deliveries(ctx, arbiter.DeliveryFilter{})
		return err == nil && len(ds) == 1 && ds[0].Attempts >= 2 && ds[0].State == arbiter.DeliveryPending
	})
	if _, err := c.AcquireLock(ctx, "other", client.LockRequest{Holder: "b"}); err != nil {
		t.Fatal(err)
	}
	srv.Process.Signal(syscall.SIGKILL)
	srv.Wait()

	rcv.status.Store(204)
	start()
	verifier, _ := standardwebhooks.NewWebhook(w.Secret)
	poll.Until(t, 30*time.Second, "both deliveries to be delivered", func() bool {
		ds, err := c.Deliveries(ctx, arbiter.DeliveryFilter{State: arbiter.DeliveryDelivered})
		return err == nil && len(ds) == 2
	})
	ids := map[string]bool{}
	for _, r := range rcv.requests() {
		if r.h.Get("webhook-id") == "" || verifier.Verify(r.body, r.h) != nil {
			t.Fatalf("a delivery does not verify: %v", r.h)
		}
		ids[r.h.Get("webhook-id")] = true
	}
	if len(ids) != 2 {
		t.Fatalf("webhook-ids: %v, want the two events' (retries keep theirs)", ids)
	}
}

// TestEndToEndCoordCLI drives the coordination commands as a person would.
func TestEndToEndCoordCLI(t *testing.T) {
	rig := newCoordRig(t, "")
	_, url := startServer(t, rig.config, nil, "--no-local")

	out, errs, code := cmdline(t, url, "lock", "acquire", "maint", "--holder", "ops", "--ttl", "90s", "--note", "driver upgrade")
	if code != 0 || !strings.Contains(out, "held by ops") || !strings.Contains(out, "token: ") {
		t.Fatalf("acquire: %d %s %s", code, out, errs)
	}
	token := strings.Fields(out[strings.Index(out, "token: "):])[1]
	if out, _, _ := cmdline(t, url, "lock", "status", "maint"); strings.Contains(out, token) || !strings.Contains(out, "driver upgrade") {
		t.Fatalf("status shows the token or not the note: %s", out)
	}
	if _, errs, code := cmdline(t, url, "lock", "acquire", "maint", "--holder", "ops"); code != 1 || !strings.Contains(errs, `is held by "ops"`) {
		t.Fatalf("second acquire: %d %s", code, errs)
	}
	if _, errs, code := cmdline(t, url, "lock", "acquire", "x", "--holder", " "); code != 1 || !strings.Contains(errs, "holder is required") {
		t.Fatalf("blank holder: %d %s", code, errs)
	}
	if _, _, code := cmdline(t, url, "lock", "acquire", "x", "--ttl", "soon"); code != 2 {
		t.Fatalf("bad --ttl: exit %d, want 2", code)
	}
	g := cliJSON[arbiter.LockGrant](t, url, "lock", "extend", "maint", "--lock-token", token, "--ttl", "600")
	if *g.SecondsRemaining != 600 || g.Token != "" {
		t.Fatalf("extend: %+v", g)
	}
	if ls := cliJSON[[]arbiter.LockState](t, url, "lock", "list"); len(ls) != 1 || ls[0].Name != "maint" {
		t.Fatalf("list: %+v", ls)
	}
	if _, errs, code := cmdline(t, url, "lock", "release", "maint", "--lock-token", "wrong"); code != 1 || !strings.Contains(errs, "does not hold") {
		t.Fatalf("release with a wrong token: %d %s", code, errs)
	}
	if out, _, code := cmdline(t, url, "lock", "release", "maint", "--lock-token", token); code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("release: %d %s", code, out)
	}
	if _, _, code := cmdline(t, url, "lock", "frob"); code != 2 {
		t.Fatalf("unknown subcommand: exit %d", code)
	}

	// Catalog: validation, bad input, admin edits.
	if out, _, code := cmdline(t, url, "catalog", "validate", "vllm", "ten31"); code != 0 || !strings.Contains(out, "is valid") {
		t.Fatalf("validate: %d %s", code, out)
	}
	for _, bad := range [][]string{
		{"--local-path", "/etc/passwd"}, {"--local-path", "models/x"}, {"--local-path", rig.dir + "/models/../x"},
	} {
		if _, errs, code := cmdline(t, url, append([]string{"catalog", "set", "vllm", "x"}, bad...)...); code != 1 || errs == "" {
			t.Fatalf("catalog set %v: exit %d %s", bad, code, errs)
		}
	}
	if _, _, code := cmdline(t, url, "catalog", "set", "vllm", "x", "--repo", "a/b", "--local-path", "/m"); code != 2 {
		t.Fatalf("both: exit %d, want 2", code)
	}
	e := cliJSON[arbiter.CatalogEntry](t, url, "catalog", "set", "vllm", "llama", "--repo", "meta-llama/Llama-3.1-8B", "--arg", "--dtype", "--arg", "bf16")
	if e.Source != "api" || strings.Join(e.Args, " ") != "--dtype bf16" {
		t.Fatalf("set: %+v", e)
	}
	if cat := cliJSON[[]arbiter.CatalogEntry](t, url, "catalog", "list"); len(cat) != 4 {
		t.Fatalf("catalog: %d entries, want 4", len(cat))
	}
	if out, _, code := cmdline(t, url, "swap", "llama", "--dry-run"); code != 0 || !strings.Contains(out, "meta-llama/Llama-3.1-8B") {
		t.Fatalf("dry run: %d %s", code, out)
	}
	if _, errs, code := cmdline(t, url, "swap", "nope"); code != 1 || !strings.Contains(errs, "not in the catalog") {
		t.Fatalf("unknown model: %d %s", code, errs)
	}
	// A swap past a held lock: the refusal says what to type.
	if _, errs, code := cmdline(t, url, "lock", "acquire", "swap:vllm", "--holder", "nightly"); code != 0 {
		t.Fatalf("lock: %d %s", code, errs)
	}
	if _, errs, code := cmdline(t, url, "swap", "llama"); code != 1 || !strings.Contains(errs, `held by "nightly"`) || !strings.Contains(errs, "--lock-token or $ARBITER_LOCK_TOKEN") {
		t.Fatalf("swap past the lock: %d %s", code, errs)
	}
	if _, errs, code := cmdline(t, url, "lock", "release", "swap:vllm", "--force"); code != 0 {
		t.Fatalf("unlock: %d %s", code, errs)
	}
	cliJSON[arbiter.CatalogEntry](t, url, "catalog", "rm", "vllm", "llama")

	// Schedules.
	s := cliJSON[arbiter.Schedule](t, url, "schedules", "add", "--name", "Daily Vol", "--cron", "@daily", "--id", "daily-vol")
	if s.ID != "daily-vol" || s.NextRun == "" {
		t.Fatalf("schedule: %+v", s)
	}
	if _, errs, code := cmdline(t, url, "schedules", "add", "--name", "x", "--id", "../etc"); code != 1 || !strings.Contains(errs, "id must match") {
		t.Fatalf("bad id: %d %s", code, errs)
	}
	if _, errs, code := cmdline(t, url, "schedules", "add", "--name", "x", "--cron", "every day"); code != 1 || !strings.Contains(errs, "cron") {
		t.Fatalf("bad cron: %d %s", code, errs)
	}
	if out, _, _ := cmdline(t, url, "schedules"); !strings.Contains(out, "Daily Vol") {
		t.Fatalf("schedules:\n%s", out)
	}
	cliJSON[arbiter.Schedule](t, url, "schedules", "rm", "daily-vol")

	// Webhooks: a metadata address is refused.
	if _, errs, code := cmdline(t, url, "webhooks", "add", "http://169.254.169.254/latest/meta-data", "--kind", "*"); code != 1 || !strings.Contains(errs, "link-local") {
		t.Fatalf("metadata webhook: %d %s", code, errs)
	}
	if out, _, code := cmdline(t, url, "webhooks", "list"); code != 0 || !strings.Contains(out, "ID") {
		t.Fatalf("webhooks list: %d %s", code, out)
	}
}

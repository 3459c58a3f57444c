package httpapi

// A fuzz target for every JSON body the server decodes (issue 12), each
// over the real control loop and store: whatever the body, the answer is
// JSON, never a 5xx (503 aside), and a refused body changes nothing.
// TestEveryBodyIsFuzzed keeps the list whole: a route that may carry a
// body must name its fuzz target here, or say why it has none.

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/artifact"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// fuzzedBodies names, for each route that decodes a JSON body, its fuzz
// target in this file.
var fuzzedBodies = map[string]string{
	"POST /api/v1/machines":                     "FuzzBodyRegisterMachine",
	"POST /api/v1/allocations":                  "FuzzBodyAllocate",
	"POST /api/v1/locks/{name}":                 "FuzzBodyLockAcquire",
	"POST /api/v1/locks/{name}/extend":          "FuzzBodyLockExtend",
	"PUT /api/v1/services/{name}/catalog/{key}": "FuzzBodyCatalogPut",
	"POST /api/v1/services/{name}/swaps":        "FuzzBodySwapRequest",
	"POST /api/v1/swaps/{id}/log":               "FuzzBodySwapLog",
	"POST /api/v1/swaps/{id}/finish":            "FuzzBodySwapFinish",
	"POST /api/v1/swaps/{id}/cancel":            "FuzzBodySwapCancel",
	"POST /api/v1/webhooks":                     "FuzzBodyWebhookCreate",
	"POST /api/v1/schedules":                    "FuzzBodySchedule",
	"POST /api/swap/lock":                       "FuzzBodyCompatLock",
	"POST /api/swap":                            "FuzzBodyCompatSwap",
	"POST /api/schedule":                        "FuzzBodyCompatSchedule",
	"POST /api/v1/tasks/claim":                  "FuzzBodyTaskClaim",
	"POST /api/v1/tasks/{id}/heartbeat":         "FuzzBodyTaskWorker",
	"POST /api/v1/tasks/{id}/complete":          "FuzzBodyTaskWorker",
	"POST /api/v1/tasks/{id}/fail":              "FuzzBodyTaskWorker",
	"POST /v1/job/claim":                        "FuzzBodyFleetClaim",
	"POST /v1/job/{id}/complete":                "FuzzBodyFleetComplete",
	"POST /v1/job/{id}/fail":                    "FuzzBodyFleetFail",
	"POST /api/v1/machines/{name}/gpus/report":  "FuzzGPUReport", // gpus_test.go
	// Fair share (fairshare_fuzz_test.go).
	"POST /api/v1/allocations/{id}/extend": "FuzzBodyExtend",
	"POST /api/v1/quotas":                  "FuzzBodyQuota",
	"POST /api/v1/reservations":            "FuzzBodyReservation",
	"POST /api/v1/notifications":           "FuzzBodyNotify",
}

// noJSONBody are the state-changing routes that decode no JSON body, and
// what they read instead.
var noJSONBody = map[string]string{
	"POST /api/v1/machines/{name}/heartbeat":              "the path only",
	"POST /api/v1/machines/{name}/leave":                  "the path only",
	"POST /api/v1/machines/{name}/drain":                  "the path only",
	"POST /api/v1/machines/{name}/undrain":                "the path only",
	"POST /api/v1/allocations/{id}/keepalive":             "the path only",
	"DELETE /api/v1/allocations/{id}":                     "the path and ?reason= (the text rule, TestStoredTextFollowsTheRule)",
	"DELETE /api/v1/locks/{name}":                         "the path and X-Lock-Token (FuzzCredentialHeaders)",
	"DELETE /api/v1/services/{name}/catalog/{key}":        "the path only",
	"POST /api/v1/services/{name}/catalog/{key}/validate": "the path only",
	"POST /api/v1/machines/{name}/swaps/claim":            "the path only",
	"DELETE /api/v1/webhooks/{id}":                        "the path only",
	"POST /api/v1/webhooks/{id}/enable":                   "the path only",
	"POST /api/v1/webhooks/{id}/disable":                  "the path and ?reason=",
	"DELETE /api/v1/schedules/{id}":                       "the path only (FuzzScheduleID)",
	"DELETE /api/swap/lock":                               "X-Swap-Lock-Token only (FuzzCredentialHeaders)",
	"POST /api/swap/{key}/validate":                       "the path only",
	"DELETE /api/schedule/{id}":                           "the path only (FuzzScheduleID)",
	"POST /api/v1/admin/reload":                           "nothing",
	"POST /api/v1/tasks/reload":                           "nothing",
	"PUT /api/v1/tasks/{id}/artifact":                     "bytes, checked against X-Content-SHA256 (FuzzArtifactUpload; TestFleetUploadLimitsWhileStreaming)",
	"POST /api/v1/tasks/{id}/cancel":                      "the path and ?reason=",
	"POST /api/v1/tasks/{id}/requeue":                     "the path only",
	"POST /v1/job/{id}/heartbeat":                         "X-Lab-Host and the path (the body is ignored, as the fleet's server did; FuzzCredentialHeaders)",
	"PUT /v1/model/{id}":                                  "bytes, checked against X-Content-SHA256 (FuzzArtifactUpload)",
	"POST /v1/job/{id}/cancel":                            "X-Operator-Token and the path (FuzzCredentialHeaders)",
	"POST /v1/job/{id}/requeue":                           "X-Operator-Token and the path",
	"POST /v1/manifest/reload":                            "X-Operator-Token only (FuzzCredentialHeaders)",
	"POST /ui/login":                                      "a form (FuzzUIRequests)",
	"POST /ui/logout":                                     "the cookie only (FuzzUIRequests)",
	"POST /api/v1/machines/{name}/gpus/{index}/drain":     "the path and ?reason=",
	"POST /api/v1/machines/{name}/gpus/{index}/undrain":   "the path and ?reason=",
	"POST /api/v1/machines/{name}/gpus/{index}/free":      "the path only",
	"DELETE /api/v1/quotas":                               "?group=, ?principal=, ?model= (FuzzDecodeFairShareBodies covers the quota)",
	"DELETE /api/v1/reservations/{id}":                    "the path only",
	"DELETE /api/v1/notifications/{id}":                   "the path only",
}

// TestEveryBodyIsFuzzed: every route that may carry a body has a fuzz
// target in this package, or a reason for none.
func TestEveryBodyIsFuzzed(t *testing.T) {
	fset := gotoken.NewFileSet()
	targets := map[string]bool{}
	files, _ := filepath.Glob("*_test.go")
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && strings.HasPrefix(fn.Name.Name, "Fuzz") {
				targets[fn.Name.Name] = true
			}
		}
	}
	s := NewServer(Options{Plane: newFakePlane(), Tokens: testTokens})
	for _, rt := range s.Routes() {
		if rt.Method == http.MethodGet {
			continue
		}
		p := rt.Method + " " + rt.Path
		name, fuzzed := fuzzedBodies[p]
		_, why := noJSONBody[p]
		switch {
		case !fuzzed && !why:
			t.Errorf("%s may carry a body: give it a fuzz target (fuzzedBodies) or say what it reads instead (noJSONBody)", p)
		case fuzzed && !targets[name]:
			t.Errorf("%s: fuzz target %s does not exist", p, name)
		}
	}
}

// fuzzEnv is a server over the real control loop with every capability.
type fuzzEnv struct {
	loop *control.Loop
	srv  *Server
	task string
}

func newFuzzEnv(tb testing.TB) *fuzzEnv {
	tb.Helper()
	dir := tb.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "a.db"), sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		tb.Fatal(err)
	}
	loop, err := control.Open(context.Background(), control.Options{Store: st})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { loop.Close(); st.Close() })
	do := func(cmd arbiter.Command) {
		if _, err := loop.Do(context.Background(), cmd); err != nil {
			tb.Fatalf("%T: %v", cmd, err)
		}
	}
	do(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{{Name: "gpubox", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{},
		GPUs: []arbiter.GPU{{Index: 0, UUID: "GPU-0", Model: "H100", VRAMGiB: 80, Healthy: true}}}}})
	do(arbiter.SyncTasks{Manifest: arbiter.TaskManifest{Name: "t", Tasks: []arbiter.TaskDef{taskTestDef("cpu1", 0), taskTestDef("gpu1", 1)}}})
	do(arbiter.SyncServices{
		Services: []arbiter.Service{{Name: "vllm", Machine: "gpubox", Kind: arbiter.ServiceVLLM, Endpoint: "http://127.0.0.1:9",
			SwapCommand: []string{"/bin/true", "{model}"}, LocalPathRoots: []string{"/models"}, ReadyTimeoutS: 60, SwapTimeoutS: 600, Default: true}},
		Catalog: []arbiter.CatalogEntry{{Service: "vllm", Key: "gemma", Repo: "google/gemma-3-27b-it"}},
	})
	arts, err := artifact.Open(filepath.Join(dir, "artifacts"), artifact.Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	srv := NewServer(Options{Plane: loop, Tokens: testTokens, Version: "fuzz",
		Tasks:        &TaskOptions{Artifacts: arts, OperatorToken: taskOpToken},
		Coordination: CoordOptions{Deliveries: st}})
	return &fuzzEnv{loop: loop, srv: srv, task: taskTestID("cpu1")}
}

// fuzzBody fuzzes the body of one route, sent with token (and X-Lab-Host
// gpubox), from the seeds and the usual malformed ones.
func fuzzBody(f *testing.F, method, path, tok string, seeds ...string) {
	f.Helper()
	e := newFuzzEnv(f)
	path = strings.ReplaceAll(path, "{task}", e.task)
	for _, s := range append(seeds, ``, `{`, `null`, `[]`, `{"a":1}{"b":2}`, `{"x": "\u001b[2J\n\u202e"}`, "\xff\xfe") {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := e.loop.LastSeq()
		r := testRequest(method, path, bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+tok)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-Lab-Host", "gpubox")
		w := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(w, r)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %s with %q: %d %s", method, path, body, w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s with %q: the answer is not JSON: %s", method, path, body, w.Body)
		}
		if w.Code >= 400 && e.loop.LastSeq() != before {
			t.Fatalf("%s %s with %q: refused (%d) yet events were emitted", method, path, body, w.Code)
		}
	})
}

func FuzzBodyRegisterMachine(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/machines", testAgent, `{"name": "h1", "cuda": "12.4", "gpus": [{"index": 0, "uuid": "GPU-9", "model": "A100", "vram_gib": 40}]}`,
		`{"name": "h2", "gpus": [{"index": 0, "uuid": "GPU-0"}]}`, `{"name": "h3", "tags": ["a b"]}`)
}

func FuzzBodyAllocate(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/allocations", testUser, `{"gpus": 1, "label": "sweep"}`, `{"pool": "p", "owner": "x"}`,
		`{"grid": {"boards": 1}}`, `{"gpus": 1, "keepalive_s": null, "model": "*H100*", "tags": ["default"]}`)
}

func FuzzBodyLockAcquire(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/locks/l1", testUser, `{"holder": "ci", "ttl_s": 60, "note": "deploy"}`, `{"ttl_s": -5}`)
}

func FuzzBodyLockExtend(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/locks/l1/extend", testUser, `{"ttl_s": 60}`, `{"note": null}`)
}

func FuzzBodyCatalogPut(f *testing.F) {
	fuzzBody(f, "PUT", "/api/v1/services/vllm/catalog/k1", testAdmin, `{"repo": "a/b", "args": ["--x"]}`, `{"local_path": "/models/../etc"}`)
}

func FuzzBodySwapRequest(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/services/vllm/swaps", testUser, `{"model": "gemma", "dry_run": true}`, `{"model": "gemma", "force": true}`)
}

func FuzzBodySwapLog(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/swaps/sw1/log", testAgent, `{"machine": "gpubox", "lines": ["a", "b"]}`)
}

func FuzzBodySwapFinish(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/swaps/sw1/finish", testAgent, `{"machine": "gpubox", "ok": false, "reason": "x", "return_code": 1}`)
}

func FuzzBodySwapCancel(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/swaps/1/cancel", testUser, `{"reason": "wrong model"}`, `{}`, ``)
}

func FuzzBodyWebhookCreate(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/webhooks", testAdmin, `{"url": "https://example.com/h", "kinds": ["swap.*"]}`,
		`{"url": "http://169.254.169.254/", "kinds": ["*"]}`, `{"url": "https://x", "format": "spark", "secret": "s"}`)
}

func FuzzBodySchedule(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/schedules", testUser, `{"name": "n", "cron": "0 * * * *", "description": "a\nb"}`, `{"id": "../x", "name": "n"}`)
}

func FuzzBodyCompatLock(f *testing.F) {
	fuzzBody(f, "POST", "/api/swap/lock", testUser, `{"holder": "h", "ttl_seconds": 30}`, `{"ttl": "1h"}`)
}

func FuzzBodyCompatSwap(f *testing.F) {
	fuzzBody(f, "POST", "/api/swap", testUser, `{"model": "gemma", "dry_run": true}`, `{"key": 1}`)
}

func FuzzBodyCompatSchedule(f *testing.F) {
	fuzzBody(f, "POST", "/api/schedule", testUser, `{"name": "n", "owner": "o", "cron": "*/5 * * * *"}`)
}

func FuzzBodyTaskClaim(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/tasks/claim", testAgent, `{"worker": "gpubox", "capability": {"cuda": true}}`, `{"worker": "a b"}`)
}

func FuzzBodyTaskWorker(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/tasks/{task}/fail", testAgent, `{"worker": "gpubox", "error": "exit 1"}`, `{"worker": "gpubox", "error": "\u001b[2J"}`)
}

func FuzzBodyFleetClaim(f *testing.F) {
	fuzzBody(f, "POST", "/v1/job/claim", testAgent, `{"capability": {"hostname": "gpubox", "cuda": true, "gpus": [{"index": 0, "vram_gib": 80, "uuid": "GPU-0"}]}}`)
}

func FuzzBodyFleetComplete(f *testing.F) {
	fuzzBody(f, "POST", "/v1/job/{task}/complete", testAgent, `{"artifact_id": "`+strings.Repeat("a", 64)+`"}`, `{"artifact_id": 7}`)
}

func FuzzBodyFleetFail(f *testing.F) {
	fuzzBody(f, "POST", "/v1/job/{task}/fail", testAgent, `{"error": "Traceback …\n  File x"}`, `{"error": {"nested": [1]}}`)
}

package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/artifact"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// taskEnv is a real control loop over SQLite with the work queue's routes.
type taskEnv struct {
	t       *testing.T
	loop    *control.Loop
	srv     *Server
	http    *httptest.Server
	artDir  string
	reloads int
	reload  func() (arbiter.TaskSyncReport, error)
}

const taskOpToken = "operator-secret-0123456789"

func taskTestID(name string) string {
	s := sha256.Sum256([]byte(name))
	return hex.EncodeToString(s[:])
}

// taskTestDef declares a task; one with GPUs has a higher priority.
func taskTestDef(name string, gpus int) arbiter.TaskDef {
	return arbiter.TaskDef{ID: taskTestID(name), Name: name, Spec: arbiter.TaskSpec{Model: "gbt", Mode: name,
		Hyper: json.RawMessage(`{"lr":0.1}`), TrainHosts: []string{}, AllowedHosts: []string{}, Command: []string{"true"},
		MaxAttempts: 2, StaleAfterS: 600, GPUs: gpus, Priority: gpus}}
}

func newTaskEnv(t *testing.T, mod func(*Options)) *taskEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "a.db"), sqlite.Options{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := control.Open(context.Background(), control.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(); st.Close() })
	gpu := arbiter.Machine{Name: "gpubox", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{},
		GPUs: []arbiter.GPU{{Index: 0, Model: "H100", VRAMGiB: 80, Healthy: true}, {Index: 1, Model: "H100", VRAMGiB: 80, Healthy: true}}}
	if _, err := loop.Do(context.Background(), arbiter.SyncConfigMachines{Machines: []arbiter.Machine{gpu}}); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Do(context.Background(), arbiter.SyncTasks{Manifest: arbiter.TaskManifest{Name: "t",
		Tasks: []arbiter.TaskDef{taskTestDef("cpu1", 0), taskTestDef("gpu1", 2), taskTestDef("cpu2", 0)}}}); err != nil {
		t.Fatal(err)
	}
	artDir := filepath.Join(dir, "artifacts")
	store, err := artifact.Open(artDir, artifact.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	e := &taskEnv{t: t, loop: loop, artDir: artDir}
	o := Options{Plane: loop, Tokens: testTokens, Version: "test", Tasks: &TaskOptions{
		Artifacts: store, MaxArtifactBytes: 64 << 10, OperatorToken: taskOpToken,
		Reload: func(ctx context.Context) (arbiter.TaskSyncReport, error) {
			e.reloads++
			if e.reload != nil {
				return e.reload()
			}
			return arbiter.TaskSyncReport{Manifest: "t", Tasks: 3, Unchanged: 3}, nil
		},
	}}
	if mod != nil {
		mod(&o)
	}
	e.srv = NewServer(o)
	e.http = httptest.NewServer(e.srv.Handler())
	t.Cleanup(e.http.Close)
	return e
}

// req sends a real HTTP request and returns the status and body. A /v1
// worker call carries the agent's bearer token, as a worker with a token
// does, unless hdr says otherwise ("Authorization": "" for none).
func (e *taskEnv) req(method, path string, hdr map[string]string, body io.Reader) (int, []byte) {
	e.t.Helper()
	r, err := http.NewRequest(method, e.http.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	operator := strings.HasSuffix(path, "/cancel") || strings.HasSuffix(path, "/requeue") || strings.HasSuffix(path, "/reload")
	if _, set := hdr["Authorization"]; !set && strings.HasPrefix(path, "/v1/") && !operator {
		r.Header.Set("Authorization", "Bearer "+testAgent)
	}
	for k, v := range hdr {
		if v != "" {
			r.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *taskEnv) task(name string) arbiter.Task {
	e.t.Helper()
	v, ok := e.loop.Record(arbiter.KindTask, taskTestID(name))
	if !ok {
		e.t.Fatalf("no task %s", name)
	}
	t, _ := taskFromRecord(v)
	return *t
}

// snapshot is what must not change after a refused request: every task's
// status, attempts and artifact, and the files under the artifact store.
func (e *taskEnv) snapshot() string {
	e.t.Helper()
	var parts []string
	for _, r := range e.loop.Records(arbiter.KindTask) {
		t, _ := taskFromRecord(r.Value)
		parts = append(parts, fmt.Sprintf("%s:%s:%d:%s:%s", t.Name, t.Status, t.Attempts, t.ArtifactID, t.ClaimedBy))
	}
	parts = append(parts, fmt.Sprintf("artifacts=%d", len(e.loop.Records(arbiter.KindArtifact))))
	filepath.WalkDir(e.artDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			parts = append(parts, "file:"+strings.TrimPrefix(p, e.artDir))
		}
		return nil
	})
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func taskSHA(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func taskHost(h string) map[string]string { return map[string]string{"X-Lab-Host": h} }

// TestFleetWorkerFlow is a fleet worker's request sequence against /v1.
func TestFleetWorkerFlow(t *testing.T) {
	e := newTaskEnv(t, nil)
	capability := `{"capability": {"hostname": "gpubox", "cores": 32, "ram_gib": 256, "cuda": true, "vram_gib": 80, "torch": "2.4", "os": "linux"}}`
	code, body := e.req("POST", "/v1/job/claim", taskHost("gpubox"), strings.NewReader(capability))
	var claim struct {
		JobID    string          `json:"job_id"`
		Name     string          `json:"name"`
		Spec     json.RawMessage `json:"spec"`
		Attempts int             `json:"attempts"`
		GPUs     []int           `json:"gpus"`
		CVD      string          `json:"cuda_visible_devices"`
	}
	json.Unmarshal(body, &claim)
	if code != 200 || claim.Name != "gpu1" || claim.Attempts != 1 || claim.CVD != "0,1" || !bytes.Contains(claim.Spec, []byte(`"hyper":{"lr":0.1}`)) {
		t.Fatalf("claim: %d %s", code, body)
	}
	if code, body := e.req("POST", "/v1/job/"+claim.JobID+"/heartbeat", taskHost("gpubox"), nil); code != 200 || strings.TrimSpace(string(body)) != `{"ok":true}` {
		t.Fatalf("heartbeat: %d %s", code, body)
	}
	bundle := []byte("a tar.zst bundle")
	hdr := map[string]string{"X-Lab-Host": "gpubox", "X-Content-SHA256": taskSHA(bundle)}
	code, body = e.req("PUT", "/v1/model/"+claim.JobID, hdr, bytes.NewReader(bundle))
	if code != 201 || !strings.Contains(string(body), `"status":"stored"`) || !strings.Contains(string(body), `"size_bytes":16`) {
		t.Fatalf("upload: %d %s", code, body)
	}
	code, body = e.req("PUT", "/v1/model/"+claim.JobID, hdr, bytes.NewReader(bundle))
	if code != 200 || !strings.Contains(string(body), `"status":"already-present"`) {
		t.Fatalf("second upload: %d %s", code, body)
	}
	code, body = e.req("POST", "/v1/job/"+claim.JobID+"/complete", taskHost("gpubox"), strings.NewReader(`{"artifact_id": "`+taskSHA(bundle)+`"}`))
	if code != 200 {
		t.Fatalf("complete: %d %s", code, body)
	}
	if got := e.task("gpu1"); got.Status != arbiter.TaskCompleted || got.ArtifactID != taskSHA(bundle) {
		t.Fatalf("task after complete: %+v", got)
	}
	// The rest: two CPU jobs, then nothing.
	for _, want := range []string{"cpu1", "cpu2"} {
		code, body = e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{"capability": {"cores": 4}}`))
		if code != 200 || !strings.Contains(string(body), `"name":"`+want+`"`) {
			t.Fatalf("claim %s: %d %s", want, code, body)
		}
	}
	code, body = e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{}`))
	if code != 200 || strings.TrimSpace(string(body)) != `{"job":null}` {
		t.Fatalf("empty claim: %d %s", code, body)
	}
	// Failing: retried once (max_attempts 2), then failed.
	id := taskTestID("cpu1")
	if code, body := e.req("POST", "/v1/job/"+id+"/fail", taskHost("pi"), strings.NewReader(`{"error": "Traceback: boom"}`)); code != 200 {
		t.Fatalf("fail: %d %s", code, body)
	}
	if got := e.task("cpu1"); got.Status != arbiter.TaskPending || got.LastError != "Traceback: boom" {
		t.Fatalf("after fail: %+v", got)
	}
	// Operator listing and workers.
	code, body = e.req("GET", "/v1/jobs?status=completed", nil, nil)
	var jobs struct {
		Jobs []map[string]any `json:"jobs"`
	}
	json.Unmarshal(body, &jobs)
	if code != 200 || len(jobs.Jobs) != 1 || jobs.Jobs[0]["artifact_id"] != taskSHA(bundle) || jobs.Jobs[0]["model"] != "gbt" {
		t.Fatalf("jobs: %d %s", code, body)
	}
	code, body = e.req("GET", "/v1/workers", nil, nil)
	if code != 200 || !strings.Contains(string(body), `"hostname":"gpubox"`) || !strings.Contains(string(body), `"os":"linux"`) {
		t.Fatalf("workers: %d %s", code, body)
	}
	if code, body := e.req("GET", "/v1/health", nil, nil); code != 200 || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Fatalf("health: %d %s", code, body)
	}
	// Operator calls: token required.
	cpu2 := taskTestID("cpu2")
	if code, body := e.req("POST", "/v1/job/"+cpu2+"/cancel", nil, nil); code != 401 || !strings.Contains(string(body), "operator token required") {
		t.Fatalf("cancel without token: %d %s", code, body)
	}
	op := map[string]string{"X-Operator-Token": taskOpToken}
	if code, body := e.req("POST", "/v1/job/"+cpu2+"/cancel", op, nil); code != 200 || strings.TrimSpace(string(body)) != `{"ok":true}` {
		t.Fatalf("cancel: %d %s", code, body)
	}
	if code, body := e.req("POST", "/v1/job/"+cpu2+"/cancel", op, nil); code != 200 || !strings.Contains(string(body), `"ok":false`) {
		t.Fatalf("cancel again: %d %s", code, body)
	}
	// The worker hears about the cancel at its next heartbeat.
	if code, _ := e.req("POST", "/v1/job/"+cpu2+"/heartbeat", taskHost("pi"), nil); code != 410 {
		t.Fatalf("heartbeat of a cancelled job: %d, want 410", code)
	}
	if code, body := e.req("POST", "/v1/job/"+cpu2+"/requeue", op, nil); code != 200 || strings.TrimSpace(string(body)) != `{"ok":true}` {
		t.Fatalf("requeue: %d %s", code, body)
	}
	// An admin bearer token is an operator too.
	if code, body := e.req("POST", "/v1/manifest/reload", map[string]string{"Authorization": "Bearer " + testAdmin}, nil); code != 200 ||
		!strings.Contains(string(body), `"n_jobs":3`) || !strings.Contains(string(body), `"unchanged":3`) {
		t.Fatalf("reload: %d %s", code, body)
	}
	e.reload = func() (arbiter.TaskSyncReport, error) {
		return arbiter.TaskSyncReport{}, fmt.Errorf("m.toml:3: jobs[0] (gbt): gpus: must be 0 to 64, got 99")
	}
	if code, body := e.req("POST", "/v1/manifest/reload", op, nil); code != 400 || !strings.Contains(string(body), "m.toml:3") {
		t.Fatalf("bad reload: %d %s", code, body)
	}
	if code, _ := e.req("POST", "/v1/manifest/reload", map[string]string{"Authorization": "Bearer " + testUser}, nil); code != 403 {
		t.Fatalf("reload with a user token: %d, want 403", code)
	}
}

// TestFleetBadInput: every refused request gets a clear 4xx and changes
// nothing, on disk or in the queue.
// TestFleetFailKeepsALogTail: an unchanged fleet worker fails a task with
// the tail of its log — progress bars' carriage returns, colours, any
// length — and the failure is recorded, escaped, with its end kept, rather
// than refused (the task would have waited to go stale, its error lost).
func TestFleetFailKeepsALogTail(t *testing.T) {
	e := newTaskEnv(t, nil)
	code, body := e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{"capability": {}}`))
	var c struct {
		JobID string `json:"job_id"`
		Name  string `json:"name"`
	}
	if json.Unmarshal(body, &c) != nil || code != 200 {
		t.Fatalf("claim: %d %s", code, body)
	}
	tail := strings.Repeat("epoch 1:  10%|#   | 1/10\r", 5000) + "\x1b[31mTraceback\x1b[0m\nRuntimeError: CUDA out of memory\n"
	msg, _ := json.Marshal(map[string]string{"error": tail})
	if code, body := e.req("POST", "/v1/job/"+c.JobID+"/fail", taskHost("pi"), bytes.NewReader(msg)); code != 200 {
		t.Fatalf("fail with a real log tail: %d %s", code, body)
	}
	got := e.task(c.Name)
	if got.Status != arbiter.TaskPending || !strings.HasSuffix(got.LastError, `\x1b[31mTraceback\x1b[0m`+"\nRuntimeError: CUDA out of memory\n") ||
		!strings.Contains(got.LastError, `\r`) || len(got.LastError) > arbiter.MaxTaskErrorInBytes {
		t.Fatalf("task after the failure: %s, error of %d bytes ending %q", got.Status, len(got.LastError), got.LastError[max(0, len(got.LastError)-80):])
	}
}

func TestFleetBadInput(t *testing.T) {
	e := newTaskEnv(t, nil)
	// gpu1 is claimed by gpubox; cpu1 by pi.
	e.req("POST", "/v1/job/claim", taskHost("gpubox"), strings.NewReader(`{"capability": {}}`))
	e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{"capability": {}}`))
	gpu1, unknown := taskTestID("gpu1"), taskTestID("nope")
	good := []byte("bundle")
	big := bytes.Repeat([]byte("x"), 64<<10+1)
	upHdr := func(h, s string) map[string]string { return map[string]string{"X-Lab-Host": h, "X-Content-SHA256": s} }
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		body               string
		status             int
		want               string
	}{
		{"claim without host", "POST", "/v1/job/claim", nil, `{}`, 400, "X-Lab-Host required"},
		{"claim with a bad host", "POST", "/v1/job/claim", taskHost("a b"), `{}`, 400, "X-Lab-Host required"},
		{"claim with a path host", "POST", "/v1/job/claim", taskHost("../etc"), `{}`, 400, "X-Lab-Host"},
		{"claim not JSON", "POST", "/v1/job/claim", taskHost("pi"), `capability=1`, 400, "body must be JSON"},
		{"claim empty body", "POST", "/v1/job/claim", taskHost("pi"), ``, 400, "body must be JSON"},
		{"claim a list", "POST", "/v1/job/claim", taskHost("pi"), `[1]`, 400, "body must be JSON"},
		{"claim bad capability", "POST", "/v1/job/claim", taskHost("pi"), `{"capability": {"cores": "many"}}`, 400, "capability.cores"},
		{"claim negative ram", "POST", "/v1/job/claim", taskHost("pi"), `{"capability": {"ram_gib": -1}}`, 400, "ram_gib"},
		{"heartbeat without host", "POST", "/v1/job/" + gpu1 + "/heartbeat", nil, ``, 400, "X-Lab-Host"},
		{"heartbeat short id", "POST", "/v1/job/abc/heartbeat", taskHost("gpubox"), ``, 400, "64"},
		{"heartbeat upper id", "POST", "/v1/job/" + strings.ToUpper(gpu1) + "/heartbeat", taskHost("gpubox"), ``, 400, "hex"},
		{"heartbeat unknown id", "POST", "/v1/job/" + unknown + "/heartbeat", taskHost("gpubox"), ``, 410, "no longer claimed"},
		{"heartbeat wrong worker", "POST", "/v1/job/" + gpu1 + "/heartbeat", taskHost("pi"), ``, 410, "no longer claimed"},
		{"complete wrong worker", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("pi"), `{"artifact_id": "` + taskSHA(good) + `"}`, 410, "no longer claimed"},
		{"complete without artifact", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `{}`, 400, "artifact_id required"},
		{"complete artifact not uploaded", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `{"artifact_id": "` + taskSHA(good) + `"}`, 400, "not uploaded"},
		{"complete bad artifact", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `{"artifact_id": "xyz"}`, 400, "64"},
		{"complete not JSON", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `artifact`, 400, "body must be JSON"},
		{"fail wrong worker", "POST", "/v1/job/" + gpu1 + "/fail", taskHost("pi"), `{"error": "x"}`, 410, "no longer claimed"},
		{"fail not JSON", "POST", "/v1/job/" + gpu1 + "/fail", taskHost("gpubox"), `oops`, 400, "body must be JSON"},
		{"fail unknown", "POST", "/v1/job/" + unknown + "/fail", taskHost("gpubox"), `{}`, 410, "no longer claimed"},
		{"upload unknown task", "PUT", "/v1/model/" + unknown, upHdr("gpubox", taskSHA(good)), string(good), 404, "unknown job_id"},
		{"upload bad id", "PUT", "/v1/model/123", upHdr("gpubox", taskSHA(good)), string(good), 400, "64"},
		{"upload without host", "PUT", "/v1/model/" + gpu1, map[string]string{"X-Content-SHA256": taskSHA(good)}, string(good), 400, "X-Lab-Host"},
		{"upload without sha", "PUT", "/v1/model/" + gpu1, taskHost("gpubox"), string(good), 400, "X-Content-SHA256"},
		{"upload short sha", "PUT", "/v1/model/" + gpu1, upHdr("gpubox", "abc"), string(good), 400, "X-Content-SHA256"},
		{"upload wrong sha", "PUT", "/v1/model/" + gpu1, upHdr("gpubox", taskSHA([]byte("other"))), string(good), 400, `"actual_sha256":"` + taskSHA(good) + `"`},
		{"upload too large", "PUT", "/v1/model/" + gpu1, upHdr("gpubox", taskSHA(big)), string(big), 413, "exceeds max size"},
		{"jobs bad status", "GET", "/v1/jobs?status=done", nil, ``, 400, "not one of"},
		{"cancel bad token", "POST", "/v1/job/" + gpu1 + "/cancel", map[string]string{"X-Operator-Token": "wrong"}, ``, 401, "operator token required"},
		{"requeue no token", "POST", "/v1/job/" + gpu1 + "/requeue", nil, ``, 401, "operator token required"},
		{"cancel bad id", "POST", "/v1/job/zz/cancel", map[string]string{"X-Operator-Token": taskOpToken}, ``, 400, "64"},
		{"reload no token", "POST", "/v1/manifest/reload", nil, ``, 401, "operator token required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.snapshot()
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			code, got := e.req(tt.method, tt.path, tt.hdr, body)
			if code != tt.status || !strings.Contains(string(got), tt.want) {
				t.Fatalf("got %d %s, want %d mentioning %q", code, got, tt.status, tt.want)
			}
			if !json.Valid(got) || !bytes.HasPrefix(got, []byte("{")) {
				t.Fatalf("answer is not a JSON object: %s", got)
			}
			if after := e.snapshot(); after != before {
				t.Fatalf("a refused request changed something:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
	if e.reloads != 0 {
		t.Errorf("reload ran %d times without an operator", e.reloads)
	}
}

// TestFleetUploadLimitsWhileStreaming: a chunked body (no Content-Length)
// over the limit, and a body cut off mid-way, leave nothing behind.
func TestFleetUploadLimitsWhileStreaming(t *testing.T) {
	e := newTaskEnv(t, nil)
	e.req("POST", "/v1/job/claim", taskHost("gpubox"), strings.NewReader(`{"capability": {}}`))
	gpu1 := taskTestID("gpu1")
	before := e.snapshot()
	big := bytes.Repeat([]byte("y"), 200<<10)
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 200; i++ {
			if _, err := pw.Write(big[i<<10 : (i+1)<<10]); err != nil {
				return
			}
		}
		pw.Close()
	}()
	code, body := e.req("PUT", "/v1/model/"+gpu1, map[string]string{"X-Lab-Host": "gpubox", "X-Content-SHA256": taskSHA(big)}, pr)
	pr.Close()
	if code != 413 {
		t.Fatalf("chunked oversize upload: %d %s", code, body)
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("oversize upload changed something: %s", after)
	}

	// A raw connection announces 1000 bytes, sends 300 and hangs up.
	addr := strings.TrimPrefix(e.http.URL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("z"), 1000)
	fmt.Fprintf(conn, "PUT /v1/model/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Lab-Host: gpubox\r\nX-Content-SHA256: %s\r\nContent-Length: 1000\r\n\r\n", gpu1, testAgent, taskSHA(payload))
	conn.Write(payload[:300])
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), "cut off") {
			t.Errorf("cut-off upload: %d %s", resp.StatusCode, b)
		}
	}
	conn.Close()
	err = poll.Try(5*time.Second, func() error {
		if got := e.snapshot(); got != before {
			return fmt.Errorf("a cut-off upload left something: %s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFleetOperatorLoopbackOnly: with no operator token configured, the
// operator endpoints take loopback callers only on a server without any
// token; once a token is configured, loopback is not enough (behind a local
// proxy everyone is on loopback): an admin token is (issue 12, finding 2).
func TestFleetOperatorLoopbackOnly(t *testing.T) {
	id := taskTestID("cpu1")
	cancel := func(e *taskEnv, remote, auth string) *httptest.ResponseRecorder {
		r := testRequest("POST", "/v1/job/"+id+"/cancel", nil)
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(w, r)
		return w
	}
	open := newTaskEnv(t, func(o *Options) { o.Tasks.OperatorToken = ""; o.Tokens = nil })
	if w := cancel(open, "10.1.2.3:4567", ""); w.Code != 401 || !strings.Contains(w.Body.String(), "loopback") {
		t.Fatalf("remote operator call: %d %s", w.Code, w.Body)
	}
	if w := cancel(open, "127.0.0.1:4567", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"ok":true`) {
		t.Fatalf("loopback operator call: %d %s", w.Code, w.Body)
	}
	e := newTaskEnv(t, func(o *Options) { o.Tasks.OperatorToken = "" })
	if w := cancel(e, "127.0.0.1:4567", ""); w.Code != 401 || !strings.Contains(w.Body.String(), "admin bearer token") {
		t.Fatalf("loopback operator call with tokens configured: %d %s", w.Code, w.Body)
	}
	if w := cancel(e, "127.0.0.1:4567", testUser); w.Code != 403 {
		t.Fatalf("operator call with a user token: %d %s", w.Code, w.Body)
	}
	if w := cancel(e, "10.1.2.3:4567", testAdmin); w.Code != 200 || !strings.Contains(w.Body.String(), `"ok"`) {
		t.Fatalf("operator call with an admin token: %d %s", w.Code, w.Body)
	}
}

// TestTasksNativeAPI drives the native routes through the Go client.
func TestTasksNativeAPI(t *testing.T) {
	e := newTaskEnv(t, nil)
	ctx := context.Background()
	agent := client.New(e.http.URL, testAgent)
	admin := client.New(e.http.URL, testAdmin)
	user := client.New(e.http.URL, testUser)

	if _, err := user.ClaimTask(ctx, "gpubox", arbiter.Capability{}, client.ClaimOptions{}); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("a user claimed: %v", err)
	}
	// GPU tasks only first: gpu1 (2 GPUs) on gpubox.
	tk, err := agent.ClaimTask(ctx, "gpubox", arbiter.Capability{Cores: 8}, client.ClaimOptions{NoCPU: true})
	if err != nil || tk == nil || tk.Name != "gpu1" || len(tk.GPUs) != 2 || tk.AllocationID == 0 {
		t.Fatalf("claim: %+v %v", tk, err)
	}
	if a, _ := admin.Allocation(ctx, tk.AllocationID); a.Owner != arbiter.TaskOwnerPrefix+tk.ID || a.State != arbiter.StateReady {
		t.Fatalf("the task's allocation: %+v", a)
	}
	if _, err := agent.HeartbeatTask(ctx, tk.ID, "other", 0); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("heartbeat by another worker: %v", err)
	}
	got, err := agent.HeartbeatTask(ctx, tk.ID, "gpubox", tk.Claim)
	if err != nil || got.Status != arbiter.TaskRunning {
		t.Fatalf("heartbeat: %+v %v", got, err)
	}
	data := []byte("result bytes")
	a, existed, err := agent.UploadArtifact(ctx, tk.ID, "gpubox", taskSHA(data), bytes.NewReader(data), int64(len(data)))
	if err != nil || existed || a.ID != taskSHA(data) || a.TaskID != tk.ID || a.Model != "gbt" || a.Worker != "gpubox" {
		t.Fatalf("upload: %+v %v %v", a, existed, err)
	}
	if _, _, err := agent.UploadArtifact(ctx, tk.ID, "gpubox", taskSHA([]byte("x")), bytes.NewReader(data), int64(len(data))); arbiter.ErrorCode(err) != arbiter.EInvalid ||
		!strings.Contains(err.Error(), taskSHA(data)) {
		t.Fatalf("upload with a wrong sha: %v", err)
	}
	if _, err := agent.CompleteTask(ctx, tk.ID, "gpubox", tk.Claim, ""); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Fatalf("complete without an artifact: %v", err)
	}
	done, err := agent.CompleteTask(ctx, tk.ID, "gpubox", tk.Claim, a.ID)
	if err != nil || done.Status != arbiter.TaskCompleted {
		t.Fatalf("complete: %+v %v", done, err)
	}
	if a, _ := admin.Allocation(ctx, tk.AllocationID); a.State != arbiter.StateDestroyed {
		t.Fatalf("the allocation after completion: %s", a.State)
	}
	var buf bytes.Buffer
	if n, err := user.DownloadArtifact(ctx, a.ID, &buf); err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("download: %d %v %q", n, err, buf.Bytes())
	}
	arts, err := user.Artifacts(ctx, tk.ID)
	if err != nil || len(arts) != 1 {
		t.Fatalf("artifacts: %+v %v", arts, err)
	}
	// Listing, summary, workers.
	ts, err := user.Tasks(ctx, client.TaskFilter{Status: arbiter.TaskPending})
	if err != nil || len(ts) != 2 {
		t.Fatalf("pending tasks: %d %v", len(ts), err)
	}
	sum, err := user.TaskSummary(ctx)
	if err != nil || sum.Counts["completed"] != 1 || sum.Counts["pending"] != 2 || sum.Total != 3 || sum.Manifest == nil || sum.Workers != 1 {
		t.Fatalf("summary: %+v %v", sum, err)
	}
	ws, err := user.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].Name != "gpubox" || ws[0].Capability.Cores != 8 {
		t.Fatalf("workers: %+v %v", ws, err)
	}
	// Operator actions need admin.
	cpu1 := taskTestID("cpu1")
	if _, err := user.CancelTask(ctx, cpu1, ""); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("a user cancelled: %v", err)
	}
	c, err := admin.CancelTask(ctx, cpu1, "wrong data")
	if err != nil || c.Status != arbiter.TaskCancelled || !strings.Contains(c.LastError, "wrong data") {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if _, err := admin.CancelTask(ctx, cpu1, ""); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("cancel twice: %v", err)
	}
	if r, err := admin.RequeueTask(ctx, cpu1); err != nil || r.Status != arbiter.TaskPending {
		t.Fatalf("requeue: %+v %v", r, err)
	}
	if rep, err := admin.ReloadTasks(ctx); err != nil || rep.Unchanged != 3 {
		t.Fatalf("reload: %+v %v", rep, err)
	}
	e.reload = func() (arbiter.TaskSyncReport, error) {
		return arbiter.TaskSyncReport{}, fmt.Errorf("m.toml:9: jobs[1]: model: missing")
	}
	if _, err := admin.ReloadTasks(ctx); arbiter.ErrorCode(err) != arbiter.EInvalid || !strings.Contains(err.Error(), "m.toml:9") {
		t.Fatalf("bad reload: %v", err)
	}
}

func TestTasksNativeBadInput(t *testing.T) {
	e := newTaskEnv(t, nil)
	agent := client.New(e.http.URL, testAgent)
	tk, _ := agent.ClaimTask(context.Background(), "gpubox", arbiter.Capability{}, client.ClaimOptions{})
	id, unknown := tk.ID, taskTestID("nope")
	tok := map[string]string{"Authorization": "Bearer " + testAgent, "Content-Type": "application/json"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range tok {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		body               string
		status             int
		code, want         string
	}{
		{"claim unknown field", "POST", "/api/v1/tasks/claim", tok, `{"worker":"w","cpus":3}`, 400, "invalid", "cpus"},
		{"claim no worker", "POST", "/api/v1/tasks/claim", tok, `{}`, 400, "invalid", "worker"},
		{"claim not JSON", "POST", "/api/v1/tasks/claim", tok, `worker=w`, 400, "invalid", "not valid JSON"},
		{"claim without token", "POST", "/api/v1/tasks/claim", nil, `{"worker":"w"}`, 401, "unauthorized", "bearer"},
		{"heartbeat bad id", "POST", "/api/v1/tasks/xyz/heartbeat", tok, `{"worker":"gpubox"}`, 400, "invalid", "64"},
		{"heartbeat unknown", "POST", "/api/v1/tasks/" + unknown + "/heartbeat", tok, `{"worker":"gpubox"}`, 404, "not_found", "does not exist"},
		{"heartbeat wrong worker", "POST", "/api/v1/tasks/" + id + "/heartbeat", tok, `{"worker":"pi"}`, 409, "conflict", "no longer claimed by pi"},
		{"complete wrong worker", "POST", "/api/v1/tasks/" + id + "/complete", tok, `{"worker":"pi","artifact_id":"` + taskSHA([]byte("a")) + `"}`, 409, "conflict", "no longer claimed"},
		{"fail no worker", "POST", "/api/v1/tasks/" + id + "/fail", tok, `{"error":"x"}`, 400, "invalid", "worker"},
		{"upload wrong sha", "PUT", "/api/v1/tasks/" + id + "/artifact?worker=gpubox", with(map[string]string{"X-Content-SHA256": taskSHA([]byte("b"))}), "a", 400, "invalid", taskSHA([]byte("a"))},
		{"upload too large", "PUT", "/api/v1/tasks/" + id + "/artifact?worker=gpubox", with(map[string]string{"X-Content-SHA256": taskSHA([]byte("b"))}), strings.Repeat("b", 64<<10+1), 413, "too_large", "limit"},
		{"upload no worker", "PUT", "/api/v1/tasks/" + id + "/artifact", with(map[string]string{"X-Content-SHA256": taskSHA([]byte("a"))}), "a", 400, "invalid", "worker"},
		{"cancel by agent", "POST", "/api/v1/tasks/" + id + "/cancel", tok, ``, 403, "forbidden", "admin"},
		{"list bad status", "GET", "/api/v1/tasks?status=x", tok, ``, 400, "invalid", "not one of"},
		{"list unknown param", "GET", "/api/v1/tasks?stat=x", tok, ``, 400, "invalid", "stat"},
		{"artifact bad id", "GET", "/api/v1/artifacts/abc", tok, ``, 400, "invalid", "64"},
		{"artifact unknown", "GET", "/api/v1/artifacts/" + unknown + "/content", tok, ``, 404, "not_found", "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := e.snapshot()
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			code, got := e.req(tt.method, tt.path, tt.hdr, body)
			var eb errorBody
			json.Unmarshal(got, &eb)
			if code != tt.status || eb.Error.Code != tt.code || !strings.Contains(eb.Error.Message, tt.want) {
				t.Fatalf("got %d %s, want %d %s mentioning %q", code, got, tt.status, tt.code, tt.want)
			}
			if after := e.snapshot(); after != before {
				t.Fatalf("a refused request changed something:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestTasksOffWithoutOptions(t *testing.T) {
	s, _ := testServer(t, nil)
	a := call(t, s, "GET", "/api/v1/tasks", testAdmin, nil)
	if code, _ := a.errorBody(t); a.status != 404 || code != "not_found" {
		t.Fatalf("got %d %s", a.status, a.body)
	}
	a = call(t, s, "POST", "/v1/job/claim", testAgent, `{}`)
	if a.status != 404 || !strings.Contains(string(a.body), "no work queue") {
		t.Fatalf("got %d %s", a.status, a.body)
	}
}

// FuzzFleetClaimBody sends arbitrary bodies and capabilities to the claim
// endpoint: always a JSON answer, never a 5xx.
func FuzzFleetClaimBody(f *testing.F) {
	f.Add([]byte(`{"capability": {"hostname": "h", "gpus": [{"index": 0, "vram_gib": 24}], "x": [1, {"y": null}]}}`))
	f.Add([]byte(`{"capability": null}`))
	f.Add([]byte(`{"capability": {"gpus": [{"index": 0}, {"index": 0}]}}`))
	f.Add([]byte(`null`))
	s := NewServer(Options{Plane: taskClaimPlane{newFakePlane()}, Tasks: &TaskOptions{Artifacts: &artifact.Store{}}})
	f.Fuzz(func(t *testing.T, body []byte) {
		r := testRequest("POST", "/v1/job/claim", bytes.NewReader(body))
		r.Header.Set("X-Lab-Host", "fuzz")
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code >= 500 && w.Code != 503 {
			t.Fatalf("got %d %s", w.Code, w.Body)
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("answer is not JSON: %s", w.Body)
		}
	})
}

// taskClaimPlane answers claims with nothing to do.
type taskClaimPlane struct{ *fakePlane }

func (taskClaimPlane) Do(_ context.Context, cmd arbiter.Command) (any, error) {
	if c, ok := cmd.(arbiter.ClaimTask); ok {
		if err := arbiter.ValidateName("worker", c.Worker); err != nil {
			return nil, err
		}
		return arbiter.TaskClaim{}, c.Capability.Validate()
	}
	return nil, arbiter.Errorf(arbiter.EInvalid, "unexpected %T", cmd)
}

// TestFleetRegistersHostOnlyWhenTrusted: X-Lab-Host alone (the open worker
// API) is not authenticated, so a /v1 claim registers its host as a
// machine only with an agent token (or a client certificate).
func TestFleetRegistersHostOnlyWhenTrusted(t *testing.T) {
	e := newTaskEnv(t, func(o *Options) { o.Tasks.OpenWorkerAPI = true })
	gpuCap := `{"capability": {"cuda": true, "gpus": [{"index": 0, "name": "RTX 4090", "vram_gib": 24, "uuid": "GPU-1"}, {"index": 1, "name": "RTX 4090", "vram_gib": 24, "uuid": "GPU-2"}]}}`
	code, body := e.req("POST", "/v1/job/claim", map[string]string{"X-Lab-Host": "lab7", "Authorization": ""}, strings.NewReader(gpuCap))
	if code != 200 {
		t.Fatalf("claim: %d %s", code, body)
	}
	if _, ok := e.loop.Machine("lab7"); ok {
		t.Fatal("an unauthenticated claim registered a machine")
	}
	hdr := map[string]string{"X-Lab-Host": "lab7", "Authorization": "Bearer " + testAgent}
	if code, body := e.req("POST", "/v1/job/claim", hdr, strings.NewReader(gpuCap)); code != 200 || !strings.Contains(string(body), `"cuda_visible_devices":"0,1"`) {
		t.Fatalf("claim with an agent token: %d %s", code, body)
	}
	if m, ok := e.loop.Machine("lab7"); !ok || len(m.Devices) != 2 || m.Free != 0 {
		t.Fatalf("machine from the capability: %+v %v", m, ok)
	}
}

// TestWorkerCertificateNamesItsHostExactly: a client certificate for
// gpubox does not let a worker call itself GPUBOX — a second machine,
// names being case-sensitive, with the same GPUs.
func TestWorkerCertificateNamesItsHostExactly(t *testing.T) {
	e := newTaskEnv(t, nil)
	for host, ok := range map[string]bool{"gpubox": true, "GPUBOX": false, "gpubox.lab": true, "GpuBox": false} {
		r := testRequest("POST", "/v1/job/claim", nil)
		r.Header.Set("X-Lab-Host", host)
		cert := &x509.Certificate{Subject: pkix.Name{CommonName: "gpubox"}, DNSNames: []string{"gpubox.lab"}}
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
		c, _, err := e.srv.authorizeWorker(httptest.NewRecorder(), r)
		switch {
		case ok && (err != nil || c.Name != host || c.Role != arbiter.RoleAgent):
			t.Errorf("X-Lab-Host %s under a certificate for it: %+v %v", host, c, err)
		case !ok && arbiter.ErrorCode(err) != arbiter.EForbidden:
			t.Errorf("X-Lab-Host %s under a certificate for gpubox: %+v %v, want forbidden", host, c, err)
		}
	}
}

// TestArtifactsOfATaskIncludeWhatItCompletedWith: identical bytes uploaded
// for a second task are stored once, under the first; the second task,
// completed with them, still lists them as its artifact.
func TestArtifactsOfATaskIncludeWhatItCompletedWith(t *testing.T) {
	e := newTaskEnv(t, nil)
	e.req("POST", "/v1/job/claim", taskHost("gpubox"), strings.NewReader(`{}`))
	e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{}`))
	gpu1, cpu1 := taskTestID("gpu1"), taskTestID("cpu1")
	bundle := []byte("same bytes")
	sha := taskSHA(bundle)
	for _, w := range []struct{ host, id string }{{"gpubox", gpu1}, {"pi", cpu1}} {
		if code, body := e.req("PUT", "/v1/model/"+w.id, map[string]string{"X-Lab-Host": w.host, "X-Content-SHA256": sha}, bytes.NewReader(bundle)); code/100 != 2 {
			t.Fatalf("upload: %d %s", code, body)
		}
		if code, body := e.req("POST", "/v1/job/"+w.id+"/complete", taskHost(w.host), strings.NewReader(`{"artifact_id":"`+sha+`"}`)); code != 200 {
			t.Fatalf("complete: %d %s", code, body)
		}
	}
	for _, id := range []string{gpu1, cpu1} {
		_, body := e.req("GET", "/api/v1/artifacts?task="+id, map[string]string{"Authorization": "Bearer " + testAgent}, nil)
		var out struct {
			Artifacts []arbiter.Artifact `json:"artifacts"`
		}
		if err := json.Unmarshal(body, &out); err != nil || len(out.Artifacts) != 1 || out.Artifacts[0].ID != sha {
			t.Errorf("artifacts of task %s…: %s", id[:8], body)
		}
	}
}

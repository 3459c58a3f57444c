package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/artifact"
)

// The exact answers of the fleet's /v1 API (docs/reference/fleet.md §3) that its
// workers and operator tools parse: status codes, key sets and values.

// jsonKeys returns the sorted top-level keys of a JSON object answer,
// joined by commas.
func jsonKeys(t *testing.T, body []byte) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %s", body)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func TestFleetExactAnswers(t *testing.T) {
	e := newTaskEnv(t, nil)
	op := map[string]string{"X-Operator-Token": taskOpToken}
	gpu1, cpu1, cpu2, unknown := taskTestID("gpu1"), taskTestID("cpu1"), taskTestID("cpu2"), taskTestID("nope")

	// A claim: the fleet's four keys (plus what the claim holds), and a
	// spec with the manifest's fields.
	code, body := e.req("POST", "/v1/job/claim", taskHost("gpubox"), strings.NewReader(`{"capability": {"cuda": true}}`))
	if code != 200 || jsonKeys(t, body) != "allocation_id,attempts,cuda_visible_devices,gpus,job_id,name,spec" {
		t.Fatalf("claim: %d %s", code, body)
	}
	var claim struct {
		JobID string                     `json:"job_id"`
		Spec  map[string]json.RawMessage `json:"spec"`
	}
	json.Unmarshal(body, &claim)
	for _, k := range []string{"model", "mode", "hyper", "split_recipe", "train_hosts", "seed", "priority", "require_cuda", "prefer_cuda",
		"min_vram_gib", "min_ram_gib", "gpus", "allowed_hosts", "command", "max_attempts", "stale_after_s"} {
		if _, ok := claim.Spec[k]; !ok {
			t.Errorf("the claim's spec has no %q: %s", k, body)
		}
	}
	if claim.JobID != gpu1 {
		t.Fatalf("claimed %s, want gpu1", claim.JobID)
	}
	// A CPU claim holds no GPUs: the additions are empty, not absent.
	code, body = e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{"capability": null}`))
	if code != 200 || !bytes.Contains(body, []byte(`"allocation_id":null,"gpus":[],"cuda_visible_devices":""`)) {
		t.Fatalf("cpu claim: %d %s", code, body)
	}
	// urllib's default Content-Type for a POST body is form-encoded; the
	// body is read as JSON whatever the header says, as the fleet's server
	// did. A body of null is an empty claim, as the fleet's (body or {}).
	form := map[string]string{"X-Lab-Host": "pi", "Content-Type": "application/x-www-form-urlencoded"}
	if code, body := e.req("POST", "/v1/job/claim", form, strings.NewReader(`null`)); code != 200 || jsonKeys(t, body) != "allocation_id,attempts,cuda_visible_devices,gpus,job_id,name,spec" {
		t.Fatalf("claim with a null body: %d %s", code, body)
	}

	bundle := []byte("bundle bytes")
	sha := taskSHA(bundle)
	up := map[string]string{"X-Lab-Host": "gpubox", "X-Content-SHA256": strings.ToUpper(sha)} // the fleet lower-cased it
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		body               string
		status             int
		want               string // the whole answer, or its keys when it starts with "keys:"
	}{
		{"heartbeat", "POST", "/v1/job/" + gpu1 + "/heartbeat", taskHost("gpubox"), ``, 200, `{"ok":true}`},
		{"heartbeat with a body", "POST", "/v1/job/" + gpu1 + "/heartbeat", taskHost("gpubox"), `{}`, 200, `{"ok":true}`},
		{"upload stored", "PUT", "/v1/model/" + gpu1, up, string(bundle), 201, `{"artifact_id":"` + sha + `","size_bytes":12,"status":"stored"}`},
		{"upload again", "PUT", "/v1/model/" + gpu1, up, string(bundle), 200, `{"artifact_id":"` + sha + `","status":"already-present"}`},
		{"upload mismatch", "PUT", "/v1/model/" + gpu1, map[string]string{"X-Lab-Host": "gpubox", "X-Content-SHA256": taskSHA(nil)}, "other", 400,
			`{"actual_sha256":"` + taskSHA([]byte("other")) + `","status":"sha-mismatch"}`},
		{"upload to a task not the worker's", "PUT", "/v1/model/" + cpu2, up, string(bundle), 200, `{"artifact_id":"` + sha + `","status":"already-present"}`},
		{"complete", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `{"artifact_id": "` + strings.ToUpper(sha) + `"}`, 200, `{"ok":true}`},
		{"heartbeat after complete", "POST", "/v1/job/" + gpu1 + "/heartbeat", taskHost("gpubox"), ``, 410, `keys:error`},
		{"complete twice", "POST", "/v1/job/" + gpu1 + "/complete", taskHost("gpubox"), `{"artifact_id": "` + sha + `"}`, 410, `keys:error`},
		{"fail after complete", "POST", "/v1/job/" + gpu1 + "/fail", taskHost("gpubox"), `{"error": "x"}`, 410, `keys:error`},
		{"fail without a message", "POST", "/v1/job/" + cpu1 + "/fail", taskHost("pi"), `{}`, 200, `{"ok":true}`},
		{"cancel unknown", "POST", "/v1/job/" + unknown + "/cancel", op, ``, 200, `keys:ok,reason`},
		{"cancel completed", "POST", "/v1/job/" + gpu1 + "/cancel", op, ``, 200, `keys:ok,reason`},
		{"requeue pending", "POST", "/v1/job/" + cpu1 + "/requeue", op, ``, 200, `keys:ok,reason`},
		{"requeue completed", "POST", "/v1/job/" + gpu1 + "/requeue", op, ``, 200, `keys:ok,reason`},
		{"requeue unknown", "POST", "/v1/job/" + unknown + "/requeue", op, ``, 200, `keys:ok,reason`},
		{"cancel claimed", "POST", "/v1/job/" + cpu2 + "/cancel", op, ``, 200, `{"ok":true}`},
		{"requeue cancelled", "POST", "/v1/job/" + cpu2 + "/requeue", op, ``, 200, `{"ok":true}`},
		{"reload", "POST", "/v1/manifest/reload", op, ``, 200, `{"counts":{"added":0,"removed":0,"unchanged":3,"updated":0},"n_jobs":3,"ok":true}`},
		{"health", "GET", "/v1/health", nil, ``, 200, `{"status":"ok"}`},
		{"workers", "GET", "/v1/workers", nil, ``, 200, `keys:workers`},
		{"jobs", "GET", "/v1/jobs", nil, ``, 200, `keys:jobs`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest(tt.method, e.http.URL+tt.path, strings.NewReader(tt.body))
			if tt.hdr["X-Operator-Token"] == "" {
				r.Header.Set("Authorization", "Bearer "+testAgent) // a worker with an agent token
			}
			for k, v := range tt.hdr {
				r.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if resp.StatusCode != tt.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, got, tt.status)
			}
			if keys, ok := strings.CutPrefix(tt.want, "keys:"); ok {
				if k := jsonKeys(t, got); k != keys {
					t.Fatalf("got %s, want the keys %s", got, keys)
				}
				return
			}
			// Compare as JSON values: key order is not part of the contract.
			var a, b any
			json.Unmarshal(got, &a)
			json.Unmarshal([]byte(tt.want), &b)
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
	if got := e.task("cpu1"); got.LastError != "no error message" {
		t.Errorf("fail without a message recorded %q", got.LastError)
	}

	// Every row of GET /v1/jobs has exactly the fleet's columns; times are
	// null until they happen.
	_, body = e.req("GET", "/v1/jobs?status=pending", nil, nil)
	var jobs struct {
		Jobs []map[string]json.RawMessage `json:"jobs"`
	}
	json.Unmarshal(body, &jobs)
	if len(jobs.Jobs) != 2 {
		t.Fatalf("pending jobs: %s", body)
	}
	var keys []string
	for k := range jobs.Jobs[0] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if got := strings.Join(keys, ","); got != "artifact_id,attempts,claimed_at,claimed_by,completed_at,heartbeat_at,job_id,last_error,mode,model,name,priority,status" {
		t.Errorf("a job row has keys %s", got)
	}
	for _, j := range jobs.Jobs {
		if string(j["completed_at"]) != "null" || string(j["artifact_id"]) != "null" {
			t.Errorf("a pending job: %s", body)
		}
	}
	// An unknown query parameter is ignored, as the fleet's server did.
	if code, body := e.req("GET", "/v1/jobs?status=completed&limit=5", nil, nil); code != 200 || !strings.Contains(string(body), gpu1) {
		t.Errorf("jobs with an extra parameter: %d %s", code, body)
	}
}

// TestFleetStaleClaim: once a task was taken from a worker (cancelled,
// requeued and claimed by another), every call of the first worker on it is
// 410 and changes nothing, and the new holder carries on.
func TestFleetStaleClaim(t *testing.T) {
	e := newTaskEnv(t, nil)
	op := map[string]string{"X-Operator-Token": taskOpToken}
	id := taskTestID("cpu1")
	if code, body := e.req("POST", "/v1/job/claim", taskHost("pi"), strings.NewReader(`{}`)); code != 200 || !strings.Contains(string(body), id) {
		t.Fatalf("claim by pi: %d %s", code, body)
	}
	e.req("POST", "/v1/job/"+id+"/cancel", op, nil)
	e.req("POST", "/v1/job/"+id+"/requeue", op, nil)
	if code, body := e.req("POST", "/v1/job/claim", taskHost("pi2"), strings.NewReader(`{}`)); code != 200 || !strings.Contains(string(body), id) {
		t.Fatalf("reclaim by pi2: %d %s", code, body)
	}
	art := []byte("old worker's result")
	e.req("PUT", "/v1/model/"+id, map[string]string{"X-Lab-Host": "pi", "X-Content-SHA256": taskSHA(art)}, bytes.NewReader(art))
	before := e.snapshot()
	for _, c := range []struct{ path, body string }{
		{"/heartbeat", ``}, {"/complete", `{"artifact_id": "` + taskSHA(art) + `"}`}, {"/fail", `{"error": "late"}`},
	} {
		if code, body := e.req("POST", "/v1/job/"+id+c.path, taskHost("pi"), strings.NewReader(c.body)); code != 410 || jsonKeys(t, body) != "error" {
			t.Errorf("%s by the old worker: %d %s, want 410", c.path, code, body)
		}
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("the old worker changed something:\nbefore %s\nafter  %s", before, after)
	}
	if code, body := e.req("POST", "/v1/job/"+id+"/heartbeat", taskHost("pi2"), nil); code != 200 {
		t.Fatalf("the new holder's heartbeat: %d %s", code, body)
	}
	if got := e.task("cpu1"); got.Status != arbiter.TaskRunning || got.ClaimedBy != "pi2" || got.Attempts != 1 {
		t.Fatalf("after the old worker's calls: %+v", got)
	}
}

// TestFleetUploadRefusedFromContentLength: an announced size over the limit
// is refused before a byte of the body is read.
func TestFleetUploadRefusedFromContentLength(t *testing.T) {
	e := newTaskEnv(t, nil)
	id := taskTestID("gpu1")
	before := e.snapshot()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	// Announces 10 GiB and sends none of it: only an answer from the
	// headers can come back.
	fmt.Fprintf(conn, "PUT /v1/model/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Lab-Host: gpubox\r\nX-Content-SHA256: %s\r\nContent-Length: %d\r\n\r\n", id, testAgent, taskSHA(nil), int64(10)<<30)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || jsonKeys(t, b) != "error" || !strings.Contains(string(b), "exceeds max size") {
		t.Fatalf("got %d %s, want 413", resp.StatusCode, b)
	}
	if after := e.snapshot(); after != before {
		t.Fatalf("a refused upload changed something: %s", after)
	}
}

// TestFleetOperatorOnOpenServer: a server with no bearer tokens treats every
// caller as admin on its native API, but that must not make a /v1 caller an
// operator: with an operator token configured only that token opens the
// operator calls; with none, only loopback callers.
func TestFleetOperatorOnOpenServer(t *testing.T) {
	e := newTaskEnv(t, func(o *Options) { o.Tokens = nil })
	id := taskTestID("cpu1")
	call := func(remote string, hdr map[string]string) (int, string) {
		r := testRequest("POST", "/v1/job/"+id+"/cancel", nil)
		r.RemoteAddr = remote
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	if code, body := call("127.0.0.1:1", map[string]string{"Authorization": "Bearer anything"}); code != 401 || !strings.Contains(body, "operator token required") {
		t.Fatalf("bearer on an open server: %d %s", code, body)
	}
	if code, body := call("127.0.0.1:1", map[string]string{"X-Operator-Token": taskOpToken + "x"}); code != 401 {
		t.Fatalf("a wrong operator token: %d %s", code, body)
	}
	if code, body := call("10.0.0.9:1", map[string]string{"X-Operator-Token": taskOpToken}); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("the operator token from afar: %d %s", code, body)
	}

	e = newTaskEnv(t, func(o *Options) { o.Tokens = nil; o.Tasks.OperatorToken = "" })
	if code, body := call("[::1]:1", nil); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("loopback (IPv6) with no operator token: %d %s", code, body)
	}
	if code, body := call("192.168.1.5:1", map[string]string{"Authorization": "Bearer anything", "X-Operator-Token": "guess"}); code != 401 {
		t.Fatalf("a remote caller on an open server with no operator token: %d %s", code, body)
	}
}

// fleetErrPlane fails every command with err.
type fleetErrPlane struct {
	*fakePlane
	err error
}

func (p fleetErrPlane) Do(ctx context.Context, cmd arbiter.Command) (any, error) { return nil, p.err }

// TestFleetErrorsMapped: errors other than the worker's own are answered
// in the fleet's form with the status of the one code table; an unexpected
// one is 500 "internal error", logged.
func TestFleetErrorsMapped(t *testing.T) {
	id := taskTestID("x")
	tests := []struct {
		name   string
		err    error
		status int
		want   string
	}{
		{"conflict", arbiter.Errorf(arbiter.EConflict, "taken"), 410, "no longer claimed"},
		{"not found", arbiter.Errorf(arbiter.ENotFound, "gone"), 410, "no longer claimed"},
		{"invalid", arbiter.Errorf(arbiter.EInvalid, "capability: bad"), 400, "capability: bad"},
		{"unavailable", arbiter.Errorf(arbiter.EUnavailable, "not the leader"), 503, "not the leader"},
		{"too large", arbiter.Errorf(arbiter.ETooLarge, "too much"), 413, "too much"},
		{"unexpected", errors.New("disk on fire"), 500, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := NewServer(Options{Plane: fleetErrPlane{newFakePlane(), tt.err}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				Tasks: &TaskOptions{Artifacts: &artifact.Store{}}})
			for _, path := range []string{"/v1/job/claim", "/v1/job/" + id + "/heartbeat"} {
				r := testRequest("POST", path, strings.NewReader(`{}`))
				r.Header.Set("X-Lab-Host", "w1")
				w := httptest.NewRecorder()
				s.Handler().ServeHTTP(w, r)
				var eb map[string]string
				if w.Code != tt.status || json.Unmarshal(w.Body.Bytes(), &eb) != nil || !strings.Contains(eb["error"], tt.want) {
					t.Errorf("%s: got %d %s, want %d {\"error\": …%s…}", path, w.Code, w.Body, tt.status, tt.want)
				}
			}
			if logged := strings.Contains(logs.String(), "disk on fire"); logged != (tt.status == 500) {
				t.Errorf("logged %v: %s", logged, logs.String())
			}
		})
	}
}

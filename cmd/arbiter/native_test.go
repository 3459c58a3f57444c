package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/clock"
)

// The fixed points of docs/reference/native.md that the command line owns: the
// server's defaults and overriding flags, ARBITER_URL and ARBITER_TOKEN.

func TestServerDefaultsAndOverrides(t *testing.T) {
	env := &cli.Env{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	m, err := newServerMain(env, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No file: SQLite under ./arbiter-data, listening on 127.0.0.1:7070.
	s := m.cfg.Server
	if kind, target := s.DatabaseTarget(); s.Listen != "127.0.0.1:7070" || s.DataDir != "./arbiter-data" ||
		kind != "sqlite" || target != filepath.Join("arbiter-data", "arbiter.db") {
		t.Errorf("defaults: listen %q data_dir %q database %s %q", s.Listen, s.DataDir, kind, target)
	}

	cfg := filepath.Join(t.TempDir(), "arbiter.toml")
	doc := "[server]\nlisten = \"127.0.0.1:7071\"\ndata_dir = \"/srv/a\"\ndatabase = \"sqlite:/srv/a/x.db\"\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if m, err = newServerMain(env, []string{"--config", cfg}); err != nil {
		t.Fatal(err)
	}
	if s := m.cfg.Server; s.Listen != "127.0.0.1:7071" || s.DataDir != "/srv/a" || s.Database != "sqlite:/srv/a/x.db" {
		t.Errorf("from the file: %+v", s)
	}
	// --data-dir, --listen and --database override the file.
	m, err = newServerMain(env, []string{"--config", cfg, "--data-dir", "/srv/b", "--listen", "127.0.0.1:0", "--database", "postgres://u@db:5432/arbiter"})
	if err != nil {
		t.Fatal(err)
	}
	if s := m.cfg.Server; s.Listen != "127.0.0.1:0" || s.DataDir != "/srv/b" || s.Database != "postgres://u@db:5432/arbiter" {
		t.Errorf("flags: %+v", s)
	}
	if _, err := newServerMain(env, []string{"--database", "mysql://x"}); err == nil || !strings.Contains(err.Error(), "server.database") {
		t.Errorf("--database mysql://x: got %v, want an error naming server.database", err)
	}
}

func TestServerUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"server", "--bogus"}, {"server", "now"}} {
		_, stderr, code := cmdline(t, "http://127.0.0.1:1", args...)
		if code != 2 || !strings.Contains(stderr, "arbiter server") {
			t.Errorf("%v: got exit %d and %q, want 2 and a message naming the command", args, code, stderr)
		}
	}
}

// nativeDo sends one request to the real server and decodes the answer.
func nativeDo(t *testing.T, method, url, body string, wantStatus int) map[string]any {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s %s: answer is not a JSON object: %v", method, url, err)
	}
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: got %d %v, want %d", method, url, resp.StatusCode, v, wantStatus)
	}
	return v
}

// hasKeys fails unless m has every key of want.
func hasKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks %q: %v", what, k, m)
		}
	}
}

// utcTime fails unless v is an RFC 3339 time in UTC.
func utcTime(t *testing.T, what string, v any) {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Errorf("%s: got %v, want an RFC 3339 string", what, v)
		return
	}
	if tm, err := time.Parse(time.RFC3339Nano, s); err != nil || !strings.HasSuffix(s, "Z") || tm.Location() != time.UTC {
		t.Errorf("%s: got %q, want an RFC 3339 time in UTC", what, s)
	}
}

// TestNativeWireNames drives the real server with the names of
// docs/reference/native.md, spelled as there, and checks the names of its answers.
func TestNativeWireNames(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	_, url := startServer(t, twoHosts, clk)
	api := url + "/api/v1"

	if h := nativeDo(t, "GET", api+"/health", "", 200); h["status"] != "ok" {
		t.Errorf("health: %v, want status ok", h)
	}
	ms := nativeDo(t, "GET", api+"/machines", "", 200)["machines"].([]any)
	m0 := ms[0].(map[string]any)
	hasKeys(t, "machine", m0, "name", "kind", "state", "tags", "devices")
	if m0["kind"] != "gpu" || len(m0["devices"].([]any)) != 8 {
		t.Errorf("machine: %v, want kind gpu with 8 devices", m0)
	}

	a := nativeDo(t, "POST", api+"/allocations", `{"owner":"alice","gpus":2,"min_vram_gib":40,"require_cuda":true,"min_compute":"8.0",
		"model":"*H100*","tags":["default"],"machine":"gpu1","priority":5,"keepalive_s":30}`, 201)
	hasKeys(t, "allocation", a, "id", "owner", "state", "reason", "machine", "devices", "request", "priority",
		"keepalive_s", "created_at", "expires_at", "why_queued")
	if a["owner"] != "alice" || a["state"] != "ready" || a["reason"] != nil || a["machine"] != "gpu1" || a["priority"] != float64(5) ||
		a["keepalive_s"] != float64(30) || a["why_queued"] != nil {
		t.Errorf("allocation: %v", a)
	}
	utcTime(t, "created_at", a["created_at"])
	utcTime(t, "expires_at", a["expires_at"])
	devs := a["devices"].([]any)
	if len(devs) != 2 {
		t.Fatalf("devices: %v, want 2", devs)
	}
	hasKeys(t, "device", devs[0].(map[string]any), "machine", "index", "uuid", "model", "vram_gib")
	hasKeys(t, "request", a["request"].(map[string]any), "owner", "gpus", "min_vram_gib", "require_cuda", "min_compute", "model",
		"tags", "machine", "priority", "keepalive_s")
	id := strconv.FormatInt(int64(a["id"].(float64)), 10)

	// keepalive_s null: never expires. A request that must wait says why.
	n := nativeDo(t, "POST", api+"/allocations", `{"owner":"bob","gpus":1,"keepalive_s":null}`, 201)
	if n["keepalive_s"] != nil || n["expires_at"] != nil {
		t.Errorf("keepalive_s null: %v, want keepalive_s and expires_at null", n)
	}
	q := nativeDo(t, "POST", api+"/allocations", `{"owner":"carol","gpus":8,"machine":"gpu1","keepalive_s":null}`, 201)
	if q["state"] != "queued" || q["machine"] != nil {
		t.Errorf("queued: %v, want state queued and machine null", q)
	}
	if s, ok := q["why_queued"].(string); !ok || s == "" {
		t.Errorf("queued: why_queued %v, want a string", q["why_queued"])
	}

	l := nativeDo(t, "GET", api+"/allocations?state=ready&owner=alice", "", 200)
	if as := l["allocations"].([]any); len(as) != 1 || as[0].(map[string]any)["owner"] != "alice" {
		t.Errorf("list: %v, want alice's allocation", l)
	}
	if g := nativeDo(t, "GET", api+"/allocations/"+id, "", 200); g["id"] != a["id"] {
		t.Errorf("get: %v", g)
	}
	if k := nativeDo(t, "POST", api+"/allocations/"+id+"/keepalive", "", 200); k["id"] != a["id"] {
		t.Errorf("keepalive: %v", k)
	}
	r := nativeDo(t, "DELETE", api+"/allocations/"+id+"?reason=done", "", 200)
	if r["state"] != "destroyed" || r["reason"] != "done" {
		t.Errorf("release: %v, want destroyed, reason done", r)
	}

	e := nativeDo(t, "GET", api+"/allocations/999", "", 404)
	detail, _ := e["error"].(map[string]any)
	if len(e) != 1 || detail["code"] != "not_found" || detail["message"] == "" || len(detail) != 2 {
		t.Errorf("error: %v, want {\"error\": {\"code\": \"not_found\", \"message\": …}}", e)
	}

	// Events: id: is the sequence, event: the kind, data: the JSON event.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api+"/events?since=0", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	fields := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && (len(fields) < 3 || sc.Text() != "") {
		if k, v, ok := strings.Cut(sc.Text(), ": "); ok && (k == "id" || k == "event" || k == "data") {
			fields[k] = v
		}
	}
	var ev struct {
		Seq  int64  `json:"seq"`
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal([]byte(fields["data"]), &ev); err != nil || strconv.FormatInt(ev.Seq, 10) != fields["id"] || ev.Kind != fields["event"] {
		t.Errorf("first event %v (%v): want id: the seq, event: the kind, data: the event", fields, err)
	}
}

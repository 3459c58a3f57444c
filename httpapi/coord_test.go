package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// coordEnv is the real server over the real control loop and a SQLite
// file, with a service vllm on machine gpu1 and a fake clock.
type coordEnv struct {
	t     *testing.T
	s     *Server
	loop  *control.Loop
	plane *listenedPlane // the loop as the server sees it
	clk   *clock.Fake
}

// listenedPlane is the real loop, counting the subscriptions that listen
// to it, so a test can wait until a long-poll or a stream is listening
// instead of sleeping and hoping it is.
type listenedPlane struct {
	*control.Loop
	listening atomic.Int64
}

// Subscribe counts a subscription from its start until its ctx ends (how
// the server's handlers end theirs).
func (p *listenedPlane) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	ch, err := p.Loop.Subscribe(ctx, since)
	if err == nil {
		p.listening.Add(1)
		context.AfterFunc(ctx, func() { p.listening.Add(-1) })
	}
	return ch, err
}

// waitListening waits until exactly n subscriptions listen.
func (e *coordEnv) waitListening(n int64, what string) {
	e.t.Helper()
	poll.Until(e.t, 10*time.Second, what, func() bool { return e.plane.listening.Load() == n })
}

func newCoordEnv(t *testing.T) *coordEnv {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "a.db"), sqlite.Options{Synchronous: "normal"})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now().UTC())
	loop, err := control.Open(context.Background(), control.Options{Store: st, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(); st.Close() })
	e := &coordEnv{t: t, loop: loop, plane: &listenedPlane{Loop: loop}, clk: clk}
	e.do(arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, Tags: []string{}, GPUs: []arbiter.GPU{}}})
	e.do(arbiter.SyncServices{
		Services: []arbiter.Service{{Name: "vllm", Machine: "gpu1", Kind: arbiter.ServiceVLLM, Endpoint: "http://127.0.0.1:8000",
			SwapCommand: []string{"/opt/vllm/launch.sh", "{model}"}, LocalPathRoots: []string{"/models"}, ReadyTimeoutS: 60, SwapTimeoutS: 600}},
		Catalog: []arbiter.CatalogEntry{{Service: "vllm", Key: "gemma", Repo: "google/gemma-3-27b-it"}, {Service: "vllm", Key: "ten31", LocalPath: "/models/ten31"}},
	})
	e.s = NewServer(Options{Plane: e.plane, Tokens: testTokens, Version: "test",
		Coordination: CoordOptions{Deliveries: st, Now: clk.Now}})
	e.s.sseHeartbeat = 50 * time.Millisecond
	return e
}

func (e *coordEnv) do(cmd arbiter.Command) any {
	e.t.Helper()
	res, err := e.loop.Do(context.Background(), cmd)
	if err != nil {
		e.t.Fatalf("%T: %v", cmd, err)
	}
	return res
}

// call sends one request; hdr holds extra headers as "Name: value".
func (e *coordEnv) call(method, path, token string, body any, hdr ...string) answer {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	r := testRequest(method, path, rd)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	e.s.Handler().ServeHTTP(w, r)
	return answer{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

func (e *coordEnv) ok(a answer, status int, v any) {
	e.t.Helper()
	if a.status != status {
		e.t.Fatalf("got %d, want %d: %s", a.status, status, a.body)
	}
	if v != nil {
		a.decode(e.t, v)
	}
}

func TestCoordNativeLocks(t *testing.T) {
	e := newCoordEnv(t)
	var g arbiter.LockGrant
	e.ok(e.call("POST", "/api/v1/locks/swap:vllm", testUser, map[string]any{"holder": "nightly", "ttl_s": 60, "note": "eval"}), 200, &g)
	if !g.Held || len(g.Token) != 32 || g.Fence < 1 || *g.SecondsRemaining != 60 || g.Name != "swap:vllm" {
		t.Fatalf("acquire: %+v", g)
	}
	// The token is never in a read.
	for _, p := range []string{"/api/v1/locks", "/api/v1/locks/swap:vllm", "/api/v1/events?stream=false&since=0"} {
		if a := e.call("GET", p, testAdmin, nil); a.status != 200 || bytes.Contains(a.body, []byte(g.Token)) {
			t.Fatalf("GET %s: %d, token shown: %v", p, a.status, bytes.Contains(a.body, []byte(g.Token)))
		}
	}
	// Same holder name, no token: 409 with the public state.
	a := e.call("POST", "/api/v1/locks/swap:vllm", testUser, map[string]any{"holder": "nightly"})
	var ref coordLockBody
	e.ok(a, 409, &ref)
	if ref.Error.Code != "conflict" || ref.Lock.Holder != "nightly" || ref.Lock.Fence != g.Fence {
		t.Fatalf("refusal: %s", a.body)
	}
	// Extend with the token.
	e.clk.Advance(10 * time.Second)
	var x arbiter.LockGrant
	e.ok(e.call("POST", "/api/v1/locks/swap:vllm/extend", testUser, map[string]any{"ttl_s": 120}, "X-Lock-Token: "+g.Token), 200, &x)
	if x.Token != "" || *x.SecondsRemaining != 120 {
		t.Fatalf("extend: %s", mustJSON(x))
	}
	// Release with the token; again is 409.
	var rel arbiter.LockRelease
	e.ok(e.call("DELETE", "/api/v1/locks/swap:vllm", testUser, nil, "X-Lock-Token: "+g.Token), 200, &rel)
	if !rel.Released || rel.Lock.Holder != "nightly" {
		t.Fatalf("release: %+v", rel)
	}
	e.ok(e.call("DELETE", "/api/v1/locks/swap:vllm", testUser, nil, "X-Lock-Token: "+g.Token), 409, nil)
	var st arbiter.LockState
	e.ok(e.call("GET", "/api/v1/locks/swap:vllm", testAgent, nil), 200, &st)
	if st.Held || st.Name != "swap:vllm" {
		t.Fatalf("after release: %+v", st)
	}
	// Force: an admin may, a user may not.
	e.ok(e.call("POST", "/api/v1/locks/maint", testUser, map[string]any{"holder": "x"}), 200, nil)
	e.ok(e.call("DELETE", "/api/v1/locks/maint?force=true", testUser, nil), 403, nil)
	e.ok(e.call("DELETE", "/api/v1/locks/maint?force=true", testAdmin, nil), 200, nil)
	// Agents may read but not lock.
	e.ok(e.call("POST", "/api/v1/locks/maint", testAgent, map[string]any{"holder": "x"}), 403, nil)
}

// TestCoordBadInput sends the bad input to every surface: each gets
// a clear 4xx and changes nothing (no event is committed).
func TestCoordBadInput(t *testing.T) {
	e := newCoordEnv(t)
	var held arbiter.LockGrant
	e.ok(e.call("POST", "/api/v1/locks/held", testUser, map[string]any{"holder": "a"}), 200, &held)
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "sched"}), 200, nil)
	tok := "X-Lock-Token: " + held.Token
	long := strings.Repeat("a", 65)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		hdr                []string
		msg                string
	}{
		{"lock blank holder", "POST", "/api/v1/locks/x", map[string]any{"holder": "  "}, 400, nil, "holder is required"},
		{"lock no holder", "POST", "/api/v1/locks/x", map[string]any{}, 400, nil, "holder is required"},
		{"compat blank holder", "POST", "/api/swap/lock", map[string]any{"holder": ""}, 400, nil, "holder is required"},
		{"lock ttl zero", "POST", "/api/v1/locks/x", map[string]any{"holder": "a", "ttl_s": 0}, 400, nil, "1 to 86400"},
		{"lock ttl negative", "POST", "/api/v1/locks/x", map[string]any{"holder": "a", "ttl_s": -5}, 400, nil, "1 to 86400"},
		{"lock ttl huge", "POST", "/api/v1/locks/x", map[string]any{"holder": "a", "ttl_s": 1e12}, 400, nil, "1 to 86400"},
		{"lock ttl string", "POST", "/api/v1/locks/x", map[string]any{"holder": "a", "ttl_s": "soon"}, 400, nil, "ttl_s"},
		{"lock unknown field", "POST", "/api/v1/locks/x", map[string]any{"holder": "a", "ttl": 5}, 400, nil, "unknown field"},
		{"lock bad name", "POST", "/api/v1/locks/a%20b", map[string]any{"holder": "a"}, 400, nil, "lock name"},
		{"lock newline holder", "POST", "/api/v1/locks/x", map[string]any{"holder": "a\nb"}, 400, nil, "control characters"},
		{"lock wrong token acquire", "POST", "/api/v1/locks/held", map[string]any{"holder": "a", "token": "0123456789abcdef0123456789abcdef"}, 409, nil, "is held by"},
		{"lock wrong token release", "DELETE", "/api/v1/locks/held", nil, 403, []string{"X-Lock-Token: nope"}, "does not hold"},
		{"lock wrong token extend", "POST", "/api/v1/locks/held/extend", nil, 403, []string{"X-Lock-Token: nope"}, "does not hold"},
		{"lock no token release", "DELETE", "/api/v1/locks/held", nil, 400, nil, "X-Lock-Token"},
		{"lock release not held", "DELETE", "/api/v1/locks/free", nil, 409, []string{tok}, "not held"},
		{"lock extend not held", "POST", "/api/v1/locks/free/extend", nil, 409, []string{tok}, "not held"},
		{"lock token in wrong header", "DELETE", "/api/v1/locks/held", nil, 400, []string{"X-Swap-Lock-Token: " + held.Token}, "send it in X-Lock-Token"},
		{"lock token in query", "DELETE", "/api/v1/locks/held?token=" + held.Token, nil, 400, nil, "unknown query parameter"},
		{"compat token in wrong header", "DELETE", "/api/swap/lock", nil, 400, []string{"X-Lock-Token: abc"}, "send it in X-Swap-Lock-Token"},
		{"compat wrong token", "DELETE", "/api/swap/lock", nil, 403, []string{"X-Swap-Lock-Token: nope"}, "token does not hold the lock"},
		{"compat held", "POST", "/api/swap/lock", map[string]any{"holder": "sched"}, 409, nil, "held by another"},
		{"swap unknown model", "POST", "/api/v1/services/vllm/swaps", map[string]any{"model_key": "nope"}, 400, nil, "not in the catalog"},
		{"swap no model", "POST", "/api/v1/services/vllm/swaps", map[string]any{}, 400, nil, "model_key is required"},
		{"swap unknown service", "POST", "/api/v1/services/tgi/swaps", map[string]any{"model_key": "gemma"}, 404, nil, "not configured"},
		{"swap token in wrong header", "POST", "/api/v1/services/vllm/swaps", map[string]any{"model_key": "gemma"}, 400, []string{"X-Lock-Token: x"}, "X-Swap-Lock-Token"},
		{"compat swap unknown model", "POST", "/api/swap", map[string]any{"model_key": "nope", "dry_run": true}, 400, nil, "not in the catalog"},
		{"compat swap locked", "POST", "/api/swap", map[string]any{"model_key": "gemma"}, 423, nil, "is held by"},
		{"compat validate unknown", "POST", "/api/swap/nope/validate", nil, 404, nil, "not in the catalog"},
		{"catalog outside roots", "PUT", "/api/v1/services/vllm/catalog/x", map[string]any{"local_path": "/etc/x"}, 400, nil, "outside the allowed roots"},
		{"catalog relative", "PUT", "/api/v1/services/vllm/catalog/x", map[string]any{"local_path": "models/x"}, 400, nil, "relative"},
		{"catalog dotdot", "PUT", "/api/v1/services/vllm/catalog/x", map[string]any{"local_path": "/models/../etc"}, 400, nil, "'..'"},
		{"catalog both", "PUT", "/api/v1/services/vllm/catalog/x", map[string]any{"repo": "a/b", "local_path": "/models/x"}, 400, nil, "not both"},
		{"catalog by a user", "PUT", "/api/v1/services/vllm/catalog/x", map[string]any{"repo": "a/b"}, 403, nil, "admin"},
		{"schedule traversal", "POST", "/api/v1/schedules", map[string]any{"id": "../../etc", "name": "x"}, 400, nil, "id must match"},
		{"schedule 65 chars", "POST", "/api/v1/schedules", map[string]any{"id": long, "name": "x"}, 400, nil, "id must match"},
		{"schedule no name", "POST", "/api/v1/schedules", map[string]any{"cron": "@daily"}, 400, nil, "name is required"},
		{"schedule bad cron", "POST", "/api/v1/schedules", map[string]any{"name": "x", "cron": "61 * * * *"}, 400, nil, "cron"},
		{"schedule 6 fields", "POST", "/api/v1/schedules", map[string]any{"name": "x", "cron": "0 0 * * * *"}, 400, nil, "want 5"},
		{"schedule @every", "POST", "/api/v1/schedules", map[string]any{"name": "x", "cron": "@every 5m"}, 400, nil, "@daily"},
		{"schedule tz", "POST", "/api/v1/schedules", map[string]any{"name": "x", "cron": "CRON_TZ=Europe/Paris 0 6 * * *"}, 400, nil, "time zone"},
		{"schedule never", "POST", "/api/v1/schedules", map[string]any{"name": "x", "cron": "0 0 30 2 *"}, 400, nil, "never fires"},
		{"schedule bad next_run", "POST", "/api/v1/schedules", map[string]any{"name": "x", "next_run": "tomorrow"}, 400, nil, "next_run"},
		{"compat schedule traversal", "POST", "/api/schedule", map[string]any{"id": "a/../b", "name": "x"}, 400, nil, "id must match"},
		{"compat schedule no name", "POST", "/api/schedule", map[string]any{"name": ""}, 400, nil, "name is required"},
		{"compat delete traversal", "DELETE", "/api/schedule/..%2F..%2Fetc", nil, 400, nil, "id must match"},
		{"compat delete 65", "DELETE", "/api/schedule/" + long, nil, 400, nil, "id must match"},
		{"compat delete absent", "DELETE", "/api/schedule/nope", nil, 404, nil, "schedule not found"},
		{"native delete absent", "DELETE", "/api/v1/schedules/nope", nil, 404, nil, "not registered"},
		{"webhook metadata", "POST", "/api/v1/webhooks", map[string]any{"url": "http://169.254.169.254/latest", "kinds": []string{"*"}}, 400, nil, "link-local"},
		{"webhook gcp metadata", "POST", "/api/v1/webhooks", map[string]any{"url": "http://metadata.google.internal/x", "kinds": []string{"*"}}, 400, nil, "metadata"},
		{"webhook ftp", "POST", "/api/v1/webhooks", map[string]any{"url": "ftp://example.com/", "kinds": []string{"*"}}, 400, nil, "http://"},
		{"webhook no url", "POST", "/api/v1/webhooks", map[string]any{"kinds": []string{"*"}}, 400, nil, "url is empty"},
		{"webhook credentials", "POST", "/api/v1/webhooks", map[string]any{"url": "https://u:p@example.com/", "kinds": []string{"*"}}, 400, nil, "credentials"},
		{"webhook decimal ip", "POST", "/api/v1/webhooks", map[string]any{"url": "http://2852039166/", "kinds": []string{"*"}}, 400, nil, "not a valid IP"},
		{"webhook no kinds", "POST", "/api/v1/webhooks", map[string]any{"url": "https://example.com/"}, 400, nil, "kinds is empty"},
		{"webhook by a user", "POST", "/api/v1/webhooks", map[string]any{"url": "https://example.com/", "kinds": []string{"*"}}, 403, nil, "admin"},
		{"swap bad id", "GET", "/api/v1/swaps/..%2Fx", nil, 400, nil, "swap number"},
		{"deliveries bad state", "GET", "/api/v1/webhooks/deliveries?state=lost", nil, 400, nil, "state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.loop.LastSeq()
			token := testUser
			if strings.HasPrefix(c.name, "webhook") && !strings.Contains(c.name, "user") || strings.HasPrefix(c.name, "catalog") && !strings.Contains(c.name, "user") || strings.HasPrefix(c.name, "deliveries") {
				token = testAdmin
			}
			a := e.call(c.method, c.path, token, c.body, c.hdr...)
			if a.status != c.status || !strings.Contains(string(a.body), c.msg) {
				t.Fatalf("got %d %s, want %d with %q", a.status, a.body, c.status, c.msg)
			}
			var body map[string]any
			a.decode(t, &body)
			if body["error"] == nil {
				t.Fatalf("no native error object: %s", a.body)
			}
			if strings.HasPrefix(c.path, "/api/swap") || strings.HasPrefix(c.path, "/api/schedule") {
				if _, ok := body["detail"].(string); !ok {
					t.Fatalf("compatible answer without detail: %s", a.body)
				}
			}
			if after := e.loop.LastSeq(); after != before {
				t.Fatalf("a refused request changed something: events %d → %d", before, after)
			}
		})
	}
}

func TestCoordCompatTTL(t *testing.T) {
	cases := []struct {
		raw  string
		want time.Duration
	}{
		{``, 15 * time.Minute},
		{`null`, 15 * time.Minute},
		{`"abc"`, 15 * time.Minute},
		{`true`, 15 * time.Minute},
		{`{}`, 15 * time.Minute},
		{`"120"`, 2 * time.Minute},
		{`120.9`, 120 * time.Second},
		{`0`, time.Second},
		{`-7`, time.Second},
		{`1e300`, 24 * time.Hour},
		{`999999`, 24 * time.Hour},
		{`" 90 "`, 90 * time.Second},
		{`"1.5"`, 15 * time.Minute},
		{`"99999999999999999999"`, 24 * time.Hour},
		{`"-99999999999999999999"`, time.Second},
	}
	for _, c := range cases {
		if got := compatTTL(json.RawMessage(c.raw)); got != c.want {
			t.Errorf("ttl_seconds %s: got %v, want %v", c.raw, got, c.want)
		}
	}
}

// TestCoordCompatLockFlow is the flow of an external scheduler through
// the compatible paths, with a person's manual swap refused meanwhile.
func TestCoordCompatLockFlow(t *testing.T) {
	e := newCoordEnv(t)
	var g arbiter.LockGrant
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "daily-vol", "ttl_seconds": "300", "note": "nightly", "extra": 1}), 200, &g)
	if g.Token == "" || g.Name != "" || *g.SecondsRemaining != 300 {
		t.Fatalf("acquire: %s", mustJSON(g))
	}
	// The dashboard's swap is refused with the lock's state.
	a := e.call("POST", "/api/swap", testAdmin, map[string]any{"model_key": "ten31"})
	var ce compatErrorBody
	e.ok(a, 423, &ce)
	if ce.Lock == nil || ce.Lock.Holder != "daily-vol" || ce.Error.Code != "locked" || ce.Detail == "" {
		t.Fatalf("423: %s", a.body)
	}
	// The scheduler swaps with its token.
	var job struct {
		JobID string `json:"job_id"`
	}
	e.ok(e.call("POST", "/api/swap", testUser, map[string]any{"model_key": "gemma"}, "X-Swap-Lock-Token: "+g.Token), 202, &job)
	var sw compatSwap
	e.ok(e.call("GET", "/api/swap/"+job.JobID, testUser, nil), 200, &sw)
	if sw.JobID != job.JobID || sw.State != arbiter.SwapPending || sw.Fence != g.Fence {
		t.Fatalf("swap: %s", mustJSON(sw))
	}
	// Extend by acquiring with the token (same fence), then release.
	var x arbiter.LockGrant
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "daily-vol", "ttl_seconds": 600, "token": g.Token}), 200, &x)
	if x.Token != g.Token || x.Fence != g.Fence || *x.SecondsRemaining != 600 {
		t.Fatalf("extend: %s", mustJSON(x))
	}
	var rel struct{ Released bool }
	e.ok(e.call("DELETE", "/api/swap/lock?token="+g.Token, testUser, nil), 200, &rel)
	if !rel.Released {
		t.Fatal("not released")
	}
	e.ok(e.call("DELETE", "/api/swap/lock", testUser, nil, "X-Swap-Lock-Token: "+g.Token), 200, &rel)
	if rel.Released {
		t.Fatal("released twice")
	}
	var st map[string]any
	e.ok(e.call("GET", "/api/swap/lock", testUser, nil), 200, &st)
	if len(st) != 1 || st["held"] != false {
		t.Fatalf("free lock: %v, want exactly {held: false}", st)
	}
}

// TestCoordSwapStreamAndClaim runs a swap through the agent's endpoints
// while a client follows its log, natively and compatibly.
func TestCoordSwapStreamAndClaim(t *testing.T) {
	e := newCoordEnv(t)
	srv := httptest.NewServer(e.s.Handler())
	defer srv.Close()

	// An agent waits for a swap (long-poll) before there is one.
	claimed := make(chan arbiter.Swap, 1)
	go func() {
		req, _ := http.NewRequest("POST", srv.URL+"/api/v1/machines/gpu1/swaps/claim?wait=10", nil)
		req.Header.Set("Authorization", "Bearer "+testAgent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(claimed)
			return
		}
		defer resp.Body.Close()
		var sw arbiter.Swap
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&sw) != nil {
			t.Errorf("claim: %d", resp.StatusCode)
		}
		claimed <- sw
	}()
	e.waitListening(1, "the claim to wait for a swap")
	var sw arbiter.Swap
	e.ok(e.call("POST", "/api/v1/services/vllm/swaps", testUser, map[string]any{"model_key": "gemma"}), 202, &sw)
	got := <-claimed
	if got.ID != sw.ID || got.State != arbiter.SwapRunning || strings.Join(got.Command, " ") != "/opt/vllm/launch.sh google/gemma-3-27b-it" {
		t.Fatalf("claimed %+v", got)
	}
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/log", testAgent, map[string]any{"machine": "gpu1", "lines": []string{"line 0", "line 1"}}), 204, nil)
	e.waitListening(0, "the claim to stop listening")
	native := sseLines(t, srv.URL+"/api/v1/swaps/"+sw.ID+"/stream")
	compat := sseLines(t, srv.URL+"/api/swap/"+sw.ID+"/stream")
	e.waitListening(2, "both streams to listen") // line 2 then reaches them live
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/log", testAgent, map[string]any{"machine": "gpu1", "lines": []string{"line 2"}}), 204, nil)
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/log", testUser, map[string]any{"machine": "gpu1", "lines": []string{"x"}}), 403, nil)
	var fin arbiter.Swap
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/finish", testAgent, map[string]any{"machine": "gpu1", "ok": true, "returncode": 0}), 200, &fin)
	if fin.State != arbiter.SwapComplete || len(fin.Log) != 3 {
		t.Fatalf("finish: %+v", fin)
	}
	n := <-native
	if !strings.Contains(n, `data: {"n":0,"line":"line 0"}`) || !strings.Contains(n, `data: {"n":2,"line":"line 2"}`) || !strings.Contains(n, "event: end") || strings.Count(n, "event: log") != 3 {
		t.Fatalf("native stream:\n%s", n)
	}
	c := <-compat
	if !strings.Contains(c, "data: line 0\n\ndata: line 1\n\ndata: line 2\n\nevent: end\ndata: {\"job_id\":\""+sw.ID+"\",\"state\":\"complete\",\"returncode\":0}") {
		t.Fatalf("compat stream:\n%q", c)
	}
	// A finished swap's stream is its log and the end, at once.
	if again := <-sseLines(t, srv.URL+"/api/swap/"+sw.ID+"/stream"); again != c {
		t.Fatalf("replay:\n%q\nwant\n%q", again, c)
	}
	// Nothing more to claim: 204 at once.
	e.ok(e.call("POST", "/api/v1/machines/gpu1/swaps/claim", testAgent, nil), 204, nil)
	var svc arbiter.Service
	e.ok(e.call("GET", "/api/v1/services/vllm", testUser, nil), 200, &svc)
	if svc.Model != "gemma" || svc.Swap != "" {
		t.Fatalf("service: %+v", svc)
	}
}

// sseLines reads a whole SSE stream in the background; the channel gets
// everything but keepalive comments once the server ends it.
func sseLines(t *testing.T, url string) <-chan string {
	out := make(chan string, 1)
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+testUser)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	go func() {
		defer resp.Body.Close()
		var b strings.Builder
		sc := bufio.NewScanner(resp.Body)
		skip := false
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, ":") {
				skip = true
				continue
			}
			if l == "" && skip {
				skip = false
				continue
			}
			b.WriteString(l + "\n")
		}
		out <- b.String()
	}()
	return out
}

func TestCoordSchedules(t *testing.T) {
	e := newCoordEnv(t)
	var s arbiter.Schedule
	e.ok(e.call("POST", "/api/schedule", testUser, map[string]any{"name": "Daily Vol", "owner": "bob", "cron": "0 6 * * 1-5", "id": nil}), 200, &s)
	if !regexp.MustCompile(`^[0-9a-f]{8}$`).MatchString(s.ID) || s.NextRun == "" {
		t.Fatalf("register: %+v", s)
	}
	next, err := time.Parse(time.RFC3339, s.NextRun)
	if err != nil || !next.After(e.clk.Now()) || next.Hour() != 6 || next.Minute() != 0 {
		t.Fatalf("next_run %q: %v", s.NextRun, err)
	}
	var u arbiter.Schedule
	e.ok(e.call("POST", "/api/v1/schedules", testUser, map[string]any{"id": s.ID, "name": "Daily Vol 2", "cron": "@daily", "next_run": "2026-06-18T07:00:00"}), 200, &u)
	// The compatible answer has the original's microseconds.
	if !u.RegisteredAt.Truncate(time.Microsecond).Equal(s.RegisteredAt) || u.NextRun != "2026-06-18T07:00:00" || u.Name != "Daily Vol 2" {
		t.Fatalf("update: %+v", u)
	}
	e.ok(e.call("POST", "/api/v1/schedules", testUser, map[string]any{"id": "weekly.report-1", "name": "Weekly", "cron": "@weekly"}), 201, nil)
	var list struct{ Schedules []arbiter.Schedule }
	e.ok(e.call("GET", "/api/schedule", testAgent, nil), 200, &list)
	if len(list.Schedules) != 2 {
		t.Fatalf("list: %+v", list)
	}
	e.ok(e.call("DELETE", "/api/schedule/"+s.ID, testUser, nil), 200, nil)
	e.ok(e.call("DELETE", "/api/schedule/"+s.ID, testUser, nil), 404, nil)
}

func TestCoordWebhooksAPI(t *testing.T) {
	e := newCoordEnv(t)
	var w arbiter.Webhook
	e.ok(e.call("POST", "/api/v1/webhooks", testAdmin, map[string]any{"url": "https://hooks.example.com/x", "kinds": []string{"swap.*"}}), 201, &w)
	if w.ID != "wh1" || !strings.HasPrefix(w.Secret, "whsec_") || arbiter.ValidateStandardSecret(w.Secret) != nil {
		t.Fatalf("create: %+v", w)
	}
	for _, p := range []string{"/api/v1/webhooks", "/api/v1/webhooks/wh1", "/api/v1/events?stream=false&since=0"} {
		a := e.call("GET", p, testAdmin, nil)
		if a.status != 200 || strings.Contains(string(a.body), w.Secret) {
			t.Fatalf("GET %s shows the secret or fails: %d", p, a.status)
		}
	}
	e.ok(e.call("GET", "/api/v1/webhooks", testUser, nil), 403, nil)
	var d arbiter.Webhook
	e.ok(e.call("POST", "/api/v1/webhooks/wh1/disable", testAdmin, nil), 200, &d)
	if d.Enabled {
		t.Fatal("still enabled")
	}
	var ds struct{ Deliveries []arbiter.Delivery }
	e.ok(e.call("GET", "/api/v1/webhooks/deliveries?webhook=wh1&limit=5", testAdmin, nil), 200, &ds)
	e.ok(e.call("DELETE", "/api/v1/webhooks/wh1", testAdmin, nil), 200, nil)
	e.ok(e.call("DELETE", "/api/v1/webhooks/wh1", testAdmin, nil), 404, nil)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Fuzz targets of the validators that take outside input.

var coordIDRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func FuzzScheduleID(f *testing.F) {
	for _, s := range []string{"", "a", "../x", strings.Repeat("a", 64), strings.Repeat("a", 65), "a b", "ü", "a\n", "x.y_z-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := arbiter.ValidScheduleID(s), coordIDRE.MatchString(s) && !strings.Contains(s, "\n"); got != want {
			t.Fatalf("ValidScheduleID(%q) = %v, want %v", s, got, want)
		}
	})
}

func FuzzParseCron(f *testing.F) {
	for _, s := range []string{"", "* * * * *", "0 6 * * 1-5", "@daily", "@every 1s", "*/0 * * * *", "0-0/0 * * * *", "61 * * * *",
		"0 0 30 2 *", "TZ=x * * * * *", "@", "? ? ? ? ?", "1,2,3-4/2 * * JAN-DEC MON-FRI", "0 0 L * *"} {
		f.Add(s)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		sched, err := ParseCron(s)
		if err != nil {
			if arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Fatalf("ParseCron(%q): error code %s", s, arbiter.ErrorCode(err))
			}
			return
		}
		if sched == nil {
			if strings.TrimSpace(s) != "" {
				t.Fatalf("ParseCron(%q): no schedule and no error", s)
			}
			return
		}
		if next := sched.Next(now); !next.IsZero() && !next.After(now) {
			t.Fatalf("ParseCron(%q).Next = %v, not after %v", s, next, now)
		}
	})
}

func FuzzCompatTTL(f *testing.F) {
	for _, s := range []string{"", "null", "1", "-1", "1e400", `"60"`, `"x"`, "[]", "1.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d := compatTTL(json.RawMessage(s)); d < arbiter.LockTTLMin || d > arbiter.LockTTLMax {
			t.Fatalf("compatTTL(%q) = %v, out of [1s, 24h]", s, d)
		}
	})
}

func FuzzWebhookURL(f *testing.F) {
	for _, s := range []string{"https://example.com/x", "http://169.254.169.254/", "http://[::ffff:a9fe:a9fe]/", "http://0x7f.1/", "http://10.0.0.1:8080/h", "http://[fe80::1%25eth0]/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if arbiter.ValidateWebhookURL(s, false) != nil {
			return
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
			t.Fatalf("accepted %q", s)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && arbiter.WebhookAddrRefused(a) != "" {
			t.Fatalf("accepted %q: %s", s, arbiter.WebhookAddrRefused(a))
		}
	})
}

// TestAuditTrailHoldsNoLockToken: DELETE /api/swap/lock takes the lock's
// token as ?token=; the trail keeps the request's target with the token's
// value masked, for a refused request and a done one alike.
func TestAuditTrailHoldsNoLockToken(t *testing.T) {
	e := newCoordEnv(t)
	var g arbiter.LockGrant
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron"}), 200, &g)
	e.ok(e.call("DELETE", "/api/swap/lock?force=false&token="+g.Token, testAgent, nil), 403, nil)
	e.ok(e.call("DELETE", "/api/swap/lock?token="+g.Token, testAdmin, nil), 200, nil)
	a := e.call("GET", "/api/v1/audit", testAdmin, nil)
	e.ok(a, 200, nil)
	if strings.Contains(string(a.body), g.Token) {
		t.Fatalf("the audit trail holds the lock's token %s: %s", g.Token, a.body)
	}
	for _, want := range []string{`"/api/swap/lock?force=false&token=xxxxx"`, `"/api/swap/lock?token=xxxxx"`} {
		if !strings.Contains(string(a.body), want) {
			t.Errorf("the trail lacks the masked target %s: %s", want, a.body)
		}
	}
}

// TestWebhookIDDeliveriesReserved: GET /api/v1/webhooks/deliveries is the
// delivery log, so no subscription may take that id.
func TestWebhookIDDeliveriesReserved(t *testing.T) {
	e := newCoordEnv(t)
	a := e.call("POST", "/api/v1/webhooks", testAdmin, map[string]any{"id": "deliveries", "url": "https://hooks.example.com/x", "kinds": []string{"swap.*"}})
	if a.status != 400 || !strings.Contains(string(a.body), "reserved") {
		t.Fatalf("a subscription named deliveries: %d %s", a.status, a.body)
	}
}

// TestPersonalSubscriptionNotToLoopback: a user's own subscription may not
// make the server POST to its own loopback; an admin may make one for
// them that does.
func TestPersonalSubscriptionNotToLoopback(t *testing.T) {
	e := newCoordEnv(t)
	for _, u := range []string{"http://127.0.0.1:2375/v1.43/containers/create", "http://[::1]/x", "http://localhost:8080/", "http://api.LOCALHOST./x", "http://[::ffff:127.0.0.2]/"} {
		a := e.call("POST", "/api/v1/notifications", testUser, map[string]any{"url": u, "kinds": []string{"allocation.ready"}})
		if a.status != 400 || !strings.Contains(string(a.body), "loopback") {
			t.Errorf("%s: %d %s, want 400 naming the loopback", u, a.status, a.body)
		}
	}
	var w arbiter.Webhook
	e.ok(e.call("POST", "/api/v1/notifications", testUser, map[string]any{"url": "http://10.0.0.7/hook", "kinds": []string{"allocation.ready"}}), 201, &w)
	if !w.NoLoopback {
		t.Errorf("a user's own subscription is not marked no_loopback: %+v", w)
	}
	var byAdmin arbiter.Webhook
	e.ok(e.call("POST", "/api/v1/notifications", testAdmin, map[string]any{"url": "http://127.0.0.1:9/hook", "principal": "alice", "kinds": []string{"allocation.ready"}}), 201, &byAdmin)
	if byAdmin.NoLoopback {
		t.Errorf("an admin's subscription for a person is marked no_loopback: %+v", byAdmin)
	}
}

// TestSwapCancelRoute: POST /api/v1/swaps/{id}/cancel ends the requester's
// swap with its reason; the agent's next word about it is refused.
func TestSwapCancelRoute(t *testing.T) {
	e := newCoordEnv(t)
	var sw arbiter.Swap
	e.ok(e.call("POST", "/api/v1/services/vllm/swaps", testUser, map[string]any{"model_key": "gemma"}), 202, &sw)
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/cancel", testAgent, nil), 403, nil)
	var got arbiter.Swap
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/cancel", testUser, map[string]any{"reason": "wrong model"}), 200, &got)
	if got.State != arbiter.SwapFailed || !strings.HasSuffix(got.Reason, ": wrong model") {
		t.Fatalf("cancelled: %+v", got)
	}
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/cancel", testUser, nil), 409, nil)
	e.ok(e.call("POST", "/api/v1/swaps/"+sw.ID+"/cancel", testUser, map[string]any{"reason": 7}), 400, nil)
}

// TestCoordCompatForceAsPythonWritesIt: the original's clients are Python;
// requests.delete(url, params={"force": True}) sends ?force=True, which the
// original (a FastAPI boolean parameter) took as true, and so does arbiter.
func TestCoordCompatForceAsPythonWritesIt(t *testing.T) {
	e := newCoordEnv(t)
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron"}), 200, nil)
	a := e.call("DELETE", "/api/swap/lock?force=True", testAdmin, nil)
	if a.status != 200 {
		t.Errorf("DELETE /api/swap/lock?force=True by an admin: %d %s, want 200 released", a.status, a.body)
	}
	e.call("DELETE", "/api/swap/lock?force=true", testAdmin, nil)
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron2"}), 200, nil)
	a = e.call("POST", "/api/swap?force=True", testAdmin, map[string]any{"model_key": "gemma"})
	if a.status != 202 {
		t.Errorf("POST /api/swap?force=True by an admin: %d %s, want 202", a.status, a.body)
	}
}

// TestCoordCompatLockNoteOnSeveralLines: the original stored any note; a
// scheduler's note on two lines is taken.
func TestCoordCompatLockNoteOnSeveralLines(t *testing.T) {
	e := newCoordEnv(t)
	var g arbiter.LockGrant
	a := e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron", "note": "nightly eval\nowner: data team"})
	if a.status != 200 {
		t.Fatalf("acquire with a two-line note: %d %s, want 200", a.status, a.body)
	}
	a.decode(t, &g)
}

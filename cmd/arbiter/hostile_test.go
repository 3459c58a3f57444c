package main

// The hostile-input suite (issue 12): an authorization matrix over every
// route the server serves × every kind of caller, taken from the server's
// own route table so that a route added anywhere is covered — and a route
// without a decision here fails — and a run of malformed inputs over every
// route that takes a body: no 5xx, no crash, no change.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// access is the authorization decision for a route: who may pass.
type access string

const (
	public   access = "public"   // everyone, no token
	anyRole  access = "any"      // every token, every role
	userRole access = "user"     // user or admin
	owner    access = "owner"    // user or admin, and a user only on what its token made
	agentRol access = "agent"    // agent or admin
	admin    access = "admin"    // admin
	worker   access = "worker"   // /v1 workers: agent or admin token (or a client certificate)
	fleetRd  access = "fleet-rd" // /v1 reads: any token (or a worker's or the operator's credential)
	operator access = "operator" // /v1 operator: the operator token or an admin token
	login    access = "login"    // the sign-in form: 303 for a token it takes, 401 otherwise
)

// decisions is this suite's own list, written from docs/guides/security.md,
// not read from the route table: a route the server serves without an entry
// here fails the matrix, and so does an entry the server does not serve.
var decisions = map[string]access{
	"GET /api/v1/health":                                  public,
	"GET /api/v1/openapi.json":                            public,
	"GET /metrics":                                        public,
	"GET /api/v1/whoami":                                  anyRole,
	"GET /api/v1/machines":                                anyRole,
	"POST /api/v1/machines":                               agentRol,
	"GET /api/v1/machines/{name}":                         anyRole,
	"POST /api/v1/machines/{name}/heartbeat":              agentRol,
	"POST /api/v1/machines/{name}/leave":                  agentRol,
	"POST /api/v1/machines/{name}/drain":                  admin,
	"POST /api/v1/machines/{name}/undrain":                admin,
	"GET /api/v1/allocations":                             anyRole,
	"POST /api/v1/allocations":                            userRole,
	"GET /api/v1/allocations/{id}":                        anyRole,
	"POST /api/v1/allocations/{id}/keepalive":             owner,
	"DELETE /api/v1/allocations/{id}":                     owner,
	"GET /api/v1/events":                                  anyRole,
	"GET /api/v1/locks":                                   anyRole,
	"GET /api/v1/locks/{name}":                            anyRole,
	"POST /api/v1/locks/{name}":                           userRole,
	"POST /api/v1/locks/{name}/extend":                    userRole,
	"DELETE /api/v1/locks/{name}":                         userRole,
	"GET /api/v1/services":                                anyRole,
	"GET /api/v1/services/{name}":                         anyRole,
	"GET /api/v1/services/{name}/catalog":                 anyRole,
	"GET /api/v1/services/{name}/catalog/{key}":           anyRole,
	"PUT /api/v1/services/{name}/catalog/{key}":           admin,
	"DELETE /api/v1/services/{name}/catalog/{key}":        admin,
	"POST /api/v1/services/{name}/catalog/{key}/validate": anyRole,
	"POST /api/v1/services/{name}/swaps":                  userRole,
	"GET /api/v1/swaps":                                   anyRole,
	"GET /api/v1/swaps/{id}":                              anyRole,
	"GET /api/v1/swaps/{id}/stream":                       anyRole,
	"POST /api/v1/swaps/{id}/log":                         agentRol,
	"POST /api/v1/swaps/{id}/finish":                      agentRol,
	"POST /api/v1/swaps/{id}/cancel":                      userRole,
	"POST /api/v1/machines/{name}/swaps/claim":            agentRol,
	"GET /api/v1/webhooks":                                admin,
	"POST /api/v1/webhooks":                               admin,
	"GET /api/v1/webhooks/deliveries":                     admin,
	"GET /api/v1/webhooks/{id}":                           admin,
	"DELETE /api/v1/webhooks/{id}":                        admin,
	"POST /api/v1/webhooks/{id}/enable":                   admin,
	"POST /api/v1/webhooks/{id}/disable":                  admin,
	"GET /api/v1/schedules":                               anyRole,
	"POST /api/v1/schedules":                              owner, // the body names alice's schedule
	"GET /api/v1/schedules/{id}":                          anyRole,
	"DELETE /api/v1/schedules/{id}":                       owner,
	"GET /api/swap/lock":                                  anyRole,
	"POST /api/swap/lock":                                 userRole,
	"DELETE /api/swap/lock":                               userRole,
	"POST /api/swap":                                      userRole,
	"GET /api/swap/{id}":                                  anyRole,
	"GET /api/swap/{id}/stream":                           anyRole,
	"POST /api/swap/{key}/validate":                       anyRole,
	"GET /api/schedule":                                   anyRole,
	"POST /api/schedule":                                  owner,
	"DELETE /api/schedule/{id}":                           owner,
	"POST /api/v1/admin/reload":                           admin,
	"GET /api/v1/audit":                                   admin,
	"GET /api/v1/pools":                                   anyRole,
	"GET /api/v1/pools/{name}":                            anyRole,
	"GET /api/v1/tasks":                                   anyRole,
	"GET /api/v1/tasks/summary":                           anyRole,
	"POST /api/v1/tasks/claim":                            agentRol,
	"POST /api/v1/tasks/reload":                           admin,
	"GET /api/v1/tasks/{id}":                              anyRole,
	"POST /api/v1/tasks/{id}/heartbeat":                   agentRol,
	"POST /api/v1/tasks/{id}/complete":                    agentRol,
	"POST /api/v1/tasks/{id}/fail":                        agentRol,
	"PUT /api/v1/tasks/{id}/artifact":                     agentRol,
	"POST /api/v1/tasks/{id}/cancel":                      admin,
	"POST /api/v1/tasks/{id}/requeue":                     admin,
	"GET /api/v1/workers":                                 anyRole,
	"GET /api/v1/artifacts":                               anyRole,
	"GET /api/v1/artifacts/{id}":                          anyRole,
	"GET /api/v1/artifacts/{id}/content":                  anyRole,
	"POST /v1/job/claim":                                  worker,
	"POST /v1/job/{id}/heartbeat":                         worker,
	"POST /v1/job/{id}/complete":                          worker,
	"POST /v1/job/{id}/fail":                              worker,
	"PUT /v1/model/{id}":                                  worker,
	"GET /v1/jobs":                                        fleetRd,
	"GET /v1/workers":                                     fleetRd,
	"POST /v1/job/{id}/cancel":                            operator,
	"POST /v1/job/{id}/requeue":                           operator,
	"POST /v1/manifest/reload":                            operator,
	"GET /v1/health":                                      public,
	"GET /{$}":                                            public,
	"POST /ui/login":                                      login,
	"POST /ui/logout":                                     public,
	"GET /ui/panels":                                      anyRole,
	"GET /ui/events":                                      anyRole,
	"GET /ui/static/{file}":                               public,
	// GPU ground truth (issue 11).
	"POST /api/v1/machines/{name}/gpus/report":          agentRol,
	"GET /api/v1/machines/{name}/gpus/orders":           agentRol,
	"POST /api/v1/machines/{name}/gpus/{index}/drain":   admin,
	"POST /api/v1/machines/{name}/gpus/{index}/undrain": admin,
	"POST /api/v1/machines/{name}/gpus/{index}/free":    admin,
	"GET /api/v1/usage":                                 anyRole,
	// Fair share (issue 15; docs/guides/fair-share.md).
	"POST /api/v1/allocations/{id}/extend": owner,
	"GET /api/v1/quotas":                   anyRole,
	"POST /api/v1/quotas":                  admin,
	"DELETE /api/v1/quotas":                admin,
	"GET /api/v1/fairshare":                anyRole,
	"GET /api/v1/reservations":             anyRole,
	"POST /api/v1/reservations":            admin,
	"DELETE /api/v1/reservations/{id}":     admin,
	"GET /api/v1/notifications":            userRole,
	"POST /api/v1/notifications":           userRole,
	"DELETE /api/v1/notifications/{id}":    userRole,
	"GET /usage":                           public, // the page: the sign-in form without a session
}

// caller is one column of the matrix.
type caller struct {
	name, token string
}

// The callers, in the order each route is tried: those that must be
// refused first, the ones whose success may change the resource last.
var callers = []caller{
	{"no token", ""},
	{"wrong token", "not-a-configured-token-0123456789"},
	{"agent", trustAgent},
	{"other user", trustBob}, // bob, on alice's resources
	{"user", trustAlice},
	{"admin", trustOps},
}

// allowed says whether c may pass a route of access a.
func allowed(a access, c string) bool {
	switch a {
	case public:
		return true
	case anyRole, fleetRd, login:
		return c != "no token" && c != "wrong token"
	case userRole:
		return c == "user" || c == "other user" || c == "admin"
	case owner:
		return c == "user" || c == "admin"
	case agentRol, worker:
		return c == "agent" || c == "admin"
	case admin, operator:
		return c == "admin"
	}
	return false
}

// hostileConfig is a server with every capability: GPU machines, tokens,
// a work queue, a service with a catalog, a pool, the metrics.
func hostileConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	return twoHosts + trustTokens(t, dir) + `
[tasks]
manifest = "` + trustManifest(t, dir, 2) + `"

[[pools]]
name = "p1"
backing = { gpus = 1 }
slots = 2

[[services]]
name = "vllm"
machine = "gpu1"
kind = "vllm"
endpoint = "http://127.0.0.1:9"
swap_command = ["/bin/true", "{model}"]
local_path_roots = ["/models"]

[[services.catalog]]
key = "gemma"
repo = "google/gemma-3-27b-it"
`
}

// fixture makes the resources a route's path and body name, afresh for
// each route so that what one caller does cannot spoil the next route.
type fixture struct {
	t    *testing.T
	url  string
	task string
	n    int
}

// allocation is a new allocation of alice's.
func (fx *fixture) allocation() string {
	fx.t.Helper()
	out, errs, code := cmdAs(fx.t, fx.url, trustAlice, "alloc", "--gpus", "1", "--no-wait", "--keepalive", "3600", "-o", "json")
	var a arbiter.Allocation
	if code != 0 || json.Unmarshal([]byte(out), &a) != nil {
		fx.t.Fatalf("alloc: %s", errs)
	}
	return fmt.Sprint(a.ID)
}

// schedule is a new schedule of alice's.
func (fx *fixture) schedule() string {
	fx.t.Helper()
	fx.n++
	id := fmt.Sprintf("alice-%d", fx.n)
	if _, errs, code := cmdAs(fx.t, fx.url, trustAlice, "schedules", "add", "--id", id, "--name", "x"); code != 0 {
		fx.t.Fatalf("schedule: %s", errs)
	}
	return id
}

// request returns the path and body a route is tried with.
func (fx *fixture) request(pattern string) (path, body string) {
	method, p, _ := strings.Cut(pattern, " ")
	p = strings.TrimSuffix(p, "{$}")
	body = "{}"
	switch {
	case strings.HasPrefix(p, "/api/v1/allocations/{id}"):
		p = strings.Replace(p, "{id}", fx.allocation(), 1)
	case strings.HasPrefix(p, "/api/v1/schedules/{id}"), strings.HasPrefix(p, "/api/schedule/{id}"):
		p = strings.Replace(p, "{id}", fx.schedule(), 1)
	case pattern == "POST /api/v1/schedules" || pattern == "POST /api/schedule":
		body = `{"id": "` + fx.schedule() + `", "name": "overwritten"}`
	case strings.HasPrefix(p, "/api/v1/tasks/{id}"), strings.HasPrefix(p, "/v1/job/{id}"), strings.HasPrefix(p, "/v1/model/{id}"):
		p = strings.Replace(p, "{id}", fx.task, 1)
	}
	p = strings.NewReplacer(
		"/machines/{name}", "/machines/gpu1",
		"/locks/{name}", "/locks/l1",
		"/services/{name}", "/services/vllm",
		"/catalog/{key}", "/catalog/gemma",
		"/api/swap/{key}", "/api/swap/gemma",
		"/pools/{name}", "/pools/p1",
		"/static/{file}", "/static/app.css",
		"/gpus/{index}", "/gpus/0",
		"/artifacts/{id}", "/artifacts/"+strings.Repeat("0", 64),
		"{id}", "x1", "{name}", "x1", "{key}", "x1", "{file}", "x1",
	).Replace(p)
	if method == http.MethodGet {
		body = ""
	}
	return p, body
}

// try sends one request as c and returns the status (0 when no answer
// came: a stream whose headers are held back counts as passing).
func try(t *testing.T, base, method, path, body string, c caller, form bool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if form {
		body = url.Values{"token": {c.token}}.Encode()
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if form {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if body != "" && !form {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-Lab-Host", "gpu2")
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAuthorizationMatrix tries every route the server serves (its own
// route table, the dashboard's included) as every kind of caller, and
// holds the answers to this file's decisions: a refusal is 401 without a
// known token, 403 with one of the wrong role or on another's resource, and
// whoever may pass is never refused.
func TestAuthorizationMatrix(t *testing.T) {
	m, base := startServer(t, hostileConfig(t), nil)
	routes := m.api.Routes()
	if len(routes) < 90 {
		t.Fatalf("the server reports %d routes; want them all", len(routes))
	}
	served := map[string]bool{}
	for _, rt := range routes {
		served[rt.Method+" "+rt.Path] = true
	}
	for pattern := range decisions {
		if !served[pattern] {
			t.Errorf("decision for %s, which the server does not serve: remove it", pattern)
		}
	}
	var task string
	if out, _, code := cmdAs(t, base, trustOps, "tasks", "list", "-o", "json"); code == 0 {
		var ts []arbiter.Task
		json.Unmarshal([]byte(out), &ts)
		if len(ts) > 0 {
			task = ts[0].ID
		}
	}
	if task == "" {
		t.Fatal("no task to aim at")
	}
	fx := &fixture{t: t, url: base, task: task}
	cells := 0
	for _, rt := range routes {
		pattern := rt.Method + " " + rt.Path
		dec, ok := decisions[pattern]
		if !ok {
			t.Errorf("route %s (access %q) has no authorization decision: add it to decisions in hostile_test.go", pattern, rt.Access)
			continue
		}
		path, body := fx.request(pattern)
		for _, c := range callers {
			got := try(t, base, rt.Method, path, body, c, dec == login)
			cells++
			want := allowed(dec, c.name)
			switch {
			case dec == login && want && got != http.StatusSeeOther,
				dec == login && !want && got != http.StatusUnauthorized:
				t.Errorf("%s as %s: %d, want %v", pattern, c.name, got, map[bool]int{true: 303, false: 401}[want])
			case dec == login:
			case want && (got == 401 || got == 403):
				t.Errorf("%s as %s: %d, want it let through (%s)", pattern, c.name, got, dec)
			case !want && (c.token == "" || c.name == "wrong token") && got != 401:
				t.Errorf("%s as %s: %d, want 401", pattern, c.name, got)
			case !want && c.token != "" && c.name != "wrong token" && got != 403:
				t.Errorf("%s as %s: %d, want 403", pattern, c.name, got)
			case got >= 500 && got != 503:
				t.Errorf("%s as %s: %d", pattern, c.name, got)
			}
		}
	}
	t.Logf("%d routes × %d callers = %d cells", len(routes), len(callers), cells)
}

// hostileBodies are malformed bodies every route that takes one is sent.
var hostileBodies = []string{
	``, `{`, `[]`, `null`, `"x"`, `{"a":1}{"b":2}`, `{"gpus": "eight"}`, `{"name": 1e999}`,
	`{"owner": "bob\u001b[2J\u001b[31mFAKE\nroot gpu0 ready"}`, `{"holder": "\u202eevil"}`,
	`{"name": "` + strings.Repeat("x", 70000) + `"}`, `{"id": "../../etc/passwd"}`,
	strings.Repeat(`[`, 5000) + strings.Repeat(`]`, 5000), `{"ttl_s": -1, "keepalive_s": "NaN"}`,
	"\xff\xfe\x00garbage", `{"capability": {"hostname": "h\u0000", "gpus": [{"index": -1}]}}`,
}

// TestHostileBodies sends every malformed body to every route that takes
// one, as an admin (who passes authorization everywhere): never a 5xx, and
// a refused request changes nothing (the event sequence stays where it was).
func TestHostileBodies(t *testing.T) {
	m, base := startServer(t, hostileConfig(t), nil)
	fx := &fixture{t: t, url: base}
	if out, _, _ := cmdAs(t, base, trustOps, "tasks", "list", "-o", "json"); out != "" {
		var ts []arbiter.Task
		json.Unmarshal([]byte(out), &ts)
		if len(ts) > 0 {
			fx.task = ts[0].ID
		}
	}
	n := 0
	for _, rt := range m.api.Routes() {
		if rt.Method == http.MethodGet || decisions[rt.Method+" "+rt.Path] == login {
			continue
		}
		path, _ := fx.request(rt.Method + " " + rt.Path)
		for _, body := range hostileBodies {
			before := m.loop.LastSeq()
			got := try(t, base, rt.Method, path, body, caller{"admin", trustOps}, false)
			n++
			switch {
			case got >= 500 && got != 503:
				t.Errorf("%s %s with %.40q: %d", rt.Method, path, body, got)
			case got >= 400 && m.loop.LastSeq() != before:
				t.Errorf("%s %s with %.40q: refused (%d), yet events were emitted", rt.Method, path, body, got)
			}
		}
	}
	t.Logf("%d malformed requests, none answered 5xx", n)
}

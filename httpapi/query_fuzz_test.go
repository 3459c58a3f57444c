package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzGETRequests fuzzes what every GET route reads besides a body: its
// query parameters (since, limit, wait, state, before, force, by …), its
// path values and the Authorization header, over the real control loop.
// Whatever they are: no 5xx (503 aside), a JSON answer where JSON is
// answered, nothing changes (no event), and nothing but a listed token
// is let in.
func FuzzGETRequests(f *testing.F) {
	e := newFuzzEnv(f)
	h := e.srv.Handler()
	var routes []RouteInfo
	for _, rt := range e.srv.Routes() {
		if rt.Method == "GET" {
			routes = append(routes, rt)
		}
	}
	queries := []string{"", "since=0&limit=5", "since=-1", "since=99999999999999999999", "limit=0", "limit=1001", "wait=0.05", "wait=NaN",
		"wait=1e400", "stream=false", "stream=0&since=1", "state=queued", "state=x", "before=1&limit=2", "force=True",
		"since=2026-11-01&until=2026-11-30&by=day", "p=queue&p=machines", "status=queued", "owner=alice&machine=gpubox", "limit=%00", "since=%ff"}
	for i := range routes { // each route once, each query on a few routes
		f.Add(uint8(i), queries[i%len(queries)], "", "")
	}
	for j, q := range queries {
		f.Add(uint8(j*7%len(routes)), q, "", "")
	}
	f.Add(uint8(4), "", "", "Bearer alice-secret")
	f.Add(uint8(4), "", "", "bearer  admin-secret ")
	f.Add(uint8(4), "", "", "Basic YWRtaW4tc2VjcmV0")
	f.Add(uint8(4), "", "gpubox", "Bearer admin-secret\x00")
	f.Fuzz(func(t *testing.T, ri uint8, query, param, auth string) {
		rt := routes[int(ri)%len(routes)]
		path := rt.Path
		for _, p := range []struct{ name, def string }{{"{name}", "gpubox"}, {"{id}", "1"}, {"{key}", "gemma"}, {"{index}", "0"}, {"{file}", "app.js"}} {
			v := p.def
			if param != "" {
				v = url.PathEscape(param)
			}
			if p.name == "{id}" && param == "" && strings.HasPrefix(path, "/api/v1/tasks/") {
				v = e.task
			}
			path = strings.ReplaceAll(path, p.name, v)
		}
		path = strings.ReplaceAll(path, "{$}", "")
		target := path
		if query != "" {
			target += "?" + query
		}
		if _, err := url.ParseRequestURI(target); err != nil || strings.ContainsAny(target, " \r\n\t#") {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		r := testRequest("GET", target, nil).WithContext(ctx)
		tok := "Bearer " + testAdmin
		if auth != "" {
			tok = auth
		}
		if strings.ContainsAny(tok, "\r\n\x00") {
			return // net/http refuses such a header before any handler
		}
		r.Header.Set("Authorization", tok)
		before := e.loop.LastSeq()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 && w.Code != 503 {
			t.Fatalf("GET %s (%s): %d %s", target, tok, w.Code, w.Body)
		}
		if strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("GET %s: the answer is not JSON: %q", target, w.Body)
		}
		if after := e.loop.LastSeq(); after != before {
			t.Fatalf("GET %s (%s): %d event(s) emitted", target, tok, after-before)
		}
		if w.Code < 300 && auth != "" && !strings.Contains(rt.Access, "public") && !strings.Contains(rt.Access, "fleet") {
			scheme, secret, _ := strings.Cut(auth, " ")
			secret = strings.TrimSpace(secret)
			if !strings.EqualFold(scheme, "Bearer") || (secret != testAdmin && secret != testUser && secret != testAgent) {
				t.Fatalf("GET %s let in Authorization %q: %d", target, auth, w.Code)
			}
		}
	})
}

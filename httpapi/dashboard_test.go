package httpapi

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// uiReq sends one request through the handler, with the cookie of a
// session signed in with token cookieSecret (a random one for a token the
// server does not take), and headers ("Name: value").
func uiReq(t *testing.T, s *Server, method, path, cookieSecret string, body io.Reader, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := testRequest(method, path, body)
	if cookieSecret != "" {
		r.AddCookie(&http.Cookie{Name: ui.CookieName, Value: uiSession(t, s, cookieSecret)})
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return w
}

// uiSession signs in with token and returns the session cookie's value; a
// token the server does not take gets a cookie no session has.
func uiSession(t *testing.T, s *Server, token string) string {
	t.Helper()
	cookie, _, ok := s.signIn(context.Background(), token)
	if !ok {
		return base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("x", 32)))
	}
	return cookie
}

func uiForm(token string) io.Reader {
	return strings.NewReader(url.Values{"token": {token}}.Encode())
}

const uiFormType = "Content-Type: application/x-www-form-urlencoded"

func TestUIPageAsksForTokenOnce(t *testing.T) {
	s, f := testServer(t, nil)
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, GPUs: []arbiter.GPU{{Index: 0, Model: "H100", Healthy: true}}})

	w := uiReq(t, s, "GET", "/", "", nil)
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `name="token"`) || strings.Contains(body, "gpu1") {
		t.Fatalf("without a token: got %d, want the sign-in form and no data:\n%s", w.Code, body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("got CSP %q", csp)
	}

	// A wrong token: the form again, with a 401 and no cookie.
	w = uiReq(t, s, "POST", "/ui/login", "", uiForm("wrong"), uiFormType, "Sec-Fetch-Site: same-origin")
	if w.Code != 401 || len(w.Result().Cookies()) != 0 || !strings.Contains(w.Body.String(), "not accepted") {
		t.Errorf("wrong token: got %d, cookies %v", w.Code, w.Result().Cookies())
	}

	// The right one: a cookie only this site's requests carry, and back to the page.
	w = uiReq(t, s, "POST", "/ui/login", "", uiForm(" "+testUser+"\n"), uiFormType, "Sec-Fetch-Site: same-origin")
	cs := w.Result().Cookies()
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/" || len(cs) != 1 {
		t.Fatalf("sign-in: got %d %q cookies %v", w.Code, w.Header().Get("Location"), cs)
	}
	c := cs[0]
	if c.Name != ui.CookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.MaxAge <= 0 {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/, persistent", c)
	}
	if c.Secure {
		t.Errorf("cookie %+v: Secure over plain HTTP", c)
	}
	// Behind a proxy that ends TLS and says so, the cookie is Secure.
	if w := uiReq(t, s, "POST", "/ui/login", "", uiForm(testUser), uiFormType, "Sec-Fetch-Site: same-origin", "X-Forwarded-Proto: https"); len(w.Result().Cookies()) != 1 || !w.Result().Cookies()[0].Secure {
		t.Errorf("sign-in behind a TLS proxy: cookies %+v, want Secure", w.Result().Cookies())
	}
	// Issue 12, finding 7: the cookie is an opaque session id, not the token.
	if got, _ := base64.RawURLEncoding.DecodeString(c.Value); strings.Contains(c.Value, testUser) || strings.Contains(string(got), testUser) || len(got) < 16 {
		t.Errorf("cookie %q holds the token or too little entropy", c.Value)
	}

	w = uiReq(t, s, "GET", "/", testUser, nil)
	body = w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `id="m-gpu1"`) || !strings.Contains(body, "alice") {
		t.Fatalf("with the cookie: got %d, want the dashboard:\n%s", w.Code, body)
	}

	// A cookie whose token was withdrawn: the form, and the cookie is cleared.
	w = uiReq(t, s, "GET", "/", "withdrawn-token", nil)
	if !strings.Contains(w.Body.String(), "no longer accepted") || len(w.Result().Cookies()) != 1 || w.Result().Cookies()[0].MaxAge >= 0 {
		t.Errorf("stale cookie: got %d cookies %v\n%s", w.Code, w.Result().Cookies(), w.Body.String())
	}

	// Logging out clears it.
	w = uiReq(t, s, "POST", "/ui/logout", testUser, nil, "Sec-Fetch-Site: same-origin")
	if w.Code != http.StatusSeeOther || len(w.Result().Cookies()) != 1 || w.Result().Cookies()[0].MaxAge >= 0 {
		t.Errorf("logout: got %d cookies %v", w.Code, w.Result().Cookies())
	}
}

func TestUICrossSiteRequests(t *testing.T) {
	s, f := testServer(t, nil)
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU})
	drain := "/api/v1/machines/gpu1/drain"
	tests := []struct {
		name    string
		cookie  string
		headers []string
		want    int
	}{
		{"the page's own call", testAdmin, []string{"Sec-Fetch-Site: same-origin", "X-Arbiter-CSRF: 1"}, 200},
		{"the page's call, no fetch metadata", testAdmin, []string{"X-Arbiter-CSRF: 1"}, 200},
		{"same origin by Origin", testAdmin, []string{"Origin: http://127.0.0.1:7070", "X-Arbiter-CSRF: 1"}, 200},
		{"cross-site with the cookie", testAdmin, []string{"Sec-Fetch-Site: cross-site", "X-Arbiter-CSRF: 1"}, 403},
		{"same-site is not same-origin", testAdmin, []string{"Sec-Fetch-Site: same-site", "X-Arbiter-CSRF: 1"}, 403},
		{"another Origin", testAdmin, []string{"Origin: https://evil.example", "X-Arbiter-CSRF: 1"}, 403},
		{"cookie without the header", testAdmin, []string{"Sec-Fetch-Site: same-origin"}, 403},
		{"user cookie, admin route", testUser, []string{"Sec-Fetch-Site: same-origin", "X-Arbiter-CSRF: 1"}, 403},
		{"bearer clients are not browsers", "", []string{"Authorization: Bearer " + testAdmin}, 200},
		{"no credentials", "", []string{"Sec-Fetch-Site: same-origin", "X-Arbiter-CSRF: 1"}, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := uiReq(t, s, "POST", drain, tt.cookie, nil, tt.headers...)
			if w.Code != tt.want {
				t.Fatalf("got %d, want %d: %s", w.Code, tt.want, w.Body)
			}
		})
	}
	// Reads with the cookie need no header: GET is safe.
	if w := uiReq(t, s, "GET", "/api/v1/machines", testUser, nil, "Sec-Fetch-Site: cross-site"); w.Code != 200 {
		t.Errorf("GET with the cookie: got %d", w.Code)
	}
	// Signing in from another site's form is refused too.
	if w := uiReq(t, s, "POST", "/ui/login", "", uiForm(testAdmin), uiFormType, "Sec-Fetch-Site: cross-site"); w.Code != 403 || len(w.Result().Cookies()) != 0 {
		t.Errorf("cross-site sign-in: got %d cookies %v", w.Code, w.Result().Cookies())
	}
}

func TestUICrossSiteWithoutTokens(t *testing.T) {
	s, _ := testServer(t, func(o *Options) { o.Tokens = nil })
	body := `{"owner":"bob","gpus":1}`
	// A server without tokens trusts everyone on loopback, but not another
	// site's page in their browser.
	if w := uiReq(t, s, "POST", "/api/v1/allocations", "", strings.NewReader(body), "Sec-Fetch-Site: cross-site"); w.Code != 403 {
		t.Errorf("cross-site POST to an open server: got %d, want 403", w.Code)
	}
	if w := uiReq(t, s, "POST", "/api/v1/allocations", "", strings.NewReader(body)); w.Code != 201 {
		t.Errorf("CLI POST to an open server: got %d, want 201: %s", w.Code, w.Body)
	}
	if w := uiReq(t, s, "GET", "/", "", nil); w.Code != 200 || !strings.Contains(w.Body.String(), "open server") {
		t.Errorf("open server's page: got %d", w.Code)
	}
}

func TestUIWhoami(t *testing.T) {
	s, _ := testServer(t, nil)
	var got arbiter.Whoami
	a := call(t, s, "GET", "/api/v1/whoami", testAdmin, nil)
	a.decode(t, &got)
	if a.status != 200 || got != (arbiter.Whoami{Name: "ops", Role: "admin", Auth: "bearer"}) {
		t.Errorf("bearer: got %d %+v", a.status, got)
	}
	w := uiReq(t, s, "GET", "/api/v1/whoami", testUser, nil)
	_ = json.Unmarshal(w.Body.Bytes(), &got)
	if w.Code != 200 || got != (arbiter.Whoami{Name: "alice", Role: "user", Auth: "cookie"}) {
		t.Errorf("cookie: got %d %+v", w.Code, got)
	}
	if a := call(t, s, "GET", "/api/v1/whoami", "", nil); a.status != 401 {
		t.Errorf("no token: got %d", a.status)
	}
	open, _ := testServer(t, func(o *Options) { o.Tokens = nil })
	call(t, open, "GET", "/api/v1/whoami", "", nil).decode(t, &got)
	if got != (arbiter.Whoami{Role: "admin", Auth: "open"}) {
		t.Errorf("open: got %+v", got)
	}
}

// uiPanelsAnswer fetches /ui/panels and returns the HTML of each panel.
func uiPanelsAnswer(t *testing.T, s *Server, secret, query string) map[string]string {
	t.Helper()
	w := uiReq(t, s, "GET", "/ui/panels"+query, secret, nil)
	if w.Code != 200 {
		t.Fatalf("panels%s: got %d: %s", query, w.Code, w.Body)
	}
	var out struct {
		Now    time.Time `json:"now"`
		Panels []struct {
			Name string `json:"name"`
			Show bool   `json:"show"`
			HTML string `json:"html"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Now.IsZero() {
		t.Fatalf("panels answer: %v: %s", err, w.Body)
	}
	m := map[string]string{}
	for _, p := range out.Panels {
		m[p.Name] = p.HTML
	}
	return m
}

func TestUIPanelsByRole(t *testing.T) {
	s, f := testServer(t, nil)
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, GPUs: []arbiter.GPU{{Index: 0, Model: "NVIDIA H100", VRAMGiB: 80, Healthy: true}}})
	bg := context.Background()
	mine, _ := f.Do(bg, arbiter.Allocate{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, Request: arbiter.Request{Owner: "alice", GPUs: 1}})
	theirs, _ := f.Do(bg, arbiter.Allocate{Caller: arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}, Request: arbiter.Request{Owner: "<b>bob</b>", GPUs: 1, Priority: 5}})
	_ = mine

	admin := uiPanelsAnswer(t, s, testAdmin, "")
	if len(admin) != len(ui.Panels()) {
		t.Errorf("got panels %v, want all %d", admin, len(ui.Panels()))
	}
	q := admin["queue"]
	if !strings.Contains(q, `id="q-2"`) || !strings.Contains(q, "no machine has 1 free GPU") || strings.Index(q, `id="q-2"`) > strings.Index(q, `id="q-1"`) {
		t.Errorf("queue: want #2 (priority 5) before #1 with why_queued:\n%s", q)
	}
	if strings.Contains(q, "<b>bob</b>") || !strings.Contains(q, "&lt;b&gt;bob&lt;/b&gt;") {
		t.Errorf("queue: the owner is not escaped:\n%s", q)
	}
	if !strings.Contains(q, `class="act danger admin"`) || !strings.Contains(admin["machines"], `data-action="drain"`) {
		t.Errorf("admin sees no admin buttons:\n%s\n%s", q, admin["machines"])
	}

	user := uiPanelsAnswer(t, s, testUser, "?p=queue&p=machines")
	if len(user) != 2 {
		t.Errorf("got panels %v, want queue and machines", user)
	}
	if strings.Contains(user["queue"]+user["machines"], "admin") {
		t.Errorf("user sees admin buttons:\n%s", user["queue"])
	}
	if !strings.Contains(user["queue"], `data-action="release" data-id="1"`) || strings.Contains(user["queue"], `data-id="2"`) {
		t.Errorf("user: want a release button on its own allocation only:\n%s", user["queue"])
	}
	agent := uiPanelsAnswer(t, s, testAgent, "?p=queue")
	if strings.Contains(agent["queue"], "data-action") {
		t.Errorf("agent sees action buttons:\n%s", agent["queue"])
	}
	_ = theirs

	if w := uiReq(t, s, "GET", "/ui/panels?p=nope", testUser, nil); w.Code != 400 || !strings.Contains(w.Body.String(), "summary, machines") {
		t.Errorf("unknown panel: got %d %s", w.Code, w.Body)
	}
	if w := uiReq(t, s, "GET", "/ui/panels?x=1", testUser, nil); w.Code != 400 {
		t.Errorf("unknown parameter: got %d", w.Code)
	}
	if w := uiReq(t, s, "GET", "/ui/panels", "", nil); w.Code != 401 {
		t.Errorf("no token: got %d", w.Code)
	}
}

func TestUIMachinesPanel(t *testing.T) {
	s, f := testServer(t, nil)
	ka := 30.0
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, LastSeen: fakeNow, GPUs: []arbiter.GPU{
		{Index: 0, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Healthy: true},
		{Index: 1, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Healthy: true},
		{Index: 2, Model: "NVIDIA A100", VRAMGiB: 40, Healthy: false},
	}})
	f.mu.Lock()
	exp := fakeNow.Add(20 * time.Second)
	f.allocs[7] = arbiter.Allocation{ID: 7, Owner: "carol", State: arbiter.StateReady, Machine: arbiter.Str("gpu1"),
		Devices: []arbiter.DeviceRef{{Machine: "gpu1", Index: 1}}, KeepaliveS: &ka, ExpiresAt: &exp,
		CreatedAt: fakeNow, ReadyAt: &fakeNow}
	f.mu.Unlock()
	html := uiPanelsAnswer(t, s, testUser, "?p=machines")["machines"]
	for _, want := range []string{
		`id="g-gpu1-0" class="gpu free"`,
		`id="g-gpu1-1" class="gpu held o`,
		`<span class="gpu-owner">carol</span>`,
		`#7<span class="gpu-since"> · `,
		`data-ka="7" data-interval="30">`,
		`datetime="2025-01-02T03:03:55.000Z"`, // last keepalive: the deadline less 30 s
		`class="gpu unhealthy"`,
		`2 × H100 80GB HBM3 · 80 GiB, 1 × A100 · 40 GiB`,
		`<span class="gpu-model">A100 · 40 GiB</span>`, // a mixed machine names each tile's model
		`data-seen="gpu1"`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("machines panel lacks %q:\n%s", want, html)
		}
	}
}

func TestUIStatic(t *testing.T) {
	s, _ := testServer(t, nil)
	// The page links its files by their current version.
	page := uiReq(t, s, "GET", "/", testUser, nil).Body.String()
	for file, ctype := range map[string]string{"app.js": "text/javascript", "app.css": "text/css", "icon.svg": "image/svg+xml"} {
		m := regexp.MustCompile(`/ui/static/` + regexp.QuoteMeta(file) + `\?v=([0-9a-f]{12})`).FindStringSubmatch(page)
		if m == nil {
			t.Errorf("the page does not link %s by its version", file)
			continue
		}
		w := uiReq(t, s, "GET", "/ui/static/"+file+"?v="+m[1], "", nil)
		if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), ctype) || !strings.Contains(w.Header().Get("Cache-Control"), "immutable") {
			t.Errorf("%s: got %d %q %q", file, w.Code, w.Header().Get("Content-Type"), w.Header().Get("Cache-Control"))
		}
		etag := w.Header().Get("ETag")
		w = uiReq(t, s, "GET", "/ui/static/"+file, "", nil, "If-None-Match: "+etag)
		if w.Code != 304 || w.Header().Get("Cache-Control") != "no-cache" {
			t.Errorf("%s revalidated: got %d %q", file, w.Code, w.Header().Get("Cache-Control"))
		}
	}
	if w := uiReq(t, s, "GET", "/ui/static/nope.js", "", nil); w.Code != 404 {
		t.Errorf("unknown file: got %d", w.Code)
	}
}

// uiSSE reads server-sent frames (blank-line separated) from a stream
// until the test ends.
func uiSSE(t *testing.T, body io.Reader) <-chan string {
	ch := make(chan string, 16)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		var frame []string
		for sc.Scan() {
			if sc.Text() == "" {
				if len(frame) > 0 {
					select {
					case ch <- strings.Join(frame, "\n"):
					case <-done:
						return
					}
				}
				frame = nil
				continue
			}
			frame = append(frame, sc.Text())
		}
	}()
	return ch
}

func uiNext(t *testing.T, ch <-chan string, want string) string {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case f, ok := <-ch:
			if !ok {
				t.Fatalf("stream closed before a frame with %q", want)
			}
			if strings.Contains(f, want) {
				return f
			}
		case <-timeout:
			t.Fatalf("no frame with %q", want)
		}
	}
}

func TestUIEventStream(t *testing.T) {
	s, f := testServer(t, nil)
	s.dash.Tick = 10 * time.Millisecond
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	bg := context.Background()
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, LastSeen: fakeNow})
	f.Do(bg, arbiter.Allocate{Caller: arbiter.Caller{Name: "alice"}, Request: arbiter.Request{Owner: "alice", GPUs: 1}})
	f.Do(bg, arbiter.Allocate{Caller: arbiter.Caller{Name: "alice"}, Request: arbiter.Request{Owner: "alice", GPUs: 1}})

	open := func(since, lastID string) (<-chan string, func()) {
		req, _ := http.NewRequest("GET", ts.URL+"/ui/events?since="+since, nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: uiSession(t, s, testUser)})
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return uiSSE(t, resp.Body), func() { resp.Body.Close() }
	}

	ch, stop := open("0", "")
	// First what the page's memory-only times are now, then the events.
	if retry := uiNext(t, ch, ""); retry != "retry: 2000" {
		t.Errorf("first frame %q, want the reconnection delay", retry)
	}
	live := uiNext(t, ch, "")
	if !strings.HasPrefix(live, "event: live\n") || !strings.Contains(live, `"seen":{"gpu1":"2025-01-02T03:04:05.000Z"}`) {
		t.Errorf("first frame %q: want liveness with gpu1's heartbeat", live)
	}
	first := uiNext(t, ch, "id: ")
	if first != `id: 1`+"\n"+`data: {"seq":1,"kind":"allocation.queued","subject":"allocation/1"}` {
		t.Errorf("got frame %q: want an id and a small data line, no event: line", first)
	}
	// A keepalive moves a deadline in memory only: the next frame says so.
	ka := 60.0
	exp := fakeNow.Add(45 * time.Second)
	f.mu.Lock()
	a := f.allocs[2]
	a.State, a.KeepaliveS, a.ExpiresAt = arbiter.StateReady, &ka, &exp
	f.allocs[2] = a
	f.mu.Unlock()
	if live = uiNext(t, ch, `"ka":{"2":`); !strings.Contains(live, `"2":"2025-01-02T03:03:50.000Z"`) || strings.Contains(live, "gpu1") {
		t.Errorf("liveness frame %q: want only allocation 2's keepalive, 15 s before now", live)
	}
	stop()

	// A reconnecting EventSource repeats ?since= but sends Last-Event-ID: that wins.
	ch, stop = open("0", "1")
	if got := uiNext(t, ch, "id: "); !strings.HasPrefix(got, "id: 2") {
		t.Errorf("resumed at %q, want id 2", got)
	}
	stop()

	// A page that followed another history (a restored database) gets
	// this one's events, numbered below its own.
	ch, stop = open("99", "")
	f.Do(bg, arbiter.Allocate{Caller: arbiter.Caller{Name: "alice"}, Request: arbiter.Request{Owner: "alice", GPUs: 1}})
	if got := uiNext(t, ch, "id: "); !strings.HasPrefix(got, "id: 3") {
		t.Errorf("a page from another history got %q, want id 3", got)
	}
	stop()

	if w := uiReq(t, s, "GET", "/ui/events?since=x", testUser, nil); w.Code != 400 {
		t.Errorf("bad since: got %d", w.Code)
	}
}

// FuzzUIRequests throws arbitrary paths, queries, cookies and forms at the
// dashboard's routes: never a panic or a 5xx, and never a page for a bad
// token.
func FuzzUIRequests(f *testing.F) {
	f.Add("GET", "/", "", "")
	f.Add("POST", "/ui/login", "", "token=admin-secret")
	f.Add("GET", "/ui/panels?p=queue&p=machines", "YWRtaW4tc2VjcmV0", "")
	f.Add("GET", "/ui/panels?p=%00", "%%%", "")
	f.Add("GET", "/ui/static/app.js?v=1", "", "")
	f.Add("GET", "/ui/events?since=-1", "YWxpY2Utc2VjcmV0", "")
	f.Add("POST", "/ui/logout", "", "a=%zz")
	p := newFakePlane()
	s := NewServer(Options{Plane: p, Tokens: testTokens, Version: "test"})
	p.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, GPUs: []arbiter.GPU{{Index: 0}}})
	f.Fuzz(func(t *testing.T, method, target, cookie, form string) {
		if method != "GET" && method != "POST" {
			method = "GET"
		}
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n\t#") {
			return
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		if strings.HasPrefix(target, "/ui/events") {
			return // a stream: it does not end by itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r := testRequest(method, target, strings.NewReader(form)).WithContext(ctx)
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Cookie", ui.CookieName+"="+cookie)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("%s %s: got %d: %s", method, target, w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), `id="p-machines"`) && !validSession(p, cookie) {
			t.Fatalf("the dashboard was served to cookie %q", cookie)
		}
	})
}

// uiRecordsPlane is the fake plane with records of other kinds.
type uiRecordsPlane struct {
	*fakePlane
	records map[string][]arbiter.Record
}

func (p *uiRecordsPlane) Records(kind string) []arbiter.Record { return p.records[kind] }

func TestUICapabilityPanels(t *testing.T) {
	f := newFakePlane()
	p := &uiRecordsPlane{fakePlane: f, records: map[string][]arbiter.Record{}}
	s := NewServer(Options{Plane: p, Tokens: testTokens})
	// Nothing recorded: the panels are absent.
	got := uiPanelsAnswer(t, s, testAdmin, "?p=locks&p=schedules&p=pools&p=tasks")
	for name, html := range got {
		if html != "" {
			t.Errorf("panel %s shows with nothing to show:\n%s", name, html)
		}
	}

	now := time.Now().UTC()
	later, past := now.Add(10*time.Minute), now.Add(-time.Minute)
	p.records[arbiter.RecordLock] = []arbiter.Record{
		{Kind: arbiter.RecordLock, Key: "swap", Value: arbiter.Lock{Name: "swap", Holder: "cron", Fence: 3, AcquiredAt: now, ExpiresAt: later, Note: "nightly"}},
		{Kind: arbiter.RecordLock, Key: "old", Value: arbiter.Lock{Name: "old", Holder: "gone", AcquiredAt: past, ExpiresAt: past}},
	}
	p.records[arbiter.RecordSchedule] = []arbiter.Record{
		{Kind: arbiter.RecordSchedule, Key: "b", Value: arbiter.Schedule{ID: "b", Name: "Later", Cron: "0 3 * * *", NextRun: later.Format(time.RFC3339)}},
		{Kind: arbiter.RecordSchedule, Key: "a", Value: arbiter.Schedule{ID: "a", Name: "Whenever", NextRun: "when the queue is empty"}},
	}
	slot := int64(9)
	p.records[arbiter.RecordPool] = []arbiter.Record{{Kind: arbiter.RecordPool, Key: "small", Value: arbiter.PoolStatus{
		Pool: arbiter.Pool{Name: "small", Slots: 2, Backing: arbiter.Request{GPUs: 1}, GraceTimeS: 60}, Configured: true,
		Backings: []arbiter.BackingStatus{{Allocation: 4, State: arbiter.StateReady, Machine: arbiter.Str("gpu1"), Slots: []*int64{&slot, nil}}},
	}}}
	claimed := now.Add(-time.Minute)
	p.records[arbiter.KindTask] = []arbiter.Record{
		{Kind: arbiter.KindTask, Key: "t1", Value: arbiter.Task{ID: "t1", Name: "train-a", Status: arbiter.TaskRunning, ClaimedBy: "w1", ClaimedAt: &claimed, Machine: "gpu1", GPUs: []int{0, 1}, Attempts: 1}},
		{Kind: arbiter.KindTask, Key: "t2", Value: arbiter.Task{ID: "t2", Name: "train-b", Status: arbiter.TaskFailed, LastError: "exit status 3", Attempts: 3}},
		{Kind: arbiter.KindTask, Key: "t3", Value: arbiter.Task{ID: "t3", Name: "train-c", Status: arbiter.TaskPending}},
	}
	admin := uiPanelsAnswer(t, s, testAdmin, "?p=locks&p=schedules&p=pools&p=tasks")
	for panel, wants := range map[string][]string{
		"locks":     {`id="lock-swap"`, "cron", "nightly", "fence 3", `data-action="lock-release" data-lock="swap"`},
		"schedules": {`id="s-b"`, "Later", "when the queue is empty", "<code>0 3 * * *</code>"},
		"pools":     {`id="pool-small"`, `id="backing-4"`, `class="slot free"`, "slot 0: #9"},
		"tasks":     {"running <strong>1</strong>", "pending <strong>1</strong>", `id="t-t1"`, "gpu1: 0, 1", `id="tf-t2"`, "exit status 3", `data-action="task-cancel"`, `data-action="task-requeue"`},
	} {
		for _, w := range wants {
			if !strings.Contains(admin[panel], w) {
				t.Errorf("panel %s lacks %q:\n%s", panel, w, admin[panel])
			}
		}
	}
	if strings.Contains(admin["locks"], "gone") {
		t.Errorf("an expired lock is shown:\n%s", admin["locks"])
	}
	if strings.Index(admin["schedules"], `id="s-b"`) > strings.Index(admin["schedules"], `id="s-a"`) {
		t.Errorf("schedules: want the one with a next run first")
	}
	user := uiPanelsAnswer(t, s, testUser, "?p=locks&p=tasks")
	if strings.Contains(user["locks"]+user["tasks"], "data-action") {
		t.Errorf("a user sees admin actions:\n%s\n%s", user["locks"], user["tasks"])
	}
}

// TestUIMachineTilesEscape: the GPU tiles are written without the template,
// so their every text must be escaped by hand — the holder's name most of
// all, which anyone with a token chooses.
func TestUIMachineTilesEscape(t *testing.T) {
	p := newUIBenchPlane(1)
	owner := `<img src=x onerror="alert(1)">`
	p.as[0].Owner = owner
	d := &p.ms[0].Devices[0]
	d.Model, d.UUID = `H100 "<i>"`, "GPU-&1"
	p.ms[0].Devices[7].Healthy = false
	s := NewServer(Options{Plane: p, Tokens: testTokens})
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, uiBenchRequest("/ui/panels?p=machines"))
	var out struct {
		Panels []struct {
			Name string `json:"name"`
			Show bool   `json:"show"`
			HTML string `json:"html"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || len(out.Panels) != 1 {
		t.Fatalf("panels: %v %s", err, w.Body.Bytes())
	}
	m := out.Panels[0].HTML
	for _, bad := range []string{owner, `"<i>"`, "GPU-&1"} {
		if strings.Contains(m, bad) {
			t.Errorf("machines panel holds %q unescaped:\n%s", bad, m)
		}
	}
	for _, want := range []string{`<span class="gpu-owner">&lt;img src=x onerror=&#34;alert(1)&#34;&gt;</span>`,
		`H100 &#34;&lt;i&gt;&#34;`, "GPU-&amp;1", `id="g-gpu0000-0"`, ">unhealthy<"} {
		if !strings.Contains(m, want) {
			t.Errorf("machines panel lacks %q:\n%s", want, m)
		}
	}
}

// uiCompactPlane is the bench plane with n GPU machines, the fourth
// draining, the fifth down with an unhealthy GPU, and a grid machine of
// 2 × 2 triads among them.
func uiCompactPlane(n int) *uiBenchPlane {
	p := newUIBenchPlane(n)
	p.ms[3].State = arbiter.MachineDraining
	p.ms[4].State = arbiter.MachineDown
	p.ms[4].Devices[7].Healthy = false
	grid, as := uiBigGrid(2, 2)
	for i := range grid.Devices {
		if id := grid.Devices[i].Allocation; id != nil {
			*id += 100000
		}
	}
	for i := range as {
		as[i].ID += 100000
	}
	grid.Name = "gpu0002-spin"
	p.ms = append(p.ms, grid)
	p.as = append(p.as, as...)
	return p
}

// TestUIMachinesCompact: past ui.CompactAt GPU machines each is one
// row with a cell per GPU, its ids those of the tiles; up to it, tiles.
func TestUIMachinesCompact(t *testing.T) {
	p := uiCompactPlane(ui.CompactAt + 1)
	s := NewServer(Options{Plane: p, Tokens: testTokens})
	admin := uiPanelsAnswer(t, s, testAdmin, "?p=machines")["machines"]
	for _, want := range []string{
		`<h2 id="h-machines">Machines <span class="count">50</span></h2>`,
		`<div class="machines compact admin">`,
		`<article class="mrow state-up" id="m-gpu0000" aria-labelledby="mh-gpu0000">`,
		`<h3 id="mh-gpu0000" class="mrow-name" title="gpu0000 · 8 × H100 80GB HBM3 · 80 GiB">gpu0000</h3>`,
		`<span class="badge badge-up">up</span>`,
		`<span class="free-count"><strong>2</strong>/8</span>`,
		`<ol class="cells" aria-label="GPUs of gpu0000">`,
		`<li id="g-gpu0000-0" class="cell held o`,
		` title="GPU 0 · NVIDIA H100 80GB HBM3 · 80 GiB · compute 9.0 · held by user1 · #1 since 2025-01-02 03:04:05 UTC · last keepalive 2025-01-02 03:03:35 UTC" aria-label="GPU 0: user1, #1"></li>`,
		`<li id="g-gpu0000-7" class="cell free" title="GPU 7 · NVIDIA H100 80GB HBM3 · 80 GiB · compute 9.0 · free" aria-label="GPU 7: free"></li>`,
		`<li id="g-gpu0004-7" class="cell unhealthy" title="GPU 7 · NVIDIA H100 80GB HBM3 · 80 GiB · compute 9.0 · unhealthy" aria-label="GPU 7: unhealthy"></li>`,
		`<span class="tags" title="tags: h100"><span class="tag">h100</span></span>`,
		`data-rel data-seen="gpu0000">`,
		`<article class="mrow state-draining" id="m-gpu0003"`,
		`<span class="badge badge-draining">draining</span>`,
		`<button type="button" class="act admin" data-action="undrain" data-machine="gpu0003" data-title="Undrain gpu0003" data-confirm="Place new allocations on gpu0003 again?">Undrain</button>`,
		`<button type="button" class="act admin" data-action="drain" data-machine="gpu0000" data-title="Drain gpu0000" data-confirm="Stop placing new allocations on gpu0000? What it holds stays until released.">Drain</button>`,
		`<article class="mrow state-down" id="m-gpu0004"`,
		// The grid machine keeps its article and board map, in name order.
		`<article class="machine state-up" id="m-gpu0002-spin" aria-labelledby="mh-gpu0002-spin">`,
		`<div class="boardmap`,
	} {
		if !strings.Contains(admin, want) {
			t.Errorf("compact machines panel lacks %q", want)
		}
	}
	if i, j, k := strings.Index(admin, `id="m-gpu0002"`), strings.Index(admin, `id="m-gpu0002-spin"`), strings.Index(admin, `id="m-gpu0003"`); !(i < j && j < k) {
		t.Errorf("machines out of name order: %d %d %d", i, j, k)
	}
	for _, bad := range []string{`class="gpu `, `class="gpus"`, `class="machine state-up" id="m-gpu0000"`} {
		if strings.Contains(admin, bad) {
			t.Errorf("compact machines panel holds %q", bad)
		}
	}
	if n := strings.Count(admin, `<li id="g-`); n != 8*(ui.CompactAt+1) {
		t.Errorf("%d cells, want %d", n, 8*(ui.CompactAt+1))
	}
	if n := strings.Count(admin, `<article class="mrow `); n != ui.CompactAt+1 {
		t.Errorf("%d rows, want %d", n, ui.CompactAt+1)
	}
	// A user sees no drain buttons; the page renders the same rows.
	user := uiPanelsAnswer(t, s, testUser, "?p=machines")["machines"]
	if strings.Contains(user, `data-action="drain"`) || !strings.Contains(user, `<div class="machines compact">`) {
		t.Errorf("user's compact panel: drain buttons or no compact class")
	}
	w := uiReq(t, s, "GET", "/", testUser, nil)
	if page := w.Body.String(); w.Code != 200 || !strings.Contains(page, `<li id="g-gpu0048-7" class="cell free"`) {
		t.Errorf("page: %d, no compact cell", w.Code)
	}

	// At the threshold: tiles, as ever.
	s = NewServer(Options{Plane: uiCompactPlane(ui.CompactAt), Tokens: testTokens})
	tiles := uiPanelsAnswer(t, s, testAdmin, "?p=machines")["machines"]
	for _, want := range []string{`<div class="machines">`, `<article class="machine state-up" id="m-gpu0000"`,
		`<ol class="gpus" aria-label="GPUs of gpu0000">`, `<li id="g-gpu0000-7" class="gpu free"`} {
		if !strings.Contains(tiles, want) {
			t.Errorf("tiled machines panel lacks %q", want)
		}
	}
	if strings.Contains(tiles, "mrow") || strings.Contains(tiles, `class="cell`) {
		t.Error("48 machines shown as compact rows")
	}
}

// TestUIMachineRowsEscape: the compact rows are written without the
// template, so every text in them must be escaped by hand: machine name,
// holder, model, tags, UUID, compute capability.
func TestUIMachineRowsEscape(t *testing.T) {
	p := newUIBenchPlane(ui.CompactAt + 1)
	owner := `<img src=x onerror="alert(1)">`
	p.as[0].Owner = owner
	m := &p.ms[0]
	m.Name = `gpu"><script>x</script>`
	m.Tags = []string{`<b>tag</b>`, `a&b`}
	d := &m.Devices[0]
	d.Model, d.UUID, d.Compute = `H100 "<i>"`, "GPU-&1", `9'0<`
	m.Devices[7].Healthy = false
	s := NewServer(Options{Plane: p, Tokens: testTokens})
	h := uiPanelsAnswer(t, s, testAdmin, "?p=machines")["machines"]
	for _, bad := range []string{owner, `"<i>"`, "GPU-&1", `<script>`, `<b>tag`, "a&b", `9'0<`} {
		if strings.Contains(h, bad) {
			t.Errorf("compact machines panel holds %q unescaped", bad)
		}
	}
	name := `gpu&#34;&gt;&lt;script&gt;x&lt;/script&gt;`
	for _, want := range []string{
		`id="m-` + name + `" aria-labelledby="mh-` + name + `"`,
		`<h3 id="mh-` + name + `" class="mrow-name" title="` + name + ` · `,
		`>` + name + `</h3>`,
		`<ol class="cells" aria-label="GPUs of ` + name + `">`,
		`<li id="g-` + name + `-0" class="cell held o`,
		`title="GPU 0 · H100 &#34;&lt;i&gt;&#34; · 80 GiB · compute 9&#39;0&lt; · GPU-&amp;1 · held by &lt;img src=x onerror=&#34;alert(1)&#34;&gt; · #1 since`,
		`aria-label="GPU 0: &lt;img src=x onerror=&#34;alert(1)&#34;&gt;, #1"`,
		`<span class="tags" title="tags: &lt;b&gt;tag&lt;/b&gt;, a&amp;b"><span class="tag">&lt;b&gt;tag&lt;/b&gt;</span><span class="tag">a&amp;b</span></span>`,
		`data-seen="` + name + `">`,
		`data-machine="` + name + `" data-title="Drain ` + name + `" data-confirm="Stop placing new allocations on ` + name + `? `,
		`aria-label="GPU 7: unhealthy"`,
	} {
		if !strings.Contains(h, want) {
			t.Errorf("compact machines panel lacks %q", want)
		}
	}
}

// validSession reports whether cookie is a session the fake plane keeps.
func validSession(p *fakePlane, cookie string) bool {
	key := sessionKey(cookie)
	_, ok := p.Record(arbiter.RecordSession, key)
	return key != "" && ok
}

// uiEvents opens the page's event stream with the session cookie.
func uiEvents(t *testing.T, url, cookie string) <-chan string {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/ui/events?since=0", nil)
	req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: cookie})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return uiSSE(t, resp.Body)
}

// TestUIStreamKeepsWebhookEventsFromUsers: the page's stream leaves out
// the webhook events and others' notifications for a user, as the event
// log does.
func TestUIStreamKeepsWebhookEventsFromUsers(t *testing.T) {
	s, f := testServer(t, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	emitRaw(f, arbiter.EventWebhookCreated, "webhook/payroll-alerts", arbiter.Webhook{ID: "payroll-alerts", URL: "https://hooks.example/T0/B0/xyz"})
	emitRaw(f, arbiter.EventNotification, "notify/bob-quota", map[string]any{"principal": "bob", "text": "bob's quota"})
	emitRaw(f, arbiter.EventAllocationQueued, "allocation/42", map[string]any{"owner": "alice"})
	fr := uiNext(t, uiEvents(t, ts.URL, uiSession(t, s, testUser)), "id: ")
	if !strings.Contains(fr, "allocation/42") {
		t.Fatalf("the user's first event: %q, want allocation/42 (the webhook and bob's notification left out)", fr)
	}
}

// TestUIStreamEndsWithItsToken: a reload that removes the token a session
// signed in with ends the page's stream already open, as it refuses new
// requests.
func TestUIStreamEndsWithItsToken(t *testing.T) {
	s, _ := testServer(t, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie := uiSession(t, s, testUser)
	ch := uiEvents(t, ts.URL, cookie)
	uiNext(t, ch, "retry:")
	if err := s.SetTokens([]Token{testTokens[0], testTokens[2]}); err != nil { // alice's removed
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return // ended
			}
		case <-deadline:
			t.Fatal("the stream is still open 5 s after its token was removed")
		}
	}
}

// TestUIStreamEndsWithItsSession: logging out ends the page's event stream
// that the same cookie has open ("the cookie then works nowhere"); another
// session's stream goes on.
func TestUIStreamEndsWithItsSession(t *testing.T) {
	s, _ := testServer(t, nil)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	cookie, other := uiSession(t, s, testUser), uiSession(t, s, testUser)
	ch, kept := uiEvents(t, ts.URL, cookie), uiEvents(t, ts.URL, other)
	uiNext(t, ch, "retry:")
	uiNext(t, kept, "retry:")
	s.signOut(context.Background(), cookie)
	deadline := time.After(5 * time.Second)
	for ended := false; !ended; {
		select {
		case _, ok := <-ch:
			ended = !ok
		case <-deadline:
			t.Fatal("the stream is still open 5 s after its session was logged out")
		}
	}
	select {
	case _, ok := <-kept:
		if !ok {
			t.Fatal("another session's stream ended with the log out")
		}
	default:
	}
}

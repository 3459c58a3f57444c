package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// Secrets of the test tokens.
const (
	testAdmin = "admin-secret"
	testUser  = "alice-secret"
	testAgent = "agent-secret"
)

var testTokens = []Token{
	{Name: "ops", Role: arbiter.RoleAdmin, Secret: testAdmin},
	{Name: "alice", Role: arbiter.RoleUser, Secret: testUser},
	{Name: "gpu-agent", Role: arbiter.RoleAgent, Secret: testAgent},
}

// testServer returns a server with the test tokens over a fresh fake.
func testServer(t *testing.T, mod func(*Options)) (*Server, *fakePlane) {
	t.Helper()
	f := newFakePlane()
	o := Options{Plane: f, Tokens: testTokens, Version: "test"}
	if mod != nil {
		mod(&o)
	}
	return NewServer(o), f
}

// answer is one recorded answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// decode unmarshals the body into v, failing the test if it is not JSON.
func (a answer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %s", a.status, err, a.body)
	}
}

// errorCode returns the error code and message of an error answer.
func (a answer) errorBody(t *testing.T) (code, message string) {
	t.Helper()
	var e errorBody
	a.decode(t, &e)
	if e.Error.Code == "" {
		t.Fatalf("answer %d has no error code: %s", a.status, a.body)
	}
	return e.Error.Code, e.Error.Message
}

// call sends one request through the handler. body may be nil, a string
// or a value to encode as JSON.
func call(t *testing.T, s *Server, method, path, token string, body any) answer {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	r := testRequest(method, path, rd)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return answer{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

func TestServerAuth(t *testing.T) {
	s, f := testServer(t, nil)
	f.addMachine(arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig})
	alloc := `{"owner":"bob","gpus":1}`
	tests := []struct {
		name, method, path, token string
		body                      any
		want                      int
		wantMsg                   string // substring of the error message
	}{
		{"no token", "GET", "/api/v1/machines", "", nil, 401, noTokenMessage},
		{"unknown token", "GET", "/api/v1/machines", "nope", nil, 401, unknownTokenMessage},
		{"prefix of a token", "GET", "/api/v1/machines", "admin", nil, 401, unknownTokenMessage},
		{"health is public", "GET", "/api/v1/health", "", nil, 200, ""},
		{"openapi is public", "GET", "/api/v1/openapi.json", "", nil, 200, ""},
		{"user reads", "GET", "/api/v1/machines", testUser, nil, 200, ""},
		{"agent reads", "GET", "/api/v1/allocations", testAgent, nil, 200, ""},
		{"user allocates", "POST", "/api/v1/allocations", testUser, alloc, 201, ""},
		{"admin allocates", "POST", "/api/v1/allocations", testAdmin, alloc, 201, ""},
		{"agent may not allocate", "POST", "/api/v1/allocations", testAgent, alloc, 403, "needs the user or admin role"},
		{"user may not register", "POST", "/api/v1/machines", testUser, `{"name":"h"}`, 403, "needs the agent or admin role"},
		{"agent registers", "POST", "/api/v1/machines", testAgent, `{"name":"h"}`, 200, ""},
		{"agent heartbeats", "POST", "/api/v1/machines/gpu1/heartbeat", testAgent, nil, 200, ""},
		{"user may not heartbeat", "POST", "/api/v1/machines/gpu1/heartbeat", testUser, nil, 403, "agent or admin"},
		{"user may not drain", "POST", "/api/v1/machines/gpu1/drain", testUser, nil, 403, "needs the admin role"},
		{"agent may not drain", "POST", "/api/v1/machines/gpu1/undrain", testAgent, nil, 403, "needs the admin role"},
		{"admin drains", "POST", "/api/v1/machines/gpu1/drain", testAdmin, nil, 200, ""},
		{"agent may not release", "DELETE", "/api/v1/allocations/1", testAgent, nil, 403, "user or admin"},
		{"agent may not keep alive", "POST", "/api/v1/allocations/1/keepalive", testAgent, nil, 403, "user or admin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := call(t, s, tt.method, tt.path, tt.token, tt.body)
			if a.status != tt.want {
				t.Fatalf("got status %d, want %d: %s", a.status, tt.want, a.body)
			}
			if tt.wantMsg == "" {
				return
			}
			_, msg := a.errorBody(t)
			if !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("got message %q, want it to contain %q", msg, tt.wantMsg)
			}
			if tt.want == 401 && a.header.Get("WWW-Authenticate") == "" {
				t.Errorf("got no WWW-Authenticate header on 401")
			}
		})
	}
}

func TestServerAuthSchemes(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, h := range []string{"Basic " + testAdmin, testAdmin, "Bearer", "Bearer ", "bearer " + testAdmin} {
		r := testRequest("GET", "/api/v1/machines", nil)
		r.Header.Set("Authorization", h)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		want := 401
		if strings.HasPrefix(h, "bearer ") { // the scheme is case-insensitive
			want = 200
		}
		if w.Code != want {
			t.Errorf("Authorization %q: got %d, want %d", h, w.Code, want)
		}
	}
}

func TestServerOpenWithoutTokens(t *testing.T) {
	s, f := testServer(t, func(o *Options) { o.Tokens = nil })
	a := call(t, s, "POST", "/api/v1/allocations", "", `{"owner":"bob","gpus":1}`)
	if a.status != 201 {
		t.Fatalf("got %d, want 201: %s", a.status, a.body)
	}
	cmd := f.commands()[0].(arbiter.Allocate)
	if want := (arbiter.Caller{Role: arbiter.RoleAdmin}); cmd.Caller != want {
		t.Errorf("got caller %+v, want %+v", cmd.Caller, want)
	}
	// Without a token there is no name to default the owner to.
	a = call(t, s, "POST", "/api/v1/allocations", "", `{"gpus":1}`)
	if code, msg := a.errorBody(t); a.status != 400 || code != arbiter.EInvalid || !strings.Contains(msg, "owner") {
		t.Errorf("got %d %s %q, want 400 invalid about owner", a.status, code, msg)
	}
}

func TestServerErrorCodes(t *testing.T) {
	for code, want := range map[string]int{
		arbiter.EInvalid: 400, arbiter.EUnauthorized: 401, arbiter.EForbidden: 403, arbiter.ENotFound: 404,
		arbiter.EConflict: 409, arbiter.ETooLarge: 413, arbiter.ELocked: 423, arbiter.EUnavailable: 503,
		arbiter.EInternal: 500, "made_up": 500,
	} {
		t.Run(code, func(t *testing.T) {
			s, f := testServer(t, nil)
			f.doErr = arbiter.Errorf(code, "the %s message", code)
			a := call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
			if a.status != want {
				t.Fatalf("got %d, want %d", a.status, want)
			}
			gotCode, msg := a.errorBody(t)
			wantCode := code
			if want == 500 {
				wantCode = arbiter.EInternal
			}
			if gotCode != wantCode {
				t.Errorf("got code %q, want %q", gotCode, wantCode)
			}
			if want != 500 && msg != "the "+code+" message" {
				t.Errorf("got message %q, want the plane's", msg)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("got Content-Type %q, want application/json", ct)
			}
		})
	}
}

func TestServerInternalErrorLoggedOnce(t *testing.T) {
	var log bytes.Buffer
	s, f := testServer(t, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	f.doErr = errors.New("disk on fire at /var/lib/arbiter")
	a := call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	if code, msg := a.errorBody(t); a.status != 500 || code != arbiter.EInternal || msg != "internal error" {
		t.Fatalf("got %d %s %q, want 500 internal \"internal error\"", a.status, code, msg)
	}
	if n := strings.Count(log.String(), "disk on fire"); n != 1 {
		t.Errorf("got the detail logged %d times, want once:\n%s", n, log.String())
	}
	if strings.Contains(log.String(), testUser) {
		t.Errorf("the log holds a secret:\n%s", log.String())
	}
}

func TestServerPanicIs500(t *testing.T) {
	s, f := testServer(t, nil)
	f.doPanic = true
	a := call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	if code, _ := a.errorBody(t); a.status != 500 || code != arbiter.EInternal {
		t.Errorf("got %d %s, want 500 internal", a.status, code)
	}
}

func TestServerUnknownRouteAndMethod(t *testing.T) {
	s, _ := testServer(t, nil)
	tests := []struct {
		name, method, path string
		want               int
		allow              string
	}{
		{"unknown path", "GET", "/api/v1/nothing", 404, ""},
		{"root is the dashboard's page", "DELETE", "/", 405, "GET, HEAD"},
		{"trailing slash", "GET", "/api/v1/machines/", 404, ""},
		{"put allocations", "PUT", "/api/v1/allocations", 405, "GET, POST, HEAD"},
		{"delete machines", "DELETE", "/api/v1/machines", 405, "GET, POST, HEAD"},
		{"get keepalive", "GET", "/api/v1/allocations/1/keepalive", 405, "POST"},
		{"post allocation", "POST", "/api/v1/allocations/1", 405, "GET, DELETE, HEAD"},
		{"post artifact", "POST", "/api/v1/tasks/abc/artifact", 405, "PUT"},
		{"post catalog entry", "POST", "/api/v1/services/vllm/catalog/gemma", 405, "GET, PUT, DELETE, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := call(t, s, tt.method, tt.path, testAdmin, nil)
			if a.status != tt.want {
				t.Fatalf("got %d, want %d: %s", a.status, tt.want, a.body)
			}
			a.errorBody(t)
			if got := a.header.Get("Allow"); got != tt.allow {
				t.Errorf("got Allow %q, want %q", got, tt.allow)
			}
		})
	}
}

func TestServerAllocateBadBodies(t *testing.T) {
	s, f := testServer(t, nil)
	tests := []struct {
		name        string
		contentType string
		body        string
		want        int
		wantMsg     string
	}{
		{"10 MB", "", `{"owner":"` + strings.Repeat("x", 10<<20) + `"}`, 413, "limit of 1048576 bytes"},
		{"unknown field", "", `{"gpus":1,"bogus":2}`, 400, `unknown field "bogus"`},
		{"lots of vram", "", `{"gpus":1,"min_vram_gib":"lots"}`, 400, `min_vram_gib: want a number, got string "lots"`},
		{"fractional gpus", "", `{"gpus":1.5}`, 400, "gpus: want an integer, got number 1.5"},
		{"gpus as text", "", `{"gpus":"two"}`, 400, `gpus: want an integer, got string "two"`},
		{"tags not a list", "", `{"gpus":1,"tags":"a"}`, 400, `tags: want a list, got string "a"`},
		{"cuda as text", "", `{"gpus":1,"require_cuda":"yes"}`, 400, `require_cuda: want true or false, got string "yes"`},
		{"tag a number", "", `{"gpus":1,"tags":[1]}`, 400, "tags: want a string, got number 1"},
		{"owner an object", "", `{"gpus":1,"owner":{}}`, 400, "owner: want a string, got object"},
		{"escaped quote", "", `{"gpus":1,"min_vram_gib":"a\"b"}`, 400, `min_vram_gib: want a number, got string "a\"b"`},
		{"keepalive bool", "", `{"gpus":1,"keepalive_s":true}`, 400, "keepalive_s: want a number of seconds or null, got a boolean"},
		{"negative gpus", "", `{"gpus":-1}`, 400, "gpus must not be negative"},
		{"zero gpus", "", `{"gpus":0}`, 400, "gpus must be at least 1"},
		{"bad compute", "", `{"gpus":1,"min_compute":"x"}`, 400, "min_compute"},
		{"keepalive text", "", `{"gpus":1,"keepalive_s":"soon"}`, 400, `keepalive_s: want a number of seconds or null, got string "soon"`},
		{"keepalive too short", "", `{"gpus":1,"keepalive_s":0.5}`, 400, "keepalive_s must be between"},
		{"keepalive huge", "", `{"gpus":1,"keepalive_s":1e999}`, 400, "keepalive_s"},
		{"two values", "", `{"gpus":1}{"gpus":2}`, 400, "more than one JSON value"},
		{"trailing junk", "", `{"gpus":1} x`, 400, "more than one JSON value"},
		{"empty", "", ``, 400, "request body is empty"},
		{"truncated", "", `{"gpus":1`, 400, "ends in the middle"},
		{"not json", "", `gpus=1`, 400, "not valid JSON"},
		{"a list", "", `[1]`, 400, "request body: want an object, got array"},
		{"text content type", "text/plain", `{"gpus":1}`, 400, "Content-Type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testRequest("POST", "/api/v1/allocations", strings.NewReader(tt.body))
			r.Header.Set("Authorization", "Bearer "+testUser)
			if tt.contentType != "" {
				r.Header.Set("Content-Type", tt.contentType)
			}
			w := httptest.NewRecorder()
			s.Handler().ServeHTTP(w, r)
			a := answer{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
			if a.status != tt.want {
				t.Fatalf("got %d, want %d: %s", a.status, tt.want, a.body)
			}
			_, msg := a.errorBody(t)
			if !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("got message %q, want it to contain %q", msg, tt.wantMsg)
			}
		})
	}
	if n := len(f.commands()); n != 0 {
		t.Errorf("bad bodies reached the plane %d times, want 0", n)
	}
}

func TestServerAllocateJSONContentType(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/merge-patch+json"} {
		r := testRequest("POST", "/api/v1/allocations", strings.NewReader(`{"gpus":1}`))
		r.Header.Set("Authorization", "Bearer "+testUser)
		r.Header.Set("Content-Type", ct)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		if w.Code != 201 {
			t.Errorf("Content-Type %q: got %d, want 201: %s", ct, w.Code, w.Body)
		}
	}
}

func TestServerAllocateKeepalive(t *testing.T) {
	tests := []struct {
		name string
		body string
		want *float64
	}{
		{"absent", `{"gpus":1}`, floatPtr(30)},
		{"null", `{"gpus":1,"keepalive_s":null}`, nil},
		{"number", `{"gpus":1,"keepalive_s":120}`, floatPtr(120)},
		{"fraction", `{"gpus":1,"keepalive_s":1.5}`, floatPtr(1.5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := testServer(t, func(o *Options) { o.DefaultKeepaliveS = 30 })
			a := call(t, s, "POST", "/api/v1/allocations", testUser, tt.body)
			if a.status != 201 {
				t.Fatalf("got %d, want 201: %s", a.status, a.body)
			}
			got := f.commands()[0].(arbiter.Allocate).Request.KeepaliveS
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got keepalive_s %v, want %v", fmtF(got), fmtF(tt.want))
			}
			var al arbiter.Allocation
			a.decode(t, &al)
			if !reflect.DeepEqual(al.KeepaliveS, tt.want) {
				t.Errorf("got answered keepalive_s %v, want %v", fmtF(al.KeepaliveS), fmtF(tt.want))
			}
		})
	}
}

func TestServerAllocateDefaultKeepaliveIs60(t *testing.T) {
	s, f := testServer(t, nil)
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	if got := f.commands()[0].(arbiter.Allocate).Request.KeepaliveS; got == nil || *got != 60 {
		t.Errorf("got keepalive_s %v, want 60", fmtF(got))
	}
}

func floatPtr(v float64) *float64 { return &v }

func fmtF(p *float64) any {
	if p == nil {
		return "null"
	}
	return *p
}

func TestServerAllocateOwnerAndCaller(t *testing.T) {
	s, f := testServer(t, nil)
	a := call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":2,"min_vram_gib":40,"tags":["a"],"priority":5}`)
	if a.status != 201 {
		t.Fatalf("got %d, want 201: %s", a.status, a.body)
	}
	cmd := f.commands()[0].(arbiter.Allocate)
	if want := (arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}); cmd.Caller != want {
		t.Errorf("got caller %+v, want %+v", cmd.Caller, want)
	}
	req := cmd.Request
	if req.Owner != "alice" || req.GPUs != 2 || req.MinVRAMGiB != 40 || req.Priority != 5 || len(req.Tags) != 1 {
		t.Errorf("got request %+v, want owner alice, 2 GPUs, 40 GiB, priority 5, tag a", req)
	}
	// An owner cannot be chosen (issue 12, finding 3): the token's name is
	// the owner, what the body said is the label.
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1,"owner":"ci"}`)
	if got := f.commands()[1].(arbiter.Allocate).Request; got.Owner != "alice" || got.Label != "ci" {
		t.Errorf("got owner %q label %q, want alice, label ci", got.Owner, got.Label)
	}
}

// The allocation body must take every field of arbiter.Request, so that a
// field added there is not refused as unknown here.
func TestServerAllocateBodyCoversRequest(t *testing.T) {
	have := map[string]bool{}
	bt := reflect.TypeFor[allocateBody]()
	for i := range bt.NumField() {
		have[strings.Split(bt.Field(i).Tag.Get("json"), ",")[0]] = true
	}
	rt := reflect.TypeFor[arbiter.Request]()
	for i := range rt.NumField() {
		name := strings.Split(rt.Field(i).Tag.Get("json"), ",")[0]
		if !have[name] {
			t.Errorf("arbiter.Request field %q is missing from allocateBody", name)
		}
	}
	if bt.NumField() != rt.NumField() {
		t.Errorf("got %d body fields, want %d (as arbiter.Request)", bt.NumField(), rt.NumField())
	}
}

// The Go client sends an arbiter.Request as it is; the server must take it.
func TestServerAllocateTakesMarshalledRequest(t *testing.T) {
	s, f := testServer(t, nil)
	req := arbiter.Request{Owner: "alice", Label: "bob's sweep", GPUs: 1, MinVRAMGiB: 8, RequireCUDA: true, MinCompute: "8.0",
		Model: "*H100*", Tags: []string{"a"}, Machine: "gpu1", Priority: 3, KeepaliveS: floatPtr(90)}
	a := call(t, s, "POST", "/api/v1/allocations", testUser, req)
	if a.status != 201 {
		t.Fatalf("got %d, want 201: %s", a.status, a.body)
	}
	if got := f.commands()[0].(arbiter.Allocate).Request; !reflect.DeepEqual(got, req) {
		t.Errorf("got request %+v, want %+v", got, req)
	}
}

func TestServerAllocationIDs(t *testing.T) {
	s, _ := testServer(t, nil)
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	tests := []struct {
		id   string
		want int
	}{
		{"1", 200}, {"2", 404}, {"abc", 400}, {"0", 400}, {"-1", 400}, {"+1", 400},
		{"1.0", 400}, {"99999999999999999999", 400}, {"0x1", 400},
	}
	for _, tt := range tests {
		for _, rt := range []struct{ method, suffix string }{{"GET", ""}, {"POST", "/keepalive"}, {"DELETE", ""}} {
			want := tt.want
			if tt.want == 200 {
				continue // answered by the tests of each route
			}
			a := call(t, s, rt.method, "/api/v1/allocations/"+tt.id+rt.suffix, testAdmin, nil)
			if a.status != want {
				t.Errorf("%s id %q: got %d, want %d: %s", rt.method, tt.id, a.status, want, a.body)
			}
		}
	}
}

func TestServerAllocationReadKeepaliveRelease(t *testing.T) {
	s, f := testServer(t, nil)
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)

	a := call(t, s, "GET", "/api/v1/allocations/1", testAgent, nil)
	var al arbiter.Allocation
	a.decode(t, &al)
	if a.status != 200 || al.ID != 1 || al.Owner != "alice" {
		t.Fatalf("got %d %+v, want 200 allocation 1 of alice", a.status, al)
	}
	if a = call(t, s, "POST", "/api/v1/allocations/1/keepalive", testUser, nil); a.status != 200 {
		t.Errorf("keepalive: got %d, want 200: %s", a.status, a.body)
	}

	// Another user's token may not release it: the plane decides, by Caller.
	s2 := NewServer(Options{Plane: f, Tokens: append(testTokens, Token{Name: "bob", Role: arbiter.RoleUser, Secret: "bob-secret"})})
	if a = call(t, s2, "DELETE", "/api/v1/allocations/1", "bob-secret", nil); a.status != 403 {
		t.Errorf("release by bob: got %d, want 403: %s", a.status, a.body)
	}

	a = call(t, s, "DELETE", "/api/v1/allocations/1", testUser, nil)
	a.decode(t, &al)
	if a.status != 200 || al.State != arbiter.StateDestroyed || al.Reason == nil || *al.Reason != "released by alice" {
		t.Fatalf("release: got %d %+v, want 200 destroyed \"released by alice\"", a.status, al)
	}
	if a = call(t, s, "POST", "/api/v1/allocations/1/keepalive", testUser, nil); a.status != 409 {
		t.Errorf("keepalive after release: got %d, want 409", a.status)
	}
	if a = call(t, s, "DELETE", "/api/v1/allocations/1?reason="+strings.Repeat("x", 2000), testAdmin, nil); a.status != 400 {
		t.Errorf("long reason: got %d, want 400", a.status)
	}
}

func TestServerReleaseReason(t *testing.T) {
	tests := []struct {
		name, token, query, want string
	}{
		{"given", testUser, "?reason=done+training", "done training"},
		{"token name", testAdmin, "", "released by ops"},
		{"owner without tokens", "", "", "released by bob"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, f := testServer(t, func(o *Options) {
				if tt.token == "" {
					o.Tokens = nil
				}
			})
			call(t, s, "POST", "/api/v1/allocations", tt.token, `{"gpus":1,"owner":"bob"}`)
			if a := call(t, s, "DELETE", "/api/v1/allocations/1"+tt.query, tt.token, nil); a.status != 200 {
				t.Fatalf("got %d, want 200: %s", a.status, a.body)
			}
			cmds := f.commands()
			if got := cmds[len(cmds)-1].(arbiter.Release).Reason; got != tt.want {
				t.Errorf("got reason %q, want %q", got, tt.want)
			}
		})
	}
}

func TestServerListAllocations(t *testing.T) {
	s, f := testServer(t, nil)
	for range 3 {
		call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	}
	f.setState(2, arbiter.StateReady)
	tests := []struct {
		query string
		want  int
		ids   []int64
	}{
		{"", 200, []int64{1, 2, 3}},
		{"?state=ready", 200, []int64{2}},
		{"?state=queued&owner=alice", 200, []int64{1, 3}},
		{"?state=live", 200, []int64{1, 2, 3}},
		{"?owner=nobody", 200, []int64{}},
		{"?state=running", 400, nil},
		{"?stat=ready", 400, nil},
		{"?machine=../etc", 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			a := call(t, s, "GET", "/api/v1/allocations"+tt.query, testUser, nil)
			if a.status != tt.want {
				t.Fatalf("got %d, want %d: %s", a.status, tt.want, a.body)
			}
			if tt.want != 200 {
				a.errorBody(t)
				return
			}
			var out struct {
				Allocations []arbiter.Allocation `json:"allocations"`
			}
			a.decode(t, &out)
			if out.Allocations == nil {
				t.Fatalf("got allocations null, want a list: %s", a.body)
			}
			ids := []int64{}
			for _, al := range out.Allocations {
				ids = append(ids, al.ID)
			}
			if !reflect.DeepEqual(ids, tt.ids) {
				t.Errorf("got ids %v, want %v", ids, tt.ids)
			}
		})
	}
}

func TestServerMachines(t *testing.T) {
	s, f := testServer(t, nil)
	reg := arbiter.Machine{
		Name: "gpu1", Kind: "grid", Source: arbiter.SourceConfig, Tags: []string{"a100"}, Cores: 32, RAMGiB: 256,
		CUDA: "12.4", Driver: "550.54", Draining: true,
		GPUs: []arbiter.GPU{{Index: 0, UUID: "GPU-0", Model: "A100", VRAMGiB: 80, Compute: "8.0", Healthy: true}},
	}
	a := call(t, s, "POST", "/api/v1/machines", testAgent, reg)
	var st arbiter.MachineStatus
	a.decode(t, &st)
	if a.status != 200 || st.Name != "gpu1" || st.Kind != arbiter.KindGPU || st.Source != arbiter.SourceAgent || len(st.Devices) != 1 {
		t.Fatalf("register: got %d %+v, want 200 gpu1 kind gpu source agent with 1 device", a.status, st)
	}
	got := f.commands()[0].(arbiter.RegisterMachine).Machine
	if got.Kind != arbiter.KindGPU || got.Source != arbiter.SourceAgent || got.Draining {
		t.Errorf("got registered %+v, want kind gpu, source agent, not draining", got)
	}

	tests := []struct {
		name, method, path string
		body               any
		want               int
		wantState          string
	}{
		{"list", "GET", "/api/v1/machines", nil, 200, ""},
		{"get", "GET", "/api/v1/machines/gpu1", nil, 200, arbiter.MachineUp},
		{"get unknown", "GET", "/api/v1/machines/gpu9", nil, 404, ""},
		{"get bad name", "GET", "/api/v1/machines/-x", nil, 400, ""},
		{"heartbeat", "POST", "/api/v1/machines/gpu1/heartbeat", nil, 200, arbiter.MachineUp},
		{"heartbeat unknown", "POST", "/api/v1/machines/gpu9/heartbeat", nil, 404, ""},
		{"drain", "POST", "/api/v1/machines/gpu1/drain", nil, 200, arbiter.MachineDraining},
		{"undrain", "POST", "/api/v1/machines/gpu1/undrain", nil, 200, arbiter.MachineUp},
		{"drain unknown", "POST", "/api/v1/machines/gpu9/drain", nil, 404, ""},
		{"register bad name", "POST", "/api/v1/machines", `{"name":"a b"}`, 400, ""},
		{"register repeated index", "POST", "/api/v1/machines", `{"name":"h","gpus":[{"index":0},{"index":0}]}`, 400, ""},
		{"register vram text", "POST", "/api/v1/machines", `{"name":"h","gpus":[{"index":0,"vram_gib":"big"}]}`, 400, ""},
		{"register unknown field", "POST", "/api/v1/machines", `{"name":"h","colour":"red"}`, 400, ""},
		{"list with params", "GET", "/api/v1/machines?x=1", nil, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := call(t, s, tt.method, tt.path, testAdmin, tt.body)
			if a.status != tt.want {
				t.Fatalf("got %d, want %d: %s", a.status, tt.want, a.body)
			}
			if tt.want >= 400 {
				a.errorBody(t)
				return
			}
			if tt.wantState != "" {
				var st arbiter.MachineStatus
				a.decode(t, &st)
				if st.State != tt.wantState {
					t.Errorf("got state %q, want %q", st.State, tt.wantState)
				}
			}
		})
	}
	a = call(t, s, "POST", "/api/v1/machines", testAgent, `{"name":"h","gpus":[{"index":0,"vram_gib":"big"}]}`)
	if _, msg := a.errorBody(t); msg != `gpus.vram_gib: want a number, got string "big"` {
		t.Errorf("got message %q, want the field path", msg)
	}
}

func TestServerHealth(t *testing.T) {
	s, _ := testServer(t, nil)
	call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`)
	a := call(t, s, "GET", "/api/v1/health", "", nil)
	var h map[string]any
	a.decode(t, &h)
	if a.status != 200 || h["status"] != "ok" || h["version"] != "test" || h["last_seq"] != float64(1) || h["time"] == nil {
		t.Errorf("got %d %v, want 200 status ok, version test, last_seq 1, a time", a.status, h)
	}
}

// TestOpenServerAnswersOnlyLoopbackNames: a server without tokens refuses
// a request addressed to another name, as a page of another site whose
// name was rebound to 127.0.0.1 sends (DNS rebinding), reads included;
// loopback names pass, and AnyHost (--insecure-no-auth) lifts the check.
func TestOpenServerAnswersOnlyLoopbackNames(t *testing.T) {
	for _, anyHost := range []bool{false, true} {
		s := NewServer(Options{Plane: newFakePlane(), AnyHost: anyHost})
		for host, ok := range map[string]bool{"rebind.evil.example:7070": anyHost, "127.0.0.1:7070": true, "localhost:7070": true,
			"[::1]:7070": true, "LOCALHOST": true, "app.localhost:80": true, "10.0.0.7:7070": anyHost} {
			for _, method := range []string{"GET", "POST"} {
				r := testRequest(method, "/api/v1/machines/gpu1/drain", nil)
				if method == "GET" {
					r = testRequest(method, "/api/v1/allocations", nil)
				}
				r.Host = host
				w := httptest.NewRecorder()
				s.Handler().ServeHTTP(w, r)
				if refused := w.Code == http.StatusForbidden && strings.Contains(w.Body.String(), "DNS rebinding"); refused == ok {
					t.Errorf("any host %v, %s to Host %s: %d %s", anyHost, method, host, w.Code, w.Body)
				}
			}
		}
	}
	// With tokens the name is not looked at: the token is the proof.
	s, _ := testServer(t, nil)
	r := testRequest("GET", "/api/v1/allocations", nil)
	r.Host = "arbiter.lab.example"
	r.Header.Set("Authorization", "Bearer "+testAdmin)
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Errorf("with tokens, Host %s: %d %s", r.Host, w.Code, w.Body)
	}
}

// TestCrossSiteFormWithBasicCredentialsRefused: only a Bearer header marks
// an API client; a browser attaches cached Basic credentials to a
// cross-site form post by itself.
func TestCrossSiteFormWithBasicCredentialsRefused(t *testing.T) {
	s := NewServer(Options{Plane: newFakePlane()})
	r := testRequest("POST", "/api/v1/machines/gpu1/drain", nil)
	r.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "cross-site") {
		t.Fatalf("a cross-site form post with Basic credentials: %d %s", w.Code, w.Body)
	}
}

// An Authorization header that is not a bearer token is told so, not that
// its token is unknown.
func TestServerAuthWantsBearer(t *testing.T) {
	s, _ := testServer(t, nil)
	for _, h := range []string{"alice-secret-0123456789", "Basic YWxpY2U6eA=="} {
		req := testRequest("GET", "/api/v1/machines", nil)
		req.Header.Set("Authorization", h)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		if w.Code != 401 || !strings.Contains(w.Body.String(), `must be \"Bearer TOKEN\"`) {
			t.Errorf("Authorization %q: %d %s", h, w.Code, w.Body)
		}
	}
}

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// clientTestServer records the last request and answers with handler.
type clientTestServer struct {
	mu     sync.Mutex
	method string
	path   string
	query  string
	auth   string
	body   string
}

func (s *clientTestServer) record(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.method, s.path, s.query = r.Method, r.URL.Path, r.URL.RawQuery
	s.auth, s.body = r.Header.Get("Authorization"), string(b)
}

func (s *clientTestServer) last() (method, path, query, auth, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.method, s.path, s.query, s.auth, s.body
}

// newClientTestServer serves answer (as JSON, status 200 unless the
// request creates an allocation) for every request.
func newClientTestServer(t *testing.T, answer any) (*clientTestServer, *Client) {
	t.Helper()
	rec := &clientTestServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost && r.URL.Path == "/api/v1/allocations" {
			w.WriteHeader(http.StatusCreated)
		}
		json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(srv.Close)
	return rec, New(srv.URL+"/", "s3cret")
}

func TestClientRoutes(t *testing.T) {
	ctx := context.Background()
	ka := 60.0
	tests := []struct {
		name                      string
		call                      func(c *Client) error
		method, path, query, body string
	}{
		{"health", func(c *Client) error { _, err := c.Health(ctx); return err }, "GET", "/api/v1/health", "", ""},
		{"machines", func(c *Client) error { _, err := c.Machines(ctx); return err }, "GET", "/api/v1/machines", "", ""},
		{"machine", func(c *Client) error { _, err := c.Machine(ctx, "gpu1"); return err }, "GET", "/api/v1/machines/gpu1", "", ""},
		{"register", func(c *Client) error {
			_, err := c.RegisterMachine(ctx, arbiter.Machine{Name: "gpu1", Kind: "gpu"})
			return err
		}, "POST", "/api/v1/machines", "", `"name":"gpu1"`},
		{"heartbeat", func(c *Client) error { _, err := c.Heartbeat(ctx, "gpu1"); return err }, "POST", "/api/v1/machines/gpu1/heartbeat", "", ""},
		{"drain", func(c *Client) error { _, err := c.SetDraining(ctx, "gpu1", true); return err }, "POST", "/api/v1/machines/gpu1/drain", "", ""},
		{"undrain", func(c *Client) error { _, err := c.SetDraining(ctx, "gpu1", false); return err }, "POST", "/api/v1/machines/gpu1/undrain", "", ""},
		{"alloc-null", func(c *Client) error {
			_, err := c.Allocate(ctx, arbiter.Request{Owner: "a", GPUs: 1})
			return err
		}, "POST", "/api/v1/allocations", "", `"keepalive_s":null`},
		{"alloc-60", func(c *Client) error {
			_, err := c.Allocate(ctx, arbiter.Request{Owner: "a", GPUs: 1, KeepaliveS: &ka})
			return err
		}, "POST", "/api/v1/allocations", "", `"keepalive_s":60`},
		{"list", func(c *Client) error {
			_, err := c.Allocations(ctx, arbiter.AllocationFilter{State: "live", Owner: "bob", Machine: "gpu1"})
			return err
		}, "GET", "/api/v1/allocations", "machine=gpu1&owner=bob&state=live", ""},
		{"get", func(c *Client) error { _, err := c.Allocation(ctx, 7); return err }, "GET", "/api/v1/allocations/7", "", ""},
		{"wait", func(c *Client) error { _, err := c.WaitAllocation(ctx, 7, 1500*time.Millisecond); return err }, "GET", "/api/v1/allocations/7", "wait=1.5", ""},
		{"wait-cap", func(c *Client) error { _, err := c.WaitAllocation(ctx, 7, time.Hour); return err }, "GET", "/api/v1/allocations/7", "wait=300", ""},
		{"keepalive", func(c *Client) error { _, err := c.Keepalive(ctx, 7); return err }, "POST", "/api/v1/allocations/7/keepalive", "", ""},
		{"release", func(c *Client) error { _, err := c.Release(ctx, 7, "done now"); return err }, "DELETE", "/api/v1/allocations/7", "reason=done+now", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, c := newClientTestServer(t, map[string]any{})
			if err := tt.call(c); err != nil {
				t.Fatalf("call: %v", err)
			}
			method, path, query, auth, body := rec.last()
			if method != tt.method || path != tt.path || query != tt.query {
				t.Errorf("got %s %s?%s, want %s %s?%s", method, path, query, tt.method, tt.path, tt.query)
			}
			if auth != "Bearer s3cret" {
				t.Errorf("got Authorization %q, want the bearer token", auth)
			}
			if !strings.Contains(body, tt.body) {
				t.Errorf("got body %s, want it to contain %s", body, tt.body)
			}
		})
	}
}

func TestClientNoTokenNoHeader(t *testing.T) {
	rec := &clientTestServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	h, err := New(srv.URL, "").Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h["status"] != "ok" {
		t.Errorf("got health %v, want status ok", h)
	}
	if _, _, _, auth, _ := rec.last(); auth != "" {
		t.Errorf("got Authorization %q, want none", auth)
	}
}

func TestClientDecodes(t *testing.T) {
	id := int64(3)
	_, c := newClientTestServer(t, map[string]any{
		"machines": []arbiter.MachineStatus{{Name: "gpu1", Free: 1, Devices: []arbiter.DeviceStatus{{Index: 0, Allocation: &id}}}},
	})
	ms, err := c.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Name != "gpu1" || *ms[0].Devices[0].Allocation != 3 {
		t.Errorf("got %+v, want gpu1 with device 0 held by 3", ms)
	}
}

func TestClientErrors(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		code     string
		contains string
	}{
		{"server-json", 409, `{"error":{"code":"conflict","message":"allocation 4 is destroyed"}}`, "conflict", "allocation 4 is destroyed"},
		{"forbidden", 403, `{"error":{"code":"forbidden","message":"only its creator may release it"}}`, "forbidden", "only its creator"},
		{"proxy-page", 502, "<html><body>Bad Gateway</body></html>", "internal", "502 Bad Gateway"},
		{"plain-404", 404, "404 page not found\n", "not_found", "404 page not found"},
		{"locked", 423, "", "locked", "423"},
		{"unavailable", 503, "going away", "unavailable", "going away"},
		{"too-large", 413, "{}", "too_large", "413"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := New(srv.URL, "").Allocation(context.Background(), 4)
			var ae *arbiter.Error
			if !errors.As(err, &ae) {
				t.Fatalf("got %T %v, want *arbiter.Error", err, err)
			}
			if ae.Code != tt.code || !strings.Contains(ae.Message, tt.contains) {
				t.Errorf("got %s %q, want %s containing %q", ae.Code, ae.Message, tt.code, tt.contains)
			}
		})
	}
}

func TestClientUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := New(url, "").Machines(context.Background())
	var ae *arbiter.Error
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("got %v, want a transport error", err)
	}
	if !strings.Contains(err.Error(), "cannot reach arbiter at "+url) || !strings.Contains(err.Error(), "arbiter server") {
		t.Errorf("got %q, want it to name the URL and the server command", err)
	}
}

// https:// to a server that speaks http:// says so.
func TestClientHTTPSToHTTP(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	url := strings.Replace(srv.URL, "http://", "https://", 1)
	_, err := New(url, "").Machines(context.Background())
	if err == nil || !strings.Contains(err.Error(), "speaks http://, not https://") {
		t.Fatalf("got %v", err)
	}
}

func TestClientNotJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html>hello</html>")
	}))
	defer srv.Close()
	_, err := New(srv.URL, "").Machines(context.Background())
	if err == nil || !strings.Contains(err.Error(), "unexpected answer") {
		t.Errorf("got %v, want an unexpected answer error", err)
	}
}

func TestClientTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := NewWithOptions(srv.URL, "", Options{Timeout: 50 * time.Millisecond})
	_, err := c.Machines(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not answer within") {
		t.Errorf("got %v, want a timeout error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Machines(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

// clientSSE writes events to w in the server's format.
func clientSSE(w io.Writer, evs ...arbiter.Event) {
	for _, ev := range evs {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Kind, b)
	}
	w.(http.Flusher).Flush()
}

func clientEv(seq int64) arbiter.Event {
	return arbiter.Event{Seq: seq, Kind: arbiter.EventAllocationReady, Subject: fmt.Sprintf("allocation/%d", seq), Data: json.RawMessage(`{}`)}
}

func TestClientEventsReconnects(t *testing.T) {
	var mu sync.Mutex
	var sinces []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sinces = append(sinces, r.URL.Query().Get("since"))
		n := len(sinces)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": ping\n\n")
		switch n {
		case 1: // two events, then the connection drops
			clientSSE(w, clientEv(5), clientEv(6))
		case 2: // a reconnection: a duplicate, then a multi-line data field
			clientSSE(w, clientEv(6))
			io.WriteString(w, "id: 7\nevent: machine.up\ndata: {\"seq\":7,\n")
			io.WriteString(w, "data: \"kind\":\"machine.up\",\"subject\":\"machine/gpu1\",\"data\":{}}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()
	c := New(srv.URL, "")
	c.backoffMin = time.Millisecond
	stop := errors.New("stop")
	var got []string
	err := c.Events(context.Background(), 4, func(ev arbiter.Event) error {
		got = append(got, fmt.Sprintf("%d %s %s", ev.Seq, ev.Kind, ev.Subject))
		if ev.Seq == 7 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("got %v, want fn's error", err)
	}
	want := []string{"5 allocation.ready allocation/5", "6 allocation.ready allocation/6", "7 machine.up machine/gpu1"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got events %q, want %q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sinces) != 2 || sinces[0] != "4" || sinces[1] != "6" {
		t.Errorf("got since %q, want [4 6]", sinces)
	}
}

func TestClientEventsIdleReconnects(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		if !first {
			clientSSE(w, clientEv(1))
		}
		<-r.Context().Done() // silence: no pings
	}))
	defer srv.Close()
	c := New(srv.URL, "")
	c.backoffMin, c.idle = time.Millisecond, 50*time.Millisecond
	stop := errors.New("stop")
	err := c.Events(context.Background(), -1, func(arbiter.Event) error { return stop })
	if !errors.Is(err, stop) {
		t.Errorf("got %v, want an event after the silent stream was dropped", err)
	}
}

func TestClientEventsContextEnds(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		clientSSE(w, clientEv(1))
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	err := New(srv.URL, "").Events(ctx, 0, func(arbiter.Event) error { cancel(); return nil })
	if err != nil {
		t.Errorf("got %v, want nil when ctx ends", err)
	}
}

func TestClientEventsRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":{"code":"unauthorized","message":"a token is required"}}`)
	}))
	defer srv.Close()
	err := New(srv.URL, "").Events(context.Background(), 0, func(arbiter.Event) error { return nil })
	if arbiter.ErrorCode(err) != arbiter.EUnauthorized || arbiter.ErrorMessage(err) != "a token is required" {
		t.Errorf("got %v, want the server's unauthorized error", err)
	}
}

func TestClientEventsBadData(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "id: 1\ndata: nope\n\n")
	}))
	defer srv.Close()
	err := New(srv.URL, "").Events(context.Background(), 0, func(arbiter.Event) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Errorf("got %v, want a protocol error", err)
	}
}

package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testTransportClient is an HTTP client on a Transport that keeps n idle
// connections a host.
func testTransportClient(n int) *http.Client {
	return &http.Client{Transport: NewTransport(nil, n)}
}

// TestTransport: requests on one goroutine share one connection; the
// answers and bodies (sized, chunked, empty) arrive whole; a connection
// the server closes is not reused.
func TestTransport(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/echo":
			fmt.Fprintf(w, "%s %s %s", r.Method, r.Header.Get("X-Test"), body)
		case "/chunked":
			for i := range 3 {
				fmt.Fprintf(w, "part %d;", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	hc := testTransportClient(4)
	defer hc.CloseIdleConnections()

	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("X-Test", "yes")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: read the body: %v", method, path, err)
		}
		return resp.StatusCode, string(b)
	}
	for i := range 20 {
		if code, b := call("POST", "/echo", fmt.Sprint(i)); code != 200 || b != fmt.Sprintf("POST yes %d", i) {
			t.Fatalf("echo %d: %d %q", i, code, b)
		}
	}
	if code, b := call("GET", "/chunked", ""); code != 200 || b != "part 0;part 1;part 2;" {
		t.Fatalf("chunked: %d %q", code, b)
	}
	if code, b := call("DELETE", "/empty", ""); code != 204 || b != "" {
		t.Fatalf("empty: %d %q", code, b)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for requests one after another, want 1", n)
	}
	if code, b := call("GET", "/close", ""); code != 200 || b != "bye" {
		t.Fatalf("close: %d %q", code, b)
	}
	if code, b := call("PUT", "/echo", "after"); code != 200 || b != "PUT yes after" {
		t.Fatalf("after close: %d %q", code, b)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want a second one after the server closed the first", n)
	}
}

// TestTransportIdleClose: a request on a kept connection that the server
// closed meanwhile goes on a new one, body and all (a POST finds the
// connection closed before it writes; a GET would be sent again); a
// request to a stopped server fails.
func TestTransportIdleClose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer srv.Close()
	hc := testTransportClient(1)
	hc.Transport.(*Transport).checkAfter = 0 // look at once
	defer hc.CloseIdleConnections()
	post := func(body string) (string, error) {
		resp, err := hc.Post(srv.URL, "text/plain", bytes.NewReader([]byte(body)))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if b, err := post("one"); err != nil || b != "one" {
		t.Fatalf("first: %q %v", b, err)
	}
	srv.CloseClientConnections() // the kept connection is closed under the transport
	if b, err := post("two"); err != nil || b != "two" {
		t.Fatalf("after the server closed the idle connection: %q %v", b, err)
	}
	srv.Close()
	if _, err := post("three"); err == nil {
		t.Fatal("a request to a stopped server succeeded")
	}
}

// TestTransportRetriesOnlyReads: when a kept connection breaks after the
// request was written and before any answer, a GET is sent again on a new
// connection, and a POST is not (the server may have carried it out): it
// fails, and the server saw it once.
func TestTransportRetriesOnlyReads(t *testing.T) {
	var seen sync.Map // method → *atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := seen.LoadOrStore(r.Method+" "+r.URL.Path, new(atomic.Int32))
		if r.URL.Path == "/drop" && n.(*atomic.Int32).Add(1) == 1 {
			// Read the request, then close without a word.
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	count := func(key string) int32 {
		n, ok := seen.Load(key)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	for _, method := range []string{"GET", "POST"} {
		hc := testTransportClient(1)
		// Keep a connection, so that the next request reuses it.
		resp, err := hc.Get(srv.URL + "/warm")
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		req, _ := http.NewRequest(method, srv.URL+"/drop", strings.NewReader("x"))
		if method == "GET" {
			req.Body, req.GetBody, req.ContentLength = nil, nil, 0
		}
		resp, err = hc.Do(req)
		switch method {
		case "GET":
			if err != nil {
				t.Fatalf("GET on a connection dropped before the answer: %v, want it sent again", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "ok" || count("GET /drop") != 2 {
				t.Fatalf("GET: %q, the server saw it %d times, want ok and 2", b, count("GET /drop"))
			}
		case "POST":
			if err == nil {
				resp.Body.Close()
				t.Fatal("a POST on a connection dropped before the answer succeeded: it was sent again")
			}
			if n := count("POST /drop"); n != 1 {
				t.Fatalf("the server saw the POST %d times, want 1", n)
			}
		}
		hc.CloseIdleConnections()
	}
}

// TestTransportContext: a request whose context ends returns the
// context's error at once, and its connection is not reused.
func TestTransportContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	defer close(release)
	hc := testTransportClient(1)
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/slow", nil)
	if _, err := hc.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's deadline", err)
	}
	resp, err := hc.Get(srv.URL + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("after a cancelled request: %q", b)
	}
}

// TestTransportHTTPS: https goes through the standard transport.
func TestTransportHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secure") }))
	defer srv.Close()
	hc := testTransportClient(1)
	tr := hc.Transport.(*Transport)
	tr.fallback.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "secure" {
		t.Fatalf("got %q", b)
	}
}

// TestTransportAfterTheServerRestarted: with several kept connections to a
// server that then closed them all (it restarted), a GET is sent again on
// a new connection, not on the next dead one.
func TestTransportAfterTheServerRestarted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	hc := testTransportClient(8)
	defer hc.CloseIdleConnections()
	tr := hc.Transport.(*Transport)
	// Keep four connections.
	host := srv.Listener.Addr().String()
	var conns []*keptConn
	for range 4 {
		c, _, err := tr.get(context.Background(), host, false)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		tr.put(c, host)
	}
	srv.CloseClientConnections() // all of them, as a restarted server has
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatalf("GET after the server closed every kept connection: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("GET: %q", b)
	}
}

package bench

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
	"sync/atomic"
	"testing"
	"time"
)

// TestConnTransport: requests on one goroutine share one connection; the
// answers and bodies (sized, chunked, empty) arrive whole; a connection
// the server closes is not reused.
func TestConnTransport(t *testing.T) {
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
	hc := benchHTTPClient(4)
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

// TestConnTransportRetriesAnIdleClose: a request sent on a kept
// connection that the server closed meanwhile goes again on a new one,
// body and all; a request on a new connection that fails is not repeated.
func TestConnTransportRetriesAnIdleClose(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	defer srv.Close()
	hc := benchHTTPClient(1)
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

// TestConnTransportContext: a request whose context ends returns the
// context's error at once, and its connection is not reused.
func TestConnTransportContext(t *testing.T) {
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
	hc := benchHTTPClient(1)
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

// TestConnTransportHTTPS: https goes through the standard transport.
func TestConnTransportHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "secure") }))
	defer srv.Close()
	hc := benchHTTPClient(1)
	tr := hc.Transport.(*connTransport)
	tr.std.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig
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

package httpio

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// bodyServer serves h behind BodyDeadline(timeout, rate).
func bodyServer(t *testing.T, timeout time.Duration, rate int64, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(BodyDeadline(h, timeout, rate))
	srv.Config.ReadHeaderTimeout = 5 * time.Second
	srv.Start()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestBodyDeadlineCutsSlowLoris is issue 12's finding 5: headers announcing
// 100 bytes, then one byte, then nothing: the connection is answered and
// closed once the deadline passes, not held.
func TestBodyDeadlineCutsSlowLoris(t *testing.T) {
	readErr := make(chan error, 1)
	addr := bodyServer(t, 300*time.Millisecond, 64<<10, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		if err != nil {
			http.Error(w, "body cut off", http.StatusBadRequest)
		}
	})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nA")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	took := time.Since(start)
	if err == nil {
		resp.Body.Close()
	}
	if e := <-readErr; e == nil {
		t.Fatal("the handler read a body that never came")
	}
	if took > 3*time.Second {
		t.Fatalf("the slow body held the connection %s", took)
	}
	// The connection is closed, not kept for another request.
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection stays open")
	}
	t.Logf("slow body cut after %s", took.Round(time.Millisecond))
}

// TestBodyDeadlineSparesStreamsAndWork: a request without a body (an event
// stream, a long poll) and a handler working after its body was read are
// not cut; a steady upload faster than the rate gets more time than the
// timeout.
func TestBodyDeadlineSparesStreamsAndWork(t *testing.T) {
	const timeout = 200 * time.Millisecond
	addr := bodyServer(t, timeout, 4<<10, func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		select { // work (or stream) past the deadline
		case <-time.After(3 * timeout):
		case <-r.Context().Done():
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
	for _, body := range []string{"", "{}"} {
		req, _ := http.NewRequest("POST", "http://"+addr+"/", strings.NewReader(body))
		if body == "" {
			req, _ = http.NewRequest("GET", "http://"+addr+"/", nil)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != fmt.Sprint(len(body)) {
			t.Fatalf("body %q: %d %s", body, resp.StatusCode, b)
		}
	}
	// 8 KiB at 4 KiB per 100ms (40 KiB/s, above the 4 KiB/s floor): 200ms
	// of sending, past the bare timeout, not cut.
	pr, pw := io.Pipe()
	go func() {
		pace := time.NewTicker(150 * time.Millisecond) // the client's pace
		defer pace.Stop()
		for i := 0; i < 2; i++ {
			pw.Write(make([]byte, 4<<10))
			<-pace.C
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", "http://"+addr+"/", pr)
	req.ContentLength = 8 << 10
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "8192" {
		t.Fatalf("steady upload: %d %s", resp.StatusCode, b)
	}
}

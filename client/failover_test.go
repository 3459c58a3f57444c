package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
)

// replicaServer answers like one replica: the leader serves, a follower
// with no leader answers 503 not applied; every request is counted.
type replicaServer struct {
	*httptest.Server
	leading atomic.Bool
	mu      sync.Mutex
	bodies  []string
}

func newReplicaServer(t *testing.T, leading bool) *replicaServer {
	r := &replicaServer{}
	r.leading.Store(leading)
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.bodies = append(r.bodies, req.Method+" "+req.URL.RequestURI()+" "+string(b))
		r.mu.Unlock()
		if !r.leading.Load() {
			w.Header().Set(arbiter.HeaderNotApplied, "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"no replica leads right now"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":7,"state":"ready","owner":"x"}`)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *replicaServer) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// TestFailoverToTheLeader: of three URLs, the first is down and the
// second has no leader; a write goes on to the third, is sent there once
// with its body, and the client sticks to it.
func TestFailoverToTheLeader(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	follower, leader := newReplicaServer(t, false), newReplicaServer(t, true)
	c := New(down.URL+", "+follower.URL+"/,"+leader.URL, "")
	a, err := c.Allocate(context.Background(), arbiter.Request{Owner: "x", GPUs: 1})
	if err != nil || a.ID != 7 {
		t.Fatalf("allocate: %+v %v", a, err)
	}
	if got := leader.seen(); len(got) != 1 || !strings.Contains(got[0], `"gpus":1`) {
		t.Fatalf("the leader saw %q", got)
	}
	if c.URL() != leader.URL {
		t.Fatalf("the client uses %s, want the leader %s", c.URL(), leader.URL)
	}
	before := len(follower.seen())
	if _, err := c.Allocation(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	if len(follower.seen()) != before || len(leader.seen()) != 2 {
		t.Fatal("the client did not stick to the replica that answered")
	}
}

// TestFailoverWaitsForALeader: while no replica leads, a call is asked
// again with backoff, and goes through once one leads.
func TestFailoverWaitsForALeader(t *testing.T) {
	a, b := newReplicaServer(t, false), newReplicaServer(t, false)
	c := New(a.URL+","+b.URL, "")
	c.servers.minBackoff = time.Millisecond
	go func() { // a leader is elected once the client asked a few times
		poll.Try(10*time.Second, func() error {
			if len(a.seen())+len(b.seen()) < 6 {
				return errors.New("not yet")
			}
			return nil
		})
		b.leading.Store(true)
	}()
	if _, err := c.Allocate(context.Background(), arbiter.Request{Owner: "x", GPUs: 1}); err != nil {
		t.Fatalf("allocate during a failover: %v", err)
	}
	if c.URL() != b.URL {
		t.Fatalf("uses %s", c.URL())
	}
	// With no leader at all the caller's time runs out, and it is told
	// why by the server. Its context ends just as a third refusal comes
	// back (after a backoff), not after a fixed time: a deadline that falls
	// while a write is on the wire rightly makes it "may have been carried
	// out", and on a busy machine a short deadline can fall anywhere.
	b.leading.Store(false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next := c.servers.next
	defer func() { c.servers.next = next }()
	c.servers.next = &cancelAfter{next: next, n: 3, cancel: cancel}
	_, err := c.Allocate(ctx, arbiter.Request{Owner: "x", GPUs: 1})
	if arbiter.ErrorCode(err) != arbiter.EUnavailable || !strings.Contains(err.Error(), "no replica leads") {
		t.Fatalf("with no leader: %v", err)
	}
}

// cancelAfter passes round trips to next and calls cancel as the n-th
// "not applied" answer comes back, its body already read: the caller's
// context ends between two attempts, never while one is on the wire.
type cancelAfter struct {
	next   http.RoundTripper
	n      int
	cancel context.CancelFunc
	mu     sync.Mutex
}

func (c *cancelAfter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil || resp.Header.Get(arbiter.HeaderNotApplied) == "" {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 {
		c.cancel()
	}
	return resp, nil
}

// TestFailoverAllDown: when no server can be reached at all the call fails
// at once, naming them all.
func TestFailoverAllDown(t *testing.T) {
	var urls []string
	for range 2 {
		s := httptest.NewServer(http.NotFoundHandler())
		s.Close()
		urls = append(urls, s.URL)
	}
	start := time.Now()
	_, err := New(strings.Join(urls, ","), "").Machines(context.Background())
	if err == nil || !strings.Contains(err.Error(), urls[0]) || !strings.Contains(err.Error(), urls[1]) {
		t.Fatalf("got %v, want an error naming both", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
}

// TestFailoverNotTwice: a write whose connection broke after it was sent
// is not sent again (it may have been carried out); a read is.
func TestFailoverNotTwice(t *testing.T) {
	var writes, reads atomic.Int32
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			reads.Add(1)
		} else {
			writes.Add(1)
		}
		hj, _ := w.(http.Hijacker)
		c, _, _ := hj.Hijack()
		c.Close() // the leader died while answering
	}))
	defer broken.Close()
	other := newReplicaServer(t, true)
	c := New(broken.URL+","+other.URL, "")
	if _, err := c.Allocate(context.Background(), arbiter.Request{Owner: "x", GPUs: 1}); err == nil {
		t.Fatal("a write that may have been applied was sent again")
	}
	if writes.Load() != 1 || len(other.seen()) != 0 {
		t.Fatalf("writes %d, the other saw %q", writes.Load(), other.seen())
	}
	if _, err := c.Machines(context.Background()); err != nil {
		t.Fatalf("a read: %v", err)
	}
	if reads.Load() != 1 || len(other.seen()) != 1 {
		t.Fatalf("reads %d, the other saw %q", reads.Load(), other.seen())
	}
}

func TestParseURLs(t *testing.T) {
	got, err := ParseURLs(" http://a:7070/ , https://b:7070,")
	if err != nil || len(got) != 2 || got[0] != "http://a:7070" || got[1] != "https://b:7070" {
		t.Fatalf("%q %v", got, err)
	}
	for _, bad := range []string{"", " , ", "a:7070", "http://a,ftp://b"} {
		if _, err := ParseURLs(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseURLs(f *testing.F) {
	f.Add("http://a:7070,https://b:7070/x")
	f.Add(",,")
	f.Fuzz(func(t *testing.T, s string) {
		us, err := ParseURLs(s)
		if err == nil && len(us) == 0 {
			t.Fatal("no URL and no error")
		}
	})
}

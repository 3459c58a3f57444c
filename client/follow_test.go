package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// swapEnd writes a swap stream's end event.
func swapEnd(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, "id: 0\nevent: log\ndata: {\"n\":0,\"line\":\"loading\"}\n\n")
	io.WriteString(w, "event: end\ndata: {\"id\":\"s1\",\"state\":\"complete\"}\n\n")
	w.(http.Flusher).Flush()
}

// firstThenEnd is a server that answers a swap's stream with first the
// first time, and with the swap's end after that.
func firstThenEnd(t *testing.T, first http.HandlerFunc) *httptest.Server {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			first(w, r)
			return
		}
		swapEnd(w)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestFollowSwapResumesASilentStream: a swap's stream that sends nothing
// for the idle time (not even the server's pings: a leader gone without a
// FIN) is taken for dropped and resumed, as Events does.
func TestFollowSwapResumesASilentStream(t *testing.T) {
	srv := firstThenEnd(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // black hole: no pings, no FIN
	})
	c := New(srv.URL, "")
	c.backoffMin, c.idle = time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sw, err := c.FollowSwap(ctx, "s1", func(int, string) {})
	if err != nil || sw.State != arbiter.SwapComplete {
		t.Errorf("got state %q, %v; want the swap's end after resuming the silent stream", sw.State, err)
	}
}

// TestFollowSwapWaitsOutUnavailable: a 503 (a follower whose leader
// stopped answering: a failover) is waited out, as Events does.
func TestFollowSwapWaitsOutUnavailable(t *testing.T) {
	srv := firstThenEnd(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"code":"unavailable","message":"the leader stopped answering before it was done"}}`)
	})
	c := New(srv.URL, "")
	c.backoffMin = time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sw, err := c.FollowSwap(ctx, "s1", func(int, string) {})
	if err != nil || sw.State != arbiter.SwapComplete {
		t.Errorf("got state %q, %v; want the unavailable answer waited out", sw.State, err)
	}
}

// TestLongPollsAskForTheirWait: WaitAllocation and WaitGPUOrders send
// their wait as it is, fractions included, not rounded up to a second.
func TestLongPollsAskForTheirWait(t *testing.T) {
	rec, c := newClientTestServer(t, arbiter.Allocation{ID: 1, State: arbiter.StateQueued})
	if _, err := c.WaitAllocation(context.Background(), 1, 1200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, _, q, _, _ := rec.last(); q != "wait=1.2" {
		t.Errorf("sent %q, want wait=1.2", q)
	}
	if _, err := c.WaitGPUOrders(context.Background(), "m1", 0, 1200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, _, q, _, _ := rec.last(); q != "since=0&wait=1.2" {
		t.Errorf("sent %q, want since=0&wait=1.2", q)
	}
}

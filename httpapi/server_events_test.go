package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// sSE reads server-sent events from a live response.
type sSE struct {
	t  *testing.T
	rd *bufio.Reader
}

// sSEEvent is one parsed event, or a comment.
type sSEEvent struct {
	id, event, data, comment string
}

// next reads one event (or comment block) up to its blank line.
func (r *sSE) next() sSEEvent {
	r.t.Helper()
	var ev sSEEvent
	for {
		line, err := r.rd.ReadString('\n')
		if err != nil {
			r.t.Fatalf("reading the stream: %v (event so far %+v)", err, ev)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			return ev
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "":
			ev.comment = value
		case "id":
			ev.id = value
		case "event":
			ev.event = value
		case "data":
			if ev.data != "" {
				r.t.Fatalf("got a second data line %q, want one", line)
			}
			ev.data = value
		default:
			r.t.Fatalf("got unexpected line %q", line)
		}
	}
}

// openStream starts a GET on the live server and returns its reader.
func openStream(t *testing.T, ctx context.Context, url string, header map[string]string) (*http.Response, *sSE) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testUser)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	sse := &sSE{t: t, rd: bufio.NewReader(resp.Body)}
	if resp.StatusCode == http.StatusOK {
		// The stream starts with where it stands: an id, no data.
		if ev := sse.next(); ev.id == "" || ev.data != "" || ev.event != "" {
			t.Fatalf("the stream's first frame %+v, want an id alone", ev)
		}
	}
	return resp, sse
}

// seed makes n allocations, hence n events (seq 1..n).
func seed(t *testing.T, s *Server, n int) {
	t.Helper()
	for range n {
		if a := call(t, s, "POST", "/api/v1/allocations", testUser, `{"gpus":1}`); a.status != 201 {
			t.Fatalf("seeding: got %d: %s", a.status, a.body)
		}
	}
}

func TestServerEventsStream(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 3)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	resp, sse := openStream(t, ctx, ts.URL+"/api/v1/events?since=1", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []int64{2, 3} {
		ev := sse.next()
		if ev.id != strconv.FormatInt(want, 10) || ev.event != arbiter.EventAllocationQueued {
			t.Fatalf("got id %q event %q, want id %d event %s", ev.id, ev.event, want, arbiter.EventAllocationQueued)
		}
		var e arbiter.Event
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
			t.Fatalf("data is not an event: %v: %s", err, ev.data)
		}
		if e.Seq != want || e.Subject != "allocation/"+strconv.FormatInt(want, 10) || len(e.Data) == 0 {
			t.Errorf("got event %+v, want seq %d about allocation/%d with data", e, want, want)
		}
	}
	// A live event arrives without the stream being reopened.
	f.setState(1, arbiter.StateReady)
	if ev := sse.next(); ev.id != "4" || ev.event != "allocation.ready" {
		t.Errorf("got id %q event %q, want id 4 allocation.ready", ev.id, ev.event)
	}
}

func TestServerEventsResume(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 3)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Last-Event-ID resumes after it when since is absent.
	_, sse := openStream(t, ctx, ts.URL+"/api/v1/events", map[string]string{"Last-Event-ID": "2"})
	if ev := sse.next(); ev.id != "3" {
		t.Errorf("resume after 2: got id %q, want 3", ev.id)
	}
	// since wins over the header.
	_, sse = openStream(t, ctx, ts.URL+"/api/v1/events?since=0", map[string]string{"Last-Event-ID": "2"})
	if ev := sse.next(); ev.id != "1" {
		t.Errorf("since=0 with Last-Event-ID 2: got id %q, want 1", ev.id)
	}
	// Neither: only new events.
	_, sse = openStream(t, ctx, ts.URL+"/api/v1/events", nil)
	poll.Until(t, 10*time.Second, "3 event subscribers", func() bool { return f.subscribers() == 3 })
	f.setState(2, arbiter.StateReady)
	if ev := sse.next(); ev.id != "4" {
		t.Errorf("new events only: got id %q, want 4", ev.id)
	}
}

func TestServerEventsHeartbeat(t *testing.T) {
	s, _ := testServer(t, nil)
	s.sseHeartbeat = 5 * time.Millisecond
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, sse := openStream(t, ctx, ts.URL+"/api/v1/events", nil)
	if ev := sse.next(); ev.comment != "keepalive" || ev.id != "" {
		t.Errorf("got %+v, want a keepalive comment", ev)
	}
}

func TestServerEventsEndWithClient(t *testing.T) {
	s, f := testServer(t, nil)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	resp, _ := openStream(t, ctx, ts.URL+"/api/v1/events", nil)
	poll.Until(t, 10*time.Second, "1 event subscriber", func() bool { return f.subscribers() == 1 })
	cancel()
	resp.Body.Close()
	poll.Until(t, 10*time.Second, "no event subscriber", func() bool { return f.subscribers() == 0 })
}

func TestServerEventsList(t *testing.T) {
	s, _ := testServer(t, nil)
	seed(t, s, 5)
	tests := []struct {
		query string
		want  int
		seqs  []int64
	}{
		{"?stream=false&since=0", 200, []int64{1, 2, 3, 4, 5}},
		{"?stream=false&since=3", 200, []int64{4, 5}},
		{"?stream=false&since=1&limit=2", 200, []int64{2, 3}},
		{"?stream=false&since=5", 200, []int64{}},
		{"?stream=false&since=99", 409, nil}, // from another history
		{"?since=99", 409, nil},
		{"?stream=false", 200, []int64{}},
		{"?stream=false&since=-1", 400, nil},
		{"?stream=false&since=x", 400, nil},
		{"?stream=false&limit=0", 400, nil},
		{"?stream=false&limit=", 400, nil},
		{"?stream=maybe", 400, nil},
		{"?from=3", 400, nil},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			a := call(t, s, "GET", "/api/v1/events"+tt.query, testUser, nil)
			if a.status != tt.want {
				t.Fatalf("got %d, want %d: %s", a.status, tt.want, a.body)
			}
			if tt.want != 200 {
				a.errorBody(t)
				return
			}
			var out struct {
				Events []arbiter.Event `json:"events"`
			}
			a.decode(t, &out)
			seqs := []int64{}
			for _, e := range out.Events {
				seqs = append(seqs, e.Seq)
			}
			if out.Events == nil || len(seqs) != len(tt.seqs) {
				t.Fatalf("got seqs %v, want %v", seqs, tt.seqs)
			}
			for i := range seqs {
				if seqs[i] != tt.seqs[i] {
					t.Fatalf("got seqs %v, want %v", seqs, tt.seqs)
				}
			}
		})
	}
}

func TestServerEventsBadLastEventID(t *testing.T) {
	s, _ := testServer(t, nil)
	r := testRequest("GET", "/api/v1/events", nil)
	r.Header.Set("Authorization", "Bearer "+testUser)
	r.Header.Set("Last-Event-ID", "abc")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "Last-Event-ID") {
		t.Errorf("got %d %s, want 400 naming Last-Event-ID", w.Code, w.Body)
	}
}

func TestServerLongPoll(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 2)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()

	type result struct {
		status int
		a      arbiter.Allocation
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("GET", ts.URL+"/api/v1/allocations/2?wait=30", nil)
		req.Header.Set("Authorization", "Bearer "+testUser)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var a arbiter.Allocation
		err = json.NewDecoder(resp.Body).Decode(&a)
		done <- result{resp.StatusCode, a, err}
	}()
	poll.Until(t, 10*time.Second, "1 event subscriber", func() bool { return f.subscribers() == 1 })
	select {
	case r := <-done:
		t.Fatalf("answered before the state changed: %+v", r)
	default:
	}
	f.setState(1, arbiter.StateReady) // another allocation: keeps waiting
	f.setState(2, arbiter.StateReady)
	select {
	case r := <-done:
		if r.err != nil || r.status != 200 || r.a.ID != 2 || r.a.State != arbiter.StateReady {
			t.Errorf("got %+v, want 200 allocation 2 ready", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not answer after the state changed")
	}
}

func TestServerLongPollAnswersAtOnce(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 2)
	f.setState(1, arbiter.StateReady)
	// A ready allocation is answered without waiting.
	a := call(t, s, "GET", "/api/v1/allocations/1?wait=300", testUser, nil)
	var al arbiter.Allocation
	a.decode(t, &al)
	if a.status != 200 || al.State != arbiter.StateReady {
		t.Errorf("got %d %q, want 200 ready", a.status, al.State)
	}
	// A short wait passes and answers the allocation as it is.
	a = call(t, s, "GET", "/api/v1/allocations/2?wait=0.02", testUser, nil)
	a.decode(t, &al)
	if a.status != 200 || al.State != arbiter.StateQueued {
		t.Errorf("got %d %q, want 200 queued", a.status, al.State)
	}
	for _, q := range []string{"0", "-1", "301", "soon", "NaN", ""} {
		if a := call(t, s, "GET", "/api/v1/allocations/2?wait="+q, testUser, nil); a.status != 400 {
			t.Errorf("wait=%q: got %d, want 400", q, a.status)
		}
	}
	if a := call(t, s, "GET", "/api/v1/allocations/9?wait=5", testUser, nil); a.status != 404 {
		t.Errorf("unknown id: got %d, want 404", a.status)
	}
}

// TestEventsFromNowResumeAfterADrop: a client that follows "from now" and
// loses its stream before the first event resumes from where the stream
// started, so the events committed while it was away are not lost.
func TestEventsFromNowResumeAfterADrop(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 2) // seq 1..2, before the client comes
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	c := client.New(ts.URL, testUser)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var got []int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Events(ctx, -1, func(ev arbiter.Event) error {
			mu.Lock()
			got = append(got, ev.Seq)
			mu.Unlock()
			return nil
		})
	}()
	poll.Until(t, 10*time.Second, "the stream open", func() bool { return f.subscribers() == 1 })
	ts.CloseClientConnections() // a proxy cuts it; meanwhile seq 3 and 4
	seed(t, s, 2)
	poll.Until(t, 10*time.Second, "the client back", func() bool { return f.subscribers() == 1 })
	seed(t, s, 1) // seq 5
	poll.Until(t, 10*time.Second, "seq 5 delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == 5
	})
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []int64{3, 4, 5}) {
		t.Errorf("delivered %v, want [3 4 5]", got)
	}
}

// getAsAlice sends alice's GET of url and tells its answer's status (-1
// when none came).
func getAsAlice(url string) <-chan int {
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+testUser)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// TestLongPollSpeltOtherwiseEndsWithItsToken: ?w%61it= is the same
// long-poll to the handler as ?wait=, and ends with its token too.
func TestLongPollSpeltOtherwiseEndsWithItsToken(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 1) // allocation 1, queued
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	start := time.Now()
	done := getAsAlice(ts.URL + "/api/v1/allocations/1?w%61it=5")
	poll.Until(t, 10*time.Second, "the long-poll waiting", func() bool { return f.subscribers() == 1 })
	if err := s.SetTokens([]Token{testTokens[0], testTokens[2]}); err != nil { // alice's token removed
		t.Fatal(err)
	}
	<-done
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the long-poll of a removed token went on for %s (its full wait); with ?wait= it ends at once", d.Round(100*time.Millisecond))
	}
}

// TestLongPollOfAWithdrawnTokenIsRefused: a long-poll whose token is
// removed meanwhile is answered 401, not with one more read after the
// reload that removed it.
func TestLongPollOfAWithdrawnTokenIsRefused(t *testing.T) {
	s, f := testServer(t, nil)
	seed(t, s, 1)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	done := getAsAlice(ts.URL + "/api/v1/allocations/1?wait=30")
	poll.Until(t, 10*time.Second, "the long-poll waiting", func() bool { return f.subscribers() == 1 })
	if err := s.SetTokens([]Token{testTokens[0], testTokens[2]}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != http.StatusUnauthorized {
			t.Errorf("the long-poll of a removed token was answered %d, want 401", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long-poll of a removed token did not end")
	}
}

// TestLongPollsShareOneSubscription: waits for allocations share one
// subscription to the events (a thousand waiting clients, not a thousand
// buffers), each woken by its own allocation's change only; the
// subscription ends with the last wait.
func TestLongPollsShareOneSubscription(t *testing.T) {
	s, f := testServer(t, nil)
	const n = 12
	seed(t, s, n) // allocations 1..n, queued
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	answered := make(chan int64, n)
	for id := 1; id <= n; id++ {
		go func() {
			req, _ := http.NewRequest("GET", ts.URL+"/api/v1/allocations/"+strconv.Itoa(id)+"?wait=20", nil)
			req.Header.Set("Authorization", "Bearer "+testUser)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answered <- -1
				return
			}
			var a arbiter.Allocation
			json.NewDecoder(resp.Body).Decode(&a)
			resp.Body.Close()
			answered <- a.ID
		}()
	}
	poll.Until(t, 10*time.Second, "the waits to be waiting", func() bool {
		s.allocWake.mu.Lock()
		defer s.allocWake.mu.Unlock()
		return len(s.allocWake.waiters) == n
	})
	if got := f.subscribers(); got != 1 {
		t.Fatalf("%d waits hold %d subscriptions, want 1", n, got)
	}
	f.setState(5, arbiter.StateReady)
	if id := <-answered; id != 5 {
		t.Fatalf("allocation 5 changed, and the wait for %d answered", id)
	}
	for id := 1; id <= n; id++ {
		if id != 5 {
			f.setState(int64(id), arbiter.StateReady)
		}
	}
	for range n - 1 {
		<-answered
	}
	poll.Until(t, 10*time.Second, "the shared subscription to end with the last wait", func() bool { return f.subscribers() == 0 })
}

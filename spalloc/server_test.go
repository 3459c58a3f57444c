package spalloc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/poll"
)

// lockedBackend makes the fake backend safe for the server's goroutines,
// and lets a test act in the middle of a command (during).
type lockedBackend struct {
	mu     sync.Mutex
	f      *fakeBackend
	during func()
}

func (b *lockedBackend) CreateJob(c *CreateJob) (int64, error) {
	b.mu.Lock()
	id, err := b.f.CreateJob(c)
	during := b.during
	b.mu.Unlock()
	if during != nil {
		during()
	}
	return id, err
}

func (b *lockedBackend) Job(id int64, touch bool, peer string) (Job, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.Job(id, touch, peer)
}

func (b *lockedBackend) PowerJob(id int64, on bool, peer string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.PowerJob(id, on, peer)
}

func (b *lockedBackend) DestroyJob(id int64, reason *string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.DestroyJob(id, reason)
}

func (b *lockedBackend) ListJobs() ([]Job, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.ListJobs()
}

func (b *lockedBackend) Machines() ([]*arbiter.GridMachine, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.Machines()
}

func (b *lockedBackend) BoardJob(machine string, bd arbiter.Board) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.BoardJob(machine, bd)
}

// testServer serves a 4×2 fake machine on a loopback port.
func testServer(t *testing.T, o ServerOptions) (*Server, *lockedBackend, string) {
	t.Helper()
	b := &lockedBackend{f: newFakeBackend(machine4x2())}
	if o.Backend == nil {
		o.Backend = b
	}
	s := NewServer(o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, b, ln.Addr().String()
}

type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, s); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) line() (string, error) {
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	l, err := c.r.ReadString('\n')
	return strings.TrimSuffix(l, "\n"), err
}

func (c *client) want(lines ...string) {
	c.t.Helper()
	for _, w := range lines {
		got, err := c.line()
		if err != nil || got != w {
			c.t.Fatalf("got %q (%v), want %q", got, err, w)
		}
	}
}

func (c *client) wantClosed() {
	c.t.Helper()
	if l, err := c.line(); err == nil {
		c.t.Fatalf("got %q, want the connection closed", l)
	}
}

func TestServerAnswersInOrder(t *testing.T) {
	_, _, addr := testServer(t, ServerOptions{})
	c := dial(t, addr)
	// Several requests in one packet, a blank line and a "\r\n".
	c.send("{\"command\": \"version\"}\n\n{\"command\": \"create_job\", \"kwargs\": {\"owner\": \"a\"}}\r\n{\"command\": \"get_job_state\", \"args\": [1]}\n")
	c.want(`{"return": "1.0.0"}`, `{"return": 1}`)
	if l, _ := c.line(); !strings.HasPrefix(l, `{"return": {"state": 3, `) || !strings.HasSuffix(l, `"keepalivehost": "127.0.0.1"}}`) {
		t.Fatalf("get_job_state: %s", l)
	}
	// An exception keeps the connection.
	c.send("{\"command\": \"create_job\"}\n{\"command\": \"version\"}\n")
	c.want(`{"exception": "owner must be specified for all jobs"}`, `{"return": "1.0.0"}`)
}

func TestServerNotificationsFollowTheReply(t *testing.T) {
	s, b, addr := testServer(t, ServerOptions{})
	c := dial(t, addr)
	c.send("{\"command\": \"notify_job\"}\n")
	c.want(`{"return": null}`)
	// The change is published while the command is still being handled:
	// its notification comes after the reply.
	b.during = func() { s.Notify([]int64{1}, []string{"m"}) }
	c.send("{\"command\": \"create_job\", \"kwargs\": {\"owner\": \"a\"}}\n")
	c.want(`{"return": 1}`, `{"jobs_changed": [1]}`)
	// An idle client gets notifications at once; machines are not watched.
	b.during = nil
	s.Notify([]int64{1, 2}, []string{"m"})
	c.want(`{"jobs_changed": [1, 2]}`)
	c.send("{\"command\": \"notify_machine\", \"args\": [\"m\"]}\n")
	c.want(`{"return": null}`)
	s.Notify(nil, []string{"m", "other"})
	c.want(`{"machines_changed": ["m"]}`)
	if !s.Watching() {
		t.Fatal("Watching: false")
	}
}

// TestServerCountsWatchers: Watching is true from the reply of the command
// that began a watch until the last watching connection stops watching or
// goes away.
func TestServerCountsWatchers(t *testing.T) {
	s, _, addr := testServer(t, ServerOptions{})
	if s.Watching() {
		t.Fatal("watching with no connection")
	}
	a, b := dial(t, addr), dial(t, addr)
	a.send("{\"command\": \"notify_job\", \"args\": [1]}\n")
	a.want(`{"return": null}`)
	if !s.Watching() {
		t.Fatal("not watching after notify_job's reply")
	}
	b.send("{\"command\": \"notify_machine\"}\n{\"command\": \"notify_machine\", \"args\": [\"m\"]}\n")
	b.want(`{"return": null}`, `{"return": null}`)
	a.send("{\"command\": \"no_notify_job\"}\n")
	a.want(`{"return": null}`)
	if !s.Watching() {
		t.Fatal("not watching while b watches")
	}
	b.c.Close()
	if err := poll.Try(5*time.Second, func() error {
		if s.Watching() {
			return errors.New("still watching")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a.send("{\"command\": \"notify_machine\", \"args\": [\"m\"]}\n{\"command\": \"no_notify_machine\", \"args\": [\"m\"]}\n")
	a.want(`{"return": null}`, `{"return": null}`)
	if s.Watching() {
		t.Fatal("watching after the last watch was removed")
	}
}

func TestServerDisconnectsBadClientsOnly(t *testing.T) {
	s, _, addr := testServer(t, ServerOptions{MaxPendingBytes: 4096})
	good := dial(t, addr)
	good.send("{\"command\": \"notify_job\"}\n")
	good.want(`{"return": null}`)

	for _, bad := range []string{"{\"command\": \"nope\"}\n", "not json\n", strings.Repeat("x", MaxLineBytes+10) + "\n"} {
		c := dial(t, addr)
		c.send(bad)
		c.wantClosed()
	}
	// A watcher that never reads is cut off once too much waits for it.
	lazy := dial(t, addr)
	lazy.send("{\"command\": \"notify_job\"}\n")
	lazy.want(`{"return": null}`)
	ids := make([]int64, 300)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Conns() > 1 && time.Now().Before(deadline) {
		s.Notify(ids, nil) // good reads them below
		good.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := good.r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Conns(); n != 1 {
		t.Fatalf("%d connections, want the lazy one cut off", n)
	}
	good.send("{\"command\": \"version\"}\n")
	good.want(`{"return": "1.0.0"}`)
}

func TestServerAllowAndLimits(t *testing.T) {
	s := NewServer(ServerOptions{Backend: &lockedBackend{f: newFakeBackend()}, Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	for a, want := range map[string]bool{"10.1.2.3": true, "127.0.0.1": false, "::ffff:10.0.0.1": true, "::1": false} {
		if got := s.Allowed(netip.MustParseAddr(a)); got != want {
			t.Errorf("Allowed(%s) = %v, want %v", a, got, want)
		}
	}
	if !NewServer(ServerOptions{}).Allowed(netip.MustParseAddr("::1")) {
		t.Error("the default allows no loopback")
	}
	_, _, addr := testServer(t, ServerOptions{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	c := dial(t, addr)
	c.send("{\"command\": \"version\"}\n")
	c.wantClosed()

	_, _, addr = testServer(t, ServerOptions{MaxConns: 1})
	one := dial(t, addr)
	one.send("{\"command\": \"version\"}\n")
	one.want(`{"return": "1.0.0"}`)
	two := dial(t, addr)
	two.send("{\"command\": \"version\"}\n")
	two.wantClosed()
}

func TestServerClose(t *testing.T) {
	s, _, addr := testServer(t, ServerOptions{})
	c := dial(t, addr)
	c.send("{\"command\": \"version\"}\n")
	c.want(`{"return": "1.0.0"}`)
	s.Close()
	c.wantClosed()
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// FuzzServerConnection feeds arbitrary bytes through a whole server
// connection over loopback TCP — framing, dispatch, replies and
// notifications — then checks that every line that came back is a reply or
// a notification, and that another connection is served normally
// afterwards.
func FuzzServerConnection(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("{", 100) + "\n"))
	f.Fuzz(fuzzServerOne)
}

func fuzzServerOne(t *testing.T, data []byte) {
	b := &lockedBackend{f: newFakeBackend(machine4x2())}
	s := NewServer(ServerOptions{Backend: b, MaxPendingBytes: 1 << 16})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	// run sends in, closes its sending side and returns all that came back
	// until the server closed the connection.
	run := func(in []byte) []byte {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var out bytes.Buffer
		done := make(chan struct{})
		go func() {
			defer close(done)
			io.Copy(&out, c)
		}()
		c.Write(in)
		s.Notify([]int64{1}, []string{"m"})
		c.(*net.TCPConn).CloseWrite()
		<-done
		return out.Bytes()
	}
	for _, l := range bytes.SplitAfter(run(data), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		if !bytes.HasSuffix(l, []byte("\n")) {
			t.Fatalf("a partial line %q", l)
		}
		if bytes.HasPrefix(l, []byte(`{"jobs_changed": `)) || bytes.HasPrefix(l, []byte(`{"machines_changed": `)) {
			continue
		}
		checkReply(t, l)
	}
	if out := run([]byte("{\"command\": \"version\"}\n")); !bytes.Equal(out, []byte(`{"return": "1.0.0"}`+"\n")) {
		t.Fatalf("a fresh connection got %q", out)
	}
}

// stuckPlane is a control plane whose store never answers: every command
// waits until its caller gives up.
type stuckPlane struct {
	Plane   // the rest is not called
	entered chan struct{}
	// unstuck ends the wait when the test does, so that a failed test
	// does not hang in its cleanup.
	unstuck chan struct{}
}

func (p *stuckPlane) Do(ctx context.Context, _ arbiter.Command) (any, error) {
	p.entered <- struct{}{}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.unstuck:
		return nil, errors.New("the test ended")
	}
}

// TestServerCloseWhileTheStoreIsDown: a command waiting on a store that
// stays down does not keep Close (and so the server's shutdown) waiting:
// its client is disconnected and the command gives up.
func TestServerCloseWhileTheStoreIsDown(t *testing.T) {
	p := &stuckPlane{entered: make(chan struct{}, 1), unstuck: make(chan struct{})}
	s, _, addr := testServer(t, ServerOptions{Backend: NewBackend(p)})
	t.Cleanup(func() { close(p.unstuck) }) // before the server's Close
	c := dial(t, addr)
	c.send("{\"command\": \"destroy_job\", \"args\": [1]}\n")
	<-p.entered
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits for a command the store never answers")
	}
	c.wantClosed()
}

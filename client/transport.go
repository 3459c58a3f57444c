package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Transport is the HTTP transport of a Client and of the load tools: it
// speaks HTTP/1.1 to plain http:// servers on the caller's goroutine.
//
// Why: net/http's Transport hands every request between three goroutines
// (the caller's, and a reader and a writer per connection). A load tool
// sharing the machine with the server it measures pays for those
// hand-offs on every request, taken from the server (~30 % of its CPU
// under `bench tasks`); a command-line call makes one request in a
// process of its own, whose threads they start and wake (5–11 % of
// `arbiter ps` on a 2-CPU machine, docs/guides/performance.md).
// Transport writes the request and reads the answer itself, with
// net/http's own Request.Write and ReadResponse, on a kept-alive
// connection that goes back to it once the body has been read.
//
// https://, requests through a proxy (the fallback's Proxy) and CONNECT go
// through the fallback, a standard Transport.
//
// A request that fails on a kept connection before any of its answer came
// back (the server had closed the connection while it was idle) is sent
// once more on a new connection when that cannot do anything twice: it
// only reads (GET, HEAD, OPTIONS) and its body, if any, can be sent again.
// A request that changes something is not retried; instead, a connection
// kept idle for longer than checkAfter is first checked for a close by the
// server (where the system allows a look without blocking), so that it is
// not written to a connection already gone. One used more recently is not:
// the look is a system call, ~10 % of the load tool's rate against a
// do-nothing server, and arbiter closes an idle connection after a second
// at the least (server.idle_timeout_s). A server that stops within that
// time fails the request instead.
type Transport struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback *http.Transport

	mu   sync.Mutex
	idle map[string][]*keptConn // by host:port
	max  int                    // idle connections kept per host

	// checkAfter: a kept connection idle for longer is looked at before
	// a request that must not be sent twice is written to it.
	checkAfter time.Duration
}

// defaultCheckAfter is Transport.checkAfter: half of the shortest idle
// timeout an arbiter server takes.
const defaultCheckAfter = 500 * time.Millisecond

// NewTransport returns a Transport that keeps up to idlePerHost idle
// connections to each host (at least 1) and dials with fallback's
// DialContext (a net.Dialer's with a 10 s timeout if it has none).
// fallback (nil: a new standard Transport) serves what Transport does not
// speak.
func NewTransport(fallback *http.Transport, idlePerHost int) *Transport {
	if fallback == nil {
		fallback = &http.Transport{}
	}
	dial := fallback.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return &Transport{dial: dial, fallback: fallback, idle: map[string][]*keptConn{}, max: max(idlePerHost, 1), checkAfter: defaultCheckAfter}
}

// keptConn is one kept-alive connection of a Transport.
type keptConn struct {
	net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	deadline time.Time // the one set on Conn: setting it again is not free
	idled    time.Time // when it was last put back
}

// setDeadline sets d on c unless it is set already.
func (c *keptConn) setDeadline(d time.Time) {
	if !d.Equal(c.deadline) {
		c.deadline = d
		c.SetDeadline(d)
	}
}

// RoundTrip sends req on an idle connection to its host, or a new one.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect || t.proxied(req) {
		return t.fallback.RoundTrip(req)
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	fail := func(err error) (*http.Response, error) {
		if req.Body != nil {
			req.Body.Close() // as a RoundTripper must, even on failure
		}
		return nil, err
	}
	replayable := readOnly(req.Method) && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
	for attempt := 0; ; attempt++ {
		c, reused, err := t.get(req.Context(), host, !replayable)
		if err != nil {
			return fail(err)
		}
		resp, answered, err := t.exchange(req, c, host)
		if err == nil {
			return resp, nil
		}
		c.Close()
		if !reused || answered || attempt > 0 || !replayable || req.Context().Err() != nil {
			return fail(err)
		}
		// The server closed a kept connection: it closed the others too
		// (it restarted, or timed them all out), so the retry goes on a
		// new one, not on the next idle one.
		t.dropIdle(host)
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return fail(err)
			}
			r := *req
			r.Body = body
			req = &r
		}
	}
}

// proxied reports whether the fallback's Proxy sends req through a proxy.
func (t *Transport) proxied(req *http.Request) bool {
	if t.fallback.Proxy == nil {
		return false
	}
	u, err := t.fallback.Proxy(req)
	return u != nil || err != nil // an error: let the fallback report it
}

// exchange writes req on c and reads its answer; answered says whether
// any of it was read.
func (t *Transport) exchange(req *http.Request, c *keptConn, host string) (_ *http.Response, answered bool, _ error) {
	ctx := req.Context()
	d, _ := ctx.Deadline()
	c.setDeadline(d)
	// A request whose context ends fails at once; its connection is not
	// reused (finish sees the watch has fired).
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(c.bw); err != nil {
		stop()
		return nil, false, ctxErr(ctx, err)
	}
	if err := c.bw.Flush(); err != nil {
		stop()
		return nil, false, ctxErr(ctx, err)
	}
	if _, err := c.br.Peek(1); err != nil {
		stop()
		return nil, false, ctxErr(ctx, err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		stop()
		return nil, true, ctxErr(ctx, err)
	}
	resp.Body = &connBody{body: resp.Body, c: c, t: t, host: host, keep: !resp.Close, stop: stop}
	return resp, true, nil
}

// ctxErr prefers the context's error to the connection's when the
// context ended the request. The connection's deadline is the context's
// and may fire a moment before the context notices: then it waits for the
// context, which is due, so that callers see ctx.Err() set as with
// net/http's Transport.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if d, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(d) {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

// get returns an idle connection to host (reused) or dials one. With
// check, an idle connection kept for longer than checkAfter that the
// server has closed (or that holds bytes nobody asked for) is closed and
// the next one tried.
func (t *Transport) get(ctx context.Context, host string, check bool) (c *keptConn, reused bool, err error) {
	for {
		t.mu.Lock()
		cs := t.idle[host]
		if len(cs) == 0 {
			t.mu.Unlock()
			break
		}
		c = cs[len(cs)-1]
		t.idle[host] = cs[:len(cs)-1]
		t.mu.Unlock()
		if !check || time.Since(c.idled) <= t.checkAfter {
			return c, true, nil
		}
		if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
			c.setDeadline(time.Time{}) // the last request's, passed: it would stop the look
		}
		if c.br.Buffered() == 0 && !closedByPeer(c.Conn) {
			return c, true, nil
		}
		c.Close()
	}
	nc, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	return &keptConn{Conn: nc, br: bufio.NewReader(nc), bw: bufio.NewWriter(nc)}, false, nil
}

// put keeps c for the next request to host, or closes it.
func (t *Transport) put(c *keptConn, host string) {
	c.idled = time.Now()
	t.mu.Lock()
	if len(t.idle[host]) < t.max {
		t.idle[host] = append(t.idle[host], c)
		c = nil
	}
	t.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// dropIdle closes the idle connections kept to host.
func (t *Transport) dropIdle(host string) {
	t.mu.Lock()
	cs := t.idle[host]
	delete(t.idle, host)
	t.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// CloseIdleConnections closes the connections kept for reuse, and the
// fallback's.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*keptConn{}
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.Close()
		}
	}
	t.fallback.CloseIdleConnections()
}

// connBody is an answer's body: once it has been read to its end, its
// connection goes back to the transport; closed before that, the
// connection is closed (what is left of the body is not worth reading).
type connBody struct {
	body io.ReadCloser
	c    *keptConn
	t    *Transport
	host string
	keep bool        // the server keeps the connection open
	stop func() bool // ends the watch on the request's context
	done bool
}

func (b *connBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err != nil {
		b.finish(errors.Is(err, io.EOF))
	}
	return n, err
}

func (b *connBody) Close() error {
	if !b.done {
		// A body read to its last byte (or announced empty) may not have
		// said EOF yet: one more read says so without I/O. Anything that
		// would wait for the server (a stream still open) fails at once
		// on the passed deadline, and the connection is closed.
		b.c.setDeadline(time.Unix(1, 0))
		var one [1]byte
		n, err := b.body.Read(one[:])
		b.finish(n == 0 && errors.Is(err, io.EOF))
	}
	return nil
}

func (b *connBody) finish(atEnd bool) {
	b.done = true
	b.body.Close()
	if b.stop() && atEnd && b.keep {
		b.t.put(b.c, b.host)
		return
	}
	b.c.Close()
}

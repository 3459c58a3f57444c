package bench

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

// The load tools share the machine with the server they measure, so what
// they spend per request is taken from the server. net/http's Transport
// hands every request between three goroutines (the caller's, and a
// reader and a writer per connection), which on two cores cost the load
// tool more CPU than the requests themselves. connTransport speaks
// HTTP/1.1 on the caller's goroutine instead: it writes the request and
// reads the answer on a kept-alive connection of its own (net/http's own
// Request.Write and ReadResponse), and puts the connection back once the
// body has been read. Only plain http:// goes this way; https:// and
// anything unusual go through a standard Transport.
type connTransport struct {
	dialer net.Dialer
	std    *http.Transport // for what connTransport does not speak

	mu   sync.Mutex
	idle map[string][]*benchConn // by host:port
	max  int                     // idle connections kept per host
}

// benchConn is one kept-alive connection of a connTransport.
type benchConn struct {
	net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	deadline time.Time // the one set on Conn: setting it again is not free
}

// setDeadline sets d on c unless it is set already.
func (c *benchConn) setDeadline(d time.Time) {
	if !d.Equal(c.deadline) {
		c.deadline = d
		c.SetDeadline(d)
	}
}

func newConnTransport(n int) *connTransport {
	t := &connTransport{
		dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		idle:   map[string][]*benchConn{},
		max:    n + 4,
	}
	t.std = &http.Transport{
		DialContext:         t.dialer.DialContext,
		MaxIdleConns:        2 * (n + 4),
		MaxIdleConnsPerHost: n + 4,
		IdleConnTimeout:     time.Minute,
	}
	return t
}

// RoundTrip sends req on an idle connection to its host, or a new one.
// A request that fails on a reused connection before any of the answer
// came back (the server had closed it while it was idle) is sent once
// more on a new connection, if its body can be sent again.
func (t *connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || req.Method == http.MethodConnect {
		return t.std.RoundTrip(req)
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
	for attempt := 0; ; attempt++ {
		c, reused, err := t.get(req.Context(), host)
		if err != nil {
			return fail(err)
		}
		resp, answered, err := t.exchange(req, c, host)
		if err == nil {
			return resp, nil
		}
		c.Close()
		if !reused || answered || attempt > 0 || req.Context().Err() != nil || (req.Body != nil && req.GetBody == nil) {
			return fail(err)
		}
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

// exchange writes req on c and reads its answer; answered says whether
// any of it was read.
func (t *connTransport) exchange(req *http.Request, c *benchConn, host string) (_ *http.Response, answered bool, _ error) {
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
	resp.Body = &benchBody{body: resp.Body, c: c, t: t, host: host, keep: !resp.Close, stop: stop}
	return resp, true, nil
}

// ctxErr prefers the context's error to the connection's when the
// context ended the request: the connection's deadline is the context's,
// and may fire a moment before the context notices.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if d, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return err
}

// get returns an idle connection to host (reused) or dials one.
func (t *connTransport) get(ctx context.Context, host string) (c *benchConn, reused bool, err error) {
	t.mu.Lock()
	if cs := t.idle[host]; len(cs) > 0 {
		c = cs[len(cs)-1]
		t.idle[host] = cs[:len(cs)-1]
		t.mu.Unlock()
		return c, true, nil
	}
	t.mu.Unlock()
	nc, err := t.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	return &benchConn{Conn: nc, br: bufio.NewReader(nc), bw: bufio.NewWriter(nc)}, false, nil
}

// put keeps c for the next request to host, or closes it.
func (t *connTransport) put(c *benchConn, host string) {
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

// CloseIdleConnections closes the connections kept for reuse.
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*benchConn{}
	t.mu.Unlock()
	for _, cs := range idle {
		for _, c := range cs {
			c.Close()
		}
	}
	t.std.CloseIdleConnections()
}

// benchBody is an answer's body: once it has been read to its end, its
// connection goes back to the transport; closed before that, the
// connection is closed (what is left of the body is not worth reading).
type benchBody struct {
	body io.ReadCloser
	c    *benchConn
	t    *connTransport
	host string
	keep bool        // the server keeps the connection open
	stop func() bool // ends the watch on the request's context
	done bool
}

func (b *benchBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err != nil {
		b.finish(errors.Is(err, io.EOF))
	}
	return n, err
}

func (b *benchBody) Close() error {
	if !b.done {
		// A body the server announced as empty needs no read to be done.
		var one [1]byte
		n, err := b.body.Read(one[:])
		b.finish(n == 0 && errors.Is(err, io.EOF))
	}
	return nil
}

func (b *benchBody) finish(atEnd bool) {
	b.done = true
	b.body.Close()
	if b.stop() && atEnd && b.keep {
		b.t.put(b.c, b.host)
		return
	}
	b.c.Close()
}

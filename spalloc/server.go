package spalloc

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// ServerOptions configure a Server. Backend is required.
type ServerOptions struct {
	Backend Backend
	// Allow lists the client addresses served; a connection from any other
	// is closed at once, without a reply. Empty: loopback only
	// (127.0.0.0/8 and ::1).
	Allow []netip.Prefix
	// Logger receives connection and error logs; nil discards.
	Logger *slog.Logger
	// MaxConns bounds the open connections (default 1024); a connection
	// beyond it is closed at once.
	MaxConns int
	// MaxPendingBytes bounds what may wait to be written to one client
	// (default 1 MiB): a client that does not read its replies and
	// notifications is disconnected past it.
	MaxPendingBytes int
}

// Defaults of ServerOptions.
const (
	DefaultMaxConns        = 1024
	DefaultMaxPendingBytes = 1 << 20
)

// Server serves the spalloc protocol over TCP: one goroutine reads and
// answers each connection's requests in order (a second one writes the
// notifications an idle client is sent). A client that sends something
// undispatchable, a line longer than MaxLineBytes, or that stops reading is
// disconnected; nothing it does reaches another connection. Create it with
// NewServer; its methods are safe for concurrent use.
type Server struct {
	o   ServerOptions
	log *slog.Logger

	mu     sync.Mutex
	ln     net.Listener
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup

	// watching counts the connections that watch a job or machine; read
	// without a lock, for every committed batch (Watching).
	watching atomic.Int64
}

// NewServer returns a server over o.Backend.
func NewServer(o ServerOptions) *Server {
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxPendingBytes <= 0 {
		o.MaxPendingBytes = DefaultMaxPendingBytes
	}
	if len(o.Allow) == 0 {
		o.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{o: o, log: log, conns: map[*conn]struct{}{}}
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("spalloc: server closed")

// Serve accepts connections on ln until Close, and returns ErrServerClosed
// then (or the listener's error). It closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.accept(c)
	}
}

// Allowed reports whether a client at addr may connect.
func (s *Server) Allowed(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range s.o.Allow {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

func (s *Server) accept(nc net.Conn) {
	peer := peerAddr(nc.RemoteAddr())
	if !peer.IsValid() || !s.Allowed(peer) {
		s.log.Warn("spalloc: connection refused: address not in [spalloc] allow", "peer", nc.RemoteAddr().String())
		nc.Close()
		return
	}
	c := &conn{s: s, nc: nc, sess: NewSession(peer.String()), wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.mu.Lock()
	if s.closed || len(s.conns) >= s.o.MaxConns {
		full := !s.closed
		s.mu.Unlock()
		if full {
			s.log.Warn("spalloc: connection refused: too many connections", "peer", nc.RemoteAddr().String(), "max", s.o.MaxConns)
		}
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(2)
	s.mu.Unlock()
	go c.read()
	go c.writeNotifications()
}

func peerAddr(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// Notify sends one processing step's changes to every connection watching
// them: at most one {"jobs_changed"} and one {"machines_changed"} line each.
// A connection busy with a command gets them after that command's reply.
// It never blocks on a client.
func (s *Server) Notify(jobs []int64, machines []string) {
	if len(jobs) == 0 && len(machines) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if !c.sess.Watching() {
			continue
		}
		if lines := c.sess.Notify(jobs, machines); len(lines) > 0 {
			c.notify(lines)
		}
	}
}

// Watching reports whether any connection watches a job or machine (the
// caller may skip working out notifications when none does). It takes no
// lock. A connection counts as watching from the end of the command that
// began its watch, before that command's reply is sent: a change the
// client cannot have seen by the time it has the reply is notified.
func (s *Server) Watching() bool { return s.watching.Load() > 0 }

// Conns is the number of open connections.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting, disconnects every client, closes the backend if
// it is an io.Closer (so that commands still waiting on it give up) and
// waits for the clients' goroutines. It is safe to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	if c, ok := s.o.Backend.(io.Closer); ok {
		c.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) drop(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.countWatch(false)
}

// conn is one client connection.
type conn struct {
	s    *Server
	nc   net.Conn
	sess *Session
	wake chan struct{} // a notification waits to be written
	done chan struct{} // closed when the connection closes

	mu sync.Mutex
	// busy: a command is being handled; its notifications wait in held
	// until its reply is queued.
	busy    bool
	held    []byte
	out     []byte // waiting to be written
	writing bool   // a goroutine is writing out
	closed  bool

	watching bool // counted in s.watching; only the read goroutine uses it
}

// countWatch keeps s.watching up to date with whether c watches now.
func (c *conn) countWatch(now bool) {
	if now == c.watching {
		return
	}
	c.watching = now
	if now {
		c.s.watching.Add(1)
	} else {
		c.s.watching.Add(-1)
	}
}

// read answers the connection's requests in order until it closes or
// misbehaves.
func (c *conn) read() {
	defer c.s.wg.Done()
	defer c.s.drop(c)
	defer c.close()
	lines := NewLineReader(c.nc, MaxLineBytes)
	for {
		line, err := lines.ReadLine()
		if err != nil {
			if errors.Is(err, ErrLineTooLong) {
				c.s.log.Info("spalloc: request line too long; disconnecting", "peer", c.sess.Peer(), "max", MaxLineBytes)
			}
			return
		}
		c.mu.Lock()
		c.busy = true
		c.mu.Unlock()
		reply, err := c.sess.Handle(c.s.o.Backend, line)
		c.countWatch(c.sess.Watching())
		if err != nil {
			c.s.log.Info("spalloc: undispatchable request; disconnecting", "peer", c.sess.Peer(), "err", err)
			return
		}
		c.mu.Lock()
		c.busy = false
		c.out = append(c.out, reply...)
		c.out = append(c.out, c.held...)
		c.held = c.held[:0]
		if !c.flushLocked() {
			return
		}
	}
}

// flushLocked writes out what waits, unless another goroutine is writing;
// it unlocks c.mu. false: the connection failed.
func (c *conn) flushLocked() bool {
	if c.writing || c.closed {
		ok := !c.closed
		c.mu.Unlock()
		return ok
	}
	c.writing = true
	for len(c.out) > 0 {
		buf := c.out
		c.out = nil
		c.mu.Unlock()
		_, err := c.nc.Write(buf)
		c.mu.Lock()
		if c.out == nil {
			c.out = buf[:0] // reuse the buffer
		}
		if err != nil {
			c.writing = false
			c.mu.Unlock()
			c.close()
			return false
		}
	}
	c.writing = false
	c.mu.Unlock()
	return true
}

// notify queues notification lines; they are written after the reply of a
// command in progress. A client that lets too much pile up is cut off.
func (c *conn) notify(lines []byte) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if len(c.out)+len(c.held)+len(lines) > c.s.o.MaxPendingBytes {
		c.mu.Unlock()
		c.s.log.Info("spalloc: client does not read its notifications; disconnecting", "peer", c.sess.Peer())
		c.close()
		return
	}
	if c.busy {
		c.held = append(c.held, lines...)
		c.mu.Unlock()
		return
	}
	c.out = append(c.out, lines...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeNotifications writes notifications to a client that is not busy
// with a command.
func (c *conn) writeNotifications() {
	defer c.s.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
			c.mu.Lock()
			if !c.flushLocked() {
				return
			}
		}
	}
}

func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	close(c.done)
	c.nc.Close()
}

// Package connlimit bounds how many connections one client address may
// hold open on a listener, so that one client cannot take every connection
// a server has (a slow-loris attack opens many and sends nothing). The HTTP
// server and the spalloc port both wrap their listeners with it.
package connlimit

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Listener is a net.Listener that closes, as soon as they are accepted,
// connections from an address that already holds PerClient open ones.
// Accept never returns them: the caller sees only connections it may
// serve. It is safe for concurrent use.
type Listener struct {
	net.Listener
	perClient int
	refused   func(remote net.Addr)

	mu   sync.Mutex
	open map[netip.Addr]int
}

// New wraps ln. perClient <= 0 means no limit. refused, when not nil, is
// called with the address of each connection closed for the limit (for a
// log); it must not block.
func New(ln net.Listener, perClient int, refused func(remote net.Addr)) *Listener {
	return &Listener{Listener: ln, perClient: perClient, refused: refused, open: map[netip.Addr]int{}}
}

// Accept returns the next connection its client may open.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.perClient <= 0 {
			return c, nil
		}
		addr := clientAddr(c.RemoteAddr())
		l.mu.Lock()
		n := l.open[addr]
		if n >= l.perClient {
			l.mu.Unlock()
			// Counted before the close, so that a client that sees its
			// connection end also finds the refusal counted.
			if l.refused != nil {
				l.refused(c.RemoteAddr())
			}
			c.Close()
			continue
		}
		l.open[addr] = n + 1
		l.mu.Unlock()
		return &conn{Conn: c, release: func() { l.release(addr) }}, nil
	}
}

// Open returns how many connections addr holds open.
func (l *Listener) Open(addr netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[addr.Unmap()]
}

func (l *Listener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr]--; l.open[addr] <= 0 {
		delete(l.open, addr)
	}
}

// clientAddr is the IP address of a remote address; the zero Addr (one
// shared bucket) for an address that is not IP.
func clientAddr(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// conn gives its client's place back when closed, once.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Logged is New with the refusals logged to log, at most once every 10
// seconds, naming the listener (what). perClient <= 0: ln itself.
func Logged(ln net.Listener, perClient int, log *slog.Logger, what string) net.Listener {
	if perClient <= 0 {
		return ln
	}
	var last atomic.Int64
	var refused atomic.Int64
	return New(ln, perClient, func(remote net.Addr) {
		n := refused.Add(1)
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev > int64(10*time.Second) && last.CompareAndSwap(prev, now) {
			log.Warn("connections refused: a client holds too many", "listener", what, "client", remote.String(),
				"max_conns_per_client", perClient, "refused_so_far", n)
		}
	})
}

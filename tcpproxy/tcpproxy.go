// Package tcpproxy is test support: a TCP proxy between clients and a
// server whose traffic a test holds back or throws away — a network cut
// that leaves connections open (a partition), or answers lost on the way
// back — to see what a client makes of it.
package tcpproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy passes the bytes of every connection made to Addr on to its
// target and back, until the test ends.
type Proxy struct {
	// Addr is where clients connect (127.0.0.1:port).
	Addr string

	mu    sync.Mutex
	gate  chan struct{} // closed while bytes flow
	conns []net.Conn
	wg    sync.WaitGroup
	drop  atomic.Bool
}

// Start runs a proxy to target (host:port) until the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{Addr: ln.Addr().String(), gate: open}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.copy(up, c, false)
			go p.copy(c, up, true)
		}
	}()
	t.Cleanup(func() {
		p.Resume()
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// copy passes src's bytes to dst, held while paused, thrown away while
// replies are dropped and they are the server's.
func (p *Proxy) copy(dst, src net.Conn, reply bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate // paused: hold the bytes
			if !(reply && p.drop.Load()) {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// Pause holds the bytes both ways, connections left open.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // paused already
	}
}

// Resume lets the bytes held, and those to come, through.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// DropReplies makes the proxy throw away what the server sends (on) or
// pass it again (off); what clients send still reaches the server.
func (p *Proxy) DropReplies(on bool) { p.drop.Store(on) }

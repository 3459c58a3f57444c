package connlimit

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// TestPerClientLimit: past the limit, a client's new connections are
// closed at once; closing one makes room again.
func TestPerClientLimit(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	ln := New(inner, 2, func(net.Addr) { refused.Add(1) })
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	sa, sb := <-accepted, <-accepted
	third := dial()
	// The third is closed by the server: a read ends at once.
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatal("the third connection is open")
	}
	if refused.Load() != 1 {
		t.Fatalf("refused %d, want 1", refused.Load())
	}
	if n := ln.Open(netip.MustParseAddr("127.0.0.1")); n != 2 {
		t.Fatalf("open %d, want 2", n)
	}
	sa.Close()
	sa.Close() // a double close gives back one place only
	if n := ln.Open(netip.MustParseAddr("127.0.0.1")); n != 1 {
		t.Fatalf("open %d after closing one twice, want 1", n)
	}
	_ = a
	dial()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a connection after one was closed was not accepted")
	}
	sb.Close()
	_ = b
}

package forward

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The spalloc port of a highly available deployment: one listener per
// replica, whose connections go to the replica's own spalloc server while
// it leads (a ChanListener the server serves) and to the leader's spalloc
// port while it follows. A relayed connection starts with a handshake that
// says, under the replicas' secret, who the caller is:
//
//	follower: ARBITER-REPLICA hello\n
//	leader:   <nonce>\n
//	follower: <caller ip:port> <HMAC-SHA256(nonce, caller)>\n
//
// so the leader checks the caller's address, not the follower's, against
// [spalloc] allow. The relay is plain TCP: the secret never goes on it, and
// an answer seen on the wire answers no other nonce. No clock is involved.
// The spalloc protocol has the client speak first, so a connection that
// does not start so is a client's, and is left to the server.

const relayMagic = "ARBITER-REPLICA "

// maxRelayLine bounds the relay line.
const maxRelayLine = 1024

// relayHello ends the follower's first line.
const relayHello = "hello"

// relayLineWait is how long a caller outside [spalloc] allow may take to
// send a replica's relay line before it is disconnected (a variable for
// the tests).
var relayLineWait = 5 * time.Second

// SwitchOptions configure a Switch. Secret and Leader are required.
type SwitchOptions struct {
	Secret string
	// Leading returns where this replica's own spalloc server takes
	// connections while it leads, nil while it follows.
	Leading func() *ChanListener
	// Leader returns the leader's spalloc address ("" when unknown).
	Leader func() string
	// Allowed checks a caller's address before it is relayed ([spalloc]
	// allow); the leader checks it again.
	Allowed func(netip.Addr) bool
	Logger  *slog.Logger
}

// Switch accepts the spalloc port's connections and hands each over by the
// replica's role at that moment.
type Switch struct {
	o        SwitchOptions
	wg       sync.WaitGroup
	lastWarn atomic.Int64 // unix ns of the last "does not answer"

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	ln     net.Listener
}

// NewSwitch returns a switch; Serve runs it.
func NewSwitch(o SwitchOptions) *Switch {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Switch{o: o, conns: map[net.Conn]struct{}{}}
}

// Serve accepts on ln until Close (then it returns nil) or ln fails.
func (s *Switch) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ln.Close()
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			var ne net.Error
			switch {
			case closed:
				return nil
			case errors.As(err, &ne) && ne.Timeout():
				continue
			}
			return err
		}
		if !s.track(c) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			s.handle(c)
		}()
	}
}

func (s *Switch) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Switch) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// Close stops accepting, closes the relayed connections and waits for
// them. Connections handed to a spalloc server are its own to close.
func (s *Switch) Close() error {
	s.mu.Lock()
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// handle reads whether c is relayed by a replica, then hands it over:
// to this replica's server while it leads, else on to the leader.
func (s *Switch) handle(c net.Conn) {
	peer := peerOf(c)
	allowed := peer.IsValid() && (s.o.Allowed == nil || s.o.Allowed(peer))
	if !allowed {
		// Only a replica's relay line may come from outside [spalloc]
		// allow: anyone else goes at their first byte, or when none came
		// in time.
		c.SetReadDeadline(time.Now().Add(relayLineWait))
	}
	c, err := s.accept(c)
	if err != nil {
		s.o.Logger.Warn("spalloc: a relayed connection was refused", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	if _, relayed := c.(*relayedConn); !allowed {
		if !relayed {
			s.o.Logger.Warn("spalloc: connection refused: address not in [spalloc] allow", "peer", c.RemoteAddr().String())
			c.Close()
			return
		}
		c.SetReadDeadline(time.Time{})
	}
	if ln := s.o.Leading(); ln != nil {
		if ln.Deliver(c) {
			return // the server owns it now
		}
	}
	if _, relayed := c.(*relayedConn); relayed {
		c.Close() // relayed once already: the caller reconnects and finds the leader
		return
	}
	addr := s.o.Leader()
	if addr == "" {
		c.Close() // no leader: the client reconnects
		return
	}
	// Keepalives end a relay whose leader vanished while the client is
	// quiet; followLeader ends it when another replica leads.
	d := net.Dialer{Timeout: 5 * time.Second, KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 5}}
	up, err := d.Dial("tcp", addr)
	if err != nil {
		// Clients reconnect at once: say so once in a while, not each time.
		if now := time.Now().UnixNano(); now-s.lastWarn.Load() > int64(10*time.Second) {
			s.lastWarn.Store(now)
			s.o.Logger.Warn("spalloc: the leader's port does not answer; clients are disconnected until it does", "leader", addr, "err", err)
		}
		c.Close()
		return
	}
	if !s.track(up) {
		up.Close()
		c.Close()
		return
	}
	defer s.untrack(up)
	if err := s.relayHandshake(up, c.RemoteAddr().String()); err != nil {
		s.o.Logger.Warn("spalloc: the leader refused a relay handshake", "leader", addr, "err", err)
		up.Close()
		c.Close()
		return
	}
	stop := make(chan struct{})
	go s.followLeader(addr, up, stop)
	pipe(c, up)
	close(stop)
}

// leaderCheckEvery is how often a relay looks whether the replica it
// relays to still leads (a variable for the tests).
var leaderCheckEvery = time.Second

// followLeader closes up, a relay to the leader at addr, once another
// replica leads or none does, until stop: a client waiting on a leader
// that vanished (no reset, no close) would wait for TCP to give up,
// minutes, instead of reconnecting to the new one.
func (s *Switch) followLeader(addr string, up net.Conn, stop <-chan struct{}) {
	t := time.NewTicker(leaderCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if s.o.Leader() != addr {
				up.Close()
				return
			}
		}
	}
}

// accept reads a relay line, when c starts with one: the connection is
// then the caller's, relayed (a relayedConn). Anything else is a client's
// first bytes, given back to whoever reads c. Errors: a relay line without
// the secret, or malformed.
func (s *Switch) accept(c net.Conn) (net.Conn, error) {
	br := bufio.NewReaderSize(c, maxRelayLine)
	// Byte by byte: a client that sent a few bytes and waits for an answer
	// must not wait for the rest of the magic.
	for k := 1; k <= len(relayMagic); k++ {
		head, err := br.Peek(k)
		if err != nil || head[k-1] != relayMagic[k-1] {
			// A client's own first bytes (or a client that closed at once).
			return &bufferedConn{Conn: c, r: br}, nil
		}
	}
	// A replica's handshake takes moments: one that stalls, even from an
	// allowed address, is not left holding the connection.
	c.SetReadDeadline(time.Now().Add(relayLineWait))
	line, err := br.ReadSlice('\n')
	if err != nil {
		return c, fmt.Errorf("relay line: %w", err)
	}
	if string(bytes.TrimRight(line, "\r\n")) != relayMagic+relayHello {
		return c, errors.New("the relay line is not ARBITER-REPLICA hello (a replica of an older build?)")
	}
	var n [16]byte
	_, _ = rand.Read(n[:]) // crypto/rand does not fail on supported systems
	nonce := hex.EncodeToString(n[:])
	if _, err := io.WriteString(c, nonce+"\n"); err != nil {
		return c, fmt.Errorf("relay handshake: %w", err)
	}
	answer, err := br.ReadSlice('\n')
	if err != nil {
		return c, fmt.Errorf("relay handshake: %w", err)
	}
	addr, err := ParseRelayAnswer(answer, s.o.Secret, nonce)
	if err != nil {
		return c, err
	}
	c.SetReadDeadline(time.Time{})
	return &relayedConn{bufferedConn{Conn: c, r: br}, addr}, nil
}

// relayHandshake opens a relayed connection on up for the caller at
// caller: the follower's side of the handshake.
func (s *Switch) relayHandshake(up net.Conn, caller string) error {
	up.SetDeadline(time.Now().Add(5 * time.Second))
	defer up.SetDeadline(time.Time{})
	if _, err := io.WriteString(up, relayMagic+relayHello+"\n"); err != nil {
		return err
	}
	// Byte by byte: what follows the nonce is the server's, for the
	// client, and must not be read here.
	var nonce []byte
	b := make([]byte, 1)
	for len(nonce) <= maxRelayLine {
		if _, err := up.Read(b); err != nil {
			return fmt.Errorf("read the leader's nonce: %w", err)
		}
		if b[0] == '\n' {
			_, err := io.WriteString(up, RelayAnswer(s.o.Secret, string(nonce), caller))
			return err
		}
		nonce = append(nonce, b[0])
	}
	return errors.New("the leader's nonce is too long")
}

// relayKey is the key of relay answers' MACs, derived from the replicas'
// secret for this use only.
func relayKey(secret string) []byte {
	k := sha256.Sum256([]byte("arbiter spalloc relay\x00" + secret))
	return k[:]
}

func relayMAC(secret, nonce, caller string) []byte {
	m := hmac.New(sha256.New, relayKey(secret))
	m.Write([]byte(nonce + " " + caller))
	return m.Sum(nil)
}

// RelayAnswer is the follower's answer to the leader's nonce for the
// caller at caller.
func RelayAnswer(secret, nonce, caller string) string {
	return caller + " " + hex.EncodeToString(relayMAC(secret, nonce, caller)) + "\n"
}

// ParseRelayAnswer reads a follower's answer (RelayAnswer) to nonce and
// returns the caller's address. Errors: the MAC is not the replicas'
// secret's for this nonce and caller, or the answer is malformed.
func ParseRelayAnswer(line []byte, secret, nonce string) (netip.AddrPort, error) {
	caller, mac, ok := strings.Cut(string(bytes.TrimRight(line, "\r\n")), " ")
	if !ok || secret == "" {
		return netip.AddrPort{}, errors.New("the relay answer is not <ip:port> <mac>")
	}
	got, err := hex.DecodeString(mac)
	if err != nil || !hmac.Equal(got, relayMAC(secret, nonce, caller)) {
		return netip.AddrPort{}, errors.New("the relay answer is not signed with the replicas' secret")
	}
	ap, err := netip.ParseAddrPort(caller)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("the relay answer's caller %q is not ip:port", caller)
	}
	return ap, nil
}

// pipe copies a and b into each other until either side ends, then
// closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// bufferedConn is a connection whose first bytes were peeked.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// relayedConn is a caller's connection relayed by a follower: its remote
// address is the caller's.
type relayedConn struct {
	bufferedConn
	caller netip.AddrPort
}

func (c *relayedConn) RemoteAddr() net.Addr { return net.TCPAddrFromAddrPort(c.caller) }

func peerOf(c net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// ChanListener is a net.Listener fed by a Switch: a leader's spalloc
// server serves it for one term. Closing it refuses further deliveries;
// the Switch's listener stays open.
type ChanListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewChanListener returns a listener that reports addr as its address.
func NewChanListener(addr net.Addr) *ChanListener {
	return &ChanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Deliver hands c to whoever Accepts, and reports false (c untouched) once
// the listener is closed.
func (l *ChanListener) Deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

// Accept returns the next delivered connection, or net.ErrClosed.
func (l *ChanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close refuses further deliveries. Safe to call twice.
func (l *ChanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the address the listener reports.
func (l *ChanListener) Addr() net.Addr { return l.addr }

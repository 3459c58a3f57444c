package forward

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/tcpproxy"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const secret = "the-replicas-shared-secret"

// seen is what the leader's handler saw of a request.
type seen struct {
	Method, Path, Query, Auth, Remote, Body, Cert string
	Forwarded, TLS                                bool
	Spoof                                         string
}

// leaderServer is a leader behind Accept that echoes what it saw.
func leaderServer(t *testing.T, cas *x509.CertPool) *httptest.Server {
	h := Accept(AcceptOptions{Secret: secret, ClientCAs: cas}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s := seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Auth: r.Header.Get("Authorization"),
			Remote: r.RemoteAddr, Body: string(b), Forwarded: Forwarded(r), TLS: r.TLS != nil,
			Spoof: r.Header.Get(HeaderClient) + r.Header.Get(HeaderSecret) + r.Header.Get(HeaderTLS)}
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			s.Cert = r.TLS.VerifiedChains[0][0].Subject.CommonName
		}
		json.NewEncoder(w).Encode(s)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func follower(t *testing.T, leader func() (string, string, bool), unreachable func()) *httptest.Server {
	p := NewProxy(ProxyOptions{Leader: leader, Secret: secret, Self: "b", Unreachable: unreachable})
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	t.Cleanup(p.o.Transport.(*http.Transport).CloseIdleConnections)
	return srv
}

func do(t *testing.T, req *http.Request) (*http.Response, seen) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s seen
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	return resp, s
}

// TestProxyForwards: a request through a follower reaches the leader as it
// was sent — method, path, query, Authorization, body — and the leader
// sees the caller's address, not the follower's; what a caller claims in
// the replicas' headers is thrown away.
func TestProxyForwards(t *testing.T) {
	leader := leaderServer(t, nil)
	f := follower(t, func() (string, string, bool) { return "a", leader.URL, true }, nil)
	req, _ := http.NewRequest(http.MethodDelete, f.URL+"/api/v1/allocations/7?reason=done%20now", strings.NewReader("body!"))
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set(HeaderClient, "1.2.3.4:5") // a caller's attempt at a forged address
	req.Header.Set(HeaderSecret, "guess")
	resp, s := do(t, req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if s.Method != "DELETE" || s.Path != "/api/v1/allocations/7" || s.Query != "reason=done%20now" || s.Auth != "Bearer tok" || s.Body != "body!" {
		t.Fatalf("the leader saw %+v", s)
	}
	if !s.Forwarded || s.Spoof != "" || !strings.HasPrefix(s.Remote, "127.0.0.1:") || s.Remote == "1.2.3.4:5" {
		t.Fatalf("the leader saw the caller as %+v", s)
	}
	if s.TLS {
		t.Fatal("a caller over plain HTTP reached the leader as over TLS")
	}
	// A caller over TLS to the follower is one over TLS to the leader (its
	// cookies are Secure).
	p := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "a", leader.URL, true }, Secret: secret, Self: "b"})
	ft := httptest.NewTLSServer(p)
	defer ft.Close()
	defer p.o.Transport.(*http.Transport).CloseIdleConnections()
	tc := ft.Client()
	resp, err := tc.Get(ft.URL + "/api/v1/machines")
	if err != nil {
		t.Fatal(err)
	}
	var st seen
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	tc.CloseIdleConnections()
	if !st.TLS || !st.Forwarded {
		t.Fatalf("a caller over TLS reached the leader as %+v", st)
	}
	// Straight to the leader, the same forgery is ignored too.
	req, _ = http.NewRequest(http.MethodGet, leader.URL+"/x", nil)
	req.Header.Set(HeaderClient, "1.2.3.4:5")
	req.Header.Set(HeaderSecret, "guess")
	if _, s := do(t, req); s.Forwarded || s.Remote == "1.2.3.4:5" || s.Spoof != "" {
		t.Fatalf("a forged claim was believed: %+v", s)
	}
}

// TestProxyNoLeader: without a leader, or with one that does not answer, a
// follower answers 503 with Retry-After in the surface's error form, says
// nothing was done, and looks at the lease at once.
func TestProxyNoLeader(t *testing.T) {
	var mu sync.Mutex
	leaderURL, pokes := "", 0
	f := follower(t, func() (string, string, bool) {
		mu.Lock()
		defer mu.Unlock()
		return "a", leaderURL, leaderURL != ""
	}, func() { mu.Lock(); pokes++; mu.Unlock() })
	check := func(path, want string) {
		t.Helper()
		resp, err := http.Post(f.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || resp.Header.Get(arbiter.HeaderNotApplied) != "1" || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %v %s", path, resp.StatusCode, resp.Header, b)
		}
	}
	check("/api/v1/allocations", `"code":"unavailable"`)
	check("/v1/job/claim", `{"error":"no replica leads`) // the fleet's own form
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	mu.Lock()
	leaderURL = dead.URL
	mu.Unlock()
	check("/api/v1/allocations", "does not answer")
	mu.Lock()
	defer mu.Unlock()
	if pokes == 0 {
		t.Fatal("the follower did not look at the lease when the leader did not answer")
	}
}

// TestForwardedOnce: a replica that does not lead does not forward a
// request another replica forwarded (no loops between two followers).
func TestForwardedOnce(t *testing.T) {
	var b2 *httptest.Server
	b1 := follower(t, func() (string, string, bool) { return "b2", b2.URL, true }, nil)
	inner := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "b1", b1.URL, true }, Secret: secret, Self: "b2"})
	b2 = httptest.NewServer(Accept(AcceptOptions{Secret: secret}, inner))
	defer b2.Close()
	defer inner.o.Transport.(*http.Transport).CloseIdleConnections()
	resp, err := http.Get(b1.URL + "/api/v1/machines")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get(arbiter.HeaderNotApplied) != "1" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
}

// TestProxyStreams: a server-sent event stream goes through a follower
// event by event, not when it ends.
func TestProxyStreams(t *testing.T) {
	next := make(chan struct{})
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 1; i <= 2; i++ {
			fmt.Fprintf(w, "id: %d\ndata: {}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer leader.Close()
	f := follower(t, func() (string, string, bool) { return "a", leader.URL, true }, nil)
	resp, err := http.Get(f.URL + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for i := 1; i <= 2; i++ {
		if !sc.Scan() || sc.Text() != fmt.Sprintf("id: %d", i) {
			t.Fatalf("event %d: %q %v", i, sc.Text(), sc.Err())
		}
		sc.Scan()
		sc.Scan()
		if i == 1 {
			next <- struct{}{} // the first arrived while the stream is open
		}
	}
	close(next)
}

// TestAcceptCertificate: a client certificate a follower verified reaches
// the leader's authentication, checked again against the leader's CAs; one
// of another CA is refused; without CAs, none is taken.
func TestAcceptCertificate(t *testing.T) {
	ca := issue(t, nil, "lab CA", true)
	other := issue(t, nil, "other CA", true)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	leader := leaderServer(t, pool)
	send := func(cert *x509.Certificate) (*http.Response, seen) {
		req, _ := http.NewRequest(http.MethodPost, leader.URL+"/v1/job/claim", nil)
		req.Header.Set(HeaderSecret, secret)
		req.Header.Set(HeaderClient, "10.1.2.3:4567")
		req.Header.Set(HeaderTLS, "1")
		req.Header.Set(HeaderCert, base64.StdEncoding.EncodeToString(cert.Raw))
		return do(t, req)
	}
	resp, s := send(issue(t, ca, "gpu7", false).cert)
	if resp.StatusCode != 200 || s.Cert != "gpu7" || s.Remote != "10.1.2.3:4567" || !s.Forwarded {
		t.Fatalf("%d %+v", resp.StatusCode, s)
	}
	if resp, _ := send(issue(t, other, "gpu7", false).cert); resp.StatusCode != 403 {
		t.Fatalf("a certificate of another CA: %d", resp.StatusCode)
	}
	noCAs := leaderServer(t, nil)
	req, _ := http.NewRequest(http.MethodGet, noCAs.URL, nil)
	req.Header.Set(HeaderSecret, secret)
	req.Header.Set(HeaderClient, "10.1.2.3:4567")
	req.Header.Set(HeaderTLS, "1")
	req.Header.Set(HeaderCert, base64.StdEncoding.EncodeToString(issue(t, ca, "gpu7", false).cert.Raw))
	if _, s := do(t, req); s.Cert != "" {
		t.Fatalf("a leader without client CAs took a certificate: %+v", s)
	}
	req.Header.Set(HeaderClient, "somewhere")
	if resp, _ := do(t, req); resp.StatusCode != 400 {
		t.Fatalf("a malformed address: %d", resp.StatusCode)
	}
}

// testCert is a certificate with its key.
type testCert struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// issue makes a certificate for name signed by parent (self-signed when
// nil): a CA's, or a client's.
func issue(t testing.TB, parent *testCert, name string, ca bool) *testCert {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	if ca {
		tpl.IsCA, tpl.BasicConstraintsValid, tpl.KeyUsage = true, true, x509.KeyUsageCertSign
	} else {
		tpl.ExtKeyUsage, tpl.KeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, x509.KeyUsageDigitalSignature
	}
	signer, signKey := tpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCert{c, key}
}

// TestSwitch: on the leader a client's connection goes to its own spalloc
// server; on a follower it is relayed to the leader, where the server sees
// the caller's address; a relay line without the secret is refused.
func TestSwitch(t *testing.T) {
	leaderLn := NewChanListener(&net.TCPAddr{})
	lead := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return leaderLn }, Leader: func() string { return "" }})
	lnA := listen(t)
	go lead.Serve(lnA)
	defer lead.Close()
	// The leader's "spalloc server": answers each line with the caller's address.
	stopServing := serveLines(leaderLn, func(c net.Conn, line string) string {
		return fmt.Sprintf("%s from %s\n", strings.TrimSpace(line), c.RemoteAddr())
	})
	follow := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return nil }, Leader: func() string { return lnA.Addr().String() }})
	lnB := listen(t)
	go follow.Serve(lnB)
	defer follow.Close()

	ask := func(addr, line string) string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, line)
		got, _ := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(got)
	}
	direct := ask(lnA.Addr().String(), "{\"command\": \"version\"}\n")
	relayed := ask(lnB.Addr().String(), "{}\n")
	if !strings.HasPrefix(direct, `{"command": "version"} from 127.0.0.1:`) || !strings.HasPrefix(relayed, "{} from 127.0.0.1:") {
		t.Fatalf("direct %q, relayed %q", direct, relayed)
	}
	// The relayed caller's port is its own, not the follower's upstream one.
	if port := relayed[strings.LastIndex(relayed, ":")+1:]; strings.Contains(direct, ":"+port) {
		t.Fatalf("relayed as %q", relayed)
	}
	if got := ask(lnA.Addr().String(), relayMagic+"wrong 1.2.3.4:5\n{}\n"); got != "" {
		t.Fatalf("a forged relay line was served: %q", got)
	}
	stopServing()
}

// TestSwitchRefusesCallersOutsideAllow: a caller outside [spalloc] allow
// is disconnected at its first byte, or after relayLineWait when it sends
// none; a replica's relay line from such an address is still served.
func TestSwitchRefusesCallersOutsideAllow(t *testing.T) {
	defer func(d time.Duration) { relayLineWait = d }(relayLineWait)
	relayLineWait = 200 * time.Millisecond
	leaderLn := NewChanListener(&net.TCPAddr{})
	lead := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return leaderLn }, Leader: func() string { return "" },
		Allowed: func(netip.Addr) bool { return false }})
	lnA := listen(t)
	go lead.Serve(lnA)
	defer lead.Close()
	go func() {
		for {
			c, err := leaderLn.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	defer leaderLn.Close()
	closedWithin := func(line string, within time.Duration) bool {
		c, err := net.Dial("tcp", lnA.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, line)
		c.SetReadDeadline(time.Now().Add(within))
		_, err = c.Read(make([]byte, 64))
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	if !closedWithin("", 5*time.Second) {
		t.Fatal("a silent caller outside allow is still connected")
	}
	if !closedWithin("{\"command\": \"version\"}\n", 100*time.Millisecond) {
		t.Fatal("a caller outside allow was not disconnected at its first line")
	}
	follow := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return nil }, Leader: func() string { return lnA.Addr().String() }})
	lnB := listen(t)
	go follow.Serve(lnB)
	defer follow.Close()
	c, err := net.Dial("tcp", lnB.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "{}\n")
	if got, err := bufio.NewReader(c).ReadString('\n'); got != "{}\n" {
		t.Fatalf("relayed through a replica: %q, %v", got, err)
	}
}

func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func FuzzParseRelayAnswer(f *testing.F) {
	const nonce = "00112233445566778899aabbccddeeff"
	f.Add([]byte(RelayAnswer(secret, nonce, "1.2.3.4:5")))
	f.Add([]byte(strings.TrimSuffix(RelayAnswer(secret, nonce, "[::1]:5"), "\n") + "\r\n"))
	f.Add([]byte(relayMagic + secret + " 1.2.3.4:5\n")) // an older build's line
	f.Add([]byte(" \n"))
	f.Fuzz(func(t *testing.T, line []byte) {
		ap, err := ParseRelayAnswer(line, secret, nonce)
		if err != nil {
			return
		}
		// Accepted: it was signed (the fuzzer cannot forge the MAC), so it
		// is one of the seeds, and never holds the secret.
		if !ap.IsValid() || strings.Contains(string(line), secret) {
			t.Fatalf("%q accepted as %v", line, ap)
		}
	})
}

// TestRelayHandshakeKeepsTheSecret: what a follower sends a leader does not
// hold the replicas' secret, and an answer seen on the wire answers no
// other nonce; an answer altered to another caller, signed with another
// secret, or an older build's line carrying the secret is refused.
func TestRelayHandshakeKeepsTheSecret(t *testing.T) {
	const nonce = "00112233445566778899aabbccddeeff"
	answer := RelayAnswer(secret, nonce, "10.1.2.3:4567")
	if strings.Contains(answer, secret) {
		t.Fatalf("the relay answer holds the secret: %q", answer)
	}
	if ap, err := ParseRelayAnswer([]byte(answer), secret, nonce); err != nil || ap.String() != "10.1.2.3:4567" {
		t.Fatalf("parse %q: %v %v", answer, ap, err)
	}
	for what, bad := range map[string]string{
		"to another nonce": answer,
		"another caller":   strings.Replace(answer, "10.1.2.3:4567", "10.9.9.9:1", 1),
		"another secret":   RelayAnswer("not-the-replicas-secret", nonce, "10.1.2.3:4567"),
		"an older build's": secret + " 10.1.2.3:4567\n",
	} {
		n := nonce
		if what == "to another nonce" {
			n = "ffeeddccbbaa99887766554433221100"
		}
		if _, err := ParseRelayAnswer([]byte(bad), secret, n); err == nil {
			t.Errorf("%s: %q accepted", what, bad)
		}
	}
}

func FuzzParseForwarded(f *testing.F) {
	ca := issue(f, nil, "ca", true)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	leaf := base64.StdEncoding.EncodeToString(issue(f, ca, "h", false).cert.Raw)
	f.Add("10.0.0.1:80", leaf, "1")
	f.Add("[::1]:1", "", "")
	f.Add("x", "!!", "0")
	f.Fuzz(func(t *testing.T, addr, cert, tls string) {
		h := http.Header{}
		h.Set(HeaderClient, addr)
		h.Set(HeaderCert, cert)
		h.Set(HeaderTLS, tls)
		c, err := ParseForwarded(h, pool)
		if err != nil {
			return
		}
		if c.Addr == "" || (c.Cert != nil && cert == "") {
			t.Fatalf("%q %q gave %+v", addr, cert, c)
		}
	})
}

// TestProxyMultiplexes: with HTTP/2 between the replicas, hundreds of
// long-polls through a follower take a few connections to the leader, not
// one each (the leader's max_conns_per_client counts the follower's).
func TestProxyMultiplexes(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	conns := map[string]bool{}
	started := make(chan struct{}, 300)
	srv := httptest.NewUnstartedServer(Accept(AcceptOptions{Secret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		io.WriteString(w, r.Proto)
	})))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns[c.RemoteAddr().String()] = true
			mu.Unlock()
		}
	}
	ServeReplicas(srv.Config, nil)
	srv.Start()
	defer srv.Close()
	tr := NewTransport(nil, true)
	defer tr.CloseIdleConnections()
	p := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "a", srv.URL, true }, Secret: secret, Transport: tr})
	f := httptest.NewServer(p)
	defer f.Close()
	const n = 300
	protos := make(chan string, n)
	for i := range n {
		if i > 0 {
			<-started // agents' long-polls begin one after another, not all in one instant
		}
		go func() {
			resp, err := http.Get(f.URL + "/api/v1/machines/x/gpus/orders?wait=60")
			if err != nil {
				protos <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			protos <- string(b)
		}()
	}
	<-started // every long-poll is waiting at the leader at once
	close(release)
	for range n {
		if got := <-protos; got != "HTTP/2.0" {
			t.Fatalf("a forwarded request: %q, want HTTP/2.0", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) > 4 {
		t.Fatalf("%d long-polls took %d connections to the leader", n, len(conns))
	}
}

// TestForwardedCertWithIntermediate: a client certificate issued by an
// intermediate CA under the [server] tls_client_ca root, which a follower's
// TLS handshake verified with the intermediate the client sent, is taken by
// the leader too: the follower forwards the intermediates with the leaf.
func TestForwardedCertWithIntermediate(t *testing.T) {
	root := issue(t, nil, "lab root", true)
	inter := issue(t, root, "lab issuing CA", true)
	leaf := issue(t, inter, "gpu7", false)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)

	leader := leaderServer(t, roots)
	p := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "a", leader.URL, true }, Secret: secret, Self: "b"})
	f := httptest.NewUnstartedServer(p)
	f.TLS = &tls.Config{ClientCAs: roots, ClientAuth: tls.VerifyClientCertIfGiven}
	f.StartTLS()
	defer f.Close()
	defer p.o.Transport.(*http.Transport).CloseIdleConnections()

	cl := f.Client()
	cl.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{{
		Certificate: [][]byte{leaf.cert.Raw, inter.cert.Raw}, PrivateKey: leaf.key, Leaf: leaf.cert}}
	defer cl.CloseIdleConnections()
	resp, err := cl.Post(f.URL+"/v1/job/claim", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var s seen
	_ = json.Unmarshal(b, &s)
	if resp.StatusCode != 200 || s.Cert != "gpu7" {
		t.Fatalf("a certificate the follower's handshake verified (leaf + intermediate under the root) reached the leader as %d %s", resp.StatusCode, b)
	}
}

// TestProxyLeaderVanishes: the leader's host vanishes (a partition: no
// reset, no close; here a proxy that holds every byte). The follower's
// HTTP/2 connection to it is pinged, and a request forwarded on it is
// answered 503 within seconds rather than hanging until TCP gives up.
func TestProxyLeaderVanishes(t *testing.T) {
	leader := httptest.NewUnstartedServer(Accept(AcceptOptions{Secret: secret}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	})))
	ServeReplicas(leader.Config, nil) // replicas speak h2c to each other, as in a deployment
	leader.Start()
	defer leader.Close()
	px := tcpproxy.Start(t, strings.TrimPrefix(leader.URL, "http://"))
	p := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "a", "http://" + px.Addr, true }, Secret: secret, Self: "b",
		Transport: NewTransport(nil, true)})
	f := httptest.NewServer(p)
	defer f.Close()
	defer p.o.Transport.(*http.Transport).CloseIdleConnections()

	// One request opens the follower's HTTP/2 connection to the leader.
	resp, err := http.Get(f.URL + "/api/v1/machines")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "HTTP/2.0" {
		t.Fatalf("status %d %q", resp.StatusCode, b)
	}

	px.Pause() // the leader's host is gone: nothing comes back, nothing resets
	defer f.CloseClientConnections()

	const limit = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.URL+"/api/v1/allocations", strings.NewReader("{}"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("a request forwarded to a vanished leader was not answered within %s (%v): the follower waits on a dead HTTP/2 connection", limit, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("status %d after %s", resp.StatusCode, time.Since(start))
	}
}

// TestSwitchRelayToVanishedLeader: a spalloc connection relayed by a
// follower to a leader whose host then vanishes (nothing comes back,
// nothing resets) is closed once the follower sees that replica no longer
// leads, so the client reconnects (the HA guide's promise), rather than
// waiting minutes for TCP to give up.
func TestSwitchRelayToVanishedLeader(t *testing.T) {
	leaderLn := NewChanListener(&net.TCPAddr{})
	lead := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return leaderLn }, Leader: func() string { return "" }})
	lnA := listen(t)
	go lead.Serve(lnA)
	defer lead.Close()
	defer serveLines(leaderLn, func(_ net.Conn, line string) string { return line })() // echoes
	px := tcpproxy.Start(t, lnA.Addr().String())
	var leaderAddr atomic.Value
	leaderAddr.Store(px.Addr)
	follow := NewSwitch(SwitchOptions{Secret: secret, Leading: func() *ChanListener { return nil }, Leader: func() string { return leaderAddr.Load().(string) }})
	lnB := listen(t)
	go follow.Serve(lnB)
	defer follow.Close()

	c, err := net.Dial("tcp", lnB.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "{\"command\": \"version\"}\n")
	if got, err := br.ReadString('\n'); err != nil || !strings.Contains(got, "version") {
		t.Fatalf("relayed: %q %v", got, err)
	}

	px.Pause()           // the leader's host is gone
	leaderAddr.Store("") // and the follower knows no leader leads any more
	const limit = 20 * time.Second
	c.SetDeadline(time.Now().Add(limit))
	io.WriteString(c, "{\"command\": \"list_jobs\"}\n")
	got, err := br.ReadString('\n')
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a spalloc connection relayed to a vanished leader was neither answered nor closed within %s", limit)
	}
	t.Logf("ended with %q %v", got, err)
}

// serveLines is a spalloc server for the switch tests: it answers each
// line of every connection ln takes with reply's, until ln closes. The
// func returned closes ln and waits for the server to stop.
func serveLines(ln *ChanListener, reply func(c net.Conn, line string) string) func() {
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, reply(c, line))
				}
			}()
		}
	}()
	return func() { ln.Close(); <-served }
}

// A leader a probe found not to answer (paused, its host gone) is not sent
// requests: they are refused as not applied, for clients to wait, rather
// than left to hang on it; once it answers again they go through.
func TestProxyLeaderFoundDown(t *testing.T) {
	leader := leaderServer(t, nil)
	var down atomic.Bool
	down.Store(true)
	p := NewProxy(ProxyOptions{Leader: func() (string, string, bool) { return "a", leader.URL, true }, Secret: secret, Self: "b",
		Unreachable: func() {}, Down: func(u string) bool { return down.Load() && u == leader.URL }})
	f := httptest.NewServer(p)
	defer f.Close()
	defer p.o.Transport.(*http.Transport).CloseIdleConnections()
	post := func() *http.Response {
		resp, err := http.Post(f.URL+"/api/v1/allocations", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := post(); resp.StatusCode != 503 || resp.Header.Get(arbiter.HeaderNotApplied) != "1" {
		t.Fatalf("to a leader found down: %d %v", resp.StatusCode, resp.Header)
	}
	down.Store(false)
	if resp := post(); resp.StatusCode != 200 {
		t.Fatalf("to the leader answering again: %d", resp.StatusCode)
	}
}

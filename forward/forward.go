// Package forward carries what reaches a follower replica to the leader
// (docs/guides/high-availability.md): every HTTP request through a reverse
// proxy (Proxy), the spalloc port's connections through a TCP relay
// (Switch); and it is the leader's side of that trust (Accept).
//
// A follower terminates the caller's connection, TLS and client
// certificate included, so the leader would see the follower, not the
// caller. The follower therefore sends, beside the request, the caller's
// address and its verified client certificate, with the secret the
// replicas share ([ha] secret_file); the leader believes them only with
// that secret, and strips them otherwise, so nobody else can claim an
// address or a certificate. A request forwarded once is never forwarded
// again: a replica that is not leading answers it 503, so the client
// tries again and finds the leader.
package forward

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpapi"
)

// The headers between replicas.
const (
	// HeaderSecret carries the replicas' shared secret.
	HeaderSecret = "X-Arbiter-Replica-Secret"
	// HeaderClient is the caller's address (host:port) as the follower
	// saw it; HeaderCert its verified TLS client certificate and the
	// intermediates it was verified with (base64 DER, leaf first, comma
	// separated).
	HeaderClient = "X-Arbiter-Client-Addr"
	HeaderCert   = "X-Arbiter-Client-Cert"
	// HeaderTLS says the caller reached the follower over TLS (the leader
	// then sets its cookies Secure, as for a caller of its own).
	HeaderTLS = "X-Arbiter-Client-TLS"
	// HeaderBy names the follower that forwarded a request (logs).
	HeaderBy = "X-Arbiter-Forwarded-By"
	// HeaderLeader on a follower's 503 is the leader's URL, when known.
	HeaderLeader = "X-Arbiter-Leader"
)

// maxCertHeader bounds HeaderCert: a certificate is a few KiB.
const maxCertHeader = 16 << 10

// ProxyOptions configure a Proxy. Leader and Secret are required.
type ProxyOptions struct {
	// Leader returns the leader's id and URL as the replica knows them,
	// false while there is none.
	Leader func() (id, url string, ok bool)
	// Secret is the replicas' shared secret; Self this replica's node id.
	Secret, Self string
	// Unreachable is called when the leader does not answer (the replica
	// looks at the lease at once).
	Unreachable func()
	// Down, when set, reports whether the leader at a URL was found not to
	// answer (a probe of its health): requests are then refused as not
	// applied, for clients to wait, rather than sent to hang on a leader
	// that still holds the lease but is paused or gone, and fail as
	// "may or may not have been carried out".
	Down func(leaderURL string) bool
	// RetryAfter is what a 503 tells the client to wait (default 1s).
	RetryAfter time.Duration
	// Transport carries the forwarded requests (default: a transport
	// trusting the system's roots; TLSClientConfig for the leader's
	// certificate).
	Transport http.RoundTripper
	Logger    *slog.Logger
}

// Proxy is a follower's HTTP handler: every request goes to the leader.
type Proxy struct {
	o  ProxyOptions
	rp *httputil.ReverseProxy
}

// NewProxy returns a follower's proxy.
func NewProxy(o ProxyOptions) *Proxy {
	if o.RetryAfter <= 0 {
		o.RetryAfter = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Unreachable == nil {
		o.Unreachable = func() {}
	}
	if o.Transport == nil {
		o.Transport = NewTransport(nil, false)
	}
	p := &Proxy{o: o}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     o.Transport,
		FlushInterval: -1, // event streams and long-polls: every write at once
		ErrorHandler:  p.failed,
		ErrorLog:      slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
	}
	return p
}

// NewTransport is the transport from followers to the leader. With
// multiplex it speaks HTTP/2 — over TLS when tc is set, else in the clear
// (h2c: the leader must serve it, ServeReplicas) — so the long-polls and
// event streams of every agent and watcher behind a follower share a few
// connections instead of taking one each, and stay under the leader's
// [server] max_conns_per_client for the follower's address.
func NewTransport(tc *tls.Config, multiplex bool) *http.Transport {
	t := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		ForceAttemptHTTP2:     tc != nil,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	if multiplex {
		// A leader whose host vanished (power lost, cut off: no reset,
		// no close) leaves the shared connection looking alive, and
		// every request forwarded on it unanswered: a ping unanswered in
		// a few seconds ends it, its requests answered 503.
		t.HTTP2 = &http.HTTP2Config{SendPingTimeout: leaderPingEvery, PingTimeout: leaderPingEvery}
		t.Protocols = new(http.Protocols)
		if tc != nil {
			t.Protocols.SetHTTP2(true)
		} else {
			t.Protocols.SetUnencryptedHTTP2(true)
		}
	}
	return t
}

// leaderPingEvery is how long a follower's connection to the leader may
// stay silent before it is pinged, and how long the ping may take.
const leaderPingEvery = 2 * time.Second

// ServeReplicas lets srv speak HTTP/2 to followers (NewTransport's
// multiplex): in the clear with prior knowledge, or over TLS when tc (the
// listener's) offers it. HTTP/1.1 stays on for every other client.
func ServeReplicas(srv *http.Server, tc *tls.Config) {
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if tc != nil && !slices.Contains(tc.NextProtos, "h2") {
		tc.NextProtos = append([]string{"h2"}, append(tc.NextProtos, "http/1.1")...)
	}
}

// leaderKey is where ServeHTTP leaves the leader's URL for rewrite.
type leaderKey struct{}

// ServeHTTP forwards r to the leader, or answers 503 with Retry-After
// while there is none. A request a follower already forwarded is not
// forwarded again.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if Forwarded(r) {
		p.notApplied(w, r, "", "this replica does not lead (any more): nothing was done; retry, the client finds the leader")
		return
	}
	id, base, ok := p.o.Leader()
	switch {
	case !ok:
		p.notApplied(w, r, "", "no replica leads right now (a failover is under way): nothing was done; retry in a few seconds")
		return
	case id == p.o.Self:
		// Taking over (the state is loading) or handing over. Not to itself.
		p.notApplied(w, r, "", "this replica is taking over (loading the state) or handing over: nothing was done; retry in a moment")
		return
	}
	if p.o.Down != nil && p.o.Down(base) {
		p.o.Unreachable()
		p.notApplied(w, r, base, fmt.Sprintf("the leader at %s does not answer (paused, or its host gone; a failover may be under way): nothing was done; retry in a few seconds", base))
		return
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		p.notApplied(w, r, "", fmt.Sprintf("the leader %s advertises %q, which is not a URL: nothing was done; fix its [ha] advertise_url",
			arbiter.EscapeText(id, false), arbiter.Clip(base, 200)))
		return
	}
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), leaderKey{}, u)))
}

// rewrite points the request at the leader, with what the leader needs to
// believe about the caller.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	u := pr.In.Context().Value(leaderKey{}).(*url.URL)
	pr.SetURL(u)
	pr.Out.Host = pr.In.Host // the leader's links and cookies stay the ones the caller used
	pr.SetXForwarded()
	h := pr.Out.Header
	for _, k := range []string{HeaderSecret, HeaderClient, HeaderCert, HeaderTLS, HeaderBy} {
		h.Del(k)
	}
	h.Set(HeaderSecret, p.o.Secret)
	h.Set(HeaderClient, pr.In.RemoteAddr)
	h.Set(HeaderBy, p.o.Self)
	if c := pr.In.TLS; c != nil {
		h.Set(HeaderTLS, "1")
		if len(c.VerifiedChains) > 0 && len(c.VerifiedChains[0]) > 0 {
			// The leaf and the intermediates the follower verified it
			// with (not the root: the leader has its own).
			chain := c.VerifiedChains[0]
			if len(chain) > 1 {
				chain = chain[:len(chain)-1]
			}
			enc := make([]string, len(chain))
			for i, cert := range chain {
				enc[i] = base64.StdEncoding.EncodeToString(cert.Raw)
			}
			h.Set(HeaderCert, strings.Join(enc, ","))
		}
	}
}

// failed answers a request the leader did not answer.
func (p *Proxy) failed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the caller went away
	}
	p.o.Unreachable()
	u, _ := r.Context().Value(leaderKey{}).(*url.URL)
	leader := ""
	if u != nil {
		leader = u.String()
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		p.notApplied(w, r, leader, fmt.Sprintf("the leader at %s does not answer (%v); a failover may be under way: nothing was done, retry in a few seconds",
			leader, oe.Err))
		return
	}
	p.o.Logger.Warn("forwarding to the leader failed", "leader", leader, "method", r.Method, "path", r.URL.Path, "err", err)
	p.unavailable(w, r, leader, fmt.Sprintf("the leader at %s stopped answering before it was done; a failover may be under way: "+
		"the request may or may not have been carried out, look before you retry", leader))
}

func (p *Proxy) unavailable(w http.ResponseWriter, r *http.Request, leader, msg string) {
	p.answer503(w, r, leader, arbiter.Errorf(arbiter.EUnavailable, "%s", msg))
}

// notApplied answers 503 for a request that reached no leader: marked
// not applied (arbiter.ErrNotApplied, whose header httpapi writes), so a
// client sends it again, here or elsewhere, whatever its method.
func (p *Proxy) notApplied(w http.ResponseWriter, r *http.Request, leader, msg string) {
	p.answer503(w, r, leader, arbiter.NotApplied(arbiter.Errorf(arbiter.EUnavailable, "%s", msg)))
}

func (p *Proxy) answer503(w http.ResponseWriter, r *http.Request, leader string, err error) {
	if leader != "" {
		w.Header().Set(HeaderLeader, leader)
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(p.o.RetryAfter.Seconds()))))
	httpapi.WriteError(w, r, err)
}

// forwardedKey marks a request that came from a follower (Accept).
type forwardedKey struct{}

// Forwarded reports whether r was forwarded by a follower (Accept saw the
// replicas' secret on it).
func Forwarded(r *http.Request) bool {
	v, _ := r.Context().Value(forwardedKey{}).(bool)
	return v
}

// AcceptOptions configure Accept.
type AcceptOptions struct {
	Secret string
	// ClientCAs, when set, checks a forwarded client certificate again
	// (it must chain to them, for client authentication); without it a
	// forwarded certificate is dropped, as the leader would take none.
	ClientCAs *x509.CertPool
	Logger    *slog.Logger
}

// Accept is the leader's side of forwarding: on a request with the
// replicas' secret it takes the caller's address and client certificate
// from the follower's headers, and marks the request Forwarded; from
// anyone else those headers are removed before next sees the request.
func Accept(o AcceptOptions, next http.Handler) http.Handler {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	want := []byte(o.Secret)
	var lastWarn atomic.Int64 // unix ns: a replica with another secret warns once in a while, not per request
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(HeaderSecret)
		if got == "" {
			strip(r.Header)
			next.ServeHTTP(w, r)
			return
		}
		if len(want) == 0 || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			if now := time.Now().UnixNano(); now-lastWarn.Load() >= int64(10*time.Second) {
				lastWarn.Store(now)
				o.Logger.Warn("a request claimed to come from a replica without the replicas' secret; its claims are ignored: is the replica's [ha] secret the same as this one's?",
					"remote", r.RemoteAddr, "replica", arbiter.Clip(arbiter.EscapeText(r.Header.Get(HeaderBy), false), 100))
			}
			strip(r.Header)
			next.ServeHTTP(w, r)
			return
		}
		f, err := ParseForwarded(r.Header, o.ClientCAs)
		strip(r.Header)
		if err != nil {
			httpapi.WriteError(w, r, err)
			return
		}
		r2 := r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true))
		r2.RemoteAddr = f.Addr
		r2.TLS = nil
		if f.TLS {
			r2.TLS = &tls.ConnectionState{HandshakeComplete: true}
			if f.Cert != nil {
				r2.TLS.PeerCertificates, r2.TLS.VerifiedChains = []*x509.Certificate{f.Cert}, [][]*x509.Certificate{f.Chain}
			}
		}
		next.ServeHTTP(w, r2)
	})
}

func strip(h http.Header) {
	for _, k := range []string{HeaderSecret, HeaderClient, HeaderCert, HeaderTLS, HeaderBy} {
		h.Del(k)
	}
}

// Claims are what a follower says of the caller it forwards.
type Claims struct {
	Addr string            // host:port
	TLS  bool              // the caller reached the follower over TLS
	Cert *x509.Certificate // verified by the follower (and again by cas); nil for none
	// Chain is Cert's chain as verified here, Cert first, the root last.
	Chain []*x509.Certificate
}

// ParseForwarded reads a follower's claims from h: the caller's address
// (an IP and port) and, when cas is set, its client certificate, which
// must chain to cas for client authentication (without cas it is
// dropped). Errors: invalid.
func ParseForwarded(h http.Header, cas *x509.CertPool) (Claims, error) {
	var c Claims
	ap, err := netip.ParseAddrPort(h.Get(HeaderClient))
	if err != nil {
		return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded the caller's address %q, which is not ip:port",
			arbiter.Clip(h.Get(HeaderClient), 80))
	}
	c.Addr = ap.String()
	c.TLS = h.Get(HeaderTLS) == "1"
	v := h.Get(HeaderCert)
	if v == "" || cas == nil {
		return c, nil
	}
	if !c.TLS {
		return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded a client certificate of a caller without TLS")
	}
	if len(v) > maxCertHeader {
		return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded a client certificate of %d bytes; at most %d", len(v), maxCertHeader)
	}
	parts := strings.Split(v, ",")
	if len(parts) > maxCertChain {
		return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded a client certificate chain of %d certificates; at most %d", len(parts), maxCertChain)
	}
	certs := make([]*x509.Certificate, len(parts))
	for i, p := range parts {
		der, err := base64.StdEncoding.DecodeString(p)
		if err != nil {
			return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded a client certificate that is not base64")
		}
		if certs[i], err = x509.ParseCertificate(der); err != nil {
			return c, arbiter.Errorf(arbiter.EInvalid, "a replica forwarded a client certificate that does not parse")
		}
	}
	inter := x509.NewCertPool()
	for _, cert := range certs[1:] {
		inter.AddCert(cert)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: cas, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return c, arbiter.Errorf(arbiter.EForbidden, "a replica forwarded a client certificate this server does not accept: %v", err)
	}
	c.Cert, c.Chain = certs[0], chains[0]
	return c, nil
}

// maxCertChain bounds the certificates of HeaderCert: a leaf and its
// intermediates.
const maxCertChain = 8

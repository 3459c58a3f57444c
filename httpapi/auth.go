package httpapi

// Who a request comes from, and whether it may do what it asks
// (docs/guides/security.md). Every route states its access in the route
// table (roles); wrap asks authorize before the handler runs:
//
//   - the native routes take a bearer token (Authorization: Bearer), or the
//     dashboard's session cookie, of one of the route's roles;
//   - the fleet's /v1 worker routes take a TLS client certificate whose
//     name is the worker's X-Lab-Host, or a bearer token of role agent (or
//     admin), or nothing when [tasks] open_worker_api is set;
//   - the fleet's operator routes take X-Operator-Token or an admin bearer
//     token; loopback alone suffices only on a server with no tokens at all;
//   - a server with no tokens at all (loopback only, unless the operator
//     insisted) takes everyone as its anonymous admin.
//
// Tokens are kept as SHA-256 digests (a token may be configured by its
// digest alone) and can be replaced while the server runs (SetTokens): a
// removed or changed token, and every dashboard session signed in with
// it, stops working at once: new requests are refused, and the streams and
// long-polls under way end (untilRefused).

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// Token is one configured bearer token: who holds it (Name, recorded as the
// Caller of their commands), what they may do (Role: arbiter.RoleAdmin,
// RoleUser or RoleAgent) and the secret they present — or, for a token
// configured by its digest (token_sha256), only the secret's SHA-256.
type Token struct {
	Name, Role, Secret string
	// SHA256 is the secret's SHA-256, used when Secret is "".
	SHA256 [sha256.Size]byte
}

// sum is the token's secret's SHA-256; the zero array for none.
func (t *Token) sum() [sha256.Size]byte {
	if t.Secret != "" {
		return sha256.Sum256([]byte(t.Secret))
	}
	return t.SHA256
}

// token is a configured token with its secret kept only as a digest, so
// that comparisons take the same time whatever the presented length.
type token struct {
	caller arbiter.Caller
	sum    [sha256.Size]byte
	fp     string // fingerprint for sessions: hex SHA-256 of sum
}

// tokenSet is the tokens in force; replaced whole by SetTokens.
type tokenSet struct {
	list   []token
	byName map[string]*token
}

func newTokenSet(ts []Token) *tokenSet {
	set := &tokenSet{byName: map[string]*token{}}
	for i := range ts {
		sum := ts[i].sum()
		if sum == ([sha256.Size]byte{}) {
			continue // an empty secret would match an empty bearer token
		}
		fp := sha256.Sum256(sum[:])
		set.list = append(set.list, token{caller: arbiter.Caller{Name: ts[i].Name, Role: ts[i].Role}, sum: sum, fp: hex.EncodeToString(fp[:])})
	}
	for i := range set.list {
		set.byName[set.list[i].caller.Name] = &set.list[i]
	}
	return set
}

// lookup returns the token whose secret is secret, comparing with every
// token so that the time taken does not tell which one matched.
func (set *tokenSet) lookup(secret string) *token {
	if secret == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(secret))
	found := -1
	for i := range set.list {
		if subtle.ConstantTimeCompare(sum[:], set.list[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return nil
	}
	return &set.list[found]
}

// tokenHolder holds the tokens in force, and a context cancelled when they
// are replaced (changed): what requests under way watch (untilRefused).
type tokenHolder struct {
	p       atomic.Pointer[tokenSet]
	changed atomic.Pointer[tokenEpoch]
}

// tokenEpoch lasts while one set of tokens is in force.
type tokenEpoch struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (h *tokenHolder) get() *tokenSet { return h.p.Load() }

func (h *tokenHolder) set(s *tokenSet) {
	h.p.Store(s)
	h.recheck()
}

// recheck has the requests under way check their credentials again: the
// tokens changed, or a session ended (log out).
func (h *tokenHolder) recheck() {
	ctx, cancel := context.WithCancel(context.Background())
	if old := h.changed.Swap(&tokenEpoch{ctx, cancel}); old != nil {
		old.cancel()
	}
}

// Why untilRefused ends a request.
var (
	errWithdrawn    = arbiter.Errorf(arbiter.EUnauthorized, "the credentials of this request were withdrawn while it waited (a reload changed its token, or its session logged out): use a current token, or sign in again")
	errSessionEnded = arbiter.Errorf(arbiter.EUnauthorized, "the dashboard session of this request expired while it waited: sign in again")
)

// untilRefused returns r with a context that is also cancelled once r's
// credentials (bearer token or session cookie) no longer make them c —
// their token removed or changed, their session logged out or expired: a
// stream or a long-poll under way ends then, as new requests are refused.
// Call stop when the request is done.
func (s *Server) untilRefused(r *http.Request, c arbiter.Caller) (_ *http.Request, stop func()) {
	// The causes say why it ended to a handler that answers once its wait
	// is over (httpio.ContextError): refused, not the wait's end.
	// Only the credentials: the handler may change r's headers meanwhile.
	probe := &http.Request{Header: http.Header{}}
	for _, k := range []string{"Authorization", "Cookie"} {
		if v := r.Header.Values(k); len(v) > 0 {
			probe.Header[k] = slices.Clone(v)
		}
	}
	ctx, cancelCause := context.WithCancelCause(r.Context())
	cancel := func() { cancelCause(errWithdrawn) }
	if r.Header.Get("Authorization") == "" {
		if sess, ok := s.session(r); ok { // it ends when the session does
			var cancelAt context.CancelFunc
			ctx, cancelAt = context.WithDeadlineCause(ctx, sess.ExpiresAt, errSessionEnded)
			cancelAll := cancel
			cancel = func() { cancelAt(); cancelAll() }
		}
	}
	var mu sync.Mutex
	unwatch := func() bool { return false }
	var watch func()
	watch = func() {
		e := s.tokens.changed.Load()
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		unwatch = context.AfterFunc(e.ctx, func() {
			if now, _, ok := s.authenticate(probe); ok && now == c {
				watch() // still them: until the next change
				return
			}
			cancel()
		})
	}
	watch()
	return r.WithContext(ctx), func() {
		cancel()
		mu.Lock()
		unwatch()
		mu.Unlock()
	}
}

// SetTokens replaces the accepted tokens while the server runs (a reload):
// a token no longer listed, or listed with another secret, is refused from
// the next request on, and so is every dashboard session signed in with it
// (TokenFingerprints gives what to keep of the stored sessions). Errors:
// CheckTokens's; then the tokens in force stay.
func (s *Server) SetTokens(ts []Token) error {
	if err := s.CheckTokens(ts); err != nil {
		return err
	}
	s.tokens.set(newTokenSet(ts))
	return nil
}

// CheckTokens says whether SetTokens would take ts. Errors: invalid when
// ts would add the first token to a server started without any, or remove
// the last one: that changes who may do what everywhere, and takes a
// restart.
func (s *Server) CheckTokens(ts []Token) error {
	if s.open != (len(newTokenSet(ts).list) == 0) {
		if s.open {
			return arbiter.Errorf(arbiter.EInvalid, "this server was started without tokens (open to loopback callers); adding the first token takes a restart")
		}
		return arbiter.Errorf(arbiter.EInvalid, "removing every token would open this server to everyone; keep at least one, or restart without tokens")
	}
	return nil
}

// TokenFingerprints returns, for each of ts that a server accepts, its
// name and the fingerprint sessions remember it by: what
// arbiter.EndSessions keeps once ts are in force.
func TokenFingerprints(ts []Token) map[string]string {
	out := map[string]string{}
	for _, t := range newTokenSet(ts).list {
		out[t.caller.Name] = t.fp
	}
	return out
}

// How a caller was taken for who it is: reported by whoami and audited.
const (
	viaOpen       = "open"        // a server without tokens: the anonymous admin
	viaBearer     = "bearer"      // Authorization: Bearer
	viaCookie     = "cookie"      // the dashboard's session
	viaNone       = "none"        // no credential at all (refused)
	viaCert       = "certificate" // a TLS client certificate (/v1 workers)
	viaOperator   = "operator token"
	viaOpenWorker = "open worker API" // [tasks] open_worker_api
	viaLoopback   = "loopback"        // an operator call from this host, on a server without tokens
)

// authenticate returns who presents r's bearer token or, on a request with
// no Authorization header, the dashboard's session cookie, and how.
func (s *Server) authenticate(r *http.Request) (arbiter.Caller, string, bool) {
	if s.open {
		return arbiter.Caller{Role: arbiter.RoleAdmin}, viaOpen, true
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		if _, err := r.Cookie(ui.CookieName); err != nil {
			return arbiter.Caller{}, viaNone, false
		}
		c, ok := s.sessionCaller(r)
		return c, viaCookie, ok
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return arbiter.Caller{}, viaBearer, false
	}
	t := s.tokens.get().lookup(strings.TrimSpace(secret))
	if t == nil {
		return arbiter.Caller{}, viaBearer, false
	}
	return t.caller, viaBearer, true
}

// authenticated is authenticate for the dashboard: who, or false.
func (s *Server) authenticated(r *http.Request) (arbiter.Caller, bool) {
	c, _, ok := s.authenticate(r)
	return c, ok
}

// authorize decides whether r may use a route of the given access, and as
// whom. It returns the caller and how it was identified, or the error to
// answer (unauthorized, forbidden, or invalid for a /v1 worker call
// without a usable X-Lab-Host).
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, route string, access roles) (arbiter.Caller, string, error) {
	switch {
	case access&publicRoute != 0:
		return arbiter.Caller{}, "", nil
	case access&fleetWorkerAuth != 0:
		return s.authorizeWorker(w, r)
	case access&fleetOperatorAuth != 0:
		return s.authorizeOperator(w, r)
	case access&fleetReadAuth != 0:
		if r.Header.Get("Authorization") != "" {
			if c, via, ok := s.authenticate(r); ok {
				return c, via, nil // any role may read the queue, as GET /api/v1/tasks
			}
		}
		if c, via, ok := s.operatorToken(r); ok {
			return c, via, nil
		}
		return s.authorizeWorker(w, r)
	}
	c, via, ok := s.authenticate(r)
	switch {
	case !ok:
		w.Header().Set("WWW-Authenticate", `Bearer realm="arbiter"`)
		msg := unknownTokenMessage
		if scheme, _, ok := strings.Cut(r.Header.Get("Authorization"), " "); r.Header.Get("Authorization") != "" && (!ok || !strings.EqualFold(scheme, "Bearer")) {
			msg = badSchemeMessage
		}
		if r.Header.Get("Authorization") == "" {
			msg = endedSessionMessage
			if _, err := r.Cookie(ui.CookieName); err != nil {
				msg = noTokenMessage
			}
		}
		return c, via, arbiter.Errorf(arbiter.EUnauthorized, "%s", msg)
	case access&roleBit(c.Role) == 0:
		return c, via, arbiter.Errorf(arbiter.EForbidden, "%s needs the %s role; token %q has role %q", route, access, c.Name, c.Role)
	}
	return c, via, nil
}

// authorizeWorker authenticates a /v1 worker call: on a server without
// tokens, anyone; else a TLS client certificate naming the X-Lab-Host, an
// agent or admin bearer token, or anyone when the open worker API is on.
// Certificate and token callers are trusted with their host (the role
// agent); open worker API callers are not (no role).
func (s *Server) authorizeWorker(w http.ResponseWriter, r *http.Request) (arbiter.Caller, string, error) {
	if s.open {
		return arbiter.Caller{Role: arbiter.RoleAdmin}, viaOpen, nil
	}
	if names := clientCertNames(r); names != nil {
		host := strings.TrimSpace(r.Header.Get("X-Lab-Host"))
		if err := arbiter.ValidateName("X-Lab-Host", host); err != nil {
			return arbiter.Caller{}, viaCert, arbiter.Errorf(arbiter.EInvalid, "X-Lab-Host required: %s", arbiter.ErrorMessage(err))
		}
		// Exactly: machine and worker names are case-sensitive, so "GPUBOX"
		// under a certificate for gpubox would be a second machine with the
		// same GPUs.
		if slices.Contains(names, host) {
			return arbiter.Caller{Name: host, Role: arbiter.RoleAgent}, viaCert, nil
		}
		return arbiter.Caller{}, viaCert, arbiter.Errorf(arbiter.EForbidden, "the client certificate is for %s, not for X-Lab-Host %s (names are case-sensitive): a worker acts only as the host its certificate names",
			arbiter.Clip(strings.Join(names, ", "), 200), host)
	}
	if r.Header.Get("Authorization") != "" {
		c, via, ok := s.authenticate(r)
		switch {
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer realm="arbiter"`)
			return c, via, arbiter.Errorf(arbiter.EUnauthorized, "unknown bearer token: a /v1 worker needs an agent token")
		case c.Role != arbiter.RoleAgent && c.Role != arbiter.RoleAdmin:
			return c, via, arbiter.Errorf(arbiter.EForbidden, "the /v1 worker API needs the agent role; token %q has role %q", c.Name, c.Role)
		}
		return c, via, nil
	}
	if s.tasks != nil && s.tasks.OpenWorkerAPI {
		return arbiter.Caller{}, viaOpenWorker, nil
	}
	return s.workerUnauthorized(w)
}

func (s *Server) workerUnauthorized(w http.ResponseWriter) (arbiter.Caller, string, error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="arbiter"`)
	return arbiter.Caller{}, "", arbiter.Errorf(arbiter.EUnauthorized, "this server's /v1 worker API needs credentials: "+
		"a TLS client certificate whose name is the worker's X-Lab-Host, or Authorization: Bearer with an agent token "+
		"(or the operator sets [tasks] open_worker_api = true)")
}

// clientCertNames returns the names of r's verified TLS client certificate
// (its common name, then its DNS names), nil without one.
func clientCertNames(r *http.Request) []string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	return certNames(r.TLS.VerifiedChains[0][0])
}

func certNames(c *x509.Certificate) []string {
	names := []string{}
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	return append(names, c.DNSNames...)
}

// authorizeOperator authenticates a /v1 operator call: X-Operator-Token
// equal to the configured operator token, or an admin bearer token; on a
// server without any token at all (and no operator token), a caller on
// this host. Whenever a token is configured, loopback alone is not enough:
// behind a local proxy, everyone is on loopback.
func (s *Server) authorizeOperator(w http.ResponseWriter, r *http.Request) (arbiter.Caller, string, error) {
	if c, via, ok := s.operatorToken(r); ok {
		return c, via, nil
	}
	op := s.operatorSecret()
	if s.open && op == "" && isLoopback(r.RemoteAddr) {
		return arbiter.Caller{Role: arbiter.RoleAdmin}, viaLoopback, nil
	}
	if !s.open && r.Header.Get("Authorization") != "" {
		c, via, ok := s.authenticate(r)
		if ok && c.Role == arbiter.RoleAdmin {
			return c, via, nil
		}
		if ok {
			return c, via, arbiter.Errorf(arbiter.EForbidden, "operator calls need the operator token or an admin token; token %q has role %q", c.Name, c.Role)
		}
	}
	msg := "operator token required: send X-Operator-Token (the server's $ARBITER_OPERATOR_TOKEN) or an admin bearer token"
	switch {
	case s.open && op == "":
		msg = "operator token required: no operator token is configured, so operator calls are accepted from this host (loopback) only"
	case !s.open && op == "":
		msg = "operator token required: no operator token is configured on this server, so operator calls need an admin bearer token"
	}
	return arbiter.Caller{}, "", arbiter.Errorf(arbiter.EUnauthorized, "%s", msg)
}

// operatorToken reports whether r carries the configured operator token.
func (s *Server) operatorToken(r *http.Request) (arbiter.Caller, string, bool) {
	op := s.operatorSecret()
	got := r.Header.Get("X-Operator-Token")
	if op == "" || got == "" {
		return arbiter.Caller{}, "", false
	}
	want := sha256.Sum256([]byte(op))
	have := sha256.Sum256([]byte(got))
	if subtle.ConstantTimeCompare(want[:], have[:]) != 1 {
		return arbiter.Caller{}, "", false
	}
	return arbiter.Caller{Name: "operator", Role: arbiter.RoleAdmin}, viaOperator, true
}

func (s *Server) operatorSecret() string {
	if s.tasks == nil {
		return ""
	}
	return s.tasks.OperatorToken
}

// isLoopback reports whether a remote address (host:port) is this host's.
// checkHost refuses, on a server without tokens, a request addressed to a
// name that is not loopback's: a page of another site whose name was
// rebound to 127.0.0.1 (DNS rebinding) is "same-origin" to the browser,
// and would act as this server's anonymous admin. Errors: forbidden.
func (s *Server) checkHost(r *http.Request) error {
	if !s.open || s.anyHost || r.Host == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host // no port
	}
	if arbiter.LoopbackHost(host) {
		return nil
	}
	return arbiter.Errorf(arbiter.EForbidden, "this server runs without tokens and answers only requests addressed to localhost or a loopback address, not to %q: "+
		"a page of another site may be behind this one (DNS rebinding); use http://127.0.0.1:PORT, or configure [[tokens]]", arbiter.Clip(r.Host, 80))
}

func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	return arbiter.LoopbackHost(host)
}

// remoteIP is the address part of a remote address, for the audit trail.
func remoteIP(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

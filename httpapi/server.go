// Package httpapi is arbiter's native HTTP interface: the server that turns
// JSON requests under /api/v1 into commands and reads of a running control
// plane (the Plane interface), streams events as server-sent events, serves
// its OpenAPI description and Prometheus metrics; and the Go client that
// speaks the same API.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Token is one configured bearer token: who holds it (Name, recorded as the
// Caller of their commands), what they may do (Role: arbiter.RoleAdmin,
// RoleUser or RoleAgent) and the secret they present.
type Token struct {
	Name, Role, Secret string
}

// Options configure a Server. Plane is required; the rest have defaults.
type Options struct {
	Plane Plane
	// Tokens are the accepted bearer tokens. With none, every caller is an
	// anonymous admin: the binary allows that only on loopback.
	Tokens []Token
	// MaxBodyBytes bounds a request body (default 1 MiB); larger → 413.
	MaxBodyBytes int64
	// DefaultKeepaliveS is the keepalive of an allocation whose request does
	// not mention keepalive_s (default 60).
	DefaultKeepaliveS float64
	// Logger receives the request log (debug) and errors; nil discards.
	Logger *slog.Logger
	// Metrics, when set, records HTTP metrics and is served at /metrics;
	// without it /metrics answers 404.
	Metrics *Metrics
	// Version is reported by /api/v1/health and the OpenAPI document.
	Version string
	// Tasks serves the work queue: /api/v1/tasks…, /api/v1/artifacts…,
	// /api/v1/workers and the fleet's /v1 API (tasks.go, fleet.go). Nil
	// answers those routes with 404.
	Tasks *TaskOptions
	// Coordination configures locks, swaps, webhooks and schedules (coord.go).
	Coordination CoordOptions
	// Admin serves the administration routes (admin.go).
	Admin AdminOptions
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes     = 1 << 20
	DefaultKeepaliveSeconds = 60
)

// Limits and fixed texts of the server.
const (
	srvMaxWaitS            = 300
	srvSSEHeartbeat        = 15 * time.Second
	srvDefaultEventsLimit  = 1000
	srvMaxEventsLimit      = 10000
	srvMaxReasonBytes      = 1024
	srvUnauthorizedMessage = "missing or unknown bearer token: set ARBITER_TOKEN"
)

// Server serves the native API over a Plane. Create it with NewServer; it is
// safe for concurrent use.
type Server struct {
	plane        Plane
	tokens       []srvToken
	open         bool // no tokens configured: everyone is admin
	maxBody      int64
	defKeepalive float64
	log          *slog.Logger
	metrics      *Metrics
	version      string
	openapi      []byte
	mux          *http.ServeMux
	sseHeartbeat time.Duration // tests shorten it
	ui           *uiServer     // the dashboard (ui.go)
	tasks        *TaskOptions  // the work queue (tasks.go); nil when off
	coord        CoordOptions  // locks, swaps, webhooks, schedules (coord.go)
	admin        AdminOptions  // configuration reload (admin.go)
	gpus         srvGPUs       // agents' GPU reports and orders (gpus.go)
}

// srvToken is a configured token with its secret kept only as a hash, so
// that comparisons take the same time whatever the presented length.
type srvToken struct {
	caller arbiter.Caller
	sum    [sha256.Size]byte
}

// NewServer returns a server over o.Plane. Tokens with an empty secret are
// ignored (they would match an empty bearer token).
func NewServer(o Options) *Server {
	s := &Server{
		plane:        o.Plane,
		maxBody:      o.MaxBodyBytes,
		defKeepalive: o.DefaultKeepaliveS,
		log:          o.Logger,
		metrics:      o.Metrics,
		version:      o.Version,
		sseHeartbeat: srvSSEHeartbeat,
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.defKeepalive <= 0 {
		s.defKeepalive = DefaultKeepaliveSeconds
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, t := range o.Tokens {
		if t.Secret == "" {
			continue
		}
		s.tokens = append(s.tokens, srvToken{
			caller: arbiter.Caller{Name: t.Name, Role: t.Role},
			sum:    sha256.Sum256([]byte(t.Secret)),
		})
	}
	s.open = len(o.Tokens) == 0
	s.openapi = srvOpenAPIDocument(s.version)
	s.tasks = taskOptions(o.Tasks)
	s.coord = o.Coordination
	s.admin = o.Admin
	s.mux = http.NewServeMux()
	for i := range srvRoutes {
		rt := &srvRoutes[i]
		s.mux.Handle(rt.pattern(), s.wrap(rt.pattern(), rt.roles, rt.handle))
	}
	s.uiInit() // the dashboard's routes (ui.go)
	s.mux.Handle("/", s.wrap("unmatched", srvPublic, (*Server).handleUnmatched))
	return s
}

// Handler returns the HTTP handler of the whole native API.
func (s *Server) Handler() http.Handler { return s.mux }

// srvRoles is a set of roles allowed on a route.
type srvRoles uint8

const (
	srvRoleAdmin srvRoles = 1 << iota
	srvRoleUser
	srvRoleAgent
	// srvPublic routes need no token at all (health, the API document,
	// metrics): probes and scrapers must reach them.
	srvPublic
	srvAnyRole = srvRoleAdmin | srvRoleUser | srvRoleAgent
)

func srvRoleBit(role string) srvRoles {
	switch role {
	case arbiter.RoleAdmin:
		return srvRoleAdmin
	case arbiter.RoleUser:
		return srvRoleUser
	case arbiter.RoleAgent:
		return srvRoleAgent
	}
	return 0
}

// String names the roles for a forbidden message: "user or admin".
func (r srvRoles) String() string {
	var names []string
	for _, x := range []struct {
		bit  srvRoles
		name string
	}{{srvRoleUser, arbiter.RoleUser}, {srvRoleAgent, arbiter.RoleAgent}, {srvRoleAdmin, arbiter.RoleAdmin}} {
		if r&x.bit != 0 {
			names = append(names, x.name)
		}
	}
	return strings.Join(names, " or ")
}

// srvHandlerFunc handles one routed request for an authenticated caller. It
// writes its answer on success and returns an error to be written otherwise.
type srvHandlerFunc func(s *Server, w http.ResponseWriter, r *http.Request, c arbiter.Caller) error

// authenticate returns the caller presenting r's bearer token or, on a
// request with no Authorization header, the dashboard's token cookie.
func (s *Server) authenticate(r *http.Request) (arbiter.Caller, bool) {
	if s.open {
		return arbiter.Caller{Role: arbiter.RoleAdmin}, true
	}
	h := r.Header.Get("Authorization")
	if h == "" {
		return s.lookupToken(uiCookieSecret(r))
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return arbiter.Caller{}, false
	}
	return s.lookupToken(strings.TrimSpace(secret))
}

// lookupToken returns the caller whose token secret is secret.
func (s *Server) lookupToken(secret string) (arbiter.Caller, bool) {
	if secret == "" {
		return arbiter.Caller{}, false
	}
	sum := sha256.Sum256([]byte(secret))
	// Look at every token, so the time taken does not tell which one matched.
	found := -1
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(sum[:], s.tokens[i].sum[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return arbiter.Caller{}, false
	}
	return s.tokens[found].caller, true
}

// wrap turns a route's handler into an http.Handler that authenticates,
// checks the role, writes errors, recovers panics, logs and measures.
func (s *Server) wrap(route string, roles srvRoles, h srvHandlerFunc) http.Handler {
	var obs *srvRouteMetrics
	if s.metrics != nil {
		obs = s.metrics.route(route)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := srvWriterPool.Get().(*srvWriter)
		sw.ResponseWriter, sw.status, sw.wrote = w, 0, false
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.LogAttrs(r.Context(), slog.LevelError, "http handler panic",
					slog.String("route", route), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				if !sw.wrote {
					s.writeError(sw, r, route, arbiter.Errorf(arbiter.EInternal, "internal error"))
				}
			}
			status := sw.status
			if status == 0 {
				status = http.StatusOK
			}
			d := time.Since(start)
			if obs != nil {
				obs.observe(status, d)
			}
			if s.log.Enabled(r.Context(), slog.LevelDebug) {
				s.log.LogAttrs(r.Context(), slog.LevelDebug, "http request",
					slog.String("method", r.Method), slog.String("route", route),
					slog.Int("status", status), slog.Duration("duration", d))
			}
			sw.ResponseWriter = nil
			srvWriterPool.Put(sw)
		}()

		var err error
		caller := arbiter.Caller{}
		if roles&srvPublic == 0 {
			var ok bool
			caller, ok = s.authenticate(r)
			switch {
			case !ok:
				sw.Header().Set("WWW-Authenticate", `Bearer realm="arbiter"`)
				err = arbiter.Errorf(arbiter.EUnauthorized, srvUnauthorizedMessage)
			case roles&srvRoleBit(caller.Role) == 0:
				err = arbiter.Errorf(arbiter.EForbidden, "%s needs the %s role; token %q has role %q",
					route, roles, caller.Name, caller.Role)
			}
		}
		if err == nil {
			err = s.uiCheckCrossSite(r, roles) // browsers' cross-site requests (ui.go)
		}
		if err == nil {
			err = h(s, sw, r, caller)
		}
		if err != nil {
			s.writeError(sw, r, route, err)
		}
	})
}

// srvWriter records the status written, for the log and metrics. It keeps
// http.Flusher working and unwraps for http.ResponseController.
type srvWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

var srvWriterPool = sync.Pool{New: func() any { return new(srvWriter) }}

func (w *srvWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *srvWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *srvWriter) Flush() {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *srvWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// srvStatus is the one table from error codes to HTTP statuses.
var srvStatus = map[string]int{
	arbiter.EInvalid:      http.StatusBadRequest,
	arbiter.EUnauthorized: http.StatusUnauthorized,
	arbiter.EForbidden:    http.StatusForbidden,
	arbiter.ENotFound:     http.StatusNotFound,
	arbiter.EConflict:     http.StatusConflict,
	arbiter.ETooLarge:     http.StatusRequestEntityTooLarge,
	arbiter.ELocked:       http.StatusLocked,
	arbiter.EUnavailable:  http.StatusServiceUnavailable,
	arbiter.EInternal:     http.StatusInternalServerError,
}

// srvErrorBody is the JSON form of every error answer.
type srvErrorBody struct {
	Error srvErrorDetail `json:"error"`
}

type srvErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError answers err in the error format. Errors that are not
// *arbiter.Error are logged here (once) and shown as "internal error".
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, route string, err error) {
	code := arbiter.ErrorCode(err)
	status, ok := srvStatus[code]
	if !ok {
		status, code = http.StatusInternalServerError, arbiter.EInternal
	}
	msg := arbiter.ErrorMessage(err)
	switch {
	case r.Context().Err() != nil:
		// The client went away; there is nobody to tell and nothing to log.
	case status >= 500 && status != http.StatusServiceUnavailable:
		s.log.LogAttrs(r.Context(), slog.LevelError, "http request failed",
			slog.String("method", r.Method), slog.String("route", route), slog.String("error", err.Error()))
		if code == arbiter.EInternal {
			msg = "internal error"
		}
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusServiceUnavailable:
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "http request refused",
			slog.String("method", r.Method), slog.String("route", route), slog.String("remote", r.RemoteAddr),
			slog.Int("status", status), slog.String("message", msg))
	}
	srvWriteError(w, r, status, code, msg)
}

// srvWriteError writes an error answer in the form of the surface r
// speaks, whoever refuses it (the handler, authentication, or no route at
// all): the fleet's {"error": msg} under /v1, the swap arbiter's {"detail"}
// with the native error beside it under /api/swap and /api/schedule, the
// native form elsewhere.
func srvWriteError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/v1/"):
		fleetError(w, status, msg)
	case p == "/api/swap" || strings.HasPrefix(p, "/api/swap/") || p == "/api/schedule" || strings.HasPrefix(p, "/api/schedule/"):
		srvWriteJSON(w, status, compatErrorBody{Detail: msg, Error: srvErrorDetail{Code: code, Message: msg}})
	default:
		srvWriteJSON(w, status, srvErrorBody{srvErrorDetail{Code: code, Message: msg}})
	}
}

// srvWriteJSON writes v as the JSON answer with the given status.
// Served as JSON with nosniff, the answer is never read as HTML, so <, >
// and & are written as they are rather than as \u003c escapes: the
// dashboard's panels, mostly markup, come a third smaller and quicker.
func srvWriteJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	// An error here means the client went away; nothing useful is left to do.
	_ = enc.Encode(v)
}

// handleUnmatched answers requests no route takes: 405 with Allow when the
// path exists under another method, 404 otherwise.
func (s *Server) handleUnmatched(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		if allow[0] == http.MethodGet {
			allow = append(allow, http.MethodHead)
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		srvWriteError(w, r, http.StatusMethodNotAllowed, arbiter.EInvalid,
			r.Method+" is not allowed on "+r.URL.Path+": use "+strings.Join(allow, ", "))
		return nil
	}
	return arbiter.Errorf(arbiter.ENotFound, "no such route: %s %s (see /api/v1/openapi.json)", r.Method, r.URL.Path)
}

// srvParseID parses an allocation id from a path: a positive integer.
func srvParseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || s[0] < '0' || s[0] > '9' {
		return 0, arbiter.Errorf(arbiter.EInvalid, "allocation id %q is not a positive integer", srvClip(s, 40))
	}
	return id, nil
}

// srvClip shortens s for an error message.
func srvClip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// srvContextError turns a cancelled or timed-out request context into an
// error worth answering (if the client is still there to read it).
func srvContextError(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return arbiter.Errorf(arbiter.EUnavailable, "the request was cancelled before the server answered: %v", ctx.Err())
	}
	return err
}

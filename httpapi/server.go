// Package httpapi is arbiter's native HTTP interface: the server that turns
// JSON requests under /api/v1 into commands and reads of a running control
// plane (the Plane interface), streams events as server-sent events, serves
// its OpenAPI description and Prometheus metrics. Package client speaks the
// same API from the other side.
package httpapi

import (
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
	"github.com/arbiter-hq/arbiter/ui"
)

// Options configure a Server. Plane is required; the rest have defaults.
type Options struct {
	Plane Plane
	// Tokens are the accepted bearer tokens (auth.go; SetTokens replaces
	// them). With none, every caller is an anonymous admin: the binary
	// allows that only on loopback, and such a server answers only
	// requests addressed to a loopback name (checkHost).
	Tokens []Token
	// AnyHost lifts checkHost: a server without tokens that listens beyond
	// loopback (--insecure-no-auth) is reached by other names.
	AnyHost bool
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
	// Cluster, under high availability, is this replica's view of the
	// replicas, reported by /api/v1/health and the dashboard (cluster.go).
	Cluster func() arbiter.Cluster
	// Problem says what is wrong with the server ("" when nothing): health
	// then answers 503 degraded with it.
	Problem func() string
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes     = 1 << 20
	DefaultKeepaliveSeconds = 60
)

// Limits and fixed texts of the server.
const (
	maxWaitS           = 300
	sSEHeartbeat       = 15 * time.Second
	defaultEventsLimit = 1000
	maxEventsLimit     = 10000
	maxReasonBytes     = 1024
	// What a caller without an accepted token is told: whether it sent none
	// (set one) or one the server does not know (check it).
	noTokenMessage      = "this server needs a bearer token (Authorization: Bearer TOKEN): set ARBITER_TOKEN (or pass --token) to a token from its configuration"
	unknownTokenMessage = "the bearer token sent is not one this server knows: check ARBITER_TOKEN (or --token), or ask an admin for a valid one"
	// badSchemeMessage: an Authorization header that is not a bearer token.
	badSchemeMessage = "the Authorization header must be \"Bearer TOKEN\" (a bearer token from the server's configuration)"
	// endedSessionMessage: a dashboard cookie whose session is over.
	endedSessionMessage = "the dashboard session has ended (logged out, expired, or its token was changed): sign in again"
)

// longPoll reports whether r asks to wait (?wait=, however it is spelt:
// w%61it is the same parameter to the handler).
func longPoll(r *http.Request) bool {
	q := r.URL.RawQuery
	return (strings.Contains(q, "wait") || strings.Contains(q, "%")) && r.URL.Query().Has("wait")
}

// Server serves the native API over a Plane. Create it with NewServer; it is
// safe for concurrent use.
type Server struct {
	plane        Plane
	tokens       tokenHolder // the tokens in force (auth.go)
	open         bool        // no tokens configured: everyone is admin
	anyHost      bool        // Options.AnyHost
	audit        *auditor    // the audit trail (audit.go)
	routes       []RouteInfo // every route served, in registration order (access.go)
	maxBody      int64
	defKeepalive float64
	log          *slog.Logger
	metrics      *Metrics
	version      string
	openapi      []byte
	mux          *http.ServeMux
	sseHeartbeat time.Duration // tests shorten it
	dash         *ui.Dashboard // the dashboard (dashboard.go)
	xsite        *http.CrossOriginProtection
	tasks        *TaskOptions // the work queue (tasks.go); nil when off
	coord        CoordOptions // locks, swaps, webhooks, schedules (coord.go)
	admin        AdminOptions // configuration reload (admin.go)
	gpus         gpuReports   // agents' GPU reports and orders (gpus.go)
	// Long-polls' shared wakers (wake.go): agents' GPU orders and swap
	// claims, and waits for an allocation.
	ordersWake, swapWake, allocWake eventWake
	cluster                         func() arbiter.Cluster
	problem                         func() string
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
		sseHeartbeat: sSEHeartbeat,
	}
	s.ordersWake.keyOf, s.swapWake.keyOf, s.allocWake.keyOf = wakeMachine, wakeSwapClaim, wakeAllocation
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	if s.defKeepalive <= 0 {
		s.defKeepalive = DefaultKeepaliveSeconds
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	toks := newTokenSet(o.Tokens)
	s.tokens.set(toks)
	s.open = len(toks.list) == 0
	s.anyHost = o.AnyHost
	s.audit = newAuditor(s.plane)
	s.openapi = openAPIDocument(s.version)
	s.tasks = taskOptions(o.Tasks)
	s.coord = o.Coordination
	s.admin = o.Admin
	s.cluster, s.problem = o.Cluster, o.Problem
	s.mux = http.NewServeMux()
	for i := range apiRoutes {
		rt := &apiRoutes[i]
		s.handle(rt.method, rt.path, rt.roles, rt.handle)
	}
	s.xsite = http.NewCrossOriginProtection()
	s.mountDashboard()
	s.mux.Handle("/", s.wrap("unmatched", publicRoute, (*Server).handleUnmatched))
	return s
}

// Handler returns the HTTP handler of the whole native API.
func (s *Server) Handler() http.Handler { return s.mux }

// roles is a set of roles allowed on a route.
type roles uint8

const (
	roleAdmin roles = 1 << iota
	roleUser
	roleAgent
	// publicRoute routes need no token at all (health, the API document,
	// metrics): probes and scrapers must reach them.
	publicRoute
	// The fleet's /v1 routes authenticate their own way (auth.go): its
	// workers, its operator, and the reads either may make.
	fleetWorkerAuth
	fleetOperatorAuth
	fleetReadAuth
	anyRole = roleAdmin | roleUser | roleAgent
)

func roleBit(role string) roles {
	switch role {
	case arbiter.RoleAdmin:
		return roleAdmin
	case arbiter.RoleUser:
		return roleUser
	case arbiter.RoleAgent:
		return roleAgent
	}
	return 0
}

// String names the roles for a forbidden message: "user or admin".
func (r roles) String() string {
	var names []string
	for _, x := range []struct {
		bit  roles
		name string
	}{{roleUser, arbiter.RoleUser}, {roleAgent, arbiter.RoleAgent}, {roleAdmin, arbiter.RoleAdmin}} {
		if r&x.bit != 0 {
			names = append(names, x.name)
		}
	}
	return strings.Join(names, " or ")
}

// handlerFunc handles one routed request for an authenticated caller. It
// writes its answer on success and returns an error to be written otherwise.
type handlerFunc func(s *Server, w http.ResponseWriter, r *http.Request, c arbiter.Caller) error

// wrap turns a route's handler into an http.Handler that authenticates,
// checks the role, writes errors, recovers panics, logs and measures.
func (s *Server) wrap(route string, roles roles, h handlerFunc) http.Handler {
	var obs *routeMetrics
	if s.metrics != nil {
		obs = s.metrics.route(route)
	}
	stream := lasts(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := writerPool.Get().(*writer)
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
			writerPool.Put(sw)
		}()

		err := s.checkHost(r) // auth.go
		var caller arbiter.Caller
		var via string
		if err == nil {
			caller, via, err = s.authorize(sw, r, route, roles) // auth.go
		}
		if err == nil {
			err = s.checkCrossSite(r, via) // browsers' cross-site requests (dashboard.go)
		}
		if err == nil && (stream || longPoll(r)) && (via == viaBearer || via == viaCookie) {
			// A stream or a long-poll, which may last, ends with its token
			// (the others are over before a reload could matter, and are
			// spared the watch's cost).
			var stop func()
			r, stop = s.untilRefused(r, caller)
			defer stop()
		}
		if err == nil {
			err = h(s, sw, r, caller)
		}
		msg := ""
		if err != nil {
			err = httpio.ContextError(r.Context(), err) // a client that went away is not an internal error
			msg = arbiter.ErrorMessage(err)
			s.writeError(sw, r, route, err)
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		s.auditRequest(r, route, roles, caller, via, status, msg) // audit.go
	})
}

// lasts reports whether route ("GET /api/v1/events") is an event stream,
// which lasts as long as its client: the events, a swap's log, the
// dashboard's stream.
func lasts(route string) bool {
	return strings.HasPrefix(route, http.MethodGet+" ") && (strings.HasSuffix(route, "/events") || strings.HasSuffix(route, "/stream"))
}

// writer records the status written, for the log and metrics. It keeps
// http.Flusher working and unwraps for http.ResponseController.
type writer struct {
	http.ResponseWriter
	status int
	wrote  bool
}

var writerPool = sync.Pool{New: func() any { return new(writer) }}

func (w *writer) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *writer) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

func (w *writer) Flush() {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// status is the one table from error codes to HTTP statuses.
var status = map[string]int{
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

// errorBody is the JSON form of every error answer.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError answers err in the error format. Errors that are not
// *arbiter.Error are logged here (once) and shown as "internal error".
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, route string, err error) {
	status, code := statusOf(w, err)
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
	writeError(w, r, status, code, msg)
}

// statusOf is err's HTTP status and code. A refusal that certainly
// changed nothing because this replica does not lead
// (arbiter.ErrNotApplied) is marked so, in w's header, for a client to
// send it to another replica.
func statusOf(w http.ResponseWriter, err error) (int, string) {
	code := arbiter.ErrorCode(err)
	st, ok := status[code]
	if !ok {
		return http.StatusInternalServerError, arbiter.EInternal
	}
	if errors.Is(err, arbiter.ErrNotApplied) {
		w.Header().Set(arbiter.HeaderNotApplied, "1")
		if w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", "1")
		}
	}
	return st, code
}

// writeError writes an error answer in the form of the surface r
// speaks, whoever refuses it (the handler, authentication, or no route at
// all): the fleet's {"error": msg} under /v1, the swap arbiter's {"detail"}
// with the native error beside it under /api/swap and /api/schedule, the
// native form elsewhere.
func writeError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	switch p := r.URL.Path; {
	case strings.HasPrefix(p, "/v1/"):
		fleetError(w, status, msg)
	case p == "/api/swap" || strings.HasPrefix(p, "/api/swap/") || p == "/api/schedule" || strings.HasPrefix(p, "/api/schedule/"):
		httpio.WriteJSON(w, status, compatErrorBody{Detail: msg, Error: errorDetail{Code: code, Message: msg}})
	default:
		httpio.WriteJSON(w, status, errorBody{errorDetail{Code: code, Message: msg}})
	}
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
		writeError(w, r, http.StatusMethodNotAllowed, arbiter.EInvalid,
			r.Method+" is not allowed on "+r.URL.Path+": use "+strings.Join(allow, ", "))
		return nil
	}
	return arbiter.Errorf(arbiter.ENotFound, "no such route: %s %s (see /api/v1/openapi.json)", r.Method, r.URL.Path)
}

// parseID parses an allocation id from a path: a positive integer.
func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 || s[0] < '0' || s[0] > '9' {
		return 0, arbiter.Errorf(arbiter.EInvalid, "allocation id %q is not a positive integer", arbiter.Clip(s, 40))
	}
	return id, nil
}

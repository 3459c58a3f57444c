package httpapi

import (
	"net/http"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// RouteInfo is one route the server serves and who may use it: what the
// authorization matrix (cmd/arbiter's hostile-input suite) reads, so that a
// route added anywhere is tested without anyone listing it.
type RouteInfo struct {
	Method, Path string
	// Access is who may use the route: "public"; a list of roles such as
	// "user or admin"; or, for the fleet's /v1 API, "fleet worker",
	// "fleet operator" or "fleet read" (auth.go).
	Access string
}

// Routes returns every route the server serves, the dashboard's included,
// in the order they were registered.
func (s *Server) Routes() []RouteInfo { return append([]RouteInfo(nil), s.routes...) }

// handle registers one route behind wrap and records it for Routes.
func (s *Server) handle(method, path string, access roles, h handlerFunc) {
	pattern := method + " " + path
	s.routes = append(s.routes, RouteInfo{Method: method, Path: path, Access: access.describe()})
	s.mux.Handle(pattern, s.wrap(pattern, access, h))
}

// describe names an access for RouteInfo.
func (r roles) describe() string {
	var parts []string
	for _, x := range []struct {
		bit  roles
		name string
	}{{publicRoute, "public"}, {fleetWorkerAuth, "fleet worker"}, {fleetOperatorAuth, "fleet operator"}, {fleetReadAuth, "fleet read"}} {
		if r&x.bit != 0 {
			parts = append(parts, x.name)
		}
	}
	if r&anyRole != 0 {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ", ")
}

// handlerOf adapts a plain handler (the dashboard's) to a handlerFunc.
func handlerOf(h func(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error) handlerFunc {
	return func(_ *Server, w http.ResponseWriter, r *http.Request, c arbiter.Caller) error { return h(w, r, c) }
}

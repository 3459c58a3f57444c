package httpapi

// The dashboard (package ui) is mounted here, behind the same wrap as the
// API routes (authentication, roles, errors, metrics). What the dashboard's
// sign-in means for authentication lives here too: the cookie it sets is
// read by authenticate, and requests it authenticates are held to the
// cross-site rules below.

import (
	"net/http"
	"strings"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// mountDashboard builds the dashboard over the server's plane and registers
// its routes.
func (s *Server) mountDashboard() {
	s.dash = ui.New(ui.Options{
		Plane:        s.plane,
		Open:         s.open,
		Authenticate: s.authenticated,
		SignIn:       s.signIn, // session.go
		SignOut:      s.signOut,
		Deliveries:   s.coord.Deliveries,
		Logger:       s.log,
		Version:      s.version,
		Cluster:      s.cluster, // high availability (cluster.go)
		Now:          s.coordNow,
	})
	for _, rt := range s.dash.Routes() {
		roles := anyRole
		if rt.Public {
			roles = publicRoute
		}
		s.handle(rt.Method, rt.Path, roles, handlerOf(rt.Handle))
	}
}

// checkCrossSite refuses a state-changing request a browser sent on behalf
// of another site. Requests with an Authorization header are API clients:
// a browser cannot attach one cross-site without a CORS preflight, which
// this server never grants. The others — the dashboard's own calls carrying
// the cookie, anyone on a server without tokens, the sign-in form, fleet
// workers and operators — must not come from another origin
// (Sec-Fetch-Site, else Origin against Host: programs send neither), and
// those authenticated by the cookie must carry the ui.CSRFHeader header.
// Errors: forbidden.
func (s *Server) checkCrossSite(r *http.Request, via string) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " "); strings.EqualFold(scheme, "Bearer") {
		// Only Bearer: a browser attaches cached Basic or Negotiate
		// credentials to a cross-site form post by itself.
		return nil
	}
	if err := s.xsite.Check(r); err != nil {
		return arbiter.Errorf(arbiter.EForbidden, "cross-site request refused: %s %s came from another site's page; "+
			"use the dashboard itself, or send Authorization: Bearer from a script", r.Method, r.URL.Path)
	}
	if via == viaCookie && r.Header.Get(ui.CSRFHeader) == "" {
		return arbiter.Errorf(arbiter.EForbidden, "%s %s was authenticated by the dashboard's cookie without the %s header: "+
			"only the dashboard's own page may act with its cookie; scripts send Authorization: Bearer", r.Method, r.URL.Path, ui.CSRFHeader)
	}
	return nil
}

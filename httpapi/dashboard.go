package httpapi

// The dashboard (package ui) is mounted here, behind the same wrap as the
// API routes (authentication, roles, errors, metrics). What the dashboard's
// sign-in means for authentication lives here too: the cookie it sets is
// read by authenticate, and requests it authenticates are held to the
// cross-site rules below.

import (
	"context"
	"encoding/base64"
	"net/http"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// mountDashboard builds the dashboard over the server's plane and registers
// its routes.
func (s *Server) mountDashboard() {
	s.dash = ui.New(ui.Options{
		Plane:        s.plane,
		Open:         s.open,
		Authenticate: s.authenticate,
		SignIn:       s.signIn,
		Deliveries:   s.coord.Deliveries,
		Logger:       s.log,
		Version:      s.version,
	})
	for _, rt := range s.dash.Routes() {
		roles := anyRole
		if rt.Public {
			roles = publicRoute
		}
		handle := rt.Handle
		pattern := rt.Method + " " + rt.Path
		s.mux.Handle(pattern, s.wrap(pattern, roles, func(_ *Server, w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
			return handle(w, r, c)
		}))
	}
}

// signIn checks a token typed into the dashboard's sign-in form; the cookie
// then carries the token (base64url).
func (s *Server) signIn(_ context.Context, token string) (string, arbiter.Caller, bool) {
	c, ok := s.lookupToken(token)
	if !ok {
		return "", arbiter.Caller{}, false
	}
	return base64.RawURLEncoding.EncodeToString([]byte(token)), c, true
}

// cookieSecret returns the token secret the dashboard's cookie carries, or
// "" if there is none or it is malformed.
func cookieSecret(r *http.Request) string {
	c, err := r.Cookie(ui.CookieName)
	if err != nil {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return ""
	}
	return string(b)
}

// checkCrossSite refuses a state-changing request a browser sent on behalf
// of another site. Requests with an Authorization header are API clients:
// a browser cannot attach one cross-site without a CORS preflight, which
// this server never grants. The others — the dashboard's own calls carrying
// the cookie, anyone on a server without tokens, the sign-in form — must not
// come from another origin (Sec-Fetch-Site, else Origin against Host), and
// those authenticated by the cookie must carry the ui.CSRFHeader header.
// Errors: forbidden.
func (s *Server) checkCrossSite(r *http.Request, roles roles) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if r.Header.Get("Authorization") != "" {
		return nil
	}
	if err := s.xsite.Check(r); err != nil {
		return arbiter.Errorf(arbiter.EForbidden, "cross-site request refused: %s %s came from another site's page; "+
			"use the dashboard itself, or send Authorization: Bearer from a script", r.Method, r.URL.Path)
	}
	if !s.open && roles&publicRoute == 0 && r.Header.Get(ui.CSRFHeader) == "" {
		return arbiter.Errorf(arbiter.EForbidden, "%s %s was authenticated by the dashboard's cookie without the %s header: "+
			"only the dashboard's own page may act with its cookie; scripts send Authorization: Bearer", r.Method, r.URL.Path, ui.CSRFHeader)
	}
	return nil
}

package httpapi

// The dashboard: a page at / rendered from the templates in package ui, one
// block per panel, refreshed panel by panel after the events that concern
// it. This file holds its routes, sign-in and cookie, the cross-site
// defence and the page; ui_panels.go the panels and their data (with
// ui_caps.go, ui_coord.go — services, swaps, webhook deliveries — and
// ui_grid.go, the grid machines' board maps); ui_render.go the template
// helpers; ui_stream.go the page's event stream.

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// uiRoutes are the dashboard's routes. The mux serves them through the same
// wrap as srvRoutes (authentication, roles, errors, metrics), but they are
// not part of the API, so the OpenAPI document leaves them out.
var uiRoutes = []srvRoute{
	// The page authenticates itself: without a token it shows the sign-in form.
	{http.MethodGet, "/{$}", srvPublic, (*Server).handleUIPage},
	{http.MethodPost, "/ui/login", srvPublic, (*Server).handleUILogin},
	{http.MethodPost, "/ui/logout", srvPublic, (*Server).handleUILogout},
	{http.MethodGet, "/ui/panels", srvAnyRole, (*Server).handleUIPanels},
	{http.MethodGet, "/ui/events", srvAnyRole, (*Server).handleUIEvents},
	{http.MethodGet, "/ui/static/{file}", srvPublic, (*Server).handleUIStatic},
}

// Names the page and the server agree on.
const (
	// uiCookieName holds the signed-in token (base64url of the secret):
	// HttpOnly, SameSite=Strict, Secure over TLS.
	uiCookieName = "arbiter_token"
	// uiCSRFHeader must be present on every state-changing request that is
	// authenticated by the cookie. The page's fetch calls add it; a
	// cross-site form cannot, and a cross-site fetch that tries needs a CORS
	// preflight this server never grants.
	uiCSRFHeader   = "X-Arbiter-CSRF"
	uiCookieMaxAge = 30 * 24 * time.Hour
	uiLoginMaxBody = 8 << 10
	// uiTick is how often the page's event stream carries the memory-only
	// liveness (keepalives, heartbeats) that no stored event reports.
	uiTick = 10 * time.Second
)

// uiCSP keeps the page to its own script, style and connections: no inline
// script or style, no framing.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// uiServer is the dashboard's part of a Server.
type uiServer struct {
	pages  *template.Template
	static map[string]uiAsset
	tick   time.Duration // tests shorten it
	xsite  *http.CrossOriginProtection
	// panelSizes is the size of each panel's last rendering (name → int),
	// to size the next one's buffer.
	panelSizes sync.Map
}

// uiAsset is one embedded static file, with its validator.
type uiAsset struct {
	body    []byte
	ctype   string
	version string // short content hash: ?v= in the page's links
}

// uiInit parses the embedded templates, indexes the static files and
// registers the dashboard's routes. The files are compiled into the binary,
// so a failure is a programming error caught by the tests: it panics.
func (s *Server) uiInit() {
	u := &uiServer{static: map[string]uiAsset{}, tick: uiTick, xsite: http.NewCrossOriginProtection()}
	u.pages = template.Must(template.New("ui").Funcs(uiFuncs).ParseFS(ui.Templates, "templates/*.html"))
	files, err := fs.Glob(ui.Static, "static/*")
	if err != nil {
		panic(err)
	}
	for _, f := range files {
		body, err := fs.ReadFile(ui.Static, f)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		ct := mime.TypeByExtension(path.Ext(f))
		if ct == "" {
			ct = "application/octet-stream"
		}
		u.static[path.Base(f)] = uiAsset{body: body, ctype: ct, version: hex.EncodeToString(sum[:6])}
	}
	s.ui = u
	for i := range uiRoutes {
		rt := &uiRoutes[i]
		s.mux.Handle(rt.pattern(), s.wrap(rt.pattern(), rt.roles, rt.handle))
	}
}

// uiCookieSecret returns the token secret the dashboard's cookie carries,
// or "" if there is none or it is malformed.
func uiCookieSecret(r *http.Request) string {
	c, err := r.Cookie(uiCookieName)
	if err != nil {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return ""
	}
	return string(b)
}

// uiCheckCrossSite refuses a state-changing request a browser sent on behalf
// of another site. Requests with an Authorization header are API clients:
// a browser cannot attach one cross-site without a CORS preflight, which
// this server never grants. The others — the dashboard's own calls carrying
// the cookie, anyone on a server without tokens, the sign-in form — must not
// come from another origin (Sec-Fetch-Site, else Origin against Host), and
// those authenticated by the cookie must carry the X-Arbiter-CSRF header.
// Errors: forbidden.
func (s *Server) uiCheckCrossSite(r *http.Request, roles srvRoles) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if r.Header.Get("Authorization") != "" {
		return nil
	}
	if err := s.ui.xsite.Check(r); err != nil {
		return arbiter.Errorf(arbiter.EForbidden, "cross-site request refused: %s %s came from another site's page; "+
			"use the dashboard itself, or send Authorization: Bearer from a script", r.Method, r.URL.Path)
	}
	if !s.open && roles&srvPublic == 0 && r.Header.Get(uiCSRFHeader) == "" {
		return arbiter.Errorf(arbiter.EForbidden, "%s %s was authenticated by the dashboard's cookie without the %s header: "+
			"only the dashboard's own page may act with its cookie; scripts send Authorization: Bearer", r.Method, r.URL.Path, uiCSRFHeader)
	}
	return nil
}

// uiSecurityHeaders are set on every HTML answer.
func uiSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// uiPageData is what the "page" and "login" templates see.
type uiPageData struct {
	Caller  arbiter.Caller
	Open    bool
	Seq     int64
	Now     time.Time
	Version string
	Panels  []uiRendered
	Message string // login: why the form is shown again
	static  map[string]uiAsset
}

// Static returns the URL of a static file, versioned by its content so that
// browsers may cache it for good.
func (d *uiPageData) Static(name string) string {
	return "/ui/static/" + name + "?v=" + d.static[name].version
}

// uiRendered is one panel rendered for the page.
type uiRendered struct {
	Name  string
	Kinds string // event kind prefixes that make it stale, space-separated
	Show  bool
	HTML  template.HTML
}

// handleUIPage serves the dashboard, or the sign-in form to a browser that
// has no valid token yet.
func (s *Server) handleUIPage(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	c, ok := s.authenticate(r)
	if !ok {
		msg := ""
		if _, err := r.Cookie(uiCookieName); err == nil {
			msg = "Your saved token is no longer accepted: sign in again."
			uiClearCookie(w, r)
		}
		return s.uiRender(w, http.StatusOK, "login", &uiPageData{Message: msg})
	}
	// The sequence number before the reads: the page's stream starts there,
	// so no change after the reads can be missed (one before them may be
	// seen twice, which only refreshes a panel again).
	seq := s.plane.LastSeq()
	v := s.uiNewView(r, c)
	d := &uiPageData{Caller: c, Open: s.open, Seq: seq, Now: v.Now, Version: s.version}
	for i := range uiPanels {
		p := &uiPanels[i]
		html, show, err := s.uiRenderPanel(v, p)
		if err != nil {
			return err
		}
		d.Panels = append(d.Panels, uiRendered{Name: p.name, Kinds: strings.Join(p.kinds, " "), Show: show, HTML: html})
	}
	return s.uiRender(w, http.StatusOK, "page", d)
}

// uiRender executes a page template and writes it whole (a template error
// becomes a 500, not half a page).
func (s *Server) uiRender(w http.ResponseWriter, status int, name string, d *uiPageData) error {
	d.static = s.ui.static
	var b bytes.Buffer
	if err := s.ui.pages.ExecuteTemplate(&b, name, d); err != nil {
		return err
	}
	h := w.Header()
	uiSecurityHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
	return nil
}

// handleUILogin checks the token typed into the sign-in form and keeps it in
// the cookie. A wrong token shows the form again with a 401.
func (s *Server) handleUILogin(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if s.open {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, uiLoginMaxBody)
	if err := r.ParseForm(); err != nil {
		return s.uiRender(w, http.StatusBadRequest, "login", &uiPageData{Message: "The sign-in form could not be read: send it again."})
	}
	c, ok := s.lookupToken(strings.TrimSpace(r.PostForm.Get("token")))
	if !ok {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "dashboard sign-in refused", slog.String("remote", r.RemoteAddr))
		return s.uiRender(w, http.StatusUnauthorized, "login", &uiPageData{Message: "That token is not accepted: check it, or ask an admin for one."})
	}
	http.SetCookie(w, &http.Cookie{
		Name:     uiCookieName,
		Value:    base64.RawURLEncoding.EncodeToString([]byte(strings.TrimSpace(r.PostForm.Get("token")))),
		Path:     "/",
		MaxAge:   int(uiCookieMaxAge / time.Second),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "dashboard sign-in", slog.String("name", c.Name), slog.String("role", c.Role))
	http.Redirect(w, r, "/", http.StatusSeeOther)
	return nil
}

// handleUILogout forgets the cookie.
func (s *Server) handleUILogout(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	uiClearCookie(w, r)
	http.Redirect(w, r, "/", http.StatusSeeOther)
	return nil
}

func uiClearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: uiCookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// uiPanelJSON is one panel in the answer of GET /ui/panels.
type uiPanelJSON struct {
	Name string `json:"name"`
	Show bool   `json:"show"`
	HTML string `json:"html"`
}

// handleUIPanels renders the panels named by ?p= (all without it) for the
// page to put in place after an event.
func (s *Server) handleUIPanels(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := srvOnlyParams(q, "p"); err != nil {
		return err
	}
	var want []*uiPanel
	if names := q["p"]; len(names) > 0 {
		for _, n := range names {
			p := uiPanelNamed(n)
			if p == nil {
				return arbiter.Errorf(arbiter.EInvalid, "unknown panel %q: the panels are %s", srvClip(n, 40), uiPanelNames())
			}
			want = append(want, p)
		}
	} else {
		for i := range uiPanels {
			want = append(want, &uiPanels[i])
		}
	}
	v := s.uiNewView(r, c)
	out := struct {
		Now    time.Time     `json:"now"`
		Panels []uiPanelJSON `json:"panels"`
	}{Now: v.Now, Panels: make([]uiPanelJSON, 0, len(want))}
	for _, p := range want {
		html, show, err := s.uiRenderPanel(v, p)
		if err != nil {
			return err
		}
		out.Panels = append(out.Panels, uiPanelJSON{Name: p.name, Show: show, HTML: string(html)})
	}
	srvWriteJSON(w, http.StatusOK, out)
	return nil
}

// handleUIStatic serves an embedded static file. With the ?v= of its
// current content it may be cached for good; otherwise it is revalidated.
func (s *Server) handleUIStatic(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	a, ok := s.ui.static[r.PathValue("file")]
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "no static file %q", srvClip(r.PathValue("file"), 60))
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("X-Content-Type-Options", "nosniff")
	etag := `"` + a.version + `"`
	h.Set("ETag", etag)
	if r.URL.Query().Get("v") == a.version {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	_, _ = w.Write(a.body)
	return nil
}

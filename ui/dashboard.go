package ui

// The dashboard: a page at / rendered from the templates, one block per
// panel, refreshed panel by panel after the events that concern it. This
// file holds the Dashboard, its routes, sign-in and the page; panels.go the
// panels and their data (with caps.go, coord.go — services, swaps, webhook
// deliveries — compact.go, the one-row-per-machine view of large fleets,
// and grid.go, the grid machines' board maps); render.go the template
// helpers; stream.go the page's event stream.

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	"github.com/arbiter-hq/arbiter/httpio"
)

// Reader is what the dashboard reads of the running control plane: the
// committed view, never anything unsaved. *control.Loop implements it.
type Reader interface {
	Machines() []arbiter.MachineStatus
	Allocations(f arbiter.AllocationFilter) []arbiter.Allocation // in id order
	Allocation(id int64) (arbiter.Allocation, bool)
	Records(kind string) []arbiter.Record // in key order
	// Subscribe and LastSeq are as in httpapi.Plane: committed events after
	// since, in order, without gaps.
	Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error)
	// Events is as in httpapi.Plane: up to limit of the events already
	// committed after since, in order.
	Events(ctx context.Context, since int64, limit int) ([]arbiter.Event, error)
	LastSeq() int64
}

// Options configure a Dashboard. Plane and Authenticate are required.
type Options struct {
	Plane Reader
	// Open says the server runs without tokens: everyone is an anonymous
	// admin and there is no sign-in.
	Open bool
	// Authenticate returns who sent r (its bearer token or the sign-in
	// cookie), or false: the page shows the sign-in form then.
	Authenticate func(r *http.Request) (arbiter.Caller, bool)
	// SignIn checks a token typed into the sign-in form and returns the
	// value of the cookie that signs its holder in, or false for a token
	// that is not accepted.
	SignIn func(ctx context.Context, token string) (cookie string, c arbiter.Caller, ok bool)
	// SignOut forgets what the cookie value signed in, if anything.
	SignOut func(ctx context.Context, cookie string)
	// Deliveries is the webhook delivery log, shown to admins; nil for none.
	// When it also has Changed() <-chan struct{} (DeliveryWatch), the page
	// is told when the log changes.
	Deliveries arbiter.DeliveryLog
	Logger     *slog.Logger
	// Version is shown in the page's footer.
	Version string
	// Cluster, under high availability, is the replicas and who leads
	// them, shown in the footer; nil without HA.
	Cluster func() arbiter.Cluster
	// Now is the clock the page's relative times ("in 28 s") are computed
	// with; the server passes the control loop's, so the page agrees with
	// the engine's deadlines. Default time.Now.
	Now func() time.Time
}

// Route is one of the dashboard's routes: the API server mounts it behind
// its authentication, role check, error answers and metrics. Public routes
// need no token (the page authenticates itself and shows the sign-in form).
type Route struct {
	Method, Path string
	Public       bool
	Handle       func(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error
}

// Routes are the dashboard's routes. They are not part of the API, so the
// OpenAPI document leaves them out.
func (u *Dashboard) Routes() []Route {
	return []Route{
		{http.MethodGet, "/{$}", true, u.handlePage},
		{http.MethodPost, "/ui/login", true, u.handleLogin},
		{http.MethodPost, "/ui/logout", true, u.handleLogout},
		{http.MethodGet, "/ui/panels", false, u.handlePanels},
		{http.MethodGet, "/ui/events", false, u.handleEvents},
		{http.MethodGet, "/ui/static/{file}", true, u.handleStatic},
		{http.MethodGet, "/usage", true, u.handleUsage},
	}
}

// Names the page and the server agree on.
const (
	// CookieName is the sign-in cookie: HttpOnly, SameSite=Strict, Secure
	// over TLS (this server's or a proxy's: overTLS). Its value is what Options.SignIn returned: an opaque
	// session id, never the token.
	CookieName = "arbiter_session"
	// legacyCookieName is the cookie of older servers, which held the token
	// itself: cleared wherever a browser still sends it.
	legacyCookieName = "arbiter_token"
	// CSRFHeader must be present on every state-changing request that is
	// authenticated by the cookie. The page's fetch calls add it; a
	// cross-site form cannot, and a cross-site fetch that tries needs a CORS
	// preflight the server never grants.
	CSRFHeader   = "X-Arbiter-CSRF"
	cookieMaxAge = arbiter.SessionTTL
	loginMaxBody = 8 << 10
	// defaultTick is how often the page's event stream carries the
	// memory-only liveness (keepalives, heartbeats) that no stored event
	// reports.
	defaultTick = 10 * time.Second
)

// csp keeps the page to its own script, style and connections: no inline
// script or style, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Dashboard renders and serves the dashboard. It is safe for concurrent use.
type Dashboard struct {
	plane        Reader
	open         bool
	authenticate func(r *http.Request) (arbiter.Caller, bool)
	signIn       func(ctx context.Context, token string) (string, arbiter.Caller, bool)
	signOut      func(ctx context.Context, cookie string)
	deliveries   arbiter.DeliveryLog
	log          *slog.Logger
	version      string
	cluster      func() arbiter.Cluster
	now          func() time.Time

	pages  *template.Template
	static map[string]asset
	// Tick is how often the page's stream sends liveness; tests shorten it.
	Tick time.Duration
	// panelSizes is the size of each panel's last rendering (name → int),
	// to size the next one's buffer.
	panelSizes sync.Map
}

// asset is one embedded static file, with its validator.
type asset struct {
	body    []byte
	ctype   string
	version string // short content hash: ?v= in the page's links
}

// New parses the embedded templates and indexes the static files. They
// are compiled into the binary, so a failure is a programming error caught
// by the tests: it panics.
func New(o Options) *Dashboard {
	u := &Dashboard{
		plane: o.Plane, open: o.Open, authenticate: o.Authenticate, signIn: o.SignIn, signOut: o.SignOut,
		deliveries: o.Deliveries, log: o.Logger, version: o.Version, cluster: o.Cluster, now: o.Now,
		static: map[string]asset{}, Tick: defaultTick,
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	if u.now == nil {
		u.now = time.Now
	}
	if u.signOut == nil {
		u.signOut = func(context.Context, string) {}
	}
	u.pages = template.Must(template.New("ui").Funcs(funcs).ParseFS(Templates, "templates/*.html"))
	files, err := fs.Glob(Static, "static/*")
	if err != nil {
		panic(err)
	}
	for _, f := range files {
		body, err := fs.ReadFile(Static, f)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		ct := mime.TypeByExtension(path.Ext(f))
		if ct == "" {
			ct = "application/octet-stream"
		}
		u.static[path.Base(f)] = asset{body: body, ctype: ct, version: hex.EncodeToString(sum[:6])}
	}
	return u
}

// securityHeaders are set on every HTML answer.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// pageData is what the "page" and "login" templates see.
type pageData struct {
	Caller  arbiter.Caller
	Open    bool
	Seq     int64
	Now     time.Time
	Version string
	// Cluster is the replicas and their leader under HA (the footer).
	Cluster *arbiter.Cluster
	Panels  []rendered
	Message string // login: why the form is shown again
	// Page is the page shown: "" for the dashboard, "usage".
	Page   string
	static map[string]asset
}

// Static returns the URL of a static file, versioned by its content so that
// browsers may cache it for good.
func (d *pageData) Static(name string) string {
	return "/ui/static/" + name + "?v=" + d.static[name].version
}

// rendered is one panel rendered for the page.
type rendered struct {
	Name  string
	Kinds string // event kind prefixes that make it stale, space-separated
	Show  bool
	HTML  template.HTML
}

// handlePage serves the dashboard, or the sign-in form to a browser that
// has no valid token yet.
func (u *Dashboard) handlePage(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if _, err := r.Cookie(legacyCookieName); err == nil {
		clearNamedCookie(w, r, legacyCookieName) // it held a token: out of the browser with it
	}
	c, ok := u.authenticate(r)
	if !ok {
		msg := ""
		if _, err := r.Cookie(CookieName); err == nil {
			msg = "Your saved token is no longer accepted: sign in again."
			clearCookie(w, r)
		}
		return u.render(w, http.StatusOK, "login", &pageData{Message: msg})
	}
	// The sequence number before the reads: the page's stream starts there,
	// so no change after the reads can be missed (one before them may be
	// seen twice, which only refreshes a panel again).
	seq := u.plane.LastSeq()
	v := u.newView(r, c)
	d := &pageData{Caller: c, Open: u.open, Seq: seq, Now: v.Now, Version: u.version, Cluster: u.clusterNow()}
	for i := range panels {
		p := &panels[i]
		html, show, err := u.renderPanel(v, p)
		if err != nil {
			return err
		}
		d.Panels = append(d.Panels, rendered{Name: p.name, Kinds: strings.Join(p.kinds, " "), Show: show, HTML: html})
	}
	return u.render(w, http.StatusOK, "page", d)
}

// clusterNow is the replicas for the footer, nil without HA.
func (u *Dashboard) clusterNow() *arbiter.Cluster {
	if u.cluster == nil {
		return nil
	}
	c := u.cluster()
	return &c
}

// render executes a page template and writes it whole (a template error
// becomes a 500, not half a page).
func (u *Dashboard) render(w http.ResponseWriter, status int, name string, d *pageData) error {
	d.static = u.static
	var b bytes.Buffer
	if err := u.pages.ExecuteTemplate(&b, name, d); err != nil {
		return err
	}
	h := w.Header()
	securityHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
	return nil
}

// handleLogin checks the token typed into the sign-in form and signs its
// holder in with the cookie. A wrong token shows the form again with a 401.
func (u *Dashboard) handleLogin(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if u.open {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, loginMaxBody)
	if err := r.ParseForm(); err != nil {
		return u.render(w, http.StatusBadRequest, "login", &pageData{Message: "The sign-in form could not be read: send it again."})
	}
	value, c, ok := u.signIn(r.Context(), strings.TrimSpace(r.PostForm.Get("token")))
	if !ok {
		u.log.LogAttrs(r.Context(), slog.LevelWarn, "dashboard sign-in refused", slog.String("remote", r.RemoteAddr))
		return u.render(w, http.StatusUnauthorized, "login", &pageData{Message: "That token is not accepted: check it, or ask an admin for one."})
	}
	http.SetCookie(w, &http.Cookie{
		Name:     CookieName,
		Value:    value,
		Path:     "/",
		MaxAge:   int(cookieMaxAge / time.Second),
		HttpOnly: true,
		Secure:   overTLS(r),
		SameSite: http.SameSiteStrictMode,
	})
	u.log.LogAttrs(r.Context(), slog.LevelInfo, "dashboard sign-in", slog.String("name", c.Name), slog.String("role", c.Role))
	http.Redirect(w, r, "/", http.StatusSeeOther)
	return nil
}

// handleLogout signs the cookie's holder out and forgets the cookie.
func (u *Dashboard) handleLogout(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if c, err := r.Cookie(CookieName); err == nil {
		u.signOut(r.Context(), c.Value)
	}
	clearCookie(w, r)
	http.Redirect(w, r, "/", http.StatusSeeOther)
	return nil
}

func clearCookie(w http.ResponseWriter, r *http.Request) { clearNamedCookie(w, r, CookieName) }

func clearNamedCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: overTLS(r), SameSite: http.SameSiteStrictMode,
	})
}

// overTLS reports whether the browser reached the page over TLS: this
// server's, or that of a proxy in front which says so
// (X-Forwarded-Proto: https). Trusting the header is safe here: a cookie
// marked Secure when it need not be only stays off plain HTTP.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// panelJSON is one panel in the answer of GET /ui/panels.
type panelJSON struct {
	Name string `json:"name"`
	Show bool   `json:"show"`
	HTML string `json:"html"`
}

// handlePanels renders the panels named by ?p= (all without it) for the
// page to put in place after an event.
func (u *Dashboard) handlePanels(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "p"); err != nil {
		return err
	}
	var want []*panel
	if names := q["p"]; len(names) > 0 {
		for _, n := range names {
			p := panelNamed(n)
			if p == nil {
				return arbiter.Errorf(arbiter.EInvalid, "unknown panel %q: the panels are %s", arbiter.Clip(n, 40), strings.Join(Panels(), ", "))
			}
			want = append(want, p)
		}
	} else {
		for i := range panels {
			want = append(want, &panels[i])
		}
	}
	v := u.newView(r, c)
	out := struct {
		Now    time.Time   `json:"now"`
		Panels []panelJSON `json:"panels"`
	}{Now: v.Now, Panels: make([]panelJSON, 0, len(want))}
	for _, p := range want {
		html, show, err := u.renderPanel(v, p)
		if err != nil {
			return err
		}
		out.Panels = append(out.Panels, panelJSON{Name: p.name, Show: show, HTML: string(html)})
	}
	httpio.WriteJSON(w, http.StatusOK, out)
	return nil
}

// handleStatic serves an embedded static file. With the ?v= of its
// current content it may be cached for good; otherwise it is revalidated.
func (u *Dashboard) handleStatic(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	a, ok := u.static[r.PathValue("file")]
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "no static file %q", arbiter.Clip(r.PathValue("file"), 60))
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

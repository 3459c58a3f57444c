package httpapi

// The audit trail's HTTP side (arbiter.AuditEntry): wrap reports every
// admin action and every refused request here; GET /api/v1/audit lists
// the trail.
//
// What is an admin action: a state-changing request (not GET or HEAD)
// that succeeded, made with an admin token, the operator token or a
// session of an admin — or, on a server without tokens, any request to a
// route only admins may use (drain, cancel, reload …). What is refused:
// every 401 and 403.
//
// Refusals can come in floods, and each entry is a commit: the first
// auditRefusedPerWindow refusals of each minute are written one by one;
// past them, refusals are counted per client address (at most
// auditMaxAddrs addresses, the rest together under "*") and written as one
// entry per address with a Count when the minute is over — at the next
// refusal or action, when the trail is listed, or when the server closes.
// So a flood costs a bounded number of commits, and the store keeps the
// newest entries only (engine.Config.AuditKeep).

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// Bounds of the refusals written one by one.
const (
	auditWindow           = time.Minute
	auditRefusedPerWindow = 60
	auditMaxAddrs         = 1024
	auditWriteTimeout     = 5 * time.Second
)

// auditor writes the trail through the plane.
type auditor struct {
	plane Plane
	now   func() time.Time

	mu      sync.Mutex
	window  time.Time // start of the current window
	written int       // refusals written one by one in it
	folded  map[string]*arbiter.AuditEntry
}

func newAuditor(p Plane) *auditor {
	return &auditor{plane: p, now: time.Now, folded: map[string]*arbiter.AuditEntry{}}
}

// action records an admin action.
func (a *auditor) action(ctx context.Context, e arbiter.AuditEntry) {
	e.Kind = arbiter.AuditAction
	a.write(ctx, append(a.takeFolded(false), e))
}

// refused records a refused request, or folds it into its address's count.
func (a *auditor) refused(ctx context.Context, e arbiter.AuditEntry) {
	e.Kind = arbiter.AuditRefused
	now := a.now()
	a.mu.Lock()
	pending := a.rollLocked(now)
	if a.written < auditRefusedPerWindow {
		a.written++
		a.mu.Unlock()
		a.write(ctx, append(pending, e))
		return
	}
	key := e.Address
	if _, ok := a.folded[key]; !ok && len(a.folded) >= auditMaxAddrs {
		key = "*"
	}
	f := a.folded[key]
	if f == nil {
		f = &arbiter.AuditEntry{Kind: arbiter.AuditRefused, Address: key, Action: "refused requests",
			Detail: "more refusals than " + strconv.Itoa(auditRefusedPerWindow) + " a minute, counted together; the first was: " + e.Action + " " + e.Target}
		a.folded[key] = f
	}
	f.Count++
	t := now.UTC()
	f.Until = &t
	a.mu.Unlock()
	a.write(ctx, pending)
}

// rollLocked starts a new window when the current one is over, returning
// the folded entries of the old one to write.
func (a *auditor) rollLocked(now time.Time) []arbiter.AuditEntry {
	if now.Sub(a.window) < auditWindow {
		return nil
	}
	a.window, a.written = now, 0
	return a.drainLocked()
}

func (a *auditor) drainLocked() []arbiter.AuditEntry {
	if len(a.folded) == 0 {
		return nil
	}
	out := make([]arbiter.AuditEntry, 0, len(a.folded))
	for _, f := range a.folded {
		out = append(out, *f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	clear(a.folded)
	return out
}

// takeFolded returns the folded entries to write: those of a window that
// is over, or all of them when force.
func (a *auditor) takeFolded(force bool) []arbiter.AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	if force {
		return a.drainLocked()
	}
	return a.rollLocked(a.now())
}

// write records entries; the request may have gone, the trail is written
// anyway (briefly).
func (a *auditor) write(ctx context.Context, es []arbiter.AuditEntry) {
	if len(es) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditWriteTimeout)
	defer cancel()
	_, _ = a.plane.Do(ctx, arbiter.RecordAuditEntries{Entries: es})
}

// Close writes what is folded, as the server stops.
func (s *Server) Close() {
	s.audit.write(context.Background(), s.audit.takeFolded(true))
}

// Audit records an admin action that did not come through HTTP (a reload
// on SIGHUP, say).
func (s *Server) Audit(ctx context.Context, e arbiter.AuditEntry) { s.audit.action(ctx, e) }

// auditRequest reports a finished request to the trail when it is an
// admin action or a refusal.
func (s *Server) auditRequest(r *http.Request, route string, access roles, c arbiter.Caller, via string, status int, msg string) {
	e := arbiter.AuditEntry{Principal: c.Name, Role: c.Role, Via: via, Address: remoteIP(r.RemoteAddr),
		Action: route, Target: auditTarget(r.URL), Status: status}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.Detail = msg
		s.audit.refused(r.Context(), e)
	case status >= 400 || r.Method == http.MethodGet || r.Method == http.MethodHead || access&publicRoute != 0:
	case via == viaOperator || (!s.open && c.Role == arbiter.RoleAdmin) || access == roleAdmin || access&fleetOperatorAuth != 0:
		s.audit.action(r.Context(), e)
	}
}

// auditTarget is the request's path and query as the trail keeps them,
// with the values of credential parameters (the swap lock's ?token=)
// replaced by "xxxxx": no stored record holds a token.
func auditTarget(u *url.URL) string {
	target := u.RequestURI()
	if u.RawQuery == "" {
		return target
	}
	parts := strings.Split(u.RawQuery, "&")
	for i, p := range parts {
		name, _, hasValue := strings.Cut(p, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if hasValue && credentialParam(name) {
			parts[i] = name + "=xxxxx"
		}
	}
	path, _, _ := strings.Cut(target, "?")
	return path + "?" + strings.Join(parts, "&")
}

// credentialParam reports whether a query parameter's name says it
// carries a credential.
func credentialParam(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "token") || strings.Contains(n, "secret") || strings.Contains(n, "password")
}

// auditPage is the answer of GET /api/v1/audit.
type auditPage struct {
	Entries []arbiter.AuditEntry `json:"entries"`
	// Next is the before= of the next (older) page; absent on the last.
	Next *int64 `json:"next,omitempty"`
}

const (
	defaultAuditLimit = 100
	maxAuditLimit     = 1000
)

func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "kind", "before", "limit"); err != nil {
		return err
	}
	f := arbiter.AuditFilter{Kind: q.Get("kind"), Limit: defaultAuditLimit}
	switch f.Kind {
	case "", arbiter.AuditAction, arbiter.AuditRefused:
	default:
		return arbiter.Errorf(arbiter.EInvalid, "kind %q is not action or refused", arbiter.Clip(f.Kind, 40))
	}
	for _, p := range []struct {
		name string
		dst  *int64
		max  int64
	}{{"before", &f.Before, 1 << 62}, {"limit", nil, maxAuditLimit}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > p.max {
			return arbiter.Errorf(arbiter.EInvalid, "%s %q must be a whole number from 1 to %d", p.name, arbiter.Clip(v, 40), p.max)
		}
		if p.dst != nil {
			*p.dst = n
		} else {
			f.Limit = int(n)
		}
	}
	// What is folded is written first, so the list shows it.
	s.audit.write(r.Context(), s.audit.takeFolded(true))
	recs := s.plane.Records(arbiter.RecordAudit) // oldest first
	page := auditPage{Entries: []arbiter.AuditEntry{}}
	for i := len(recs) - 1; i >= 0; i-- {
		e, ok := recs[i].Value.(arbiter.AuditEntry)
		if !ok || (f.Before > 0 && e.Seq >= f.Before) || (f.Kind != "" && e.Kind != f.Kind) {
			continue
		}
		if len(page.Entries) == f.Limit {
			next := page.Entries[len(page.Entries)-1].Seq
			page.Next = &next
			break
		}
		page.Entries = append(page.Entries, e)
	}
	httpio.WriteJSON(w, http.StatusOK, page)
	return nil
}

package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// The coordination API (docs/reference/coordination.md): locks, services and their
// catalogs, swaps, webhook subscriptions and deliveries, the schedule
// registry — natively under /api/v1 here, and the compatible /api/swap…
// and /api/schedule endpoints in compat_swap.go.

// CoordOptions configure the coordination API.
type CoordOptions struct {
	// Deliveries is the webhook delivery log shown by
	// GET /api/v1/webhooks/deliveries; nil answers 404.
	Deliveries arbiter.DeliveryLog
	// AllowLinkLocalWebhooks lets subscriptions target link-local and cloud
	// metadata addresses ([webhooks] allow_link_local).
	AllowLinkLocalWebhooks bool
	// Now is the clock a lock's remaining time is computed with (default
	// time.Now); the server passes the control loop's.
	Now func() time.Time
}

// Headers carrying lock tokens: X-Lock-Token on the native lock routes,
// X-Swap-Lock-Token on swaps (and the compatible lock routes).
const (
	coordLockTokenHeader = "X-Lock-Token"
	coordSwapTokenHeader = "X-Swap-Lock-Token"
)

// coordTokenHeaders are headers people put lock tokens in by mistake; a
// request carrying one where another is expected is refused, naming the
// right one, rather than treated as presenting no token.
var coordTokenHeaders = []string{coordLockTokenHeader, coordSwapTokenHeader, "X-Swap-Token", "X-Lock", "Lock-Token", "X-Token"}

// coordToken returns the lock token of r from header want. Errors: invalid
// when the token is in another header people confuse with it.
func coordToken(r *http.Request, want string) (string, error) {
	for _, h := range coordTokenHeaders {
		if h != want && r.Header.Get(h) != "" {
			return "", arbiter.Errorf(arbiter.EInvalid, "the lock token is in header %s; send it in %s", h, want)
		}
	}
	tok := strings.TrimSpace(r.Header.Get(want))
	if len(tok) > arbiter.MaxLockTokenBytes {
		return "", arbiter.Errorf(arbiter.EInvalid, "%s is longer than %d bytes", want, arbiter.MaxLockTokenBytes)
	}
	return tok, nil
}

// coordNewToken draws a lock token: 128 random bits, hex. The engine stays
// deterministic: tokens come in with the command (arbiter.AcquireLock).
func coordNewToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("httpapi: draw a lock token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func (s *Server) coordNow() time.Time {
	if s.coord.Now != nil {
		return s.coord.Now().UTC()
	}
	return time.Now().UTC()
}

// coordForce parses ?force= as the original's framework parsed a boolean
// query parameter, in any case: its Python clients send
// params={"force": True} as ?force=True.
func coordForce(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("force")
	switch strings.ToLower(v) {
	case "", "false", "f", "no", "n", "off", "0":
		return false, nil
	case "true", "t", "yes", "y", "on", "1":
		return true, nil
	default:
		return false, arbiter.Errorf(arbiter.EInvalid, "force %q must be true or false", arbiter.Clip(v, 20))
	}
}

// coordLockBody is the native error answer of a refusal by a lock: the
// error, and the lock's public state.
type coordLockBody struct {
	Error errorDetail       `json:"error"`
	Lock  arbiter.LockState `json:"lock"`
}

// coordError writes a *arbiter.LockHeldError with the lock's state and
// returns nil; any other error is returned for the usual error answer.
func coordError(w http.ResponseWriter, r *http.Request, err error) error {
	err = httpio.ContextError(r.Context(), err)
	var held *arbiter.LockHeldError
	if errors.As(err, &held) {
		code := arbiter.ErrorCode(err)
		httpio.WriteJSON(w, status[code], coordLockBody{errorDetail{Code: code, Message: arbiter.ErrorMessage(err)}, held.Lock})
		return nil
	}
	return err
}

// coordRecord returns the committed record (kind, key) as T.
func coordRecord[T any](s *Server, kind, key string) (T, bool) {
	v, ok := s.plane.Record(kind, key)
	if !ok {
		var zero T
		return zero, false
	}
	return coordValue[T](v)
}

func coordValue[T any](v any) (T, bool) {
	switch x := v.(type) {
	case T:
		return x, true
	case *T:
		if x != nil {
			return *x, true
		}
	case json.RawMessage:
		var t T
		if json.Unmarshal(x, &t) == nil {
			return t, true
		}
	}
	var zero T
	return zero, false
}

func coordRecords[T any](s *Server, kind string) []T {
	out := []T{}
	for _, rec := range s.plane.Records(kind) {
		if v, ok := coordValue[T](rec.Value); ok {
			out = append(out, v)
		}
	}
	return out
}

// Locks.

// lockState is the public state of lock name now: free once its expiry has
// passed, even if the engine's tick has not yet committed.
func (s *Server) lockState(name string) arbiter.LockState {
	now := s.coordNow()
	if l, ok := coordRecord[arbiter.Lock](s, arbiter.RecordLock, name); ok && l.ExpiresAt.After(now) {
		return l.Public(now)
	}
	return arbiter.FreeLock(name)
}

func coordLockName(r *http.Request) (string, error) {
	name := r.PathValue("name")
	return name, arbiter.ValidateLockName(name)
}

func (s *Server) handleLocks(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	out := []arbiter.LockState{}
	for _, l := range coordRecords[arbiter.Lock](s, arbiter.RecordLock) {
		if st := s.lockState(l.Name); st.Held {
			out = append(out, st)
		}
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Locks []arbiter.LockState `json:"locks"`
	}{out})
	return nil
}

func (s *Server) handleLock(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	name, err := coordLockName(r)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, s.lockState(name))
	return nil
}

// coordTTL is a native ttl_s: absent (the default, 15 minutes) or a number
// of seconds from 1 to 86400.
type coordTTL struct {
	set bool
	v   float64
}

// UnmarshalJSON takes a number of seconds or null.
func (t *coordTTL) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, &t.v); err != nil {
		return arbiter.Errorf(arbiter.EInvalid, "ttl_s: want a number of seconds from 1 to 86400, got %s", arbiter.Clip(string(b), 40))
	}
	t.set = true
	return nil
}

func (t coordTTL) duration() (time.Duration, error) {
	if !t.set {
		return 0, nil // the engine's default
	}
	if math.IsNaN(t.v) || t.v < 1 || t.v > arbiter.LockTTLMax.Seconds() {
		return 0, arbiter.Errorf(arbiter.EInvalid, "ttl_s %v is out of range: a lock is held from 1 to 86400 seconds", t.v)
	}
	return time.Duration(t.v * float64(time.Second)), nil
}

func (s *Server) handleLockAcquire(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, err := coordLockName(r)
	if err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	var b struct {
		Holder string   `json:"holder"`
		TTLS   coordTTL `json:"ttl_s"`
		Note   string   `json:"note"`
		Token  string   `json:"token"`
	}
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	if b.Token == "" {
		if b.Token, err = coordToken(r, coordLockTokenHeader); err != nil {
			return err
		}
	}
	ttl, err := b.TTLS.duration()
	if err != nil {
		return err
	}
	if strings.TrimSpace(b.Holder) == "" {
		return arbiter.Errorf(arbiter.EInvalid, "holder is required: say who takes the lock (it is shown to others, it is not a credential)")
	}
	tok, err := coordNewToken()
	if err != nil {
		return err
	}
	g, err := arbiter.Do(r.Context(), s.plane, arbiter.AcquireLock{Caller: c, Name: name, Holder: b.Holder, TTL: ttl, Note: b.Note, Token: b.Token, NewToken: tok})
	if err != nil {
		return coordError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, g)
	return nil
}

func (s *Server) handleLockExtend(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, err := coordLockName(r)
	if err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	tok, err := coordToken(r, coordLockTokenHeader)
	if err != nil {
		return err
	}
	if tok == "" {
		return arbiter.Errorf(arbiter.EInvalid, "extending a lock needs its token in the %s header", coordLockTokenHeader)
	}
	var b struct {
		TTLS coordTTL `json:"ttl_s"`
		Note *string  `json:"note"`
	}
	if err := s.coordBody(w, r, &b, true); err != nil {
		return err
	}
	ttl, err := b.TTLS.duration()
	if err != nil {
		return err
	}
	g, err := arbiter.Do(r.Context(), s.plane, arbiter.ExtendLock{Caller: c, Name: name, Token: tok, TTL: ttl, Note: b.Note})
	if err != nil {
		return coordError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, g)
	return nil
}

func (s *Server) handleLockRelease(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	name, err := coordLockName(r)
	if err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query(), "force"); err != nil {
		return err
	}
	force, err := coordForce(r)
	if err != nil {
		return err
	}
	tok, err := coordToken(r, coordLockTokenHeader)
	if err != nil {
		return err
	}
	if tok == "" && !force {
		return arbiter.Errorf(arbiter.EInvalid, "releasing a lock needs its token in the %s header (or ?force=true from an admin)", coordLockTokenHeader)
	}
	rel, err := arbiter.Do(r.Context(), s.plane, arbiter.ReleaseLock{Caller: c, Name: name, Token: tok, Force: force})
	if err != nil {
		return coordError(w, r, err)
	}
	if !rel.Released {
		return arbiter.Errorf(arbiter.EConflict, "lock %q is not held (it may have expired): nothing to release", name)
	}
	httpio.WriteJSON(w, http.StatusOK, rel)
	return nil
}

// coordBody decodes a JSON body strictly into v; with optional, an empty
// body leaves v as it is.
func (s *Server) coordBody(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	if optional && len(bytes.TrimSpace(buf.Bytes())) == 0 {
		return nil
	}
	return decodeJSON(buf.Bytes(), v)
}

// Services and the catalog.

func (s *Server) coordService(r *http.Request) (arbiter.Service, error) {
	name := r.PathValue("name")
	if err := arbiter.ValidateName("service name", name); err != nil {
		return arbiter.Service{}, err
	}
	svc, ok := coordRecord[arbiter.Service](s, arbiter.RecordService, name)
	if !ok {
		return arbiter.Service{}, arbiter.Errorf(arbiter.ENotFound, "service %q is not configured (see GET /api/v1/services)", name)
	}
	return svc, nil
}

// defaultService is the service the compatible endpoints act on.
func (s *Server) defaultService() (arbiter.Service, error) {
	svcs := coordRecords[arbiter.Service](s, arbiter.RecordService)
	for _, svc := range svcs {
		if svc.Default {
			return svc, nil
		}
	}
	if len(svcs) == 0 {
		return arbiter.Service{}, arbiter.Errorf(arbiter.ENotFound, "no services are configured: add a [[services]] section to the configuration")
	}
	return arbiter.Service{}, arbiter.Errorf(arbiter.ENotFound, "no service is the default: mark one [[services]] default = true")
}

func (s *Server) handleServices(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Services []arbiter.Service `json:"services"`
	}{coordRecords[arbiter.Service](s, arbiter.RecordService)})
	return nil
}

func (s *Server) handleService(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	svc, err := s.coordService(r)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, svc)
	return nil
}

// catalog returns service's catalog entries in key order.
func (s *Server) catalog(service string) []arbiter.CatalogEntry {
	out := []arbiter.CatalogEntry{}
	for _, ce := range coordRecords[arbiter.CatalogEntry](s, arbiter.RecordCatalog) {
		if ce.Service == service {
			out = append(out, ce)
		}
	}
	return out
}

func (s *Server) handleCatalog(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	svc, err := s.coordService(r)
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Service string                 `json:"service"`
		Catalog []arbiter.CatalogEntry `json:"catalog"`
	}{svc.Name, s.catalog(svc.Name)})
	return nil
}

func coordModelKey(r *http.Request) (string, error) {
	key := r.PathValue("key")
	return key, arbiter.ValidateName("model key", key)
}

func (s *Server) handleCatalogEntry(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	svc, key, err := s.coordServiceModel(r)
	if err != nil {
		return err
	}
	ce, ok := coordRecord[arbiter.CatalogEntry](s, arbiter.RecordCatalog, arbiter.CatalogKey(svc.Name, key))
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "model key %q is not in the catalog of service %s", key, svc.Name)
	}
	httpio.WriteJSON(w, http.StatusOK, ce)
	return nil
}

// coordServiceModel returns the {service} and {key} path values, checked:
// the service configured, the key well formed.
func (s *Server) coordServiceModel(r *http.Request) (arbiter.Service, string, error) {
	svc, err := s.coordService(r)
	if err != nil {
		return arbiter.Service{}, "", err
	}
	key, err := coordModelKey(r)
	if err != nil {
		return arbiter.Service{}, "", err
	}
	return svc, key, nil
}

func (s *Server) handleCatalogPut(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	svc, key, err := s.coordServiceModel(r)
	if err != nil {
		return err
	}
	var b struct {
		Repo       string   `json:"repo"`
		LocalPath  string   `json:"local_path"`
		Args       []string `json:"args"`
		ServedName string   `json:"served_name"`
	}
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	ce, err := arbiter.Do(r.Context(), s.plane, arbiter.PutCatalogEntry{Caller: c, Entry: arbiter.CatalogEntry{
		Service: svc.Name, Key: key, Repo: b.Repo, LocalPath: b.LocalPath, Args: b.Args, ServedName: b.ServedName,
	}})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, ce)
	return nil
}

func (s *Server) handleCatalogDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	svc, key, err := s.coordServiceModel(r)
	if err != nil {
		return err
	}
	ce, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteCatalogEntry{Caller: c, Service: svc.Name, Key: key})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, ce)
	return nil
}

// validate checks a swap of svc to key from the committed catalog.
func (s *Server) validate(svc arbiter.Service, key string) arbiter.SwapValidation {
	var entry *arbiter.CatalogEntry
	if ce, ok := coordRecord[arbiter.CatalogEntry](s, arbiter.RecordCatalog, arbiter.CatalogKey(svc.Name, key)); ok {
		entry = &ce
	}
	return arbiter.ValidateSwap(&svc, key, entry)
}

func (s *Server) handleCatalogValidate(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	svc, err := s.coordService(r)
	if err != nil {
		return err
	}
	v, err := s.validateKnown(svc, r.PathValue("key"))
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, v)
	return nil
}

// Swaps.

// coordSwapBody is the body of a swap request, natively and compatibly.
type coordSwapBody struct {
	ModelKey string `json:"model_key"`
	DryRun   bool   `json:"dry_run"`
}

// requestSwap builds and applies a swap request for service ("" = the
// default): the token from X-Swap-Lock-Token, ?force= for admins.
func (s *Server) requestSwap(r *http.Request, c arbiter.Caller, service string, b coordSwapBody) (arbiter.Swap, error) {
	if err := httpio.OnlyParams(r.URL.Query(), "force"); err != nil {
		return arbiter.Swap{}, err
	}
	force, err := coordForce(r)
	if err != nil {
		return arbiter.Swap{}, err
	}
	tok, err := coordToken(r, coordSwapTokenHeader)
	if err != nil {
		return arbiter.Swap{}, err
	}
	if strings.TrimSpace(b.ModelKey) == "" {
		return arbiter.Swap{}, arbiter.Errorf(arbiter.EInvalid, "model_key is required: name a catalog entry (see arbiter catalog list)")
	}
	return arbiter.Do(r.Context(), s.plane, arbiter.RequestSwap{Caller: c, Service: service, ModelKey: b.ModelKey, DryRun: b.DryRun, LockToken: tok, Force: force})
}

func (s *Server) handleSwapRequest(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	svc, err := s.coordService(r)
	if err != nil {
		return err
	}
	var b coordSwapBody
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	sw, err := s.requestSwap(r, c, svc.Name, b)
	if err != nil {
		return coordError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusAccepted, sw)
	return nil
}

func coordSwapID(id string) error {
	if id == "" || len(id) > 19 || strings.Trim(id, "0123456789") != "" || id[0] == '0' {
		return arbiter.Errorf(arbiter.EInvalid, "swap id %q is not a swap number", arbiter.Clip(id, 40))
	}
	return nil
}

func (s *Server) swap(id string) (arbiter.Swap, error) {
	if err := coordSwapID(id); err != nil {
		return arbiter.Swap{}, err
	}
	sw, ok := coordRecord[arbiter.Swap](s, arbiter.RecordSwap, id)
	if !ok {
		return arbiter.Swap{}, arbiter.Errorf(arbiter.ENotFound, "swap %s is not known (it may have left the history)", id)
	}
	return sw, nil
}

func (s *Server) handleSwaps(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "service", "state", "limit"); err != nil {
		return err
	}
	state := q.Get("state")
	switch state {
	case "", arbiter.SwapPending, arbiter.SwapRunning, arbiter.SwapComplete, arbiter.SwapFailed:
	default:
		return arbiter.Errorf(arbiter.EInvalid, "state %q is not one of pending, running, complete, failed", arbiter.Clip(state, 20))
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return arbiter.Errorf(arbiter.EInvalid, "limit %q must be an integer from 1 to 1000", arbiter.Clip(v, 20))
		}
		limit = n
	}
	all := coordRecords[arbiter.Swap](s, arbiter.RecordSwap)
	sort.Slice(all, func(i, j int) bool { return arbiter.SwapIDLess(all[j].ID, all[i].ID) })
	out := []arbiter.Swap{}
	for _, sw := range all {
		if (q.Get("service") == "" || sw.Service == q.Get("service")) && (state == "" || sw.State == state) {
			sw.Log = nil
			out = append(out, sw)
			if len(out) == limit {
				break
			}
		}
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Swaps []arbiter.Swap `json:"swaps"`
	}{out})
	return nil
}

func (s *Server) handleSwap(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	sw, err := s.swap(r.PathValue("id"))
	if err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, sw)
	return nil
}

// swapStream writes a swap's log as it grows until the swap ends: line
// writes one line (n counts from 0 across the whole log), end the final
// state. It reads the log so far from the view, then follows the swap's
// events, so no line is lost or repeated.
func (s *Server) swapStream(w http.ResponseWriter, r *http.Request, id string, line func(buf *bytes.Buffer, n int, l string), end func(buf *bytes.Buffer, sw *arbiter.Swap)) error {
	since := s.plane.LastSeq() // before the read: later changes come as events
	sw, err := s.swap(id)
	if err != nil {
		return err
	}
	ctx := r.Context()
	rc := httpio.StartStream(w)
	var buf bytes.Buffer
	sent := sw.LogDropped
	emit := func(offset int, lines []string) {
		for i, l := range lines {
			if n := offset + i; n >= sent {
				line(&buf, n, l)
				sent = n + 1
			}
		}
	}
	flush := func() bool {
		if buf.Len() == 0 {
			return true
		}
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		return err == nil && rc.Flush() == nil
	}
	emit(sw.LogDropped, sw.Log)
	if sw.Done() {
		end(&buf, &sw)
		flush()
		return nil
	}
	if !flush() {
		return nil
	}
	ch, err := s.plane.Subscribe(ctx, since)
	if err != nil {
		return nil
	}
	// The view may have moved between LastSeq and Subscribe.
	if cur, err := s.swap(id); err == nil {
		emit(cur.LogDropped, cur.Log)
		if cur.Done() {
			end(&buf, &cur)
			flush()
			return nil
		}
	}
	tick := time.NewTicker(s.sseHeartbeat)
	defer tick.Stop()
	subject := "swap/" + id
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			buf.WriteString(": keepalive\n\n")
		case ev, ok := <-ch:
			if !ok {
				// Fell behind: the client reconnects and reads the log again.
				return nil
			}
			if ev.Subject != subject {
				continue
			}
			switch ev.Kind {
			case arbiter.EventSwapLog:
				var lg arbiter.SwapLog
				if json.Unmarshal(ev.Data, &lg) == nil {
					emit(lg.Offset, lg.Lines)
				}
			case arbiter.EventSwapComplete, arbiter.EventSwapFailed:
				cur, err := s.swap(id)
				if err != nil {
					_ = json.Unmarshal(ev.Data, &cur)
				}
				emit(cur.LogDropped, cur.Log)
				end(&buf, &cur)
				flush()
				return nil
			}
		}
		if !flush() {
			return nil
		}
	}
}

// handleSwapStream streams a swap's log natively: "log" events whose data
// is {"n","line"}, then one "end" event with the swap (without its log).
func (s *Server) handleSwapStream(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	enc := func(buf *bytes.Buffer, v any) {
		b, _ := json.Marshal(v)
		buf.Write(b)
	}
	return s.swapStream(w, r, r.PathValue("id"),
		func(buf *bytes.Buffer, n int, l string) {
			buf.WriteString("id: " + strconv.Itoa(n) + "\nevent: log\ndata: ")
			enc(buf, struct {
				N    int    `json:"n"`
				Line string `json:"line"`
			}{n, l})
			buf.WriteString("\n\n")
		},
		func(buf *bytes.Buffer, sw *arbiter.Swap) {
			c := *sw
			c.Log = nil
			buf.WriteString("event: end\ndata: ")
			enc(buf, c)
			buf.WriteString("\n\n")
		})
}

// coordMachine parses the {name} of an agent's machine.
func coordMachine(r *http.Request) (string, error) {
	name := r.PathValue("name")
	return name, arbiter.ValidateName("machine name", name)
}

// handleSwapClaim gives the agent of a machine its next swap: 200 with the
// swap, or 204 when there is none within ?wait= seconds (a long-poll).
func (s *Server) handleSwapClaim(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	machine, err := coordMachine(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "wait", "instance"); err != nil {
		return err
	}
	var wait time.Duration
	if q.Has("wait") {
		if wait, err = parseWait(q.Get("wait")); err != nil {
			return err
		}
	}
	instance := q.Get("instance")
	claim := func() (*arbiter.Swap, error) {
		return arbiter.Do(r.Context(), s.plane, arbiter.ClaimSwap{Caller: c, Machine: machine, Instance: instance})
	}
	since := s.plane.LastSeq()
	sw, err := claim()
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	if sw == nil && wait > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		for misses := 0; sw == nil && ctx.Err() == nil && misses <= 3; {
			if !s.swapWake.wait(ctx, s.plane, machine, since) { // a swap pending on the machine
				misses++ // cannot tell, or the plane closed: look, a few times
			}
			if ctx.Err() != nil {
				break
			}
			since = s.plane.LastSeq()
			if sw, err = claim(); err != nil {
				return httpio.ContextError(r.Context(), err)
			}
		}
		if err := r.Context().Err(); err != nil {
			return httpio.ContextError(r.Context(), err) // refused meanwhile, or the client went
		}
	}
	if sw == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	httpio.WriteJSON(w, http.StatusOK, sw)
	return nil
}

func (s *Server) handleSwapLog(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id := r.PathValue("id")
	if err := coordSwapID(id); err != nil {
		return err
	}
	var b struct {
		Machine string   `json:"machine"`
		Lines   []string `json:"lines"`
	}
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	if err := arbiter.ValidateName("machine", b.Machine); err != nil {
		return err
	}
	if _, err := s.plane.Do(r.Context(), arbiter.AppendSwapLog{Caller: c, ID: id, Machine: b.Machine, Lines: b.Lines}); err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleSwapFinish(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id := r.PathValue("id")
	if err := coordSwapID(id); err != nil {
		return err
	}
	var b struct {
		Machine    string `json:"machine"`
		OK         bool   `json:"ok"`
		ReturnCode *int   `json:"returncode"`
		Reason     string `json:"reason"`
	}
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	if err := arbiter.ValidateName("machine", b.Machine); err != nil {
		return err
	}
	sw, err := arbiter.Do(r.Context(), s.plane, arbiter.FinishSwap{Caller: c, ID: id, Machine: b.Machine, ReturnCode: b.ReturnCode, OK: b.OK, Reason: b.Reason})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, sw)
	return nil
}

// handleSwapCancel ends a pending or running swap: its requester's or an
// admin's, with an optional {"reason"}.
func (s *Server) handleSwapCancel(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id := r.PathValue("id")
	if err := coordSwapID(id); err != nil {
		return err
	}
	var b struct {
		Reason string `json:"reason"`
	}
	if err := s.coordBody(w, r, &b, true); err != nil {
		return err
	}
	sw, err := arbiter.Do(r.Context(), s.plane, arbiter.CancelSwap{Caller: c, ID: id, Reason: b.Reason})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, sw)
	return nil
}

// Webhooks.

func coordWebhookID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	return id, arbiter.ValidateName("webhook id", id)
}

func (s *Server) handleWebhooks(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	out := []arbiter.Webhook{}
	for _, wh := range coordRecords[arbiter.Webhook](s, arbiter.RecordWebhook) {
		out = append(out, wh.Public())
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Webhooks []arbiter.Webhook `json:"webhooks"`
	}{out})
	return nil
}

func (s *Server) handleWebhook(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id, err := coordWebhookID(r)
	if err != nil {
		return err
	}
	wh, ok := coordRecord[arbiter.Webhook](s, arbiter.RecordWebhook, id)
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "webhook %q does not exist (see GET /api/v1/webhooks)", id)
	}
	httpio.WriteJSON(w, http.StatusOK, wh.Public())
	return nil
}

// coordNewWebhookSecret draws a Standard Webhooks secret, whsec_ and the
// base64 of 32 random bytes.
func coordNewWebhookSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("httpapi: draw a webhook secret: %w", err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:]), nil
}

func (s *Server) handleWebhookCreate(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	var b struct {
		ID     string   `json:"id"`
		URL    string   `json:"url"`
		Secret string   `json:"secret"`
		Kinds  []string `json:"kinds"`
		Format string   `json:"format"`
	}
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	if b.Format == "" {
		b.Format = arbiter.WebhookStandard
	}
	if b.Secret == "" && b.Format == arbiter.WebhookStandard {
		sec, err := coordNewWebhookSecret()
		if err != nil {
			return err
		}
		b.Secret = sec
	}
	wh, err := arbiter.Do(r.Context(), s.plane, arbiter.CreateWebhook{Caller: c, AllowLinkLocal: s.coord.AllowLinkLocalWebhooks,
		Webhook: arbiter.Webhook{ID: b.ID, URL: b.URL, Secret: b.Secret, Kinds: b.Kinds, Format: b.Format}})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	// The secret is shown this once.
	httpio.WriteJSON(w, http.StatusCreated, wh)
	return nil
}

func (s *Server) handleWebhookDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := coordWebhookID(r)
	if err != nil {
		return err
	}
	wh, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteWebhook{Caller: c, ID: id})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, wh)
	return nil
}

func (s *Server) handleWebhookEnable(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	return s.setWebhook(w, r, c, true)
}

func (s *Server) handleWebhookDisable(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	return s.setWebhook(w, r, c, false)
}

func (s *Server) setWebhook(w http.ResponseWriter, r *http.Request, c arbiter.Caller, on bool) error {
	id, err := coordWebhookID(r)
	if err != nil {
		return err
	}
	wh, err := arbiter.Do(r.Context(), s.plane, arbiter.SetWebhookEnabled{Caller: c, ID: id, Enabled: on})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, wh)
	return nil
}

func (s *Server) handleDeliveries(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "webhook", "state", "limit"); err != nil {
		return err
	}
	if s.coord.Deliveries == nil {
		return arbiter.Errorf(arbiter.ENotFound, "this server keeps no webhook delivery log")
	}
	f := arbiter.DeliveryFilter{Webhook: q.Get("webhook"), State: q.Get("state"), Limit: 100}
	if f.Webhook != "" {
		if err := arbiter.ValidateName("webhook", f.Webhook); err != nil {
			return err
		}
	}
	switch f.State {
	case "", arbiter.DeliveryPending, arbiter.DeliveryDelivered, arbiter.DeliveryFailed:
	default:
		return arbiter.Errorf(arbiter.EInvalid, "state %q is not one of pending, delivered, failed", arbiter.Clip(f.State, 20))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return arbiter.Errorf(arbiter.EInvalid, "limit %q must be an integer from 1 to 1000", arbiter.Clip(v, 20))
		}
		f.Limit = n
	}
	ds, err := s.coord.Deliveries.Deliveries(r.Context(), f)
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Deliveries []arbiter.Delivery `json:"deliveries"`
	}{ds})
	return nil
}

// Schedules.

// coordCronParser reads standard 5-field expressions and @descriptors.
var coordCronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// coordDescriptors are the @ forms accepted: the usual ones, not @every or
// @reboot.
var coordDescriptors = map[string]bool{
	"@yearly": true, "@annually": true, "@monthly": true, "@weekly": true, "@daily": true, "@midnight": true, "@hourly": true,
}

// ParseCron checks a cron expression of the schedule registry: five fields
// (minute hour day-of-month month day-of-week) or one of @yearly,
// @annually, @monthly, @weekly, @daily, @midnight, @hourly; times are UTC.
// It returns nil for "". Errors: invalid, saying what is wrong.
func ParseCron(spec string) (arbiter.CronSchedule, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case spec == "":
		return nil, nil
	case len(spec) > arbiter.MaxScheduleCron:
		return nil, arbiter.Errorf(arbiter.EInvalid, "cron is longer than %d bytes", arbiter.MaxScheduleCron)
	case strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ="):
		return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q: time zone prefixes are not supported; write the expression in UTC", arbiter.Clip(spec, 60))
	case strings.HasPrefix(spec, "@"):
		if !coordDescriptors[spec] {
			return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q: want one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly", arbiter.Clip(spec, 60))
		}
	default:
		if n := len(strings.Fields(spec)); n != 5 {
			return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q has %d fields; want 5 (minute hour day-of-month month day-of-week), e.g. \"0 6 * * 1-5\", or @daily", arbiter.Clip(spec, 60), n)
		}
	}
	sched, err := coordParse(spec)
	if err != nil {
		return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q: %v", arbiter.Clip(spec, 60), err)
	}
	return sched, nil
}

// coordParse runs the parser, turning a panic on hostile input into an error.
func coordParse(spec string) (s cron.Schedule, err error) {
	defer func() {
		if p := recover(); p != nil {
			s, err = nil, fmt.Errorf("not a valid expression")
		}
	}()
	return coordCronParser.Parse(spec)
}

// coordNextRunLayouts are the forms a scheduler's next_run may take: RFC
// 3339, or ISO 8601 without a zone (as Python's isoformat writes it).
var coordNextRunLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999"}

// ParseNextRun checks a next_run a scheduler reports: "" or a date and time
// in RFC 3339 or ISO 8601 form. Errors: invalid.
func ParseNextRun(v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil
	}
	if len(v) <= arbiter.MaxScheduleNextRun {
		for _, l := range coordNextRunLayouts {
			if _, err := time.Parse(l, v); err == nil {
				return nil
			}
		}
	}
	return arbiter.Errorf(arbiter.EInvalid, "next_run %q is not a date and time such as 2026-06-18T07:00:00Z", arbiter.Clip(v, 40))
}

// coordScheduleBody is the body of a schedule registration.
type coordScheduleBody struct {
	ID          *string `json:"id"`
	Name        string  `json:"name"`
	Owner       string  `json:"owner"`
	Cron        string  `json:"cron"`
	NextRun     string  `json:"next_run"`
	Description string  `json:"description"`
}

// registerSchedule checks and applies a registration. It reports whether
// the entry is new.
func (s *Server) registerSchedule(r *http.Request, c arbiter.Caller, b coordScheduleBody) (arbiter.Schedule, bool, error) {
	sched := arbiter.Schedule{Name: b.Name, Owner: b.Owner, Cron: b.Cron, NextRun: b.NextRun, Description: b.Description}
	if b.ID != nil {
		sched.ID = strings.TrimSpace(*b.ID)
		if sched.ID != "" && !arbiter.ValidScheduleID(sched.ID) {
			return sched, false, arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)")
		}
	}
	if strings.TrimSpace(b.Name) == "" {
		return sched, false, arbiter.Errorf(arbiter.EInvalid, "name is required")
	}
	spec, err := ParseCron(b.Cron)
	if err != nil {
		return sched, false, err
	}
	if err := ParseNextRun(b.NextRun); err != nil {
		return sched, false, err
	}
	_, existed := s.plane.Record(arbiter.RecordSchedule, sched.ID)
	var gen [4]byte
	if _, err := rand.Read(gen[:]); err != nil {
		return sched, false, fmt.Errorf("httpapi: draw a schedule id: %w", err)
	}
	out, err := arbiter.Do(r.Context(), s.plane, arbiter.RegisterSchedule{Caller: c, Schedule: sched, GeneratedID: hex.EncodeToString(gen[:]), CronSpec: spec})
	if err != nil {
		return out, false, httpio.ContextError(r.Context(), err)
	}
	return out, sched.ID == "" || !existed, nil
}

func (s *Server) handleSchedules(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Schedules []arbiter.Schedule `json:"schedules"`
	}{coordRecords[arbiter.Schedule](s, arbiter.RecordSchedule)})
	return nil
}

func (s *Server) handleSchedule(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	id := r.PathValue("id")
	if !arbiter.ValidScheduleID(id) {
		return arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)")
	}
	sched, ok := coordRecord[arbiter.Schedule](s, arbiter.RecordSchedule, id)
	if !ok {
		return arbiter.Errorf(arbiter.ENotFound, "schedule %q is not registered", id)
	}
	httpio.WriteJSON(w, http.StatusOK, sched)
	return nil
}

func (s *Server) handleScheduleRegister(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	var b coordScheduleBody
	if err := s.coordBody(w, r, &b, false); err != nil {
		return err
	}
	sched, created, err := s.registerSchedule(r, c, b)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	httpio.WriteJSON(w, status, sched)
	return nil
}

func (s *Server) handleScheduleDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id := r.PathValue("id")
	if !arbiter.ValidScheduleID(id) {
		return arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)")
	}
	sched, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteSchedule{Caller: c, ID: id})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, sched)
	return nil
}

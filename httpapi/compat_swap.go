package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// The compatible endpoints of docs/reference/coordination.md §5, for schedulers and
// dashboards written against seed 000: the swap lock, swaps of the default
// service, and the schedule registry, under /api. They act on the service
// marked default (or the only one) and its lock "swap". Bodies are read
// leniently, as the original did (unknown fields are ignored); errors are
// answered as {"detail": "…"} — the original's form — with the native
// {"error": {"code", "message"}} beside it, and a refusal by the lock adds
// the lock's public state as "lock".

// compatErrorBody is the error answer of a compatible endpoint.
type compatErrorBody struct {
	Detail string           `json:"detail"`
	Error  errorDetail      `json:"error"`
	Lock   *compatLockState `json:"lock,omitempty"`
}

// compatTime is a time as the original wrote it (arbiter.PyISOFormat).
// Decision: the compatible answers use this form rather than Go's RFC 3339
// with nanoseconds and "Z": the schedulers and dashboard scripts of seed 000
// are Python, and it is still RFC 3339, so other clients read it too.
type compatTime time.Time

func (t compatTime) MarshalJSON() ([]byte, error) {
	return []byte(`"` + arbiter.PyISOFormat(time.Time(t)) + `"`), nil
}

func (t *compatTime) UnmarshalJSON(b []byte) error { return (*time.Time)(t).UnmarshalJSON(b) }

func compatTimePtr(t *time.Time) *compatTime {
	if t == nil {
		return nil
	}
	c := compatTime(*t)
	return &c
}

// compatLockState is a lock's public state as the original shows it: no
// name, times in its form.
type compatLockState struct {
	Held             bool        `json:"held"`
	Holder           string      `json:"holder,omitempty"`
	AcquiredAt       *compatTime `json:"acquired_at,omitempty"`
	ExpiresAt        *compatTime `json:"expires_at,omitempty"`
	SecondsRemaining *int64      `json:"seconds_remaining,omitempty"`
	Note             *string     `json:"note,omitempty"`
	Fence            int64       `json:"fence,omitempty"`
}

// compatError leaves err to the usual answer (writeError, which speaks the
// compatible form under these paths) and returns it, but answers a refusal
// by the lock itself, with the lock's public state beside the error.
func compatError(w http.ResponseWriter, r *http.Request, err error) error {
	var held *arbiter.LockHeldError
	if !errors.As(err, &held) {
		return httpio.ContextError(r.Context(), err)
	}
	code, msg := arbiter.ErrorCode(err), arbiter.ErrorMessage(err)
	st := compatPublic(held.Lock)
	body := compatErrorBody{Detail: msg, Error: errorDetail{Code: code, Message: msg}, Lock: &st}
	if code == arbiter.EConflict {
		body.Detail = "swap lock is held by another holder"
	}
	httpio.WriteJSON(w, status[code], body)
	return nil
}

// compatBody decodes a JSON body leniently into v (unknown fields are
// ignored). Errors: invalid for what is not a JSON object of the right types.
func (s *Server) compatBody(w http.ResponseWriter, r *http.Request, v any) error {
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	if len(bytes.TrimSpace(buf.Bytes())) == 0 {
		return arbiter.Errorf(arbiter.EInvalid, "request body is empty: send a JSON object")
	}
	if err := json.Unmarshal(buf.Bytes(), v); err != nil {
		return jsonError(buf.Bytes(), err)
	}
	return nil
}

// compatTTL reads ttl_seconds as the original did: absent or null is the
// default (15 minutes); a number is truncated to whole seconds; a numeric
// string is read as one; anything else falls back to the default. The
// result is clamped to [1 s, 24 h].
func compatTTL(raw json.RawMessage) time.Duration {
	var secs float64
	ok := false
	var f float64
	var str string
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case json.Unmarshal(raw, &f) == nil:
		secs, ok = math.Trunc(f), true
	case json.Unmarshal(raw, &str) == nil:
		// Python's int() has no overflow: a numeric string beyond int64 is
		// still a number and is clamped (ParseInt gives ±max with ErrRange).
		if n, err := strconv.ParseInt(strings.TrimSpace(str), 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
			secs, ok = float64(n), true
		}
	}
	switch {
	case !ok:
		return arbiter.LockTTLDefault
	case secs < 1:
		return arbiter.LockTTLMin
	case secs > arbiter.LockTTLMax.Seconds():
		return arbiter.LockTTLMax
	}
	return time.Duration(secs) * time.Second
}

// compatPublic is a lock's public state as the original shows it.
func compatPublic(st arbiter.LockState) compatLockState {
	return compatLockState{Held: st.Held, Holder: st.Holder, AcquiredAt: compatTimePtr(st.AcquiredAt), ExpiresAt: compatTimePtr(st.ExpiresAt),
		SecondsRemaining: st.SecondsRemaining, Note: st.Note, Fence: st.Fence}
}

func (s *Server) handleCompatLockGet(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	httpio.WriteJSON(w, http.StatusOK, compatPublic(s.lockState(arbiter.CompatSwapLock)))
	return nil
}

func (s *Server) handleCompatLockAcquire(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	var b struct {
		Holder     *string         `json:"holder"`
		TTLSeconds json.RawMessage `json:"ttl_seconds"`
		Note       *string         `json:"note"`
		Token      *string         `json:"token"`
	}
	if err := s.compatBody(w, r, &b); err != nil {
		return compatError(w, r, err)
	}
	if b.Holder == nil || strings.TrimSpace(*b.Holder) == "" {
		return compatError(w, r, arbiter.Errorf(arbiter.EInvalid, "holder is required"))
	}
	note, token := "", ""
	if b.Note != nil {
		note = *b.Note
	}
	if b.Token != nil {
		token = *b.Token
	}
	if token == "" {
		tok, err := coordToken(r, coordSwapTokenHeader)
		if err != nil {
			return compatError(w, r, err)
		}
		token = tok
	}
	newTok, err := coordNewToken()
	if err != nil {
		return err
	}
	g, err := arbiter.Do(r.Context(), s.plane, arbiter.AcquireLock{Caller: c, Name: arbiter.CompatSwapLock, Holder: *b.Holder,
		TTL: compatTTL(b.TTLSeconds), Note: note, Token: token, NewToken: newTok})
	if err != nil {
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		compatLockState
		Token string `json:"token"`
	}{compatPublic(g.LockState), g.Token})
	return nil
}

func (s *Server) handleCompatLockRelease(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "token", "force"); err != nil {
		return compatError(w, r, err)
	}
	force, err := coordForce(r)
	if err != nil {
		return compatError(w, r, err)
	}
	tok, err := coordToken(r, coordSwapTokenHeader)
	if err != nil {
		return compatError(w, r, err)
	}
	if tok == "" {
		tok = q.Get("token")
	}
	rel, err := arbiter.Do(r.Context(), s.plane, arbiter.ReleaseLock{Caller: c, Name: arbiter.CompatSwapLock, Token: tok, Force: force})
	if err != nil {
		if arbiter.ErrorCode(err) == arbiter.EForbidden && !force {
			err = arbiter.Errorf(arbiter.EForbidden, "token does not hold the lock")
		}
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Released bool `json:"released"`
	}{rel.Released})
	return nil
}

func (s *Server) handleCompatSwap(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	var b struct {
		ModelKey *string `json:"model_key"`
		DryRun   *bool   `json:"dry_run"`
	}
	if err := s.compatBody(w, r, &b); err != nil {
		return compatError(w, r, err)
	}
	body := coordSwapBody{}
	if b.ModelKey != nil {
		body.ModelKey = *b.ModelKey
	}
	if b.DryRun != nil {
		body.DryRun = *b.DryRun
	}
	sw, err := s.requestSwap(r, c, "", body)
	if err != nil {
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusAccepted, struct {
		JobID string `json:"job_id"`
	}{sw.ID})
	return nil
}

// compatSwap is a swap as the compatible GET shows it: with job_id, and
// times in the original's form (these fields hide the Swap's own).
type compatSwap struct {
	JobID string `json:"job_id"`
	arbiter.Swap
	CreatedAt  compatTime  `json:"created_at"`
	StartedAt  *compatTime `json:"started_at"`
	FinishedAt *compatTime `json:"finished_at"`
}

func newCompatSwap(sw arbiter.Swap) compatSwap {
	return compatSwap{JobID: sw.ID, Swap: sw, CreatedAt: compatTime(sw.CreatedAt), StartedAt: compatTimePtr(sw.StartedAt), FinishedAt: compatTimePtr(sw.FinishedAt)}
}

func (s *Server) handleCompatSwapGet(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	sw, err := s.swap(r.PathValue("id"))
	if err != nil {
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, newCompatSwap(sw))
	return nil
}

// handleCompatSwapStream streams a swap's log as the original did: one
// "data:" line per log line, then an "end" event with the final state.
func (s *Server) handleCompatSwapStream(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	err := s.swapStream(w, r, r.PathValue("id"),
		func(buf *bytes.Buffer, _ int, l string) {
			buf.WriteString("data: ")
			buf.WriteString(strings.NewReplacer("\r", " ", "\n", " ").Replace(l))
			buf.WriteString("\n\n")
		},
		func(buf *bytes.Buffer, sw *arbiter.Swap) {
			b, _ := json.Marshal(struct {
				JobID      string `json:"job_id"`
				State      string `json:"state"`
				ReturnCode *int   `json:"returncode"`
				Reason     string `json:"reason,omitempty"`
			}{sw.ID, sw.State, sw.ReturnCode, sw.Reason})
			buf.WriteString("event: end\ndata: ")
			buf.Write(b)
			buf.WriteString("\n\n")
		})
	if err != nil {
		return compatError(w, r, err)
	}
	return nil
}

func (s *Server) handleCompatValidate(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	svc, err := s.defaultService()
	if err != nil {
		return compatError(w, r, err)
	}
	v, err := s.validateKnown(svc, r.PathValue("key"))
	if err != nil {
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, v)
	return nil
}

// validateKnown validates a swap of svc to key. Errors: not_found when key
// is not in the catalog.
func (s *Server) validateKnown(svc arbiter.Service, key string) (arbiter.SwapValidation, error) {
	if arbiter.ValidateName("model key", key) != nil {
		return arbiter.SwapValidation{}, arbiter.Errorf(arbiter.ENotFound, "model key %q is not in the catalog of service %s", arbiter.Clip(key, 64), svc.Name)
	}
	if _, ok := coordRecord[arbiter.CatalogEntry](s, arbiter.RecordCatalog, arbiter.CatalogKey(svc.Name, key)); !ok {
		return arbiter.SwapValidation{}, arbiter.Errorf(arbiter.ENotFound, "model key %q is not in the catalog of service %s", key, svc.Name)
	}
	return s.validate(svc, key), nil
}

// compatSchedule is a schedule as the compatible endpoints show it: times
// in the original's form.
type compatSchedule struct {
	arbiter.Schedule
	RegisteredAt compatTime `json:"registered_at"`
	UpdatedAt    compatTime `json:"updated_at"`
}

func newCompatSchedule(s arbiter.Schedule) compatSchedule {
	return compatSchedule{s, compatTime(s.RegisteredAt), compatTime(s.UpdatedAt)}
}

func (s *Server) handleCompatSchedules(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	out := []compatSchedule{}
	for _, sched := range coordRecords[arbiter.Schedule](s, arbiter.RecordSchedule) {
		out = append(out, newCompatSchedule(sched))
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Schedules []compatSchedule `json:"schedules"`
	}{out})
	return nil
}

func (s *Server) handleCompatScheduleRegister(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	var b struct {
		ID          *string `json:"id"`
		Name        *string `json:"name"`
		Owner       *string `json:"owner"`
		Cron        *string `json:"cron"`
		NextRun     *string `json:"next_run"`
		Description *string `json:"description"`
	}
	if err := s.compatBody(w, r, &b); err != nil {
		return compatError(w, r, err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	sched, _, err := s.registerSchedule(r, c, coordScheduleBody{ID: b.ID, Name: str(b.Name), Owner: str(b.Owner),
		Cron: str(b.Cron), NextRun: str(b.NextRun), Description: str(b.Description)})
	if err != nil {
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, newCompatSchedule(sched))
	return nil
}

func (s *Server) handleCompatScheduleDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id := r.PathValue("id")
	if !arbiter.ValidScheduleID(id) {
		return compatError(w, r, arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)"))
	}
	if _, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteSchedule{Caller: c, ID: id}); err != nil {
		if arbiter.ErrorCode(err) == arbiter.ENotFound {
			err = arbiter.Errorf(arbiter.ENotFound, "schedule not found")
		}
		return compatError(w, r, err)
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Deleted bool   `json:"deleted"`
		ID      string `json:"id"`
	}{true, id})
	return nil
}

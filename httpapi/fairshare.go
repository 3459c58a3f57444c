package httpapi

import (
	"net/http"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// Fair share (docs/guides/fair-share.md): quotas, standings, reservations,
// extend, personal notifications.

// handleQuotas answers GET /api/v1/quotas: every quota in effect with its
// use.
func (s *Server) handleQuotas(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	qs := coordRecords[arbiter.QuotaStatus](s, arbiter.RecordQuotaStatus)
	if qs == nil {
		qs = []arbiter.QuotaStatus{}
	}
	arbiter.SortQuotaStatuses(qs)
	httpio.WriteJSON(w, http.StatusOK, struct {
		Quotas []arbiter.QuotaStatus `json:"quotas"`
	}{qs})
	return nil
}

// decodeQuota turns a body (a Quota; its source is the server's to say)
// into a valid quota. Errors: invalid.
func decodeQuota(data []byte) (arbiter.Quota, error) {
	var q arbiter.Quota
	if err := decodeJSON(data, &q); err != nil {
		return arbiter.Quota{}, err
	}
	q.Source = ""
	if err := q.Validate(); err != nil {
		return arbiter.Quota{}, err
	}
	return q, nil
}

// fsBody answers a fair-share route that takes a body: it reads the body,
// decodes it with decode, applies the command cmd makes of it and writes
// the result with status.
func fsBody[T any, R any](s *Server, w http.ResponseWriter, r *http.Request, status int,
	decode func([]byte) (T, error), cmd func(T) arbiter.Typed[R]) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	v, err := decode(buf.Bytes())
	if err != nil {
		return err
	}
	res, err := arbiter.Do(r.Context(), s.plane, cmd(v))
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, status, res)
	return nil
}

func (s *Server) handleQuotaSet(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	return fsBody(s, w, r, http.StatusOK, decodeQuota,
		func(q arbiter.Quota) arbiter.Typed[arbiter.QuotaStatus] { return arbiter.SetQuota{Caller: c, Quota: q} })
}

// handleQuotaDelete is DELETE /api/v1/quotas?group=|principal=[&model=].
func (s *Server) handleQuotaDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "group", "principal", "model"); err != nil {
		return err
	}
	key := arbiter.Quota{Group: q.Get("group"), Principal: q.Get("principal"), Model: q.Get("model")}
	if (key.Group == "") == (key.Principal == "") {
		return arbiter.Errorf(arbiter.EInvalid, "name the quota by group= or principal= (and model= for a model quota)")
	}
	if len(key.Group) > 128 || len(key.Principal) > 128 || len(key.Model) > 256 {
		return arbiter.Errorf(arbiter.EInvalid, "group, principal or model is too long")
	}
	st, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteQuota{Caller: c, Key: key.Key()})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, st)
	return nil
}

// handleFairShare answers GET /api/v1/fairshare: each group's standing,
// brought to now, in queue order.
func (s *Server) handleFairShare(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	gs := arbiter.StandingsAt(coordRecords[arbiter.GroupStanding](s, arbiter.RecordStanding), time.Now().UTC())
	if gs == nil {
		gs = []arbiter.GroupStanding{}
	}
	pol, _ := coordRecord[arbiter.FairSharePolicy](s, arbiter.RecordFairSharePolicy, "config")
	httpio.WriteJSON(w, http.StatusOK, struct {
		HalfLifeS float64                 `json:"half_life_s"`
		Groups    []arbiter.GroupStanding `json:"groups"`
	}{pol.HalfLifeS, gs})
	return nil
}

// handleReservations answers GET /api/v1/reservations, by window start.
func (s *Server) handleReservations(w http.ResponseWriter, r *http.Request, _ arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	rs := coordRecords[arbiter.Reservation](s, arbiter.RecordReservation)
	if rs == nil {
		rs = []arbiter.Reservation{}
	}
	arbiter.SortReservations(rs)
	httpio.WriteJSON(w, http.StatusOK, struct {
		Reservations []arbiter.Reservation `json:"reservations"`
	}{rs})
	return nil
}

// reservationBody is the body of POST /api/v1/reservations.
type reservationBody struct {
	ID        string    `json:"id"`
	GPUs      int       `json:"gpus"`
	Machine   string    `json:"machine"`
	Tags      []string  `json:"tags"`
	Start     time.Time `json:"start"`
	DurationS float64   `json:"duration_s"`
	Group     string    `json:"group"`
	Cron      string    `json:"cron"`
}

// decodeReservation turns a body into a reservation to make, its cron
// checked. Errors: invalid.
func decodeReservation(data []byte) (arbiter.Reservation, error) {
	var b reservationBody
	if err := decodeJSON(data, &b); err != nil {
		return arbiter.Reservation{}, err
	}
	rv := arbiter.Reservation{ID: b.ID, GPUs: b.GPUs, Machine: b.Machine, Tags: b.Tags, Start: b.Start.UTC(), DurationS: b.DurationS,
		Group: b.Group, Cron: b.Cron}
	if b.Start.IsZero() {
		rv.Start = time.Time{}
	}
	if rv.Cron != "" {
		if _, err := ParseCron(rv.Cron); err != nil {
			return arbiter.Reservation{}, err
		}
	}
	if err := rv.Validate(); err != nil {
		return arbiter.Reservation{}, err
	}
	return rv, nil
}

func (s *Server) handleReservationCreate(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	return fsBody(s, w, r, http.StatusCreated, decodeReservation,
		func(rv arbiter.Reservation) arbiter.Typed[arbiter.Reservation] {
			return arbiter.CreateReservation{Caller: c, Reservation: rv}
		})
}

func (s *Server) handleReservationDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := arbiter.ValidateName("reservation id", id); err != nil {
		return err
	}
	res, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteReservation{Caller: c, ID: id})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, res)
	return nil
}

// handleExtend is POST /api/v1/allocations/{id}/extend with {"by_s": N}.
func (s *Server) handleExtend(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	// Another's allocation is refused before its body is read (the engine
	// checks again).
	if a, ok := s.plane.Allocation(id); ok {
		if err := arbiter.MayTouch(c, &a, "extend it"); err != nil {
			return err
		}
	}
	buf := getBuf()
	defer putBuf(buf)
	if err := readBody(w, r, s.maxBody, buf); err != nil {
		return err
	}
	by, err := decodeExtend(buf.Bytes())
	if err != nil {
		return err
	}
	a, err := arbiter.Do(r.Context(), s.plane, arbiter.ExtendAllocation{Caller: c, ID: id, ByS: by})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, a)
	return nil
}

// decodeExtend reads {"by_s": N}. Errors: invalid.
func decodeExtend(data []byte) (float64, error) {
	var b struct {
		ByS *float64 `json:"by_s"`
	}
	if err := decodeJSON(data, &b); err != nil {
		return 0, err
	}
	if b.ByS == nil {
		return 0, arbiter.Errorf(arbiter.EInvalid, "by_s is required: the seconds to add to the time limit, e.g. {\"by_s\": 7200}")
	}
	if v := *b.ByS; v != v || v < 1 || v > arbiter.MaxTimeLimitS {
		return 0, arbiter.Errorf(arbiter.EInvalid, "by_s must be 1 to %d seconds", arbiter.MaxTimeLimitS)
	}
	return *b.ByS, nil
}

// handleNotifications answers GET /api/v1/notifications: the caller's own
// subscriptions (an admin's: everyone's).
func (s *Server) handleNotifications(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	out := []arbiter.Webhook{}
	for _, wh := range coordRecords[arbiter.Webhook](s, arbiter.RecordWebhook) {
		if wh.Principal != "" && (c.Role == arbiter.RoleAdmin || wh.Principal == c.Name) {
			out = append(out, wh.Public())
		}
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Notifications []arbiter.Webhook `json:"notifications"`
	}{out})
	return nil
}

// notifyBody is the body of POST /api/v1/notifications.
type notifyBody struct {
	URL       string               `json:"url"`
	Format    string               `json:"format"`
	Secret    string               `json:"secret"`
	Kinds     []string             `json:"kinds"`
	Match     *arbiter.NotifyMatch `json:"match"`
	Principal string               `json:"principal"`
}

// decodeNotify turns a body into a personal subscription (a secret drawn
// when none is given). Errors: invalid.
func decodeNotify(data []byte) (arbiter.Webhook, error) {
	var b notifyBody
	if err := decodeJSON(data, &b); err != nil {
		return arbiter.Webhook{}, err
	}
	if b.Format == "" {
		b.Format = arbiter.WebhookStandard
	}
	if b.Format != arbiter.WebhookStandard && b.Format != arbiter.WebhookSlack {
		return arbiter.Webhook{}, arbiter.Errorf(arbiter.EInvalid, "format %q: want standard or slack", arbiter.Clip(b.Format, 40))
	}
	if len(b.Kinds) == 0 {
		b.Kinds = arbiter.NotifyKinds()
	}
	return arbiter.Webhook{URL: b.URL, Format: b.Format, Secret: b.Secret, Kinds: b.Kinds, Match: b.Match, Principal: b.Principal}, nil
}

func (s *Server) handleNotifyCreate(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	decode := func(data []byte) (arbiter.Webhook, error) {
		wh, err := decodeNotify(data)
		if err == nil && wh.Secret == "" {
			wh.Secret, err = coordNewWebhookSecret()
		}
		return wh, err
	}
	// The answer shows the secret this once.
	return fsBody(s, w, r, http.StatusCreated, decode, func(wh arbiter.Webhook) arbiter.Typed[arbiter.Webhook] {
		return arbiter.CreateNotify{Caller: c, Webhook: wh, AllowLinkLocal: s.coord.AllowLinkLocalWebhooks}
	})
}

func (s *Server) handleNotifyDelete(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	if err := httpio.OnlyParams(r.URL.Query()); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := arbiter.ValidateName("subscription id", id); err != nil {
		return err
	}
	res, err := arbiter.Do(r.Context(), s.plane, arbiter.DeleteNotify{Caller: c, ID: id})
	if err != nil {
		return httpio.ContextError(r.Context(), err)
	}
	httpio.WriteJSON(w, http.StatusOK, res)
	return nil
}

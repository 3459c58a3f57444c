package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Fair share (docs/guides/fair-share.md).

// Quotas lists the quotas in effect with their use.
func (c *Client) Quotas(ctx context.Context) ([]arbiter.QuotaStatus, error) {
	var out struct {
		Quotas []arbiter.QuotaStatus `json:"quotas"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/quotas", nil, nil, &out)
	return out.Quotas, err
}

// SetQuota adds or replaces a quota (admin). Errors: invalid, forbidden.
func (c *Client) SetQuota(ctx context.Context, q arbiter.Quota) (arbiter.QuotaStatus, error) {
	q.Source = ""
	return send[arbiter.QuotaStatus](ctx, c, http.MethodPost, "/api/v1/quotas", nil, q)
}

// DeleteQuota removes a quota set through the API (admin), named by its
// group or principal and model. Errors: not_found; conflict for a quota of
// the configuration.
func (c *Client) DeleteQuota(ctx context.Context, q arbiter.Quota) (arbiter.QuotaStatus, error) {
	v := url.Values{}
	for k, s := range map[string]string{"group": q.Group, "principal": q.Principal, "model": q.Model} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return send[arbiter.QuotaStatus](ctx, c, http.MethodDelete, "/api/v1/quotas", v, nil)
}

// FairShare is the answer of GET /api/v1/fairshare.
type FairShare struct {
	HalfLifeS float64                 `json:"half_life_s"`
	Groups    []arbiter.GroupStanding `json:"groups"`
}

// FairShare returns the groups' standings, in queue order.
func (c *Client) FairShare(ctx context.Context) (FairShare, error) {
	return send[FairShare](ctx, c, http.MethodGet, "/api/v1/fairshare", nil, nil)
}

// Reservations lists the reservations by window start.
func (c *Client) Reservations(ctx context.Context) ([]arbiter.Reservation, error) {
	var out struct {
		Reservations []arbiter.Reservation `json:"reservations"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/reservations", nil, nil, &out)
	return out.Reservations, err
}

// Reserve makes a reservation (admin): r's ID (optional), GPUs, Machine or
// Tags, Start, DurationS, Group and Cron. Errors: invalid, forbidden,
// conflict when the GPUs are not to be had.
func (c *Client) Reserve(ctx context.Context, r arbiter.Reservation) (arbiter.Reservation, error) {
	body := struct {
		ID        string     `json:"id,omitempty"`
		GPUs      int        `json:"gpus"`
		Machine   string     `json:"machine,omitempty"`
		Tags      []string   `json:"tags,omitempty"`
		Start     *time.Time `json:"start,omitempty"`
		DurationS float64    `json:"duration_s"`
		Group     string     `json:"group"`
		Cron      string     `json:"cron,omitempty"`
	}{ID: r.ID, GPUs: r.GPUs, Machine: r.Machine, Tags: r.Tags, DurationS: r.DurationS, Group: r.Group, Cron: r.Cron}
	if !r.Start.IsZero() {
		s := r.Start.UTC()
		body.Start = &s
	}
	return send[arbiter.Reservation](ctx, c, http.MethodPost, "/api/v1/reservations", nil, body)
}

// Unreserve deletes a reservation (admin). Errors: not_found.
func (c *Client) Unreserve(ctx context.Context, id string) (arbiter.Reservation, error) {
	return send[arbiter.Reservation](ctx, c, http.MethodDelete, "/api/v1/reservations/"+url.PathEscape(id), nil, nil)
}

// Extend moves an allocation's time limit by later. Errors: conflict with
// the reason it is refused; forbidden; not_found.
func (c *Client) Extend(ctx context.Context, id int64, by time.Duration) (arbiter.Allocation, error) {
	return send[arbiter.Allocation](ctx, c, http.MethodPost, allocPath(id)+"/extend", nil, map[string]float64{"by_s": by.Seconds()})
}

// Notifications lists the caller's notification subscriptions (an admin's:
// everyone's).
func (c *Client) Notifications(ctx context.Context) ([]arbiter.Webhook, error) {
	var out struct {
		Notifications []arbiter.Webhook `json:"notifications"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/notifications", nil, nil, &out)
	return out.Notifications, err
}

// Notify subscribes the caller (or, for an admin, w.Principal) to
// notifications at w.URL: w.Format, w.Kinds (all when empty), w.Match,
// w.Secret (drawn when empty). The answer shows the secret once.
func (c *Client) Notify(ctx context.Context, w arbiter.Webhook) (arbiter.Webhook, error) {
	body := struct {
		URL       string               `json:"url"`
		Format    string               `json:"format,omitempty"`
		Secret    string               `json:"secret,omitempty"`
		Kinds     []string             `json:"kinds,omitempty"`
		Match     *arbiter.NotifyMatch `json:"match,omitempty"`
		Principal string               `json:"principal,omitempty"`
	}{w.URL, w.Format, w.Secret, w.Kinds, w.Match, w.Principal}
	return send[arbiter.Webhook](ctx, c, http.MethodPost, "/api/v1/notifications", nil, body)
}

// Unnotify removes a notification subscription. Errors: not_found,
// forbidden.
func (c *Client) Unnotify(ctx context.Context, id string) (arbiter.Webhook, error) {
	return send[arbiter.Webhook](ctx, c, http.MethodDelete, "/api/v1/notifications/"+url.PathEscape(id), nil, nil)
}

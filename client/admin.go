package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/arbiter-hq/arbiter"
)

// Reload makes the server read its configuration again, as SIGHUP does
// (admin), and returns the parts reloaded. Errors: invalid (with the file's
// problem: file, line, key) when the file does not load, nothing changed
// then; not_found when the server runs without a configuration file.
func (c *Client) Reload(ctx context.Context) ([]string, error) {
	var out struct {
		Reloaded []string `json:"reloaded"`
	}
	err := c.do(ctx, http.MethodPost, "/api/v1/admin/reload", nil, nil, &out)
	return out.Reloaded, err
}

// Pools returns every pool with its backings and slot occupancy.
func (c *Client) Pools(ctx context.Context) ([]arbiter.PoolStatus, error) {
	var out struct {
		Pools []arbiter.PoolStatus `json:"pools"`
	}
	if err := c.do(ctx, http.MethodGet, "/api/v1/pools", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Pools, nil
}

// Pool returns one pool. Errors: not_found when it is not configured.
func (c *Client) Pool(ctx context.Context, name string) (arbiter.PoolStatus, error) {
	return send[arbiter.PoolStatus](ctx, c, http.MethodGet, "/api/v1/pools/"+url.PathEscape(name), nil, nil)
}

// Whoami returns who the server takes the client's token for. Errors:
// unauthorized for a missing or unknown token.
func (c *Client) Whoami(ctx context.Context) (arbiter.Whoami, error) {
	return send[arbiter.Whoami](ctx, c, http.MethodGet, "/api/v1/whoami", nil, nil)
}

// AuditPage is one page of the audit trail, newest first; Next is the
// Before of the next (older) page, 0 on the last.
type AuditPage struct {
	Entries []arbiter.AuditEntry `json:"entries"`
	Next    int64                `json:"next"`
}

// Audit returns a page of the audit trail (admin). Errors: forbidden for
// another role, invalid for a bad filter.
func (c *Client) Audit(ctx context.Context, f arbiter.AuditFilter) (AuditPage, error) {
	q := url.Values{}
	if f.Kind != "" {
		q.Set("kind", f.Kind)
	}
	if f.Before > 0 {
		q.Set("before", strconv.FormatInt(f.Before, 10))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return send[AuditPage](ctx, c, http.MethodGet, "/api/v1/audit", q, nil)
}

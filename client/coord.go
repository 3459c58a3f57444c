package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Client methods of the coordination API (coord.go). Errors are as for
// every Client method; a refusal by a lock (409 on acquire, 423 on a swap)
// is an *arbiter.LockHeldError carrying the lock's public state.

// LockRequest is what AcquireLock sends: Holder is required; TTLS nil
// means the server's default (15 minutes); Token, when set, extends a lock
// already held with it.
type LockRequest struct {
	Holder string   `json:"holder"`
	TTLS   *float64 `json:"ttl_s,omitempty"`
	Note   string   `json:"note,omitempty"`
	Token  string   `json:"token,omitempty"`
}

// Locks lists the held locks.
func (c *Client) Locks(ctx context.Context) ([]arbiter.LockState, error) {
	var out struct {
		Locks []arbiter.LockState `json:"locks"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/locks", nil, nil, &out)
	return out.Locks, err
}

// Lock returns one lock's public state ({held: false} when free).
func (c *Client) Lock(ctx context.Context, name string) (arbiter.LockState, error) {
	return send[arbiter.LockState](ctx, c, http.MethodGet, lockPath(name), nil, nil)
}

// AcquireLock takes lock name (or extends it with r.Token). The answer
// holds the token: the only time the server shows it. Errors: invalid,
// *arbiter.LockHeldError (conflict) when someone else holds it.
func (c *Client) AcquireLock(ctx context.Context, name string, r LockRequest) (arbiter.LockGrant, error) {
	var out arbiter.LockGrant
	err := c.coordCall(ctx, http.MethodPost, lockPath(name), nil, nil, r, &out, 0)
	return out, err
}

// ExtendLock moves a held lock's expiry to ttlS seconds from now (0: the
// default); note, when not nil, replaces its note. Errors: forbidden for a
// wrong token, conflict when not held.
func (c *Client) ExtendLock(ctx context.Context, name, token string, ttlS float64, note *string) (arbiter.LockGrant, error) {
	body := map[string]any{}
	if ttlS > 0 {
		body["ttl_s"] = ttlS
	}
	if note != nil {
		body["note"] = *note
	}
	var out arbiter.LockGrant
	err := c.coordCall(ctx, http.MethodPost, lockPath(name)+"/extend", nil, http.Header{lockTokenHeader: {token}}, body, &out, 0)
	return out, err
}

// ReleaseLock frees a lock with its token, or with force (admins). Errors:
// forbidden for a wrong token, conflict when not held.
func (c *Client) ReleaseLock(ctx context.Context, name, token string, force bool) (arbiter.LockRelease, error) {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	var h http.Header
	if token != "" {
		h = http.Header{lockTokenHeader: {token}}
	}
	var out arbiter.LockRelease
	err := c.coordCall(ctx, http.MethodDelete, lockPath(name), q, h, nil, &out, 0)
	return out, err
}

func lockPath(name string) string { return "/api/v1/locks/" + url.PathEscape(name) }

// Services lists the configured services.
func (c *Client) Services(ctx context.Context) ([]arbiter.Service, error) {
	var out struct {
		Services []arbiter.Service `json:"services"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/services", nil, nil, &out)
	return out.Services, err
}

// Catalog returns a service's catalog. Errors: not_found.
func (c *Client) Catalog(ctx context.Context, service string) ([]arbiter.CatalogEntry, error) {
	var out struct {
		Catalog []arbiter.CatalogEntry `json:"catalog"`
	}
	err := c.do(ctx, http.MethodGet, servicePath(service)+"/catalog", nil, nil, &out)
	return out.Catalog, err
}

// PutCatalogEntry adds or replaces e in its service's catalog (admin).
func (c *Client) PutCatalogEntry(ctx context.Context, e arbiter.CatalogEntry) (arbiter.CatalogEntry, error) {
	body := struct {
		Repo       string   `json:"repo,omitempty"`
		LocalPath  string   `json:"local_path,omitempty"`
		Args       []string `json:"args"`
		ServedName string   `json:"served_name,omitempty"`
	}{e.Repo, e.LocalPath, e.Args, e.ServedName}
	return send[arbiter.CatalogEntry](ctx, c, http.MethodPut, catalogPath(e.Service, e.Key), nil, body)
}

// DeleteCatalogEntry removes a catalog entry (admin). Errors: not_found.
func (c *Client) DeleteCatalogEntry(ctx context.Context, service, key string) (arbiter.CatalogEntry, error) {
	return send[arbiter.CatalogEntry](ctx, c, http.MethodDelete, catalogPath(service, key), nil, nil)
}

// ValidateModel checks that a swap of service to key could run and shows
// its command. Errors: not_found for an unknown service or key.
func (c *Client) ValidateModel(ctx context.Context, service, key string) (arbiter.SwapValidation, error) {
	return send[arbiter.SwapValidation](ctx, c, http.MethodPost, catalogPath(service, key)+"/validate", nil, nil)
}

func servicePath(s string) string { return "/api/v1/services/" + url.PathEscape(s) }
func catalogPath(s, k string) string {
	return servicePath(s) + "/catalog/" + url.PathEscape(k)
}

// SwapOptions tune RequestSwap: a dry run, the token of the lock guarding
// the service, and an admin's force.
type SwapOptions struct {
	DryRun    bool
	LockToken string
	Force     bool
}

// RequestSwap asks for a swap of service to the catalog entry key. Errors:
// *arbiter.LockHeldError (locked) when the service's swap lock is held by
// someone else, conflict while another swap runs, invalid for an unknown
// model.
func (c *Client) RequestSwap(ctx context.Context, service, key string, o SwapOptions) (arbiter.Swap, error) {
	var q url.Values
	if o.Force {
		q = url.Values{"force": {"true"}}
	}
	var h http.Header
	if o.LockToken != "" {
		h = http.Header{swapTokenHeader: {o.LockToken}}
	}
	var out arbiter.Swap
	err := c.coordCall(ctx, http.MethodPost, servicePath(service)+"/swaps", q, h, swapBody{ModelKey: key, DryRun: o.DryRun}, &out, 0)
	return out, err
}

// Swaps lists swaps, newest first, without logs; service and state filter
// when not empty.
func (c *Client) Swaps(ctx context.Context, service, state string, limit int) ([]arbiter.Swap, error) {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	if state != "" {
		q.Set("state", state)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Swaps []arbiter.Swap `json:"swaps"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/swaps", q, nil, &out)
	return out.Swaps, err
}

// Swap returns one swap with its log. Errors: not_found.
func (c *Client) Swap(ctx context.Context, id string) (arbiter.Swap, error) {
	return send[arbiter.Swap](ctx, c, http.MethodGet, "/api/v1/swaps/"+url.PathEscape(id), nil, nil)
}

// FollowSwap streams a swap's log: line is called with each line (n counts
// from 0 across the whole log) until the swap ends; it returns the swap as
// it ended (without its log). A dropped stream is resumed, skipping the
// lines already seen, as Events resumes: a silent one (no byte, not even
// the server's pings, for the idle time) is taken for dropped, and the
// server's unavailable and internal answers (a failover) are waited out;
// a server that cannot be reached at all, or another error, ends it.
func (c *Client) FollowSwap(ctx context.Context, id string, line func(n int, l string)) (arbiter.Swap, error) {
	next := 0
	var sw arbiter.Swap
	err := c.resume(ctx, func() (progress, connected, stop bool, err error) { // events.go
		before := next
		s, done, connected, err := c.followOnce(ctx, id, &next, line)
		if done {
			sw = s
			return true, true, true, nil
		}
		return next > before, connected, false, err
	})
	switch {
	case err == nil:
		return sw, nil
	case ctx.Err() != nil:
		return arbiter.Swap{}, fmt.Errorf("follow swap %s: %w", id, ctx.Err())
	}
	return arbiter.Swap{}, err
}

// followOnce reads one connection of a swap's stream. It reports the swap
// when it ended, whether the server answered at all, and why the stream
// ended otherwise.
func (c *Client) followOnce(ctx context.Context, id string, next *int, line func(int, string)) (sw arbiter.Swap, done, connected bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.newRequest(sctx, http.MethodGet, "/api/v1/swaps/"+url.PathEscape(id)+"/stream", nil, nil)
	if err != nil {
		return sw, false, false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	connect := time.AfterFunc(c.timeout, cancel) // as Events: the connection is bounded, then each silence
	resp, err := c.hc.Do(req)
	connect.Stop()
	if err != nil {
		return sw, false, false, c.transportError(ctx, sctx, c.timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sw, false, true, decodeError(resp)
	}
	idle := time.AfterFunc(c.idle, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	event := ""
	for sc.Scan() {
		idle.Reset(c.idle)
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "event: "):
			event = strings.TrimPrefix(l, "event: ")
		case strings.HasPrefix(l, "data: "):
			data := []byte(strings.TrimPrefix(l, "data: "))
			switch event {
			case "log":
				var ln struct {
					N    int    `json:"n"`
					Line string `json:"line"`
				}
				// A swap's log holds far fewer lines than MaxInt: a number
				// next to it is not a line's (and would wrap next).
				if json.Unmarshal(data, &ln) == nil && ln.N >= *next && ln.N < math.MaxInt32 {
					idle.Stop() // the caller's own time is not the server's silence
					line(ln.N, ln.Line)
					idle.Reset(c.idle)
					*next = ln.N + 1
				}
			case "end":
				if err := json.Unmarshal(data, &sw); err != nil {
					return sw, false, true, fmt.Errorf("unexpected end of swap %s from arbiter at %s: %w", id, c.base, err)
				}
				return sw, true, true, nil
			}
		case l == "":
			event = ""
		}
	}
	if err := sc.Err(); err != nil {
		return arbiter.Swap{}, false, true, fmt.Errorf("the stream of swap %s from arbiter at %s ended early: %w", id, c.base, err)
	}
	return arbiter.Swap{}, false, true, fmt.Errorf("the stream of swap %s from arbiter at %s ended before the swap did", id, c.base)
}

// ClaimSwap takes the next swap of machine for its agent, waiting up to
// wait for one; nil when there is none.
func (c *Client) ClaimSwap(ctx context.Context, machine string, wait time.Duration) (*arbiter.Swap, error) {
	q := url.Values{"instance": {instance()}}
	if wait > 0 {
		wait = min(wait, maxWait)
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	var out *arbiter.Swap
	err := c.coordCall(ctx, http.MethodPost, "/api/v1/machines/"+url.PathEscape(machine)+"/swaps/claim", q, nil, nil, &out, wait)
	return out, err
}

// instance names this process in swap claims: a claim from the process
// that runs a swap gets that swap again (the answer of its claim was lost)
// instead of failing it as if its agent had restarted.
var instance = sync.OnceValue(func() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail on supported systems
	return hex.EncodeToString(b[:])
})

// AppendSwapLog sends output lines of a running swap (at most 1000).
func (c *Client) AppendSwapLog(ctx context.Context, id, machine string, lines []string) error {
	body := struct {
		Machine string   `json:"machine"`
		Lines   []string `json:"lines"`
	}{machine, lines}
	return c.do(ctx, http.MethodPost, "/api/v1/swaps/"+url.PathEscape(id)+"/log", nil, body, nil)
}

// SwapResult is how an agent ends a swap.
type SwapResult struct {
	Machine    string `json:"machine"`
	OK         bool   `json:"ok"`
	ReturnCode *int   `json:"returncode"`
	Reason     string `json:"reason,omitempty"`
}

// FinishSwap ends a running swap.
func (c *Client) FinishSwap(ctx context.Context, id string, r SwapResult) (arbiter.Swap, error) {
	return send[arbiter.Swap](ctx, c, http.MethodPost, "/api/v1/swaps/"+url.PathEscape(id)+"/finish", nil, r)
}

// CancelSwap ends a pending or running swap (its requester's, or as an
// admin), saying why. Errors: not_found, forbidden, conflict once ended.
func (c *Client) CancelSwap(ctx context.Context, id, reason string) (arbiter.Swap, error) {
	body := struct {
		Reason string `json:"reason,omitempty"`
	}{reason}
	return send[arbiter.Swap](ctx, c, http.MethodPost, "/api/v1/swaps/"+url.PathEscape(id)+"/cancel", nil, body)
}

// Webhooks lists the subscriptions (admin), without secrets.
func (c *Client) Webhooks(ctx context.Context) ([]arbiter.Webhook, error) {
	var out struct {
		Webhooks []arbiter.Webhook `json:"webhooks"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/webhooks", nil, nil, &out)
	return out.Webhooks, err
}

// CreateWebhook subscribes w.URL (admin). The answer shows the secret once.
func (c *Client) CreateWebhook(ctx context.Context, w arbiter.Webhook) (arbiter.Webhook, error) {
	body := struct {
		ID     string   `json:"id,omitempty"`
		URL    string   `json:"url"`
		Secret string   `json:"secret,omitempty"`
		Kinds  []string `json:"kinds,omitempty"`
		Format string   `json:"format,omitempty"`
	}{w.ID, w.URL, w.Secret, w.Kinds, w.Format}
	return send[arbiter.Webhook](ctx, c, http.MethodPost, "/api/v1/webhooks", nil, body)
}

// DeleteWebhook removes a subscription (admin).
func (c *Client) DeleteWebhook(ctx context.Context, id string) (arbiter.Webhook, error) {
	return send[arbiter.Webhook](ctx, c, http.MethodDelete, "/api/v1/webhooks/"+url.PathEscape(id), nil, nil)
}

// SetWebhookEnabled enables or disables a subscription (admin).
func (c *Client) SetWebhookEnabled(ctx context.Context, id string, on bool) (arbiter.Webhook, error) {
	verb := "/disable"
	if on {
		verb = "/enable"
	}
	return send[arbiter.Webhook](ctx, c, http.MethodPost, "/api/v1/webhooks/"+url.PathEscape(id)+verb, nil, nil)
}

// Deliveries lists the webhook delivery log (admin), newest first.
func (c *Client) Deliveries(ctx context.Context, f arbiter.DeliveryFilter) ([]arbiter.Delivery, error) {
	q := url.Values{}
	if f.Webhook != "" {
		q.Set("webhook", f.Webhook)
	}
	if f.State != "" {
		q.Set("state", f.State)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out struct {
		Deliveries []arbiter.Delivery `json:"deliveries"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/webhooks/deliveries", q, nil, &out)
	return out.Deliveries, err
}

// Schedules lists the schedule registry.
func (c *Client) Schedules(ctx context.Context) ([]arbiter.Schedule, error) {
	var out struct {
		Schedules []arbiter.Schedule `json:"schedules"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/schedules", nil, nil, &out)
	return out.Schedules, err
}

// RegisterSchedule registers (or, with an existing id, updates) a schedule.
func (c *Client) RegisterSchedule(ctx context.Context, s arbiter.Schedule) (arbiter.Schedule, error) {
	body := map[string]any{"name": s.Name, "owner": s.Owner, "cron": s.Cron, "next_run": s.NextRun, "description": s.Description}
	if s.ID != "" {
		body["id"] = s.ID
	}
	return send[arbiter.Schedule](ctx, c, http.MethodPost, "/api/v1/schedules", nil, body)
}

// DeleteSchedule removes a schedule. Errors: not_found.
func (c *Client) DeleteSchedule(ctx context.Context, id string) (arbiter.Schedule, error) {
	return send[arbiter.Schedule](ctx, c, http.MethodDelete, "/api/v1/schedules/"+url.PathEscape(id), nil, nil)
}

// coordCall sends one call bounded by the client's timeout plus extra, with
// headers h and body encoded as JSON when not nil, and decodes a 2xx answer
// into out; a 204 leaves out as it is, and a refusal by a lock comes back as
// *arbiter.LockHeldError.
func (c *Client) coordCall(ctx context.Context, method, path string, q url.Values, h http.Header, body, out any, extra time.Duration) error {
	limit := c.timeout + extra
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := c.newRequest(rctx, method, path, q, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.transportError(ctx, rctx, limit, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusLocked {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		var lb lockHeldBody
		if json.Unmarshal(b, &lb) == nil && lb.Error.Code != "" && lb.Lock.Held {
			return arbiter.LockHeldErrorFrom(lb.Error.Code, lb.Error.Message, lb.Lock)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return decodeError(resp)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil || rctx.Err() != nil {
			return c.transportError(ctx, rctx, limit, err)
		}
		return fmt.Errorf("unexpected answer from arbiter at %s to %s %s: %w", c.base, method, path, err)
	}
	// Drain what is left so the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return nil
}

// Headers and bodies of the coordination routes, as the server reads and
// writes them (docs/reference/coordination.md).
const (
	lockTokenHeader = "X-Lock-Token"
	swapTokenHeader = "X-Swap-Lock-Token"
)

type swapBody struct {
	ModelKey string `json:"model_key"`
	DryRun   bool   `json:"dry_run"`
}

// lockHeldBody is the answer refusing a held lock: the error and the lock.
type lockHeldBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Lock arbiter.LockState `json:"lock"`
}

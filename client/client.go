// Package client is the Go client of arbiter's HTTP API: the native routes
// under /api/v1, the coordination routes and the work queue's. The CLI and
// the agent use it; it imports nothing of the server, so a program that only
// speaks HTTP does not carry the server's code.
//
// Errors the server answers are *arbiter.Error with the server's own code and
// message, so callers can switch on arbiter.ErrorCode.
//
// Plain http:// requests go through Transport, which sends each on the
// caller's goroutine (transport.go); https:// and proxied ones through a
// standard net/http Transport.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Client speaks the native API (/api/v1) of a running arbiter server. It is
// safe for concurrent use; share one Client so that connections are reused.
//
// Every method returns an *arbiter.Error carrying the server's own code and
// message when the server answers with an error; when the answer is not
// arbiter's error JSON (a proxy's page, say) the code comes from the HTTP
// status. When the server cannot be reached the error is a plain wrapped
// error that names the URL. When ctx ends the error wraps ctx.Err().
type Client struct {
	base  string // without trailing slash: the first of the servers'
	token string
	// servers is the failover among the servers' URLs (failover.go).
	servers *failover
	hc      *http.Client
	timeout time.Duration

	// Reconnection backoff of Events; tests shorten it.
	backoffMin, backoffMax time.Duration
	// idle is how long Events waits for any byte (the server pings) before
	// it treats the connection as dead and reconnects.
	idle time.Duration
}

// Options tunes a Client. The zero value gives New's defaults.
type Options struct {
	// Timeout bounds each ordinary call (default 30s). A long-poll gets its
	// wait on top of it; an event stream has no overall bound.
	Timeout time.Duration
	// MaxIdleConnsPerHost is how many keep-alive connections to the server
	// stay open between calls (default 64). Set it to at least the number of
	// goroutines that call the Client at once.
	MaxIdleConnsPerHost int
	// HTTPClient, when set, is used instead of the built-in one. Its own
	// Timeout must be 0, or it would cut event streams and long-polls.
	HTTPClient *http.Client
}

// Defaults of a Client.
const (
	defaultTimeout = 30 * time.Second
	defaultIdle    = 64
	// maxWait is the longest single long-poll the server accepts.
	maxWait = 300 * time.Second
	// maxErrorBody bounds how much of an error answer is read.
	maxErrorBody = 64 << 10
)

// New returns a client of the server at baseURL (like
// http://127.0.0.1:7070; a trailing slash is fine) that sends token as a
// bearer token when it is not empty. baseURL may list several replicas of
// one server, separated by commas: the client sends each call to the one
// that answered last and moves on when it cannot be reached or no replica
// leads (failover.go).
func New(baseURL, token string) *Client {
	return NewWithOptions(baseURL, token, Options{})
}

// NewWithOptions is New with tuning; see Options.
func NewWithOptions(baseURL, token string, o Options) *Client {
	if o.Timeout <= 0 {
		o.Timeout = defaultTimeout
	}
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = defaultIdle
	}
	hc := o.HTTPClient
	if hc == nil {
		// No http.Client.Timeout: it would cut SSE streams and long-polls.
		// Ordinary calls are bounded per request through their context.
		tr := &http.Transport{
			Proxy: http.ProxyFromEnvironment,
			DialContext: (&net.Dialer{
				Timeout:   10 * time.Second,
				KeepAlive: 30 * time.Second,
			}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          o.MaxIdleConnsPerHost * 2,
			MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		hc = &http.Client{Transport: NewTransport(tr, o.MaxIdleConnsPerHost)}
	}
	bases, err := ParseURLs(baseURL)
	if err != nil {
		bases = []string{strings.TrimRight(baseURL, "/")} // refused by the first call: "bad arbiter URL"
	}
	servers := newFailover(hc.Transport, bases)
	hc = &http.Client{Transport: servers, CheckRedirect: hc.CheckRedirect, Jar: hc.Jar, Timeout: hc.Timeout}
	return &Client{
		base:       bases[0],
		servers:    servers,
		token:      token,
		hc:         hc,
		timeout:    o.Timeout,
		backoffMin: 250 * time.Millisecond,
		backoffMax: 10 * time.Second,
		idle:       90 * time.Second,
	}
}

// URL returns the base URL of the server the client uses now: of several
// replicas, the one that answered last.
func (c *Client) URL() string { return c.servers.current() }

// where names the servers in messages: the one in use, or all of them.
func (c *Client) where() string {
	if len(c.servers.bases) == 1 {
		return c.base
	}
	return strings.Join(c.servers.bases, ", ")
}

// Health returns the server's health document ({"status":"ok", …}).
func (c *Client) Health(ctx context.Context) (map[string]any, error) {
	return send[map[string]any](ctx, c, http.MethodGet, "/api/v1/health", nil, nil)
}

// Cluster returns what the replica that answered knows of the replicas
// of a highly available server (from its health document), nil for a
// server without HA.
func (c *Client) Cluster(ctx context.Context) (*arbiter.Cluster, error) {
	var out struct {
		*arbiter.Cluster
	}
	if err := c.do(ctx, http.MethodGet, "/api/v1/health", nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Cluster == nil || out.Cluster.Role == "" {
		return nil, nil
	}
	return out.Cluster, nil
}

// Machines lists every machine with its devices and their holders.
func (c *Client) Machines(ctx context.Context) ([]arbiter.MachineStatus, error) {
	var out struct {
		Machines []arbiter.MachineStatus `json:"machines"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/machines", nil, nil, &out)
	return out.Machines, err
}

// Machine returns one machine. Errors: not_found for an unknown name.
func (c *Client) Machine(ctx context.Context, name string) (arbiter.MachineStatus, error) {
	return send[arbiter.MachineStatus](ctx, c, http.MethodGet, "/api/v1/machines/"+url.PathEscape(name), nil, nil)
}

// RegisterMachine adds or updates a machine (an agent's registration).
// Errors: invalid for a bad description, forbidden without the agent role.
func (c *Client) RegisterMachine(ctx context.Context, m arbiter.Machine) (arbiter.MachineStatus, error) {
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, "/api/v1/machines", nil, m)
}

// Heartbeat tells the server that name's agent is alive. Errors: not_found
// when the server does not know the machine (register it again).
func (c *Client) Heartbeat(ctx context.Context, name string) (arbiter.MachineStatus, error) {
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, "/api/v1/machines/"+url.PathEscape(name)+"/heartbeat", nil, nil)
}

// LeaveMachine tells the server the machine's agent is stopping: it is down
// at once. Errors: not_found, conflict for a configured machine.
func (c *Client) LeaveMachine(ctx context.Context, name string) (arbiter.MachineStatus, error) {
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, "/api/v1/machines/"+url.PathEscape(name)+"/leave", nil, nil)
}

// SetDraining drains (true) or undrains (false) a machine. Errors: not_found,
// forbidden without the admin role.
func (c *Client) SetDraining(ctx context.Context, name string, draining bool) (arbiter.MachineStatus, error) {
	verb := "/undrain"
	if draining {
		verb = "/drain"
	}
	return send[arbiter.MachineStatus](ctx, c, http.MethodPost, "/api/v1/machines/"+url.PathEscape(name)+verb, nil, nil)
}

// Allocate asks for devices. The request is sent as it is: a nil KeepaliveS
// is sent as null, an allocation that never expires. The answer is the new
// allocation: queued, ready, or already destroyed (with its reason) when it
// can never fit. Errors: invalid for a malformed request.
func (c *Client) Allocate(ctx context.Context, r arbiter.Request) (arbiter.Allocation, error) {
	return send[arbiter.Allocation](ctx, c, http.MethodPost, "/api/v1/allocations", nil, r)
}

// Allocations lists the allocations that pass f, in id order.
func (c *Client) Allocations(ctx context.Context, f arbiter.AllocationFilter) ([]arbiter.Allocation, error) {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", f.State)
	}
	if f.Owner != "" {
		q.Set("owner", f.Owner)
	}
	if f.Machine != "" {
		q.Set("machine", f.Machine)
	}
	var out struct {
		Allocations []arbiter.Allocation `json:"allocations"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/allocations", q, nil, &out)
	return out.Allocations, err
}

// Allocation returns one allocation. Errors: not_found for an unknown id
// (or one retired from the bounded history).
func (c *Client) Allocation(ctx context.Context, id int64) (arbiter.Allocation, error) {
	return c.WaitAllocation(ctx, id, 0)
}

// WaitAllocation is one long-poll: it returns the allocation as soon as it
// has left the queued and power states, or as it is when wait has passed.
// wait is capped at 300s; 0 returns at once. Callers loop until the state
// they want. Errors: as Allocation.
func (c *Client) WaitAllocation(ctx context.Context, id int64, wait time.Duration) (arbiter.Allocation, error) {
	var q url.Values
	if wait > 0 {
		wait = min(wait, maxWait)
		q = url.Values{"wait": {strconv.FormatFloat(wait.Seconds(), 'f', -1, 64)}}
	}
	var out arbiter.Allocation
	err := c.doWait(ctx, http.MethodGet, allocPath(id), q, nil, &out, wait)
	return out, err
}

// Keepalive refreshes an allocation's keepalive deadline. Errors: not_found
// for an unknown id, conflict when the allocation is already destroyed.
func (c *Client) Keepalive(ctx context.Context, id int64) (arbiter.Allocation, error) {
	return send[arbiter.Allocation](ctx, c, http.MethodPost, allocPath(id)+"/keepalive", nil, nil)
}

// Release destroys an allocation, recording reason (the server's default
// when empty). Releasing a destroyed allocation returns it unchanged.
// Errors: not_found, forbidden when the caller neither created it nor is admin.
func (c *Client) Release(ctx context.Context, id int64, reason string) (arbiter.Allocation, error) {
	var q url.Values
	if reason != "" {
		q = url.Values{"reason": {reason}}
	}
	return send[arbiter.Allocation](ctx, c, http.MethodDelete, allocPath(id), q, nil)
}

func allocPath(id int64) string {
	return "/api/v1/allocations/" + strconv.FormatInt(id, 10)
}

// do sends one ordinary call bounded by the client's timeout.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any) error {
	return c.doWait(ctx, method, path, q, body, out, 0)
}

// send is do for a call that answers a T.
func send[T any](ctx context.Context, c *Client, method, path string, q url.Values, body any) (T, error) {
	var out T
	err := c.do(ctx, method, path, q, body, &out)
	return out, err
}

// doWait sends one call bounded by the client's timeout plus extra, encodes
// body as JSON when not nil, and decodes a 2xx answer into out (see
// coordCall, which also takes headers).
func (c *Client) doWait(ctx context.Context, method, path string, q url.Values, body, out any, extra time.Duration) error {
	return c.coordCall(ctx, method, path, q, nil, body, out, extra)
}

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("bad arbiter URL %q: %w", c.base, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// transportError explains a failed round trip: the caller's context ended,
// the server was too slow, or it could not be reached at all.
func (c *Client) transportError(ctx, rctx context.Context, limit time.Duration, err error) error {
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("call to arbiter at %s: %w", c.URL(), ctx.Err())
	case rctx.Err() != nil:
		return fmt.Errorf("arbiter at %s did not answer within %s: %w", c.URL(), limit, rctx.Err())
	}
	if strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return fmt.Errorf("arbiter at %s speaks http://, not https://: use http:// in the URL (or give the server a certificate, [server] tls_cert_file)", c.where())
	}
	return fmt.Errorf("cannot reach arbiter at %s: %w; is `arbiter server` running?", c.where(), unwrapURLError(err))
}

// unwrapURLError drops net/url's "Get "URL": " prefix: the message
// already names the server.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// statusCodes maps an HTTP status back to an error code, for answers
// that do not carry arbiter's error JSON.
var statusCodes = map[int]string{
	http.StatusBadRequest:            arbiter.EInvalid,
	http.StatusUnauthorized:          arbiter.EUnauthorized,
	http.StatusForbidden:             arbiter.EForbidden,
	http.StatusNotFound:              arbiter.ENotFound,
	http.StatusConflict:              arbiter.EConflict,
	http.StatusRequestEntityTooLarge: arbiter.ETooLarge,
	http.StatusLocked:                arbiter.ELocked,
	http.StatusServiceUnavailable:    arbiter.EUnavailable,
	http.StatusInternalServerError:   arbiter.EInternal,
}

// decodeError turns an error answer into an *arbiter.Error: the
// server's own code and message, or a code from the status and a message
// that quotes the start of whatever came back. What the server said is
// bounded and escaped: a caller may print it to a terminal as it is.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var doc struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &doc) == nil && doc.Error != nil && doc.Error.Code != "" {
		msg := doc.Error.Message
		if msg == "" {
			msg = doc.Error.Code
		}
		return &arbiter.Error{Code: arbiter.Clip(arbiter.EscapeText(doc.Error.Code, false), 64),
			Message: arbiter.Clip(arbiter.EscapeText(msg, true), maxErrorMessage)}
	}
	code, ok := statusCodes[resp.StatusCode]
	if !ok {
		code = arbiter.EInternal
	}
	msg := "server answered " + resp.Status
	if snippet := clientSnippet(b); snippet != "" {
		msg += ": " + snippet
	}
	return &arbiter.Error{Code: code, Message: msg}
}

// clientSnippet returns the start of a body on one line, for messages.
func clientSnippet(b []byte) string {
	return arbiter.Clip(arbiter.EscapeText(strings.Join(strings.Fields(string(b)), " "), false), 200)
}

// maxErrorMessage bounds a server's error message as the client hands it
// on: long enough for any the server writes.
const maxErrorMessage = 4000

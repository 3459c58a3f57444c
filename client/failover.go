package client

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Several replicas (docs/guides/high-availability.md): a client given a
// comma-separated list of server URLs sends each request to the one that
// answered last, and moves on to the next when that one cannot be reached;
// a replica that answers 503 with X-Arbiter-Not-Applied (no replica leads
// yet: a failover is under way) is asked again, after a backoff, until the
// call's time runs out. A request is sent again only when it certainly did
// nothing — it was never sent, or it was refused as not applied — or when
// it only reads (GET, HEAD).

// ParseURLs splits a comma-separated list of server URLs, trimming spaces
// and trailing slashes. Errors: an empty list, or an entry that is not an
// http:// or https:// URL with a host.
func ParseURLs(list string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimRight(strings.TrimSpace(s), "/")
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, errors.New("arbiter URL " + strings.TrimSpace(s) + " is not an http:// or https:// URL like http://127.0.0.1:7070")
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, errors.New("no arbiter URL given")
	}
	return out, nil
}

// failover is the round tripper of a client of several replicas (or of one
// address behind which replicas answer).
type failover struct {
	next  http.RoundTripper
	bases []string     // the servers' base URLs; requests are built on bases[0]
	path0 string       // bases[0]'s path, which requests start with
	cur   atomic.Int32 // the one that answered last
	// minBackoff and maxBackoff bound the wait between two rounds through
	// every server while none leads.
	minBackoff, maxBackoff time.Duration
}

func newFailover(next http.RoundTripper, bases []string) *failover {
	if next == nil {
		next = http.DefaultTransport
	}
	f := &failover{next: next, bases: bases, minBackoff: 100 * time.Millisecond, maxBackoff: time.Second}
	if u, err := url.Parse(bases[0]); err == nil {
		f.path0 = u.EscapedPath()
	}
	return f
}

// current is the base URL requests go to now.
func (f *failover) current() string { return f.bases[int(f.cur.Load())%len(f.bases)] }

// RoundTrip sends req to the current server and, when it certainly did
// nothing there, to the next ones in turn.
func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	suffix := strings.TrimPrefix(req.URL.RequestURI(), f.path0)
	start := int(f.cur.Load())
	backoff := f.minBackoff
	unreachable := 0           // servers in a row that could not be reached
	var refused *http.Response // the last "not applied" answer, kept to tell the caller
	for attempt := 0; ; attempt++ {
		i := (start + attempt) % len(f.bases)
		out, err := f.prepare(req, f.bases[i]+suffix, attempt)
		if err != nil {
			return nil, err
		}
		resp, err := f.next.RoundTrip(out)
		switch {
		case err == nil && !(resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(arbiter.HeaderNotApplied) != ""):
			f.cur.Store(int32(i))
			return resp, nil
		case err != nil && !notSent(err) && !readOnly(req.Method):
			return nil, err // it may have been carried out: the caller decides
		case req.Body != nil && req.GetBody == nil:
			return resp, err // a stream that cannot be sent again
		case ctx.Err() != nil:
			if resp != nil {
				return resp, nil
			}
			if refused != nil {
				return refused, nil
			}
			return nil, err
		}
		if err == nil {
			unreachable = 0
		} else {
			unreachable++
			if unreachable >= len(f.bases) {
				return nil, err // none can be reached at all: say so now
			}
		}
		if resp != nil {
			refused = keep(resp)
		}
		if (attempt+1)%len(f.bases) != 0 {
			continue // the next server at once
		}
		// A round through every one: none leads yet. Wait, then again.
		t := time.NewTimer(backoff)
		backoff = min(2*backoff, f.maxBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			if refused != nil {
				return refused, nil // the server's own word: no replica leads
			}
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// prepare is req aimed at target; from the second attempt on, with a
// fresh body.
func (f *failover) prepare(req *http.Request, target string, attempt int) (*http.Request, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	out := req.Clone(req.Context())
	out.URL, out.Host = u, ""
	if attempt > 0 && req.GetBody != nil {
		if out.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// keep reads resp's body into memory (it is small: an error) and closes
// the connection's, so resp can still be returned after another attempt.
func keep(resp *http.Response) *http.Response {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp
}

// notSent reports whether err means the request never left: no connection
// was made.
func notSent(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	var de *net.DNSError
	return errors.As(err, &de)
}

func readOnly(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// CloseIdleConnections passes the call on, so Client users can still
// close idle connections.
func (f *failover) CloseIdleConnections() {
	if c, ok := f.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Package httpio holds the conventions every arbiter HTTP surface follows
// when it reads a request or writes an answer: JSON answers (nosniff, never
// cached, markup left unescaped), the rule that unknown query parameters are
// an error, where an event stream resumes, and what a request cancelled by
// its client becomes. The API server (httpapi) and the dashboard (ui) both
// use it, so they answer alike.
package httpio

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// WriteJSON writes v as the JSON answer with the given status. Served as
// JSON with nosniff, the answer is never read as HTML, so <, > and & are
// written as they are rather than as \u003c escapes: the dashboard's
// panels, mostly markup, come a third smaller and quicker.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// A value that writes its own JSON (an allocation: the answer of the
	// busiest routes) skips reflection and the re-validation of a
	// MarshalJSON's output.
	if a, ok := v.(interface{ AppendJSON([]byte) []byte }); ok {
		bp := answerBufs.Get().(*[]byte)
		b := append(a.AppendJSON((*bp)[:0]), '\n')
		_, _ = w.Write(b)
		*bp = b
		answerBufs.Put(bp)
		return
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	// An error here means the client went away; nothing useful is left to do.
	_ = enc.Encode(v)
}

// StartStream answers 200 with the headers of a server-sent event stream
// (never cached, never buffered by a proxy such as nginx) and lifts the
// write deadline, which a stream outlives. The caller writes frames through
// the returned controller's Flush.
func StartStream(w http.ResponseWriter) *http.ResponseController {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return rc
}

var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// OnlyParams refuses a query with a parameter not in allowed, so that a
// misspelt filter is an error rather than silently ignored. Errors: invalid.
func OnlyParams(q url.Values, allowed ...string) error {
	for k := range q {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			if len(allowed) == 0 {
				return arbiter.Errorf(arbiter.EInvalid, "unknown query parameter %q: this route takes none", arbiter.Clip(k, 40))
			}
			return arbiter.Errorf(arbiter.EInvalid, "unknown query parameter %q: this route takes %s", arbiter.Clip(k, 40), strings.Join(allowed, ", "))
		}
	}
	return nil
}

// Since is where an event watcher starts: v (a ?since= value) when given,
// else the Last-Event-ID header of a reconnecting EventSource, else last
// (only new events). Errors: invalid for anything but a sequence number.
func Since(r *http.Request, v string, last int64) (int64, error) {
	what := "since"
	if v == "" {
		v, what = r.Header.Get("Last-Event-ID"), "Last-Event-ID"
	}
	if v == "" {
		return last, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || v[0] < '0' || v[0] > '9' {
		return 0, arbiter.Errorf(arbiter.EInvalid, "%s %q must be an event sequence number (an integer, 0 or more)", what, arbiter.Clip(v, 40))
	}
	return n, nil
}

// ContextError turns a cancelled or timed-out request context into an
// error worth answering (if the client is still there to read it); any
// other error is returned as it is.
func ContextError(ctx context.Context, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		var ae *arbiter.Error
		if errors.As(context.Cause(ctx), &ae) {
			return ae // why the server ended it (its credentials were withdrawn)
		}
		return arbiter.Errorf(arbiter.EUnavailable, "the request was cancelled before the server answered: %v", ctx.Err())
	}
	return err
}

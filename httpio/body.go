package httpio

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// BodyDeadline bounds how long a request's body may take to arrive, so
// that a client announcing a body and sending it slowly — or not at all —
// cannot hold a connection and a handler (issue 12, finding 5). A body
// must arrive within timeout of the handler's start, plus one second for
// every minRate bytes received: a large upload at minRate bytes a second
// or faster is never cut, a slow-loris one is, after timeout. When the
// deadline passes, the body's Read fails (the handler answers as for a
// body cut off) and the connection is closed.
//
// Requests without a body get no deadline, so event streams and long polls
// run as long as they like; once the body has been read to its end, the
// deadline is lifted, so the handler's own work is not cut. A body the
// handler leaves unread is not waited for: its connection is closed. A
// server-wide ReadTimeout could do none of this.
func BodyDeadline(h http.Handler, timeout time.Duration, minRate int64) http.Handler {
	if timeout <= 0 {
		return h
	}
	if minRate <= 0 {
		minRate = 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		start := time.Now()
		if rc.SetReadDeadline(start.Add(timeout)) != nil {
			h.ServeHTTP(w, r) // a writer that cannot (a test recorder): nothing to bound
			return
		}
		b := &deadlineBody{ReadCloser: r.Body, rc: rc, start: start, timeout: timeout, rate: minRate, length: r.ContentLength}
		r.Body = b
		h.ServeHTTP(w, r)
		b.finish()
	})
}

// deadlineBody moves the read deadline on as bytes arrive, and lifts it
// at the body's end.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	start   time.Time
	timeout time.Duration
	rate    int64
	length  int64 // Content-Length, -1 when unknown

	mu     sync.Mutex
	n      int64
	lifted bool // the body was read to its end: no deadline any more
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lifted {
		return n, err
	}
	b.n += int64(n)
	switch {
	case err == io.EOF:
		b.liftLocked()
	case err != nil:
		// The deadline passed (or the client went): the deadline stays, so
		// what is left is not waited for and the connection closes.
	case n > 0:
		allowed := b.timeout + time.Duration(b.n*int64(time.Second)/b.rate)
		_ = b.rc.SetReadDeadline(b.start.Add(allowed))
	}
	return n, err
}

// finish runs when the handler is done: a body read to its length is done
// with; the rest of one left unread is not waited for.
func (b *deadlineBody) finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.lifted:
	case b.length >= 0 && b.n >= b.length:
		b.liftLocked()
	default:
		_ = b.rc.SetReadDeadline(time.Now())
	}
}

func (b *deadlineBody) liftLocked() {
	if !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

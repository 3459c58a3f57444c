package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// maxEventLine bounds one line of the event stream (a machine with
// many GPUs makes a large data line).
const maxEventLine = 4 << 20

// Events follows the server's event stream, calling fn for each event with
// Seq > since, in Seq order. A negative since starts with the events that
// happen after the stream is opened.
//
// When an established stream drops (the server restarts, a proxy cuts it,
// nothing arrives for a while, not even the server's pings) Events reconnects
// with backoff and resumes after the last Seq it delivered, skipping any
// event it already delivered, so fn sees each event once.
//
// Events returns nil when ctx ends and fn's error when fn returns one. It
// returns an error at once when the first connection fails (the server is
// unreachable or refuses it), and when the server refuses a reconnection
// with an application error other than unavailable or internal (a revoked
// token, say, or a conflict: the server's history no longer reaches the
// last event delivered, its database having been restored or replaced);
// an undecodable event is an error too.
func (c *Client) Events(ctx context.Context, since int64, fn func(arbiter.Event) error) error {
	last := since
	err := c.resume(ctx, func() (progress, connected, stop bool, err error) {
		delivered, connected, fnErr, err := c.eventsOnce(ctx, &last, fn)
		if fnErr != nil {
			return false, connected, true, fnErr
		}
		return delivered > 0, connected, false, err
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// resume runs a stream's connections: once, then again after each drop,
// with backoff (back to its least after progress), until once says stop
// (returning its error), ctx ends (ctx's error), the first connection
// fails (the server unreachable, or refusing), or the server refuses a
// reconnection with an error other than unavailable or internal, or speaks
// something else (protocolError): that error.
func (c *Client) resume(ctx context.Context, once func() (progress, connected, stop bool, err error)) error {
	everConnected := false
	backoff := c.backoffMin
	for {
		progress, connected, stop, err := once()
		switch {
		case stop:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case !everConnected && !connected:
			return err
		}
		everConnected = everConnected || connected
		var ae *arbiter.Error
		var pe protocolError
		if errors.As(err, &pe) || errors.As(err, &ae) && ae.Code != arbiter.EUnavailable && ae.Code != arbiter.EInternal {
			return err
		}
		if progress {
			backoff = c.backoffMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, c.backoffMax)
	}
}

// protocolError is a stream the client cannot understand; reconnecting
// would not help.
type protocolError struct{ err error }

func (e protocolError) Error() string { return e.err.Error() }
func (e protocolError) Unwrap() error { return e.err }

// eventsOnce reads one connection of the event stream, advancing *last. It
// reports how many events it delivered, whether the server accepted the
// stream, fn's error, and why the stream ended otherwise.
func (c *Client) eventsOnce(ctx context.Context, last *int64, fn func(arbiter.Event) error) (delivered int, connected bool, fnErr, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var q url.Values
	if *last >= 0 {
		q = url.Values{"since": {strconv.FormatInt(*last, 10)}}
	}
	req, err := c.newRequest(sctx, http.MethodGet, "/api/v1/events", q, nil)
	if err != nil {
		return 0, false, nil, protocolError{err}
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	if *last >= 0 {
		req.Header.Set("Last-Event-ID", strconv.FormatInt(*last, 10))
	}
	// The connection attempt is bounded like an ordinary call; once the
	// stream is open, the idle timer below bounds each silence instead.
	connect := time.AfterFunc(c.timeout, cancel)
	resp, err := c.hc.Do(req)
	connect.Stop()
	if err != nil {
		return 0, false, nil, c.transportError(ctx, sctx, c.timeout, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, nil, decodeError(resp)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "text/event-stream") {
		return 0, true, nil, protocolError{fmt.Errorf("arbiter at %s answered the event stream with %q, not text/event-stream", c.base, ct)}
	}

	idle := time.AfterFunc(c.idle, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var (
		id, kind string
		data     strings.Builder
		hasData  bool
	)
	for sc.Scan() {
		idle.Reset(c.idle)
		line := sc.Text()
		if line != "" {
			if strings.HasPrefix(line, ":") {
				continue // a comment: the server's ping
			}
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				id = value
			case "event":
				kind = value
			case "data":
				// Lines are bounded by the scanner; an event's many
				// lines are bounded here.
				if data.Len()+len(value) >= maxEventLine {
					return delivered, true, nil, protocolError{fmt.Errorf("arbiter at %s sent an event longer than %d bytes", c.base, maxEventLine)}
				}
				if hasData {
					data.WriteByte('\n')
				}
				data.WriteString(value)
				hasData = true
			}
			continue
		}
		// A blank line ends an event.
		if !hasData {
			// An id alone is where the stream stands (the server's first
			// frame): a reconnection resumes from it.
			if n, err := strconv.ParseInt(id, 10, 64); err == nil && n > *last {
				*last = n
			}
			id, kind = "", ""
			continue
		}
		var ev arbiter.Event
		if err := json.Unmarshal([]byte(data.String()), &ev); err != nil {
			return delivered, true, nil, protocolError{fmt.Errorf("arbiter at %s sent an event that is not JSON (id %q): %w", c.base, id, err)}
		}
		if ev.Seq == 0 {
			ev.Seq, _ = strconv.ParseInt(id, 10, 64)
		}
		if ev.Kind == "" {
			ev.Kind = kind
		}
		if ev.Seq < 0 {
			return delivered, true, nil, protocolError{fmt.Errorf("arbiter at %s sent an event numbered %d", c.base, ev.Seq)}
		}
		id, kind, hasData = "", "", false
		data.Reset()
		if *last >= 0 && ev.Seq != 0 && ev.Seq <= *last {
			continue // already delivered before a reconnection
		}
		idle.Stop() // fn's own time is not the server's silence
		if err := fn(ev); err != nil {
			return delivered, true, err, nil
		}
		idle.Reset(c.idle)
		delivered++
		if ev.Seq != 0 {
			*last = ev.Seq
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return delivered, true, nil, protocolError{fmt.Errorf("arbiter at %s sent an event line longer than %d bytes", c.base, maxEventLine)}
		}
		return delivered, true, nil, fmt.Errorf("event stream from %s dropped: %w", c.base, err)
	}
	return delivered, true, nil, fmt.Errorf("event stream from %s ended", c.base)
}

package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// parseWait parses ?wait=SECONDS: 0 < wait ≤ 300, fractions allowed.
func parseWait(v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f <= 0 || f > maxWaitS {
		return 0, arbiter.Errorf(arbiter.EInvalid, "wait %q must be a number of seconds above 0 and at most %d", arbiter.Clip(v, 40), maxWaitS)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// waiting reports whether an allocation is still on its way to ready.
func waiting(state string) bool {
	return state == arbiter.StateQueued || state == arbiter.StatePower
}

// waitAllocation returns allocation id, first waiting up to wait for it to
// leave its state if it is queued or powering. It watches the allocation's
// events rather than polling the view. Errors: not_found.
func (s *Server) waitAllocation(w http.ResponseWriter, r *http.Request, id int64, wait time.Duration) (arbiter.Allocation, error) {
	// LastSeq before the read: a change after the read has a later Seq, so
	// the subscription below cannot miss it.
	since := s.plane.LastSeq()
	a, ok := s.plane.Allocation(id)
	if !ok {
		return arbiter.Allocation{}, arbiter.Errorf(arbiter.ENotFound, "allocation %d is not known (it may have been retired)", id)
	}
	if wait <= 0 || !waiting(a.State) {
		return a, nil
	}
	// Let the answer outlive a server-wide write timeout.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + 10*time.Second))
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	subject := "allocation/" + strconv.FormatInt(id, 10)
	from := a.State
	for misses := 0; ctx.Err() == nil && misses <= 3; {
		// Woken by an event of the allocation (the view and the events
		// change together), or at once when the waker cannot tell, a few
		// times (the plane may have closed).
		if !s.allocWake.wait(ctx, s.plane, subject, since) {
			misses++
		}
		since = s.plane.LastSeq()
		if cur, ok := s.plane.Allocation(id); ok && cur.State != from {
			return cur, nil
		}
	}
	if err := r.Context().Err(); err != nil {
		return arbiter.Allocation{}, httpio.ContextError(r.Context(), err) // refused meanwhile, or the client went
	}
	if cur, ok := s.plane.Allocation(id); ok {
		return cur, nil
	}
	return a, nil
}

// handleEvents streams events as server-sent events, or with ?stream=false
// answers a JSON list of the events already committed after since.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "since", "stream", "limit"); err != nil {
		return err
	}
	last := s.plane.LastSeq()
	since, err := httpio.Since(r, q.Get("since"), last)
	if err != nil {
		return err
	}
	stream := true
	switch v := q.Get("stream"); v {
	case "", "true", "1":
	case "false", "0":
		stream = false
	default:
		return arbiter.Errorf(arbiter.EInvalid, "stream %q must be true or false", arbiter.Clip(v, 20))
	}
	limit := defaultEventsLimit
	if q.Has("limit") {
		v := q.Get("limit")
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventsLimit {
			return arbiter.Errorf(arbiter.EInvalid, "limit %q must be an integer from 1 to %d", arbiter.Clip(v, 20), maxEventsLimit)
		}
		limit = n
	}
	if since > last {
		// Numbers only grow, so the caller's came from another history:
		// answered, it would wait silently for events numbered past it.
		return arbiter.Errorf(arbiter.EConflict, "since %d is ahead of the last event, %d: this server's history is not the one that number came from (its database was restored from a backup or replaced); follow again without since, or from %d", since, last, last)
	}
	if !stream {
		return s.listEvents(w, r, c, since, limit)
	}
	return s.streamEvents(w, r, c, since)
}

// listEvents answers up to limit events after since that are committed now
// and c may read (arbiter.EventVisible): it reads on past the ones c may
// not, so that a page comes back empty only at the end.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, c arbiter.Caller, since int64, limit int) error {
	events := []arbiter.Event{} // [], not null
	for upTo := s.plane.LastSeq(); len(events) < limit && since < upTo; {
		evs, err := s.plane.Events(r.Context(), since, limit-len(events))
		if err != nil {
			return httpio.ContextError(r.Context(), err)
		}
		if len(evs) == 0 {
			break
		}
		since = evs[len(evs)-1].Seq
		for i := range evs {
			if arbiter.EventVisible(c, &evs[i]) {
				events = append(events, evs[i])
			}
		}
	}
	httpio.WriteJSON(w, http.StatusOK, struct {
		Events []arbiter.Event `json:"events"`
	}{events})
	return nil
}

// streamEvents writes the events after since that c may read
// (arbiter.EventVisible) as server-sent events until the client goes or
// the subscription closes (the client then resumes with Last-Event-ID). A
// comment line every 15s keeps proxies from timing out.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, c arbiter.Caller, since int64) error {
	ctx := r.Context()
	ch, err := s.plane.Subscribe(ctx, since)
	if err != nil {
		return httpio.ContextError(ctx, err)
	}
	rc := httpio.StartStream(w)
	// Where the stream starts, as an id without data: a client that came
	// "from now" and loses the connection before the first event resumes
	// from here rather than from a later now (the SSE rules set
	// Last-Event-ID from it, and client.Events reads it).
	if _, err := w.Write([]byte("id: " + strconv.FormatInt(since, 10) + "\n\n")); err != nil {
		return nil
	}
	if err := rc.Flush(); err != nil {
		return nil // not flushable, or the client went: nothing more to send
	}
	tick := time.NewTicker(s.sseHeartbeat)
	defer tick.Stop()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if _, err := w.Write([]byte(": keepalive\n\n")); err != nil {
				return nil
			}
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			buf.Reset()
			if arbiter.EventVisible(c, &ev) {
				appendEvent(&buf, enc, &ev)
			}
			// Send whatever else is already waiting before one flush.
			for more := true; more && buf.Len() < 32<<10; {
				select {
				case ev, ok = <-ch:
					if !ok {
						more = false
						break
					}
					if arbiter.EventVisible(c, &ev) {
						appendEvent(&buf, enc, &ev)
					}
				default:
					more = false
				}
			}
			if _, err := w.Write(buf.Bytes()); err != nil {
				return nil
			}
			if !ok {
				_ = rc.Flush()
				return nil
			}
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}

// appendEvent appends one event in the SSE format: id, event, data.
// JSON encoding never produces a newline inside the value, so one data line
// holds it.
func appendEvent(buf *bytes.Buffer, enc *json.Encoder, ev *arbiter.Event) {
	buf.WriteString("id: ")
	buf.Write(strconv.AppendInt(buf.AvailableBuffer(), ev.Seq, 10))
	buf.WriteString("\nevent: ")
	buf.WriteString(ev.Kind)
	buf.WriteString("\ndata: ")
	if err := enc.Encode(ev); err != nil {
		// Only malformed Data can fail; send the event without it.
		e := *ev
		e.Data = json.RawMessage("null")
		_ = enc.Encode(&e)
	}
	buf.WriteString("\n") // Encode ended the data line; this ends the event
}

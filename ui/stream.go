package ui

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/httpio"
)

// handleEvents is the page's event stream. It carries the same events as
// GET /api/v1/events, in a form an EventSource takes with one handler:
//
//	id: <seq>
//	data: {"seq":…,"kind":…,"subject":…}
//
// (no "event:" line, so every kind reaches onmessage, the page needs only
// the kind and subject: it renders the panels again from the server) and,
// every few seconds, a liveness frame without an id, so a reconnect still
// resumes from the last event:
//
//	event: live
//	data: {"now":…,"ka":{"<allocation id>":…},"seen":{"<machine>":…}}
//
// holding the keepalives and heartbeats that changed since the last frame:
// they live in memory only and no stored event reports them. For an admin,
// a change of the webhook delivery log (which has no events either) sends,
// at most once a second,
//
//	event: stale
//	data: {"panels":["deliveries"]}
//
// A reconnecting EventSource repeats the URL's ?since= but sends
// Last-Event-ID, which wins.
func (u *Dashboard) handleEvents(w http.ResponseWriter, r *http.Request, c arbiter.Caller) error {
	q := r.URL.Query()
	if err := httpio.OnlyParams(q, "since"); err != nil {
		return err
	}
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = q.Get("since")
	}
	r.Header.Del("Last-Event-ID")
	last := u.plane.LastSeq()
	since, err := httpio.Since(r, v, last)
	if err != nil {
		return err
	}
	// A page that followed another history (the database was restored or
	// replaced) follows this one: it refreshes every panel when it
	// reconnects, and events numbered at or below its old number must
	// still reach it.
	since = min(since, last)
	ctx := r.Context()
	ch, err := u.plane.Subscribe(ctx, since)
	if err != nil {
		return httpio.ContextError(ctx, err)
	}
	rc := httpio.StartStream(w)

	// The delivery log's changes, for admins (who alone see its panel),
	// from before the first frame on; after a frame the next waits a
	// second, so a burst of attempts costs one refresh.
	var deliv, delivNext <-chan struct{}
	var delivGate <-chan time.Time
	if c.Role == arbiter.RoleAdmin {
		deliv = u.deliveriesChanged()
	}
	var buf bytes.Buffer
	buf.WriteString("retry: 2000\n\n")
	live := liveness{ka: map[string]string{}, seen: map[string]string{}, now: u.now}
	live.frame(&buf, u.plane)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return nil
	}
	if err := rc.Flush(); err != nil {
		return nil
	}
	tick := time.NewTicker(u.Tick)
	defer tick.Stop()
	for {
		buf.Reset()
		select {
		case <-ctx.Done():
			return nil
		case <-deliv:
			// The change after this one closes delivNext, even during the gap.
			deliv, delivNext, delivGate = nil, u.deliveriesChanged(), time.After(staleGap)
			buf.WriteString("event: stale\ndata: {\"panels\":[\"deliveries\"]}\n\n")
		case <-delivGate:
			delivGate, deliv = nil, delivNext
			continue
		case <-tick.C:
			if !live.frame(&buf, u.plane) {
				buf.WriteString(": keepalive\n\n")
			}
		case ev, ok := <-ch:
			if !ok {
				return nil // fell behind or shutting down: the page reconnects
			}
			if arbiter.EventVisible(c, &ev) {
				appendEvent(&buf, &ev)
			}
			// Send whatever else is already waiting with one flush.
			for more := true; more && buf.Len() < 32<<10; {
				select {
				case ev, ok = <-ch:
					if !ok {
						more = false
						break
					}
					if arbiter.EventVisible(c, &ev) {
						appendEvent(&buf, &ev)
					}
				default:
					more = false
				}
			}
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
	}
}

// staleGap is the least time between two "stale" frames of one stream.
const staleGap = time.Second

// streamEvent is an event as the page's stream carries it.
type streamEvent struct {
	Seq     int64  `json:"seq"`
	Kind    string `json:"kind"`
	Subject string `json:"subject"`
}

func appendEvent(buf *bytes.Buffer, ev *arbiter.Event) {
	b, _ := json.Marshal(streamEvent{ev.Seq, ev.Kind, ev.Subject}) // strings and an int: cannot fail
	buf.WriteString("id: ")
	buf.WriteString(strconv.FormatInt(ev.Seq, 10))
	buf.WriteString("\ndata: ")
	buf.Write(b)
	buf.WriteString("\n\n")
}

// liveness remembers what one stream last sent of the memory-only times,
// and what the GPU tiles last showed of each machine's samples.
type liveness struct {
	ka, seen map[string]string
	usage    map[string]string
	now      func() time.Time // the page's clock, for the frame's "now"
}

// frame appends a liveness frame with the keepalives and heartbeats that
// changed since the last one, and reports whether there was anything.
func (l *liveness) frame(buf *bytes.Buffer, p Reader) bool {
	ka := map[string]string{}
	for _, a := range p.Allocations(arbiter.AllocationFilter{State: arbiter.StateReady}) {
		if t := lastKeepalive(&a); t != nil {
			ka[strconv.FormatInt(a.ID, 10)] = isoTime(*t)
		}
	}
	seen := map[string]string{}
	machines := p.Machines()
	for _, m := range machines {
		if m.LastSeen != nil && m.Source == arbiter.SourceAgent {
			seen[m.Name] = isoTime(*m.LastSeen)
		}
	}
	dka, dseen := changed(l.ka, ka), changed(l.seen, seen)
	l.ka, l.seen = ka, seen
	// GPU samples live in memory too, and no event says they changed: when
	// what a tile shows of them changed, the machines panel is stale.
	usage := map[string]string{}
	for _, m := range machines {
		usage[m.Name] = usageSignature(&m)
	}
	stale := l.usage != nil && (len(changed(l.usage, usage)) > 0 || len(usage) != len(l.usage))
	l.usage = usage
	if stale {
		buf.WriteString("event: stale\ndata: {\"panels\":[\"machines\"]}\n\n")
	}
	if len(dka) == 0 && len(dseen) == 0 {
		return stale
	}
	b, _ := json.Marshal(struct {
		Now  string            `json:"now"`
		KA   map[string]string `json:"ka"`
		Seen map[string]string `json:"seen"`
	}{isoTime(l.now()), dka, dseen})
	buf.WriteString("event: live\ndata: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	return true
}

// changed returns the entries of cur that old does not have alike.
func changed(old, cur map[string]string) map[string]string {
	d := map[string]string{}
	for k, v := range cur {
		if old[k] != v {
			d[k] = v
		}
	}
	return d
}

// usageSignature is what the tiles show of a machine's GPU samples, at the
// precision they show it: the state, the utilisation's tenth, the memory
// to a tenth of a GiB, the processes and an unmanaged one.
func usageSignature(m *arbiter.MachineStatus) string {
	var b strings.Builder
	for i := range m.Devices {
		d := &m.Devices[i]
		b.WriteString(d.State)
		if d.Unmanaged {
			b.WriteByte('!')
		}
		if u := d.Usage; u != nil {
			use, _ := useText(u)
			b.WriteString(use)
			for _, p := range u.Processes {
				b.WriteString(procText(p))
			}
		}
		b.WriteByte(';')
	}
	return b.String()
}

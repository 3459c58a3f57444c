package ui

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The dashboard's panels of the coordination capability: services with
// their model, lock and swap control, the recent swaps and the log of one;
// and, for admins, the webhook delivery log.

// Services and swaps.

// swapRows is how many of the latest swaps the panel lists.
const swapRows = 10

type services struct {
	Services []service
	Swaps    []swap // newest first
	// Log is the swap whose log the page streams unless the reader picked
	// another: the one in progress, else the latest.
	Log *swap
	// CanSwap: the caller's role may request swaps (user, admin).
	CanSwap bool
}

type service struct {
	arbiter.Service
	Serving  *arbiter.CatalogEntry // the entry of Model; nil when unknown or gone from the catalog
	Since    *time.Time            // when its last complete swap ended
	Catalog  []arbiter.CatalogEntry
	Locks    []arbiter.LockState // held locks guarding its swaps
	Current  *swap               // the swap in progress
	MachineS string              // "up", "down", "draining", "" when not registered
}

// swap is one swap as the panel shows it (without its log).
type swap struct {
	ID, Service, ModelKey, State string
	RequestedBy, Reason          string
	DryRun, Forced               bool
	Fence                        int64
	ReturnCode                   *int
	CreatedAt                    time.Time
	StartedAt, FinishedAt        *time.Time
	Lines                        int // lines of output so far
}

// Took says how long an ended swap ran: "42 s", "3 min".
func (s *swap) Took() string {
	if s.FinishedAt == nil {
		return ""
	}
	from := s.CreatedAt
	if s.StartedAt != nil {
		from = *s.StartedAt
	}
	return duration(s.FinishedAt.Sub(from))
}

// Result says how an ended swap ended: its exit status and reason.
func (s *swap) Result() string {
	var parts []string
	if s.ReturnCode != nil {
		parts = append(parts, "exit "+strconv.Itoa(*s.ReturnCode))
	}
	if s.Reason != "" {
		parts = append(parts, s.Reason)
	}
	if s.DryRun {
		parts = append(parts, "dry run")
	}
	if s.Forced {
		parts = append(parts, "forced past the lock")
	} else if s.Fence > 0 {
		parts = append(parts, "with the lock's token (fence "+strconv.FormatInt(s.Fence, 10)+")")
	}
	return strings.Join(parts, " · ")
}

func swapOf(s *arbiter.Swap) swap {
	return swap{
		ID: s.ID, Service: s.Service, ModelKey: s.ModelKey, State: s.State,
		RequestedBy: s.RequestedBy, Reason: s.Reason, DryRun: s.DryRun, Forced: s.Forced, Fence: s.Fence,
		ReturnCode: s.ReturnCode, CreatedAt: s.CreatedAt, StartedAt: s.StartedAt, FinishedAt: s.FinishedAt,
		Lines: s.LogDropped + len(s.Log),
	}
}

func servicesData(v *view) (any, bool) {
	svcs := records[arbiter.Service](v, arbiter.RecordService)
	if len(svcs) == 0 {
		return nil, false
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	d := services{CanSwap: v.Caller.Role == arbiter.RoleAdmin || v.Caller.Role == arbiter.RoleUser}

	catalog := map[string][]arbiter.CatalogEntry{}
	for _, c := range records[arbiter.CatalogEntry](v, arbiter.RecordCatalog) {
		catalog[c.Service] = append(catalog[c.Service], c)
	}
	locks := map[string]arbiter.LockState{}
	for _, l := range records[arbiter.Lock](v, arbiter.RecordLock) {
		if l.ExpiresAt.After(v.Now) {
			locks[l.Name] = l.Public(v.Now)
		}
	}
	raw := records[arbiter.Swap](v, arbiter.RecordSwap)
	sort.Slice(raw, func(i, j int) bool { return arbiter.SwapIDLess(raw[j].ID, raw[i].ID) })
	byID := map[string]*arbiter.Swap{}
	lastDone := map[string]*time.Time{} // service → end of its latest complete real swap
	for i := range raw {
		s := &raw[i]
		byID[s.ID] = s
		if s.State == arbiter.SwapComplete && !s.DryRun && lastDone[s.Service] == nil {
			lastDone[s.Service] = s.FinishedAt
		}
	}
	machines := map[string]string{}
	for _, m := range v.Machines() {
		machines[m.Name] = m.State
	}
	for _, s := range svcs {
		u := service{Service: s, Catalog: catalog[s.Name], Since: lastDone[s.Name], MachineS: machines[s.Machine]}
		sort.Slice(u.Catalog, func(i, j int) bool { return u.Catalog[i].Key < u.Catalog[j].Key })
		for i := range u.Catalog {
			if u.Catalog[i].Key == s.Model {
				u.Serving = &u.Catalog[i]
			}
		}
		for _, name := range s.SwapLocks() {
			if l, ok := locks[name]; ok {
				u.Locks = append(u.Locks, l)
			}
		}
		if sw := byID[s.Swap]; sw != nil && !sw.Done() {
			c := swapOf(sw)
			u.Current = &c
		}
		d.Services = append(d.Services, u)
	}
	for i := range raw {
		if i == swapRows {
			break
		}
		d.Swaps = append(d.Swaps, swapOf(&raw[i]))
	}
	for i := range d.Swaps {
		if !byID[d.Swaps[i].ID].Done() {
			d.Log = &d.Swaps[i] // the oldest in progress among the listed
		}
	}
	if d.Log == nil && len(d.Swaps) > 0 {
		d.Log = &d.Swaps[0]
	}
	return d, true
}

// duration writes a duration for people: "850 ms", "42 s", "3 min 5 s",
// "2 h 10 min".
func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "—"
	case d < time.Second:
		return strconv.Itoa(int(d/time.Millisecond)) + " ms"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		s := strconv.Itoa(int(d/time.Minute)) + " min"
		if sec := int(d % time.Minute / time.Second); sec > 0 {
			s += " " + strconv.Itoa(sec) + " s"
		}
		return s
	}
	return strconv.Itoa(int(d/time.Hour)) + " h " + strconv.Itoa(int(d%time.Hour/time.Minute)) + " min"
}

// Webhook deliveries (admins only): the latest attempts from the delivery
// log the dispatcher keeps in the store.

// deliveryRows is how many of the latest deliveries the panel lists.
const deliveryRows = 20

type deliveries struct {
	Subs   []sub // id order
	Rows   []delivery
	Counts []count // of the listed rows, by state
	Err    string
}

type sub struct {
	arbiter.Webhook        // public
	Host            string // of its URL
}

type delivery struct {
	arbiter.Delivery
	Target string // the subscription's host, "" when it is gone
	Last   *arbiter.DeliveryAttempt
}

// Outcome says what the receiver answered last: "200 OK", "500 Internal
// Server Error", "dial tcp …: connection refused"; "" before any attempt.
func (d *delivery) Outcome() string {
	if d.Last == nil {
		return d.LastError
	}
	var parts []string
	st := ""
	if d.Last.Status != 0 {
		st = strconv.Itoa(d.Last.Status) + " " + http.StatusText(d.Last.Status)
		parts = append(parts, st)
	}
	// The dispatcher's error repeats the status ("the receiver answered 500
	// Internal Server Error"): keep only what it adds.
	if e := strings.TrimLeft(strings.TrimPrefix(d.Last.Error, "the receiver answered "+st), ": "); e != "" {
		parts = append(parts, e)
	}
	return strings.Join(parts, " · ")
}

// GaveUp is why a failed delivery is not tried again, "" otherwise.
func (d *delivery) GaveUp() string {
	if d.State != arbiter.DeliveryFailed || d.LastError == d.Outcome() {
		return ""
	}
	return d.LastError
}

// OK reports whether the last attempt had a 2xx answer.
func (d *delivery) OK() bool { return d.Last != nil && d.Last.Status >= 200 && d.Last.Status < 300 }

func deliveriesData(v *view) (any, bool) {
	if !v.Admin || v.deliveries == nil {
		return nil, false
	}
	var d deliveries
	hosts := map[string]string{}
	for _, w := range records[arbiter.Webhook](v, arbiter.RecordWebhook) {
		sub := sub{Webhook: w.Public()}
		if u, err := url.Parse(w.URL); err == nil {
			sub.Host = u.Host
		}
		hosts[w.ID] = sub.Host
		d.Subs = append(d.Subs, sub)
	}
	sort.Slice(d.Subs, func(i, j int) bool { return d.Subs[i].ID < d.Subs[j].ID })
	ctx, cancel := context.WithTimeout(v.ctx, 5*time.Second)
	defer cancel()
	ds, err := v.deliveries.Deliveries(ctx, arbiter.DeliveryFilter{Limit: deliveryRows})
	if err != nil {
		d.Err = "the delivery log could not be read: " + arbiter.ErrorMessage(err)
	}
	n := map[string]int{}
	for _, x := range ds {
		r := delivery{Delivery: x, Target: hosts[x.Webhook]}
		if len(x.History) > 0 {
			r.Last = &x.History[len(x.History)-1]
		}
		n[x.State]++
		d.Rows = append(d.Rows, r)
	}
	for _, st := range []string{arbiter.DeliveryPending, arbiter.DeliveryDelivered, arbiter.DeliveryFailed} {
		if n[st] > 0 {
			d.Counts = append(d.Counts, count{st, n[st]})
		}
	}
	return d, len(d.Subs) > 0 || len(d.Rows) > 0 || d.Err != ""
}

// DeliveryWatch is a webhook delivery log that tells the dashboard when a
// delivery is created or attempted, so the page's delivery panel follows
// the dispatcher without asking the store on a timer: the store has no
// events of its own. The server hands the same DeliveryWatch to the
// dispatcher (which writes through it) and to CoordOptions.Deliveries.
// Its methods are those of the wrapped log, with the same errors.
type DeliveryWatch struct {
	arbiter.DeliveryLog
	mu      sync.Mutex
	changed chan struct{}
}

// WatchDeliveries wraps dl.
func WatchDeliveries(dl arbiter.DeliveryLog) *DeliveryWatch {
	return &DeliveryWatch{DeliveryLog: dl, changed: make(chan struct{})}
}

// Changed returns a channel closed at the next change of the log.
func (w *DeliveryWatch) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

func (w *DeliveryWatch) notify() {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// EnqueueDeliveries is the wrapped log's, and then wakes the watchers when
// deliveries were added.
func (w *DeliveryWatch) EnqueueDeliveries(ctx context.Context, ds []arbiter.Delivery, cursor int64) error {
	err := w.DeliveryLog.EnqueueDeliveries(ctx, ds, cursor)
	if err == nil && len(ds) > 0 {
		w.notify()
	}
	return err
}

// RecordAttempt is the wrapped log's, and then wakes the watchers.
func (w *DeliveryWatch) RecordAttempt(ctx context.Context, d arbiter.Delivery, a arbiter.DeliveryAttempt) error {
	err := w.DeliveryLog.RecordAttempt(ctx, d, a)
	if err == nil {
		w.notify()
	}
	return err
}

// deliveriesChanged is what the page's stream waits on for the delivery
// panel: nil (never ready) when the server's delivery log is not watched.
func (u *Dashboard) deliveriesChanged() <-chan struct{} {
	if w, ok := u.deliveries.(interface{ Changed() <-chan struct{} }); ok {
		return w.Changed()
	}
	return nil
}

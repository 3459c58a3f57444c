package engine

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

// swaps is the services-and-swaps capability (docs/reference/coordination.md §2):
// the configured services, their model catalogs, and swaps — recorded
// operations that change a service's model, carried out by the agent on the
// service's machine and guarded by the service's swap locks.
//
// A swap's log lines are saved as swap.log events as they come (the outbox
// of the stream and of webhooks); the swap record in the read view follows
// them in memory, and the whole log is saved with the record when the swap
// ends. A swap that does not end within its service's swap timeout fails:
// that is a deadline, like a lock's expiry.
type swaps struct {
	services map[string]*arbiter.Service
	catalog  map[string]*arbiter.CatalogEntry // by arbiter.CatalogKey
	all      map[string]*swapRec
	done     []string        // ended swaps, oldest first, for the bounded history
	dryDone  []string        // likewise, dry runs: they do not push real swaps out
	next     int64           // the number of the last swap recorded
	waiting  map[string]bool // services whose GPUs are to be held when they can be: holdWaiting
}

type swapRec struct {
	s  arbiter.Swap
	n  int64 // its number (the id, parsed)
	dl deadline
}

// swapSeqKind is the record kind of the swap counter (key "last").
const swapSeqKind = "swap.seq"

// swapHistory is how many ended swaps are kept, and swapDryHistory how
// many dry runs besides.
const (
	swapHistory    = 500
	swapDryHistory = 50
)

type swapSeq struct {
	Last int64 `json:"last"`
}

func (w *swaps) init() {
	if w.services == nil {
		w.services = map[string]*arbiter.Service{}
		w.catalog = map[string]*arbiter.CatalogEntry{}
		w.all = map[string]*swapRec{}
	}
}

func (w *swaps) kinds() []string {
	return []string{arbiter.RecordService, arbiter.RecordCatalog, arbiter.RecordSwap, swapSeqKind}
}

func (w *swaps) load(e *Engine, recs []arbiter.Record, now time.Time) error {
	w.init()
	var bad []string
	var live []*swapRec
	for _, r := range recs {
		switch r.Kind {
		case swapSeqKind:
			if s, err := coordDecode[swapSeq](r); err == nil {
				w.next = max(w.next, s.Last)
			} else {
				bad = append(bad, err.Error())
			}
		case arbiter.RecordService:
			s, err := coordDecode[arbiter.Service](r)
			if err != nil || s.Name != r.Key {
				bad = append(bad, fmt.Sprintf("service %q: unreadable record", r.Key))
				continue
			}
			w.services[s.Name] = &s
		case arbiter.RecordCatalog:
			c, err := coordDecode[arbiter.CatalogEntry](r)
			if err != nil || arbiter.CatalogKey(c.Service, c.Key) != r.Key {
				bad = append(bad, fmt.Sprintf("catalog entry %q: unreadable record", r.Key))
				continue
			}
			w.catalog[r.Key] = &c
		case arbiter.RecordSwap:
			s, err := coordDecode[arbiter.Swap](r)
			n, nerr := strconv.ParseInt(r.Key, 10, 64)
			if err != nil || nerr != nil || s.ID != r.Key {
				bad = append(bad, fmt.Sprintf("swap %q: unreadable record", r.Key))
				continue
			}
			rec := w.add(s, n)
			w.next = max(w.next, n)
			if !s.Done() {
				live = append(live, rec)
			}
		}
	}
	// Ended swaps in number order form the history.
	var ended []*swapRec
	for _, rec := range w.all {
		if rec.s.Done() {
			ended = append(ended, rec)
		}
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].n < ended[j].n })
	for _, rec := range ended {
		if rec.s.DryRun {
			w.dryDone = append(w.dryDone, rec.s.ID)
		} else {
			w.done = append(w.done, rec.s.ID)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].n < live[j].n })
	for _, rec := range live {
		at := rec.s.CreatedAt.Add(coordSeconds(rec.s.TimeoutS))
		if svc := w.services[rec.s.Service]; svc == nil || svc.Swap != rec.s.ID {
			w.fail(e, rec, "the service was removed or no longer names this swap", now)
			continue
		}
		if !at.After(now) {
			w.timeout(e, rec, now)
			continue
		}
		e.dl.set(&rec.dl, at)
	}
	// A service naming a swap that is not running any more is repaired;
	// one without the GPUs it asks for waits for them (holdWaiting), as
	// before the restart.
	for _, name := range w.serviceNames() {
		svc := w.services[name]
		if rec := w.all[svc.Swap]; svc.Swap != "" && (rec == nil || rec.s.Done()) {
			svc.Swap = ""
			w.saveService(e, svc)
		}
		if svc.Allocation != 0 && e.allocs[svc.Allocation] == nil {
			svc.Allocation = 0 // ended meanwhile
			w.saveService(e, svc)
		}
		if svc.GPUs > 0 && svc.Allocation == 0 {
			w.wait(name)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("swaps: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (w *swaps) add(s arbiter.Swap, n int64) *swapRec {
	rec := &swapRec{s: s, n: n}
	rec.dl = newDeadline(func(e *Engine, now time.Time) { e.swaps.timeout(e, rec, now) })
	w.all[s.ID] = rec
	return rec
}

func (w *swaps) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	w.init()
	var res any
	var err error
	switch c := cmd.(type) {
	case arbiter.SyncServices:
		err = w.sync(e, c, now, true)
	case arbiter.PutCatalogEntry:
		res, err = w.putEntry(e, c, now)
	case arbiter.DeleteCatalogEntry:
		res, err = w.deleteEntry(e, c, now)
	case arbiter.RequestSwap:
		res, err = w.request(e, c, now)
	case arbiter.ClaimSwap:
		res, err = w.claim(e, c, now)
	case arbiter.AppendSwapLog:
		err = w.appendLog(e, c, now)
	case arbiter.FinishSwap:
		res, err = w.finish(e, c, now)
	case arbiter.CancelSwap:
		res, err = w.cancel(e, c, now)
	default:
		return nil, nil, false
	}
	return res, err, true
}

func (w *swaps) records() []arbiter.Record {
	out := []arbiter.Record{{Kind: swapSeqKind, Key: "last", Value: swapSeq{w.next}}}
	for _, n := range w.serviceNames() {
		out = append(out, arbiter.Record{Kind: arbiter.RecordService, Key: n, Value: *w.services[n]})
	}
	keys := make([]string, 0, len(w.catalog))
	for k := range w.catalog {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, arbiter.Record{Kind: arbiter.RecordCatalog, Key: k, Value: *w.catalog[k]})
	}
	ids := make([]string, 0, len(w.all))
	for id := range w.all {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		out = append(out, arbiter.Record{Kind: arbiter.RecordSwap, Key: id, Value: w.all[id].s})
	}
	return out
}

func (w *swaps) serviceNames() []string {
	names := make([]string, 0, len(w.services))
	for n := range w.services {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// checkServices returns c's services by name (the one service made the
// default when none is) and its catalog entries by key. Errors: invalid,
// for a service or entry that does not validate, or is given twice.
func checkServices(c arbiter.SyncServices) (map[string]arbiter.Service, map[string]arbiter.CatalogEntry, error) {
	want := map[string]arbiter.Service{}
	defaults := 0
	for _, s := range c.Services {
		if err := s.Validate(); err != nil {
			return nil, nil, err
		}
		if _, dup := want[s.Name]; dup {
			return nil, nil, arbiter.Errorf(arbiter.EInvalid, "service %q is configured twice", s.Name)
		}
		if s.Default {
			defaults++
		}
		want[s.Name] = s
	}
	if defaults > 1 {
		return nil, nil, arbiter.Errorf(arbiter.EInvalid, "more than one service is marked default = true")
	}
	if defaults == 0 && len(want) == 1 {
		for n, s := range want {
			s.Default = true
			want[n] = s
		}
	}
	entries := map[string]arbiter.CatalogEntry{}
	for _, ce := range c.Catalog {
		s, ok := want[ce.Service]
		if !ok {
			return nil, nil, arbiter.Errorf(arbiter.EInvalid, "catalog entry %q names service %q, which is not configured", ce.Key, ce.Service)
		}
		if err := ce.Validate(&s); err != nil {
			return nil, nil, err
		}
		k := arbiter.CatalogKey(ce.Service, ce.Key)
		if _, dup := entries[k]; dup {
			return nil, nil, arbiter.Errorf(arbiter.EInvalid, "service %s: model key %q is in the catalog twice", ce.Service, ce.Key)
		}
		entries[k] = ce
	}
	return want, entries, nil
}

// sync makes the configured services and catalog entries those of c;
// with hold, the GPUs the services ask for are held now, or an event says
// why not (else the caller does, as Reconfigure once the machines are in).
func (w *swaps) sync(e *Engine, c arbiter.SyncServices, now time.Time, hold bool) error {
	want, entries, err := checkServices(c)
	if err != nil {
		return err
	}
	// Services gone from the configuration go, with their catalogs.
	for _, name := range w.serviceNames() {
		if _, ok := want[name]; ok {
			continue
		}
		svc := w.services[name]
		if rec := w.all[svc.Swap]; rec != nil && !rec.s.Done() {
			w.fail(e, rec, "service "+name+" was removed from the configuration", now)
		}
		for _, k := range w.catalogKeys(name) {
			w.removeEntry(e, k, now)
		}
		delete(w.services, name) // first: its allocation's end must not hold it again
		if svc.Allocation != 0 {
			e.end(svc.Allocation, "service "+name+" was removed from the configuration", now)
		}
		e.removeRecord(arbiter.RecordService, name)
		e.emit(now, arbiter.EventServiceRemoved, "service/"+name, svc)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := want[n]
		s.SwapCommand = append([]string{}, s.SwapCommand...)
		s.LocalPathRoots = append([]string{}, s.LocalPathRoots...)
		if old := w.services[n]; old != nil {
			s.Model, s.Swap, s.Allocation = old.Model, old.Swap, old.Allocation
			if reflect.DeepEqual(*old, s) {
				continue
			}
		}
		w.services[n] = &s
		w.saveService(e, &s)
		e.emit(now, arbiter.EventServiceUpdated, "service/"+n, s)
	}
	for _, n := range names {
		w.holdGPUs(e, w.services[n], now)
	}
	// Configured entries: the configuration wins; entries from the API stay.
	keys := make([]string, 0, len(w.catalog))
	for k := range w.catalog {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := entries[k]; !ok && w.catalog[k].Source == arbiter.CatalogFromConfig {
			w.removeEntry(e, k, now)
		}
	}
	keys = keys[:0]
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ce := entries[k]
		ce.Source = arbiter.CatalogFromConfig
		ce.Args = append([]string{}, ce.Args...)
		if old := w.catalog[k]; old != nil {
			ce.UpdatedAt = old.UpdatedAt
			if reflect.DeepEqual(*old, ce) {
				continue
			}
		}
		ce.UpdatedAt = now
		w.catalog[k] = &ce
		e.putRecord(arbiter.RecordCatalog, k, ce)
		e.emit(now, arbiter.EventCatalogUpdated, "catalog/"+k, ce)
	}
	if hold {
		w.holdWaiting(e, now, true)
	}
	return nil
}

func (w *swaps) catalogKeys(service string) []string {
	var out []string
	for k, ce := range w.catalog {
		if ce.Service == service {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (w *swaps) removeEntry(e *Engine, k string, now time.Time) {
	ce := w.catalog[k]
	delete(w.catalog, k)
	e.removeRecord(arbiter.RecordCatalog, k)
	e.emit(now, arbiter.EventCatalogRemoved, "catalog/"+k, ce)
}

func (w *swaps) service(name string) (*arbiter.Service, error) {
	if name == "" {
		for _, n := range w.serviceNames() {
			if w.services[n].Default {
				return w.services[n], nil
			}
		}
		if len(w.services) == 0 {
			return nil, arbiter.Errorf(arbiter.ENotFound, "no services are configured: add a [[services]] section to the configuration")
		}
		return nil, arbiter.Errorf(arbiter.ENotFound, "no service is the default: mark one [[services]] default = true")
	}
	if err := arbiter.ValidateName("service name", name); err != nil {
		return nil, err
	}
	s := w.services[name]
	if s == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "service %q is not configured (see arbiter services)", name)
	}
	return s, nil
}

func (w *swaps) putEntry(e *Engine, c arbiter.PutCatalogEntry, now time.Time) (any, error) {
	svc, err := w.service(c.Entry.Service)
	if err != nil {
		return nil, err
	}
	ce := c.Entry
	ce.Service = svc.Name
	ce.Source = arbiter.CatalogFromAPI
	ce.UpdatedAt = now
	ce.Args = append([]string{}, ce.Args...)
	if err := ce.Validate(svc); err != nil {
		return nil, err
	}
	if _, err := arbiter.SwapCommandFor(svc, &ce); err != nil {
		return nil, err
	}
	k := arbiter.CatalogKey(svc.Name, ce.Key)
	w.catalog[k] = &ce
	e.putRecord(arbiter.RecordCatalog, k, ce)
	e.emit(now, arbiter.EventCatalogUpdated, "catalog/"+k, ce)
	return ce, nil
}

func (w *swaps) deleteEntry(e *Engine, c arbiter.DeleteCatalogEntry, now time.Time) (any, error) {
	svc, err := w.service(c.Service)
	if err != nil {
		return nil, err
	}
	k := arbiter.CatalogKey(svc.Name, c.Key)
	ce := w.catalog[k]
	if ce == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "model key %q is not in the catalog of service %s", arbiter.Clip(c.Key, 64), svc.Name)
	}
	old := *ce
	w.removeEntry(e, k, now)
	return old, nil
}

func (w *swaps) request(e *Engine, c arbiter.RequestSwap, now time.Time) (any, error) {
	svc, err := w.service(c.Service)
	if err != nil {
		return nil, err
	}
	if c.ModelKey == "" {
		return nil, arbiter.Errorf(arbiter.EInvalid, "model_key is required: name a catalog entry of service %s", svc.Name)
	}
	ce := w.catalog[arbiter.CatalogKey(svc.Name, c.ModelKey)]
	v := arbiter.ValidateSwap(svc, c.ModelKey, ce)
	if !v.OK {
		return nil, arbiter.Errorf(arbiter.EInvalid, "%s", strings.Join(v.Errors, "; "))
	}
	if len(c.LockToken) > arbiter.MaxLockTokenBytes {
		return nil, arbiter.Errorf(arbiter.EInvalid, "lock token is longer than %d bytes", arbiter.MaxLockTokenBytes)
	}
	s := arbiter.Swap{
		Service: svc.Name, Machine: svc.Machine, ModelKey: ce.Key, DryRun: c.DryRun,
		Command: v.Command, Kind: svc.Kind, Endpoint: svc.Endpoint, LocalPath: ce.LocalPath, Repo: ce.Repo,
		LocalRoots: append([]string(nil), svc.LocalPathRoots...), ServedNames: ce.ServedNames(),
		ReadyTimeoutS: svc.ReadyTimeoutS, TimeoutS: svc.SwapTimeoutS,
		RequestedBy: c.Caller.Name, CreatedAt: now, Log: []string{},
	}
	if c.DryRun {
		// A dry run validates and shows the command; it never reaches the
		// agent, the locks, or the service.
		w.next++
		s.ID = strconv.FormatInt(w.next, 10)
		zero := 0
		t := now
		s.State, s.ReturnCode, s.StartedAt, s.FinishedAt = arbiter.SwapComplete, &zero, &t, &t
		s.Log = []string{"dry run: the agent on " + svc.Machine + " would run: " + coordQuoteArgv(v.Command)}
		rec := w.add(s, w.next)
		e.putRecord(swapSeqKind, "last", swapSeq{w.next})
		w.saveSwap(e, rec)
		w.ended(e, rec)
		e.emit(now, arbiter.EventSwapComplete, "swap/"+s.ID, coordSwapEvent(&rec.s))
		return rec.s, nil
	}
	if c.Force && c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may force a swap past its lock")
	}
	// The gate: one reading of each guarding lock, after expired ones went.
	// It comes before the one-swap-per-service check (docs/reference/coordination.md §2: a swap
	// without the token is refused with 423 whenever another holds the
	// lock), so that a dashboard whose swap meets a scheduler's lock and the
	// scheduler's running swap is shown who holds the lock, not just 409.
	for _, name := range svc.SwapLocks() {
		held, blocked := e.locks.gate(name, c.LockToken)
		switch {
		case blocked && !c.Force:
			return nil, arbiter.NewLockHeldError(arbiter.ELocked, held.Public(now),
				"a swap of service "+svc.Name+" needs its token in X-Swap-Lock-Token (or an admin's ?force=true)")
		case held != nil && !blocked:
			s.Fence = max(s.Fence, held.Fence)
		case blocked:
			s.Forced = true
		}
	}
	if rec := w.all[svc.Swap]; rec != nil && !rec.s.Done() {
		return nil, arbiter.Errorf(arbiter.EConflict, "swap %s of service %s is %s; only one swap per service runs at a time (arbiter swap status %s)",
			rec.s.ID, svc.Name, rec.s.State, rec.s.ID)
	}
	mc := e.byName[svc.Machine]
	switch {
	case mc == nil:
		return nil, arbiter.Errorf(arbiter.EConflict, "machine %s of service %s is not registered: run arbiter agent --name %s there", svc.Machine, svc.Name, svc.Machine)
	case mc.m.Down:
		return nil, arbiter.Errorf(arbiter.EConflict, "machine %s of service %s is down (its agent stopped heartbeating): no agent would run the swap", svc.Machine, svc.Name)
	}
	w.next++
	s.ID = strconv.FormatInt(w.next, 10)
	s.State = arbiter.SwapPending
	rec := w.add(s, w.next)
	e.putRecord(swapSeqKind, "last", swapSeq{w.next})
	e.dl.set(&rec.dl, now.Add(coordSeconds(s.TimeoutS)))
	svc.Swap = s.ID
	w.saveService(e, svc)
	w.saveSwap(e, rec)
	e.emit(now, arbiter.EventSwapPending, "swap/"+s.ID, coordSwapEvent(&rec.s))
	return rec.s, nil
}

// claim hands the oldest pending swap on the machine to its agent.
func (w *swaps) claim(e *Engine, c arbiter.ClaimSwap, now time.Time) (any, error) {
	if err := arbiter.ValidateName("machine", c.Machine); err != nil {
		return nil, err
	}
	if c.Instance != "" {
		if err := arbiter.ValidateName("agent instance", c.Instance); err != nil {
			return nil, err
		}
	}
	var pick *swapRec
	for _, id := range w.liveIDs() {
		rec := w.all[id]
		if rec.s.Machine != c.Machine {
			continue
		}
		if rec.s.State == arbiter.SwapRunning && c.Instance != "" && rec.s.Instance == c.Instance {
			// Its agent claims again: the answer of its claim was lost.
			s := rec.s
			s.Log = append([]string(nil), s.Log...)
			return &s, nil
		}
		if rec.s.State == arbiter.SwapRunning {
			// The agent runs one swap at a time: claiming, it runs none.
			w.fail(e, rec, "the agent on "+c.Machine+" stopped or restarted while the swap ran", now)
			continue
		}
		if pick == nil {
			pick = rec
		}
	}
	if pick == nil {
		return nil, nil
	}
	t := now
	pick.s.State, pick.s.StartedAt, pick.s.Instance = arbiter.SwapRunning, &t, c.Instance
	w.saveSwap(e, pick)
	e.emit(now, arbiter.EventSwapRunning, "swap/"+pick.s.ID, coordSwapEvent(&pick.s))
	s := pick.s
	s.Log = append([]string(nil), s.Log...)
	return &s, nil
}

// liveIDs are the pending and running swaps, oldest first.
func (w *swaps) liveIDs() []string {
	var recs []*swapRec
	for _, rec := range w.all {
		if !rec.s.Done() {
			recs = append(recs, rec)
		}
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].n < recs[j].n })
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.s.ID
	}
	return ids
}

func (w *swaps) running(id, machine string) (*swapRec, error) {
	rec := w.all[id]
	if rec == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "swap %q is not known", arbiter.Clip(id, 40))
	}
	if rec.s.State != arbiter.SwapRunning {
		return nil, arbiter.Errorf(arbiter.EConflict, "swap %s is %s, not running", id, rec.s.State)
	}
	if machine != "" && rec.s.Machine != machine {
		return nil, arbiter.Errorf(arbiter.EConflict, "swap %s runs on machine %s, not %s", id, rec.s.Machine, machine)
	}
	return rec, nil
}

func (w *swaps) appendLog(e *Engine, c arbiter.AppendSwapLog, now time.Time) error {
	if len(c.Lines) > arbiter.MaxSwapLogBatch {
		return arbiter.Errorf(arbiter.EInvalid, "at most %d log lines at once, got %d", arbiter.MaxSwapLogBatch, len(c.Lines))
	}
	for i, l := range c.Lines {
		// Lines longer than MaxSwapLogLine are cut, not refused: the
		// bound here is only the body's.
		if err := arbiter.ValidateLines(fmt.Sprintf("lines[%d]", i), l, len(l)); err != nil {
			return err
		}
	}
	rec, err := w.running(c.ID, c.Machine)
	if err != nil {
		return err
	}
	if len(c.Lines) == 0 {
		return nil
	}
	lines := make([]string, len(c.Lines))
	for i, l := range c.Lines {
		lines[i] = coordCutLine(l)
	}
	offset := rec.s.LogDropped + len(rec.s.Log)
	rec.s.Log = append(rec.s.Log, lines...)
	if over := len(rec.s.Log) - arbiter.MaxSwapLogLines; over > 0 {
		rec.s.Log = append([]string(nil), rec.s.Log[over:]...)
		rec.s.LogDropped += over
	}
	// The lines are durable in the event; the record follows in memory and
	// is saved whole when the swap ends.
	e.touchRecord(arbiter.RecordSwap, rec.s.ID, coordCopySwap(&rec.s))
	e.emit(now, arbiter.EventSwapLog, "swap/"+rec.s.ID, arbiter.SwapLog{ID: rec.s.ID, Offset: offset, Lines: lines})
	return nil
}

func (w *swaps) finish(e *Engine, c arbiter.FinishSwap, now time.Time) (any, error) {
	if err := arbiter.ValidateLines("reason", c.Reason, len(c.Reason)); err != nil {
		return nil, err
	}
	rec, err := w.running(c.ID, c.Machine)
	if err != nil {
		return nil, err
	}
	if c.ReturnCode != nil {
		rc := *c.ReturnCode
		rec.s.ReturnCode = &rc
	}
	if c.OK {
		w.end(e, rec, arbiter.SwapComplete, "", now)
	} else {
		reason := strings.TrimSpace(c.Reason)
		if reason == "" {
			reason = "the agent reported a failure"
		}
		w.end(e, rec, arbiter.SwapFailed, coordCutLine(reason), now)
	}
	return coordCopySwap(&rec.s), nil
}

// cancel ends a pending or running swap at its requester's or an admin's
// word.
func (w *swaps) cancel(e *Engine, c arbiter.CancelSwap, now time.Time) (any, error) {
	if err := arbiter.ValidateLines("reason", c.Reason, len(c.Reason)); err != nil {
		return nil, err
	}
	rec := w.all[c.ID]
	if rec == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "swap %q is not known", arbiter.Clip(c.ID, 40))
	}
	if c.Caller.Role != arbiter.RoleAdmin && rec.s.RequestedBy != c.Caller.Name {
		return nil, arbiter.Errorf(arbiter.EForbidden, "swap %s is %s's; only they or an admin may cancel it", c.ID, arbiter.Clip(rec.s.RequestedBy, 64))
	}
	if rec.s.Done() {
		return nil, arbiter.Errorf(arbiter.EConflict, "swap %s is %s already", c.ID, rec.s.State)
	}
	why := "cancelled by " + arbiter.Clip(c.Caller.Name, 64)
	if c.Caller.Name == "" {
		why = "cancelled"
	}
	if r := strings.TrimSpace(c.Reason); r != "" {
		why += ": " + r
	}
	w.fail(e, rec, coordCutLine(why), now)
	return coordCopySwap(&rec.s), nil
}

func (w *swaps) timeout(e *Engine, rec *swapRec, now time.Time) {
	if rec.s.Done() {
		return
	}
	d := coordSeconds(rec.s.TimeoutS)
	why := fmt.Sprintf("timed out after %s: no agent on machine %s claimed it", d, rec.s.Machine)
	if rec.s.State == arbiter.SwapRunning {
		why = fmt.Sprintf("timed out after %s: the agent on machine %s did not report its end", d, rec.s.Machine)
	}
	w.fail(e, rec, why, now)
}

// failOn fails the swaps of machine: the running ones only, or the
// pending ones too.
func (w *swaps) failOn(e *Engine, machine string, runningOnly bool, reason string, now time.Time) {
	if len(w.all) == 0 {
		return
	}
	for _, id := range w.liveIDs() {
		if rec := w.all[id]; rec.s.Machine == machine && (!runningOnly || rec.s.State == arbiter.SwapRunning) {
			w.fail(e, rec, reason, now)
		}
	}
}

func (w *swaps) fail(e *Engine, rec *swapRec, reason string, now time.Time) {
	if !rec.s.Done() {
		w.end(e, rec, arbiter.SwapFailed, reason, now)
	}
}

// end finishes a live swap in state (complete or failed).
func (w *swaps) end(e *Engine, rec *swapRec, state, reason string, now time.Time) {
	e.dl.clear(&rec.dl)
	t := now
	rec.s.State, rec.s.Reason, rec.s.FinishedAt = state, reason, &t
	if svc := w.services[rec.s.Service]; svc != nil && svc.Swap == rec.s.ID {
		svc.Swap = ""
		if state == arbiter.SwapComplete {
			svc.Model = rec.s.ModelKey
		}
		w.saveService(e, svc)
	}
	w.saveSwap(e, rec)
	w.ended(e, rec)
	kind := arbiter.EventSwapComplete
	if state == arbiter.SwapFailed {
		kind = arbiter.EventSwapFailed
	}
	e.emit(now, kind, "swap/"+rec.s.ID, coordSwapEvent(&rec.s))
}

// ended adds rec to the history and forgets the oldest beyond its bound.
func (w *swaps) ended(e *Engine, rec *swapRec) {
	list, keep := &w.done, swapHistory
	if rec.s.DryRun {
		list, keep = &w.dryDone, swapDryHistory
	}
	*list = append(*list, rec.s.ID)
	for len(*list) > keep {
		id := (*list)[0]
		*list = (*list)[1:]
		delete(w.all, id)
		e.removeRecord(arbiter.RecordSwap, id)
	}
}

func (w *swaps) saveSwap(e *Engine, rec *swapRec) {
	e.putRecord(arbiter.RecordSwap, rec.s.ID, coordCopySwap(&rec.s))
}

// holdGPUs makes s's held GPUs what it now asks for: an allocation that no
// longer matches ends, and GPUs it asks for and does not hold are to be
// held by holdWaiting.
func (w *swaps) holdGPUs(e *Engine, s *arbiter.Service, now time.Time) {
	old := s.Allocation
	if old != 0 {
		if a := e.allocs[old]; a != nil && s.GPUs > 0 && a.a.Request.GPUs == s.GPUs && a.a.Machine != nil && *a.a.Machine == s.Machine {
			return
		}
		s.Allocation = 0 // first: the old one's end must not find it held
		w.saveService(e, s)
	}
	if s.GPUs > 0 {
		w.wait(s.Name) // before the old one's end: what it frees is the service's before the queue's
	}
	if old != 0 {
		e.end(old, "service "+s.Name+" now needs "+arbiter.Plural(s.GPUs, "GPU")+" on "+s.Machine, now)
	}
}

// holdWaiting holds the GPUs of the services waiting for them — at their
// sync, their machine not registered yet (an agent that comes up after the
// server), down, or its GPUs taken — as soon as they can be: schedule calls
// it first, so a service takes GPUs freed or added before the queue does.
// report, at a sync, says in an event why a service is left waiting.
func (w *swaps) holdWaiting(e *Engine, now time.Time, report bool) {
	if len(w.waiting) == 0 {
		return // every release calls it: the usual case costs nothing
	}
	for _, n := range sortedKeys(w.waiting) {
		s := w.services[n]
		if s == nil || s.GPUs == 0 || s.Allocation != 0 {
			delete(w.waiting, n) // gone, changed or held since
			continue
		}
		if mc := e.byName[s.Machine]; !report && (mc == nil || e.cluster.Index.Free(mc.pos) < s.GPUs) {
			continue // not there, down, drained, or too few GPUs free: nothing to try
		}
		id, err := e.grantNow(arbiter.Caller{}, arbiter.Request{Owner: arbiter.ServiceOwnerPrefix + s.Name, GPUs: s.GPUs, Machine: s.Machine}, now)
		if err != nil {
			if report {
				e.emit(now, arbiter.EventServiceGPUsUnavailable, "service/"+s.Name, map[string]string{
					"service": s.Name, "reason": arbiter.ErrorMessage(err)})
			}
			continue
		}
		s.Allocation = id
		w.saveService(e, s)
		delete(w.waiting, n)
	}
}

// allocationDestroyed forgets a service's allocation that ended under it
// (its machine removed, a GPU gone) and holds its GPUs again when it can.
func (w *swaps) allocationDestroyed(e *Engine, a *arbiter.Allocation, now time.Time) {
	if s := w.holder(a); s != nil {
		s.Allocation = 0
		w.saveService(e, s)
		w.wait(s.Name)
	}
}

// letGo forgets a service's allocation an admin releases: its GPUs stay
// free until the service's next sync (a restart). Called before the end,
// so that allocationDestroyed does not hold them again.
func (w *swaps) letGo(e *Engine, a *arbiter.Allocation) {
	if s := w.holder(a); s != nil {
		s.Allocation = 0
		w.saveService(e, s)
	}
}

// holder is the service a holds the GPUs of, or nil.
func (w *swaps) holder(a *arbiter.Allocation) *arbiter.Service {
	name, ok := strings.CutPrefix(a.Owner, arbiter.ServiceOwnerPrefix)
	if s := w.services[name]; ok && s != nil && s.Allocation == a.ID {
		return s
	}
	return nil
}

// wait makes holdWaiting hold the service's GPUs as soon as it can.
func (w *swaps) wait(name string) {
	if w.waiting == nil {
		w.waiting = map[string]bool{}
	}
	w.waiting[name] = true
}

func (w *swaps) saveService(e *Engine, s *arbiter.Service) {
	e.putRecord(arbiter.RecordService, s.Name, *s)
}

// coordCopySwap copies a swap with its own log slice: records handed to the
// store and the view must not change afterwards.
func coordCopySwap(s *arbiter.Swap) arbiter.Swap {
	c := *s
	c.Log = append(make([]string, 0, len(s.Log)), s.Log...)
	return c
}

// coordSwapEvent is a swap as event data: without its log.
func coordSwapEvent(s *arbiter.Swap) arbiter.Swap {
	c := *s
	c.Log = nil
	return c
}

// coordCutLine cuts a log line to MaxSwapLogLine bytes on a rune boundary.
func coordCutLine(l string) string {
	if len(l) <= arbiter.MaxSwapLogLine {
		return l
	}
	cut := arbiter.MaxSwapLogLine
	for cut > 0 && !utf8.RuneStart(l[cut]) {
		cut--
	}
	return l[:cut] + "…"
}

// coordQuoteArgv shows an argv the way a shell user would type it.
func coordQuoteArgv(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			parts[i] = a
		} else {
			parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(parts, " ")
}

func coordSeconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

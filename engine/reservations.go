package engine

import (
	"fmt"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Reservations (docs/guides/fair-share.md): GPUs kept free for a group
// during a window, once or recurring (cron + duration). The GPUs are chosen
// when the reservation is made. Before a window, a request of anyone may
// take them only if it ends before the window starts (backfill by time
// limit: a request without one never does); during the window only
// requests that name the reservation (its group's members) take them,
// and they end with the window. Allocations of others still on them when
// it is made are ended at its start: preempted, with the grace, when
// preemptible, else by a time limit with the notice. Windows are deadlines:
// reservation.started and reservation.ended.
//
// Recurring windows come from the cron expression, parsed by the parser
// the engine is given (Config.Cron): the engine itself reads no cron, and
// stays deterministic.

// resv is a reservation and its current or next window.
type resv struct {
	r      arbiter.Reservation
	cron   arbiter.CronSchedule // nil: one window
	gpus   []*resvGPU
	ws, we time.Time // the open or next window; zero: none left
	active bool
	dl     deadline
	// memo is the last answer of windowAfter (placement asks it per GPU).
	memo struct {
		t, s, e time.Time
		ok, set bool
	}
}

// resvGPU is one reserved GPU.
type resvGPU struct {
	rv      *resv
	machine string
	index   int
}

// resSeqKind is the record kind of the id counter (key "last").
const resSeqKind = "reservation.seq"

type resSeq struct {
	Last int64 `json:"last"`
}

// maxHorizon bounds how far ahead reservations are compared for overlap.
const maxHorizon = 35 * 24 * time.Hour

// windowAfter returns the first window of rv that ends after t, or false.
func (rv *resv) windowAfter(t time.Time) (time.Time, time.Time, bool) {
	m := &rv.memo
	if m.set && m.t.Equal(t) {
		return m.s, m.e, m.ok
	}
	s, e, ok := rv.windowAfterT(t)
	m.t, m.s, m.e, m.ok, m.set = t, s, e, ok, true
	return s, e, ok
}

func (rv *resv) windowAfterT(t time.Time) (time.Time, time.Time, bool) {
	d := rv.r.Duration()
	if rv.cron == nil {
		s := rv.r.Start
		if s.Add(d).After(t) {
			return s, s.Add(d), true
		}
		return time.Time{}, time.Time{}, false
	}
	from := t.Add(-d)
	if earliest := rv.r.Start.Add(-time.Nanosecond); from.Before(earliest) {
		from = earliest
	}
	s := rv.cron.Next(from)
	if s.IsZero() {
		return time.Time{}, time.Time{}, false
	}
	return s, s.Add(d), true
}

// windows calls f with each window of rv that starts before until and
// ends after from, in order, at most n of them; f returning false stops.
func (rv *resv) windows(from, until time.Time, n int, f func(s, e time.Time) bool) {
	t := from
	for i := 0; i < n; i++ {
		s, e, ok := rv.windowAfter(t)
		if !ok || !s.Before(until) || !f(s, e) {
			return
		}
		if !e.After(t) {
			return
		}
		t = e
	}
}

// resOverlap reports whether two reservations have overlapping windows
// from now to the horizon past the later of their first windows (a one-off
// window six weeks out is compared with another one there, not left past
// a horizon counted from now).
func resOverlap(a, b *resv, now time.Time) bool {
	first := now
	for _, rv := range []*resv{a, b} {
		if s, _, ok := rv.windowAfter(now); ok && s.After(first) {
			first = s
		}
	}
	until := first.Add(maxHorizon)
	hit := false
	a.windows(now, until, 200, func(as, ae time.Time) bool {
		b.windows(as, ae, 200, func(bs, be time.Time) bool {
			if bs.Before(ae) && be.After(as) {
				hit = true
			}
			return !hit
		})
		return !hit
	})
	return hit
}

// resCreate makes a reservation.
func (e *Engine) resCreate(c arbiter.CreateReservation, now time.Time) (any, error) {
	if c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may make reservations")
	}
	r := c.Reservation
	r.Tags = append([]string(nil), r.Tags...)
	if r.Cron != "" && r.Start.IsZero() {
		r.Start = now
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	// A one-off window that began already would open at once, ending what
	// runs on its GPUs without the notice it promises. A minute of slack
	// takes "now" as sent from a client a moment ago.
	if r.Cron == "" && r.Start.Before(now.Add(-time.Minute)) {
		return nil, arbiter.Errorf(arbiter.EInvalid, "start %s is in the past: give a time from now on, or a duration from now (--start 2h)",
			r.Start.UTC().Format(time.RFC3339))
	}
	fs := &e.fs
	if len(fs.res) >= arbiter.MaxReservations {
		return nil, arbiter.Errorf(arbiter.EConflict, "there are already %d reservations; delete some first", arbiter.MaxReservations)
	}
	if fs.groups[r.Group] == nil || fs.none != nil {
		return nil, arbiter.Errorf(arbiter.EInvalid, "group %q is not configured: reservations are for groups of [[groups]]", arbiter.Clip(r.Group, 64))
	}
	// The id is drawn now and kept only if the reservation is made: a
	// command that fails changes nothing.
	seq := fs.resSeq
	if r.ID == "" {
		for {
			seq++
			r.ID = "r" + strconv.FormatInt(seq, 10)
			if fs.res[r.ID] == nil {
				break
			}
		}
	} else if fs.res[r.ID] != nil {
		return nil, arbiter.Errorf(arbiter.EConflict, "reservation %q exists: choose another id or delete it first", r.ID)
	}
	rv := &resv{r: r}
	if r.Cron != "" {
		if e.cfg.Cron == nil {
			return nil, arbiter.Errorf(arbiter.EInvalid, "this server cannot read cron expressions")
		}
		cs, err := e.cfg.Cron(r.Cron)
		if err != nil {
			return nil, err
		}
		rv.cron = cs
	}
	if _, _, ok := rv.windowAfter(now); !ok {
		return nil, arbiter.Errorf(arbiter.EInvalid, "the reservation has no window after now: its start plus duration_s is in the past")
	}
	if err := e.resChoose(rv, now); err != nil {
		return nil, err
	}
	rv.r.CreatedBy, rv.r.CreatedAt = c.Caller.Name, now
	if seq != fs.resSeq {
		fs.resSeq = seq
		e.putRecord(resSeqKind, "last", resSeq{fs.resSeq})
	}
	e.resAdd(rv)
	fs.on = true
	e.resArm(rv, now)
	e.emit(now, arbiter.EventReservationCreated, "reservation/"+rv.r.ID, rv.r)
	e.fsRebuild(now)
	return rv.r, nil
}

// resChoose picks rv's GPUs: those of its machine, or of the machines
// carrying its tags, in name and index order, that no other reservation
// holds in an overlapping window.
func (e *Engine) resChoose(rv *resv, now time.Time) error {
	r := &rv.r
	var cands []*machine
	if r.Machine != "" {
		mc := e.byName[r.Machine]
		if mc == nil || mc.m.Kind != arbiter.KindGPU {
			return arbiter.Errorf(arbiter.EInvalid, "machine %q is not a known GPU machine; `arbiter status` lists them", r.Machine)
		}
		cands = []*machine{mc}
	} else {
		for _, mc := range e.ms {
			if mc.m.Kind == arbiter.KindGPU && mc.m.HasTags(r.Tags) {
				cands = append(cands, mc)
			}
		}
		if len(cands) == 0 {
			return arbiter.Errorf(arbiter.EInvalid, "no GPU machine carries all of the tags %v", r.Tags)
		}
	}
	total, taken := 0, 0
	r.Devices = []arbiter.DeviceRef{}
	for _, mc := range cands {
	gpus:
		for _, g := range mc.m.GPUs {
			if len(r.Devices) == r.GPUs {
				break
			}
			total++
			for _, other := range e.fs.resBy[mc.m.Name] {
				if other.index == g.Index && resOverlap(rv, other.rv, now) {
					taken++
					continue gpus
				}
			}
			r.Devices = append(r.Devices, arbiter.DeviceRef{Machine: mc.m.Name, Index: g.Index, UUID: g.UUID, Model: g.Model, VRAMGiB: g.VRAMGiB})
		}
	}
	if len(r.Devices) < r.GPUs {
		where := "machine " + r.Machine
		if r.Machine == "" {
			where = fmt.Sprintf("the machines tagged %v", r.Tags)
		}
		return arbiter.Errorf(arbiter.EConflict, "%s have %d GPUs, %d of them reserved by other reservations in overlapping windows: %d cannot be reserved",
			where, total, taken, r.GPUs)
	}
	return nil
}

// resAdd registers rv and its GPUs.
func (e *Engine) resAdd(rv *resv) {
	fs := &e.fs
	fs.res[rv.r.ID] = rv
	rv.dl = newDeadline(func(e *Engine, now time.Time) { e.resFire(rv, now) })
	for _, d := range rv.r.Devices {
		g := &resvGPU{rv: rv, machine: d.Machine, index: d.Index}
		rv.gpus = append(rv.gpus, g)
		fs.resBy[d.Machine] = append(fs.resBy[d.Machine], g)
	}
}

// resArm sets rv's current or next window, its deadline, and the ends of
// others' allocations on its GPUs; it saves and shows rv. A window that
// has begun opens at once (resFire), unless it was open before a restart.
func (e *Engine) resArm(rv *resv, now time.Time) {
	s, en, ok := rv.windowAfter(now)
	wasOpen := rv.r.Active && rv.r.WindowStart != nil && rv.r.WindowStart.Equal(s)
	rv.active = false
	if !ok {
		rv.ws, rv.we = time.Time{}, time.Time{}
		e.dl.clear(&rv.dl)
	} else {
		rv.ws, rv.we = s, en
		switch {
		case now.Before(s):
			e.dl.set(&rv.dl, s)
		case wasOpen:
			rv.active = true
			e.dl.set(&rv.dl, en)
		default:
			e.resSave(rv)
			e.resFire(rv, now) // it opens now
			return
		}
	}
	e.resSave(rv)
	if ok {
		for _, g := range rv.gpus {
			if mc := e.byName[g.machine]; mc != nil {
				if a := e.holderAlloc(mc, g.index); a != nil && a.a.Request.Reservation != rv.r.ID {
					e.fsImposeEnd(a, rv.ws, rv, now)
				}
			}
		}
	}
	e.fs.etaDirty = true
}

// resSave saves rv with its window shown.
func (e *Engine) resSave(rv *resv) {
	rv.r.Active = rv.active
	rv.r.WindowStart, rv.r.WindowEnd = nil, nil
	if !rv.ws.IsZero() {
		s, en := rv.ws, rv.we
		rv.r.WindowStart, rv.r.WindowEnd = &s, &en
	}
	r := rv.r
	r.Tags = append([]string(nil), r.Tags...)
	r.Devices = append([]arbiter.DeviceRef(nil), r.Devices...)
	e.putRecord(arbiter.RecordReservation, r.ID, r)
}

// resFire opens or closes rv's window.
func (e *Engine) resFire(rv *resv, now time.Time) {
	if e.fs.res[rv.r.ID] != rv {
		return
	}
	if !rv.active {
		rv.active = true
		e.resSave(rv)
		// Others still on its GPUs (their ends fall at this same instant)
		// end now, whatever order the deadlines fire in.
		for _, g := range rv.gpus {
			if mc := e.byName[g.machine]; mc != nil {
				if a := e.holderAlloc(mc, g.index); a != nil && a.a.Request.Reservation != rv.r.ID {
					e.fsImposeEnd(a, now, rv, now)
					if e.allocs[a.a.ID] == a {
						e.destroy(a, a.fs.endWhy, now)
					}
				}
			}
		}
		e.emit(now, arbiter.EventReservationStarted, "reservation/"+rv.r.ID, rv.r)
		e.dl.set(&rv.dl, rv.we)
		e.freed = true // its members may now be placed
		e.fs.etaDirty = true
		return
	}
	// The window closes: its allocations end with it.
	rv.active = false
	for _, id := range sortedKeys(e.allocs) {
		a := e.allocs[id]
		if a.a.Request.Reservation == rv.r.ID && a.a.State == arbiter.StateReady {
			e.destroy(a, fmt.Sprintf("%s: reservation %s ended", arbiter.ReasonTimeLimit, rv.r.ID), now)
		}
	}
	ended := rv.r
	ended.Active = false
	e.emit(now, arbiter.EventReservationEnded, "reservation/"+rv.r.ID, ended)
	if _, _, ok := rv.windowAfter(now); !ok {
		e.resRemove(rv, now, "is over")
		e.removeRecord(arbiter.RecordReservation, rv.r.ID)
		e.fs.on = len(e.fs.quotas) > 0 || len(e.fs.res) > 0
	} else {
		e.resArm(rv, now)
	}
	e.freed = true
}

// resRemove forgets rv. Requests still waiting to allocate inside it can
// never be placed: they end.
func (e *Engine) resRemove(rv *resv, now time.Time, why string) {
	fs := &e.fs
	e.dl.clear(&rv.dl)
	delete(fs.res, rv.r.ID)
	for _, a := range append([]*alloc(nil), e.queue...) {
		if a.a.Request.Reservation == rv.r.ID {
			e.destroy(a, fmt.Sprintf("impossible: reservation %s %s", rv.r.ID, why), now)
		}
	}
	for _, d := range rv.r.Devices {
		list := fs.resBy[d.Machine]
		keep := list[:0]
		for _, g := range list {
			if g.rv != rv {
				keep = append(keep, g)
			}
		}
		if len(keep) == 0 {
			delete(fs.resBy, d.Machine)
		} else {
			fs.resBy[d.Machine] = keep
		}
	}
	fs.etaDirty = true
}

// resDelete removes a reservation; allocations it moved the end of get
// their own end back.
func (e *Engine) resDelete(c arbiter.DeleteReservation, now time.Time) (any, error) {
	if c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may delete reservations")
	}
	if err := arbiter.ValidateName("reservation id", c.ID); err != nil {
		return nil, err
	}
	rv := e.fs.res[c.ID]
	if rv == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "reservation %q does not exist (see arbiter reservations)", c.ID)
	}
	e.resRemove(rv, now, "was deleted")
	e.removeRecord(arbiter.RecordReservation, rv.r.ID)
	for _, id := range sortedKeys(e.allocs) {
		if a := e.allocs[id]; a.fs != nil && a.fs.endRes == rv.r.ID {
			e.fsRestoreOwnEnd(a, now)
		}
	}
	e.emit(now, arbiter.EventReservationDeleted, "reservation/"+rv.r.ID, rv.r)
	e.fsRebuild(now)
	return rv.r, nil
}

// resLoad restores a saved reservation (armed by resArmAll).
func (e *Engine) resLoad(rec arbiter.Record) error {
	if rec.Kind == resSeqKind {
		var s resSeq
		if err := tasksDecode(rec.Value, &s); err != nil {
			return err
		}
		e.fs.resSeq = max(e.fs.resSeq, s.Last)
		return nil
	}
	var r arbiter.Reservation
	if err := tasksDecode(rec.Value, &r); err != nil || r.ID != rec.Key {
		return fmt.Errorf("unreadable reservation")
	}
	rv := &resv{r: r}
	if r.Cron != "" {
		if e.cfg.Cron == nil {
			return fmt.Errorf("reservation %s: this server cannot read cron expressions", r.ID)
		}
		cs, err := e.cfg.Cron(r.Cron)
		if err != nil {
			return fmt.Errorf("reservation %s: %v", r.ID, err)
		}
		rv.cron = cs
	}
	e.resAdd(rv)
	return nil
}

// resArmAll arms every reservation at load; one with no window left goes.
func (e *Engine) resArmAll(now time.Time) {
	for _, id := range sortedKeys(e.fs.res) {
		rv := e.fs.res[id]
		if _, _, ok := rv.windowAfter(now); !ok {
			e.resRemove(rv, now, "is over")
			e.removeRecord(arbiter.RecordReservation, id)
			continue
		}
		e.resArm(rv, now)
	}
}

func (fs *fairshare) resRecords() []arbiter.Record {
	out := []arbiter.Record{{Kind: resSeqKind, Key: "last", Value: resSeq{fs.resSeq}}}
	for _, id := range sortedKeys(fs.res) {
		out = append(out, arbiter.Record{Kind: arbiter.RecordReservation, Key: id, Value: fs.res[id].r})
	}
	return out
}

// resMasked reports whether a request of a, placed at t, may not take GPU
// index of machine mc because of a reservation, and the reservation.
func (e *Engine) resMasked(a *alloc, name string, index int, t time.Time) (bool, *resv) {
	mine := a.a.Request.Reservation
	list := e.fs.resBy[name]
	if mine != "" {
		for _, g := range list {
			if g.index == index && g.rv.r.ID == mine {
				s, _, ok := g.rv.windowAfter(t)
				return !ok || s.After(t), g.rv
			}
		}
		return true, nil
	}
	limit := 0.0
	if a.fs != nil {
		limit = a.fs.limit
	}
	for _, g := range list {
		if g.index != index {
			continue
		}
		s, _, ok := g.rv.windowAfter(t)
		if !ok {
			continue
		}
		if limit <= 0 || s.Before(t.Add(secs(limit))) {
			return true, g.rv
		}
	}
	return false, nil
}

// resWhy says why reservations hold a back, for why_queued.
func (e *Engine) resWhy(a *alloc, now time.Time) string {
	if name := a.a.Request.Reservation; name != "" {
		rv := e.fs.res[name]
		switch {
		case rv == nil:
			return fmt.Sprintf("reservation %s does not exist any more", name)
		case !rv.active && !rv.ws.IsZero():
			return fmt.Sprintf("waiting for reservation %s to start at %s", name, rv.ws.UTC().Format(time.RFC3339))
		}
		return fmt.Sprintf("waiting for %s free in reservation %s", arbiter.Plural(a.a.Request.GPUs, "GPU"), name)
	}
	// The first window among the reservations of the GPUs it could use.
	var first *resv
	for i, mc := range e.ms {
		if !e.cluster.Eligible(i, &a.a.Request) {
			continue
		}
		for _, g := range e.fs.resBy[mc.m.Name] {
			if first == nil || (!g.rv.ws.IsZero() && g.rv.ws.Before(first.ws)) {
				first = g.rv
			}
		}
	}
	if first == nil {
		return ""
	}
	return fmt.Sprintf("the GPUs that could hold it are reserved (reservation %s of group %s from %s); a request with a time_limit_s that ends before then may use them",
		first.r.ID, first.r.Group, first.ws.UTC().Format(time.RFC3339))
}

// resImposeOn moves a newly granted allocation's end before the next
// window of any reservation of its GPUs it is not in (placement avoids
// that; this keeps the rule when placement could not know, e.g. a task
// granted on a named machine).
func (e *Engine) resImposeOn(a *alloc, now time.Time) {
	list := e.fs.resBy[a.mach.m.Name]
	if len(list) == 0 {
		return
	}
	for _, idx := range a.gpus {
		for _, g := range list {
			if g.index != idx || g.rv.r.ID == a.a.Request.Reservation {
				continue
			}
			if s, _, ok := g.rv.windowAfter(now); ok {
				e.fsImposeEnd(a, maxTime(s, now), g.rv, now)
			}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// resBlocksExtend says why a may not run until `to` for a reservation of
// its GPUs, or "".
func (e *Engine) resBlocksExtend(a *alloc, to time.Time, now time.Time) string {
	for _, idx := range a.gpus {
		for _, g := range e.fs.resBy[a.mach.m.Name] {
			if g.index != idx {
				continue
			}
			s, en, ok := g.rv.windowAfter(now)
			if !ok {
				continue
			}
			if g.rv.r.ID == a.a.Request.Reservation {
				if to.After(en) {
					return fmt.Sprintf("its reservation %s ends at %s", g.rv.r.ID, en.UTC().Format(time.RFC3339))
				}
				continue
			}
			if s.Before(to) {
				return fmt.Sprintf("GPU %d of %s is reserved for group %s from %s (reservation %s)", idx, a.mach.m.Name, g.rv.r.Group,
					s.UTC().Format(time.RFC3339), g.rv.r.ID)
			}
		}
	}
	return ""
}

// resMember checks that the caller may allocate inside reservation name.
func (e *Engine) resMember(c arbiter.Caller, r *arbiter.Request) error {
	rv := e.fs.res[r.Reservation]
	if rv == nil {
		return arbiter.Errorf(arbiter.EInvalid, "reservation %q does not exist (see arbiter reservations)", arbiter.Clip(r.Reservation, 64))
	}
	if r.Machine != "" {
		on := false
		for _, d := range rv.r.Devices {
			on = on || d.Machine == r.Machine
		}
		if !on {
			return arbiter.Errorf(arbiter.EInvalid, "reservation %s holds no GPU of machine %s; leave machine out or name one of its machines", rv.r.ID, r.Machine)
		}
	}
	if c.Role == arbiter.RoleAdmin && c.Name != "" {
		return nil // an admin's token; on a server without tokens the owner says who it is
	}
	if g := e.fs.groupOf(c.Name, r.Owner); g == nil || g.name != rv.r.Group {
		return arbiter.Errorf(arbiter.EForbidden, "reservation %s is for group %s, and %q is not one of its members", rv.r.ID, rv.r.Group, arbiter.Clip(c.Name, 64))
	}
	return nil
}

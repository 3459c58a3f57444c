package engine

import (
	"fmt"
	"path"
	"sort"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/place"
)

// Quotas (docs/guides/fair-share.md): a group's or a person's GPUs held at
// once (max_gpus, optionally of one model pattern) and GPU-hours used in a
// rolling window (max_gpu_hours per window_s).
//
// max_gpus is counted on grant and release. max_gpu_hours is kept the way
// Slurm keeps GrpTRESRunMins: a request is admitted only while what its
// subject used in the window so far, plus what its live allocations may
// still use until their time limits, plus what it asks for (its GPUs times
// its time limit) fits. So no window ever holds more than the quota: what
// slides out of the window is past usage, what comes in was committed. A
// request without a time limit under such a quota gets, at its grant, the
// time limit that spends what is left.
//
// A request that can never fit a quota (more GPUs than max_gpus, more
// GPU-hours than max_gpu_hours) is refused at once; one that fits later
// queues with why_queued naming the quota and when it frees.

// fsQuota is a quota in effect and its count.
type fsQuota struct {
	q     arbiter.Quota
	key   string
	held  int              // GPUs its subject holds (of its model)
	live  map[int64]*alloc // the live allocations counted
	subj  *fsSubject       // window usage (max_gpu_hours)
	shown arbiter.QuotaStatus
}

// fsSubject is the usage of a quota subject that ended in the window.
type fsSubject struct {
	spans  []arbiter.UsageSpan
	window time.Duration // the longest window of its quotas
}

// maxSpans bounds the spans kept per subject: beyond it the oldest two are
// merged (their GPU-time kept, spread over both).
const maxSpans = 4096

// quotaBuild makes the quotas in effect: the configuration's, replaced by
// those set through the API of the same key.
func (e *Engine) quotaBuild() {
	fs := &e.fs
	byKey := map[string]arbiter.Quota{}
	for _, q := range fs.pol.Quotas {
		q.Source = arbiter.QuotaFromConfig
		byKey[q.Key()] = q
	}
	for k, q := range fs.api {
		byKey[k] = q
	}
	fs.quotas = fs.quotas[:0]
	windows := map[string]time.Duration{}
	for _, k := range sortedKeys(byKey) {
		q := byKey[k]
		fq := &fsQuota{q: q, key: k, live: map[int64]*alloc{}}
		if q.MaxGPUHours != nil {
			s := q.Subject()
			windows[s] = max(windows[s], q.Window())
		}
		fs.quotas = append(fs.quotas, fq)
	}
	for s := range fs.subjects {
		if windows[s] == 0 {
			delete(fs.subjects, s)
			e.removeRecord(arbiter.RecordWindowUsage, s)
		}
	}
	for _, fq := range fs.quotas {
		if fq.q.MaxGPUHours == nil {
			continue
		}
		s := fq.q.Subject()
		sub := fs.subjects[s]
		if sub == nil {
			sub = &fsSubject{}
			fs.subjects[s] = sub
		}
		sub.window = windows[s]
		fq.subj = sub
	}
}

// quotaApplies reports whether q limits a.
func quotaApplies(q *arbiter.Quota, a *alloc) bool {
	if q.Group != "" {
		return a.fs != nil && a.fs.group.name == q.Group
	}
	return person(a) == q.Principal
}

// person is who an allocation belongs to: its principal, or its owner on a
// server without tokens.
func person(a *alloc) string {
	if a.a.Principal != "" {
		return a.a.Principal
	}
	return a.a.Owner
}

// quotaCountOf is how many of a's GPUs q counts.
func quotaCountOf(q *arbiter.Quota, a *alloc) int {
	if q.Model == "" {
		return len(a.gpus)
	}
	n := 0
	for _, d := range a.a.Devices {
		if ok, _ := path.Match(q.Model, d.Model); ok {
			n++
		}
	}
	return n
}

// quotaCount counts a granted allocation in the quotas that limit it.
func (e *Engine) quotaCount(a *alloc, _ int) {
	fa := a.fs
	if fa == nil {
		return
	}
	for _, fq := range e.fs.quotas {
		if !quotaApplies(&fq.q, a) {
			continue
		}
		n := quotaCountOf(&fq.q, a)
		fq.held += n
		fq.live[a.a.ID] = a
		fa.quotas = append(fa.quotas, fq)
		fa.qheld = append(fa.qheld, n)
	}
}

// quotaEnded uncounts an allocation that ends and keeps its GPU time in
// its subjects' window usage.
func (e *Engine) quotaEnded(a *alloc, now time.Time) {
	fa := a.fs
	subjects := map[*fsSubject]bool{}
	for i, fq := range fa.quotas {
		fq.held -= fa.qheld[i]
		delete(fq.live, a.a.ID)
		if fq.subj != nil {
			subjects[fq.subj] = true
		}
	}
	fa.quotas, fa.qheld = nil, nil
	if len(subjects) == 0 || a.a.ReadyAt == nil {
		return
	}
	for _, s := range sortedKeys(e.fs.subjects) {
		sub := e.fs.subjects[s]
		if !subjects[sub] {
			continue
		}
		sub.spans = append(sub.spans, arbiter.UsageSpan{Start: *a.a.ReadyAt, End: now, GPUs: float64(len(a.gpus))})
		sub.prune(now)
		e.putRecord(arbiter.RecordWindowUsage, s, arbiter.WindowUsage{Subject: s, Spans: append([]arbiter.UsageSpan(nil), sub.spans...)})
	}
}

// prune drops spans that ended before the window and merges the oldest
// beyond maxSpans.
func (s *fsSubject) prune(now time.Time) {
	from := now.Add(-s.window)
	keep := s.spans[:0]
	for _, sp := range s.spans {
		if sp.End.After(from) {
			keep = append(keep, sp)
		}
	}
	s.spans = keep
	for len(s.spans) > maxSpans {
		a, b := s.spans[0], s.spans[1]
		start, end := a.Start, b.End
		if b.Start.Before(start) {
			start = b.Start
		}
		if a.End.After(end) {
			end = a.End
		}
		gs := a.GPUs*a.End.Sub(a.Start).Seconds() + b.GPUs*b.End.Sub(b.Start).Seconds()
		m := arbiter.UsageSpan{Start: start, End: end}
		if d := end.Sub(start).Seconds(); d > 0 {
			m.GPUs = gs / d
		}
		s.spans = append([]arbiter.UsageSpan{m}, s.spans[2:]...)
	}
}

// overlap is the seconds [s, e) and [from, to) share.
func overlap(s, e, from, to time.Time) float64 {
	if s.Before(from) {
		s = from
	}
	if e.After(to) {
		e = to
	}
	if !e.After(s) {
		return 0
	}
	return e.Sub(s).Seconds()
}

// hoursAt returns, in GPU-seconds, what q's subject used in the window
// ending at t (past spans and its live allocations up to t) and what its
// live allocations are committed to after t (until their ends, as far as
// they have one). A live allocation without an end counts as committed to
// the whole window.
func (e *Engine) hoursAt(fq *fsQuota, t time.Time) (used, committed float64) {
	w := fq.q.Window()
	from := t.Add(-w)
	for _, sp := range fq.subj.spans {
		used += sp.GPUs * overlap(sp.Start, sp.End, from, t)
	}
	for _, id := range sortedKeys(fq.live) {
		a := fq.live[id]
		if a.a.ReadyAt == nil {
			continue
		}
		n := float64(len(a.gpus))
		end := t // for a t to come (quotaFrees), it runs until its end only
		if a.a.EndsAt != nil && a.a.EndsAt.Before(t) {
			end = *a.a.EndsAt
		}
		used += n * overlap(*a.a.ReadyAt, end, from, t)
		switch {
		case a.a.EndsAt == nil:
			committed += n * w.Seconds()
		case a.a.EndsAt.After(t):
			committed += n * a.a.EndsAt.Sub(t).Seconds()
		}
	}
	return used, committed
}

// quotaNeed is the GPU-seconds a asks for under an hours quota: its GPUs
// times its time limit, or a minute's worth when it has none (it then gets
// what is left).
func quotaNeed(a *alloc) float64 {
	n := float64(a.a.Request.GPUs)
	if a.fs != nil && a.fs.limit > 0 {
		return n * a.fs.limit
	}
	return n * 60
}

// quotaBlock returns the quota that holds a back now, or nil. Quotas of a
// model pattern do not hold a request back: they mask their model's GPUs
// (quotaMasks).
func (e *Engine) quotaBlock(a *alloc, now time.Time) *fsQuota {
	if a.fs == nil {
		return nil
	}
	r := &a.a.Request
	for _, fq := range e.fs.quotas {
		q := &fq.q
		if !quotaApplies(q, a) {
			continue
		}
		if q.MaxGPUs != nil && q.Model == "" && fq.held+r.GPUs > *q.MaxGPUs {
			return fq
		}
		if q.MaxGPUHours != nil {
			used, committed := e.hoursAt(fq, now)
			if used+committed+quotaNeed(a) > *q.MaxGPUHours*3600+1e-6 {
				return fq
			}
		}
	}
	return nil
}

// quotaNever says why a request can never fit one of its quotas, or "".
func (e *Engine) quotaNever(a *alloc) string {
	if a.fs == nil {
		return ""
	}
	r := &a.a.Request
	for _, fq := range e.fs.quotas {
		q := &fq.q
		if !quotaApplies(q, a) {
			continue
		}
		if q.MaxGPUs != nil && (q.Model == "" || q.Model == r.Model) && r.GPUs > *q.MaxGPUs {
			return fmt.Sprintf("it asks for %d GPUs and quota %s allows %s at once (max_gpus)", r.GPUs, fq.key, arbiter.Plural(*q.MaxGPUs, "GPU"))
		}
		if q.MaxGPUs != nil && q.Model != "" && r.GPUs > *q.MaxGPUs && !e.fitsOutside(r, q.Model) {
			// The quota masks every GPU of its model from it (quotaMasks),
			// and no machine that could hold it has enough others.
			return fmt.Sprintf("it asks for %d GPUs and quota %s allows %s of %s at once (max_gpus); no machine that could hold it has %d other GPUs",
				r.GPUs, fq.key, arbiter.Plural(*q.MaxGPUs, "GPU"), q.Model, r.GPUs)
		}
		if q.MaxGPUHours != nil && quotaNeed(a) > *q.MaxGPUHours*3600+1e-6 {
			return fmt.Sprintf("it asks for %s GPU-hours (%d GPUs for its time limit) and quota %s allows %g per %s (max_gpu_hours)",
				gpuHours(quotaNeed(a)), r.GPUs, fq.key, *q.MaxGPUHours, arbiter.HumanDuration(q.Window()))
		}
	}
	return ""
}

// fitsOutside reports whether some machine has r.GPUs GPUs that r may
// use and that do not match the model pattern.
func (e *Engine) fitsOutside(r *arbiter.Request, model string) bool {
	for _, mc := range e.ms {
		if !place.MachineOK(&mc.m, r) {
			continue
		}
		n := 0
		for i := range mc.m.GPUs {
			g := &mc.m.GPUs[i]
			if ok, _ := path.Match(model, g.Model); !ok && place.GPUOK(g, r) {
				n++
			}
		}
		if n >= r.GPUs {
			return true
		}
	}
	return false
}

// quotaLeft is the GPU-seconds a may still use under its hours quotas
// from now (-1: no hours quota applies).
func (e *Engine) quotaLeft(a *alloc, now time.Time) float64 {
	left := -1.0
	for _, fq := range e.fs.quotas {
		q := &fq.q
		if q.MaxGPUHours == nil || !quotaApplies(q, a) {
			continue
		}
		used, committed := e.hoursAt(fq, now)
		l := max(*q.MaxGPUHours*3600-used-committed, 0)
		if left < 0 || l < left {
			left = l
		}
	}
	return left
}

// quotaMasks returns the model patterns whose GPUs a may not take now
// (its model quotas have less room than it asks for).
func (e *Engine) quotaMasks(a *alloc, count func(*fsQuota) int) []string {
	var out []string
	for _, fq := range e.fs.quotas {
		q := &fq.q
		if q.Model == "" || q.MaxGPUs == nil || !quotaApplies(q, a) {
			continue
		}
		held := fq.held
		if count != nil {
			held = count(fq)
		}
		if held+a.a.Request.GPUs > *q.MaxGPUs {
			out = append(out, q.Model)
		}
	}
	return out
}

// quotaFrees says when quota fq lets a in, for why_queued: the time, or
// zero when it cannot tell (a holder without a time limit).
func (e *Engine) quotaFrees(fq *fsQuota, a *alloc, now time.Time) time.Time {
	q := &fq.q
	if q.MaxGPUs != nil && q.Model == "" && fq.held+a.a.Request.GPUs > *q.MaxGPUs {
		// The GPUs free as its allocations end: the earliest ends that
		// leave room.
		var ends []time.Time
		for _, x := range fq.live {
			if x.a.EndsAt == nil {
				continue
			}
			for range len(x.gpus) {
				ends = append(ends, *x.a.EndsAt)
			}
		}
		need := fq.held + a.a.Request.GPUs - *q.MaxGPUs
		if len(ends) < need {
			return time.Time{}
		}
		sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
		return ends[need-1]
	}
	if q.MaxGPUHours == nil {
		return time.Time{}
	}
	target := *q.MaxGPUHours*3600 - quotaNeed(a)
	fits := func(t time.Time) bool {
		used, committed := e.hoursAt(fq, t)
		return used+committed <= target+1e-6
	}
	hi := now.Add(q.Window())
	for _, x := range fq.live {
		if x.a.EndsAt == nil {
			return time.Time{}
		}
		if end := x.a.EndsAt.Add(q.Window()); end.After(hi) {
			hi = end
		}
	}
	if !fits(hi) {
		return time.Time{}
	}
	lo := now
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2)
		if fits(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi.Truncate(time.Second).Add(time.Second)
}

// quotaWhy is why_queued for a request held back by quota fq.
func (e *Engine) quotaWhy(fq *fsQuota, a *alloc, now time.Time) string {
	q := &fq.q
	var s string
	if q.MaxGPUs != nil && q.Model == "" && fq.held+a.a.Request.GPUs > *q.MaxGPUs {
		s = fmt.Sprintf("quota %s (max_gpus = %d): %s %d and this request asks for %d", fq.key, *q.MaxGPUs, holdsWho(q), fq.held, a.a.Request.GPUs)
	} else if q.MaxGPUHours != nil {
		used, committed := e.hoursAt(fq, now)
		left := max(*q.MaxGPUHours*3600-used-committed, 0)
		need := "for its time limit"
		if a.fs == nil || a.fs.limit <= 0 {
			need = "for at least a minute: it has no time limit"
		}
		s = fmt.Sprintf("quota %s (max_gpu_hours = %g per %s): %s GPU-hours are left (its running allocations count to their ends, one without an end to the window's), and this request needs %s (%s %s)",
			fq.key, *q.MaxGPUHours, arbiter.HumanDuration(q.Window()), gpuHours(left), gpuHours(quotaNeed(a)), arbiter.Plural(a.a.Request.GPUs, "GPU"), need)
	}
	if t := e.quotaFrees(fq, a, now); !t.IsZero() {
		if q.MaxGPUHours != nil && (e.fs.quotaDL.pos < 0 || t.Before(e.fs.quotaDL.at)) && t.After(now) {
			e.dl.set(&e.fs.quotaDL, t) // nothing else may happen by then
		}
		return s + "; frees at " + t.UTC().Format(time.RFC3339)
	}
	return s + "; frees when its allocations end"
}

// gpuHours says GPU-seconds s in GPU-hours, with the digits that show a
// small amount (0.02, not 0.0).
func gpuHours(s float64) string {
	if h := s / 3600; h < 0.1 && h > 0 {
		return strconv.FormatFloat(h, 'f', 3, 64)
	}
	return strconv.FormatFloat(s/3600, 'f', 1, 64)
}

func holdsWho(q *arbiter.Quota) string {
	if q.Group != "" {
		return "the group holds"
	}
	return q.Principal + " holds"
}

// quotaShowAll shows every quota's status in the read view.
func (e *Engine) quotaShowAll(now time.Time) {
	for _, fq := range e.fs.quotas {
		e.quotaShow(fq, now)
	}
}

// quotaShow shows a quota's status when it changed.
func (e *Engine) quotaShow(fq *fsQuota, now time.Time) {
	st := arbiter.QuotaStatus{Quota: fq.q, Key: fq.key, HeldGPUs: fq.held, AsOf: now}
	if fq.subj != nil {
		u, c := e.hoursAt(fq, now)
		st.UsedGPUHours, st.CommittedGPUHours = round2(u/3600), round2(c/3600)
	}
	prev := fq.shown
	if prev.Key == st.Key && prev.HeldGPUs == st.HeldGPUs && prev.UsedGPUHours == st.UsedGPUHours &&
		prev.CommittedGPUHours == st.CommittedGPUHours && sameQuota(&prev.Quota, &st.Quota) {
		return
	}
	fq.shown = st
	e.touchRecord(arbiter.RecordQuotaStatus, fq.key, st)
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func sameQuota(a, b *arbiter.Quota) bool {
	eqi := func(x, y *int) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqf := func(x, y *float64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Group == b.Group && a.Principal == b.Principal && a.Model == b.Model && a.WindowS == b.WindowS &&
		a.Source == b.Source && eqi(a.MaxGPUs, b.MaxGPUs) && eqf(a.MaxGPUHours, b.MaxGPUHours)
}

// quotaSet adds or replaces a quota set through the API.
func (e *Engine) quotaSet(c arbiter.SetQuota, now time.Time) (any, error) {
	if c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may set quotas")
	}
	q := c.Quota
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if q.Group != "" && (e.fs.groups[q.Group] == nil || e.fs.none != nil) {
		// As reservations do: a misspelt group would hold nobody back.
		return nil, arbiter.Errorf(arbiter.EInvalid, "group %q is not configured: quotas are for groups of [[groups]] (arbiter fairshare lists them)", arbiter.Clip(q.Group, 64))
	}
	q.Source = arbiter.QuotaFromAPI
	if _, ok := e.fs.api[q.Key()]; !ok && len(e.fs.api) >= arbiter.MaxQuotas {
		return nil, arbiter.Errorf(arbiter.EConflict, "there are already %d quotas set through the API; delete some first", arbiter.MaxQuotas)
	}
	e.fs.api[q.Key()] = q
	e.putRecord(arbiter.RecordQuota, q.Key(), q)
	e.emit(now, arbiter.EventQuotaUpdated, "quota/"+q.Key(), q)
	e.fsRebuild(now)
	return e.quotaStatus(q.Key()), nil
}

// quotaDelete removes a quota set through the API.
func (e *Engine) quotaDelete(c arbiter.DeleteQuota, now time.Time) (any, error) {
	if c.Caller.Role != arbiter.RoleAdmin {
		return nil, arbiter.Errorf(arbiter.EForbidden, "only an admin may delete quotas")
	}
	q, ok := e.fs.api[c.Key]
	if !ok {
		for _, cq := range e.fs.pol.Quotas {
			if cq.Key() == c.Key {
				return nil, arbiter.Errorf(arbiter.EConflict, "quota %s comes from the configuration ([[quotas]]); change the file and reload", arbiter.Clip(c.Key, 80))
			}
		}
		return nil, arbiter.Errorf(arbiter.ENotFound, "quota %s does not exist (see arbiter quotas)", arbiter.Clip(c.Key, 80))
	}
	st := e.quotaStatus(c.Key)
	delete(e.fs.api, c.Key)
	e.removeRecord(arbiter.RecordQuota, c.Key)
	e.emit(now, arbiter.EventQuotaDeleted, "quota/"+c.Key, q)
	e.fsRebuild(now)
	if e.quotaStatus(c.Key).Quota.MaxGPUs == nil && e.quotaStatus(c.Key).Quota.MaxGPUHours == nil {
		e.removeRecord(arbiter.RecordQuotaStatus, c.Key) // no configured quota of that key takes over
	}
	return st, nil
}

func (e *Engine) quotaStatus(key string) arbiter.QuotaStatus {
	for _, fq := range e.fs.quotas {
		if fq.key == key {
			return fq.shown
		}
	}
	return arbiter.QuotaStatus{Key: key}
}

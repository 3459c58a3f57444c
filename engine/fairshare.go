package engine

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// fairshare is fair shares for small teams (docs/guides/fair-share.md):
// groups and their usage-based fair-share factor, which orders the queue
// after priority (this file); quotas (quota.go); time limits and extend
// (timelimit.go); reservations (reservations.go); preemption
// (preempt.go); queue positions and ETAs (eta.go); notifications to
// people (notify.go).
//
// Usage is kept per group as a decayed accumulator of GPU-seconds held,
// brought forward exactly (arbiter.DecayedUsage) whenever the GPUs a group
// holds change and whenever the queue is ranked: O(groups) per decision,
// never a pass over the accounting records. It is saved when it changes
// (with the grant or release that changed it), so that a restart keeps
// it; a group with no saved usage starts from the accounting's day
// summaries (usage.day) of owners that belong to it.
//
// With nothing configured (no groups, quotas, reservations or time limits)
// every hook returns at once and placement takes the plain path.
type fairshare struct {
	pol arbiter.FairSharePolicy
	// on: quotas or reservations restrict placement (the slow path of find).
	on     bool
	groups map[string]*fsGroup
	glist  []*fsGroup // configured order, then the default group
	none   *fsGroup   // the group of everything when no group is configured

	api      map[string]arbiter.Quota // quotas set through the API, by key
	quotas   []*fsQuota               // in effect, by key
	subjects map[string]*fsSubject    // window usage, by subject

	res    map[string]*resv // reservations.go
	resSeq int64
	resBy  map[string][]*resvGPU // reserved GPUs by machine name

	limited     int         // live allocations with an end (ETA needs a simulation)
	preemptible int         // live preemptible allocations (preemption needs a search)
	prio        map[int]int // live preemptible allocations by priority
	// victims are the allocations being preempted, by the queued request
	// they are preempted for (Preempting.For), whose machines are held for
	// it (preemptHold). A victim that ended or was let off goes when looked
	// at; a request's entry goes when it leaves the queue.
	victims map[int64][]*alloc
	// young is when the first allocation that only min_runtime_s protects
	// from a waiting request may be preempted; preemptDL fires then.
	young     time.Time
	preemptDL deadline
	// quotaDL wakes the queue when the first request held back by a
	// max_gpu_hours quota may go in (quota.go).
	quotaDL deadline

	// simWork is the work of the last ETA simulation, lastSim its time;
	// etaDL refreshes ETAs held back by the throttle (eta.go).
	simWork int
	lastSim time.Time
	etaDL   deadline

	qver     int64 // bumped when the queue changes: positions need a refresh
	shownVer int64
	etaDirty bool
	lastNow  time.Time
	loaded   bool

	notify notifier // notify.go
}

// fsGroup is one group's standing.
type fsGroup struct {
	name     string
	cfg      *arbiter.Group // nil for the default group
	share    float64
	implicit bool      // the default group, neither configured nor given a share (weight)
	u        float64   // decayed GPU-seconds as of at
	at       time.Time // zero: not started
	n        int       // GPUs its live allocations hold
	queued   int
	x        float64 // the exponent of its factor, at the last ranking
	rank     int
	shown    arbiter.GroupStanding
}

// fsAlloc is an allocation's fair-share state; nil while nothing of fair
// share applies to it.
type fsAlloc struct {
	a       *alloc
	group   *fsGroup
	counted int         // GPUs counted in group.n
	waiting bool        // counted in group.queued
	quotas  []*fsQuota  // quotas its GPUs are counted in
	qheld   []int       // GPUs counted in each
	limit   float64     // its time limit in seconds (0: none)
	end     deadline    // at its EndsAt: it ends with endReason
	notice  deadline    // notice before the end
	endWhy  string      // the reason it ends at EndsAt
	endRes  string      // the reservation that moved its end earlier ("" none)
	ownEnd  *time.Time  // with endRes: the end it had before (nil: none)
	ownWhy  string      // with endRes: the reason of that end
	noticed bool        // the notice of this end went out
	saved   bool        // it has a RecordAllocationEnd
	notKind string      // the event its notice emits
	quota   string      // while queued: the quota that holds it back ("" none)
	resWhy  string      // while queued: why reservations hold it back ("" none)
	preempt *preemption // set while it is being preempted
}

// fsNew gives a new allocation its group and default time limit.
func (e *Engine) fsNew(a *alloc) {
	fs := &e.fs
	if !fs.loaded {
		fs.init()
	}
	r := &a.a.Request
	if r.Grid != nil || r.Pool != "" || strings.HasPrefix(a.a.Owner, arbiter.ServiceOwnerPrefix) {
		// A service's GPUs are the configuration's hold, not a user's
		// request: no group, quota, time limit or preemption applies.
		return
	}
	g := fs.groupOf(a.a.Principal, a.a.Owner)
	if g == fs.none && r.TimeLimitS == nil && !r.Preemptible && !fs.on {
		return
	}
	fa := &fsAlloc{a: a, group: g}
	a.fs = fa
	a.a.Group = g.name
	if r.TimeLimitS != nil {
		fa.limit = *r.TimeLimitS
	} else if g.cfg != nil && g.cfg.TimeLimitS > 0 {
		fa.limit = g.cfg.TimeLimitS
	}
	fa.end = newDeadline(func(e *Engine, now time.Time) { e.fsEndFire(fa, now) })
	fa.notice = newDeadline(func(e *Engine, now time.Time) { e.fsNoticeFire(fa, now) })
}

func (fs *fairshare) init() {
	fs.loaded = true
	if fs.groups == nil {
		// A pass, as at any other moment the queue may move: the group
		// order may have changed since the last (preempt.go).
		fs.preemptDL = newDeadline(func(e *Engine, now time.Time) { e.freed = true })
		fs.quotaDL = newDeadline(func(e *Engine, now time.Time) { e.freed = true })
		fs.etaDL = newDeadline(func(*Engine, time.Time) {})
		fs.pol = arbiter.DefaultFairSharePolicy()
		fs.api = map[string]arbiter.Quota{}
		fs.subjects = map[string]*fsSubject{}
		fs.res = map[string]*resv{}
		fs.resBy = map[string][]*resvGPU{}
		fs.setGroups(nil)
	}
}

// setGroups rebuilds the groups of the policy, keeping the usage of those
// that stay.
func (fs *fairshare) setGroups(old map[string]*fsGroup) {
	fs.groups = map[string]*fsGroup{}
	fs.glist = nil
	get := func(name string, cfg *arbiter.Group) *fsGroup {
		g := old[name]
		if g == nil {
			g = &fsGroup{name: name}
		}
		g.cfg, g.share, g.n, g.queued = cfg, fs.pol.Share(name), 0, 0
		_, shared := fs.pol.Shares[name]
		g.implicit = name == arbiter.DefaultGroup && cfg == nil && !shared
		fs.groups[name] = g
		fs.glist = append(fs.glist, g)
		return g
	}
	for i := range fs.pol.Groups {
		get(fs.pol.Groups[i].Name, &fs.pol.Groups[i])
	}
	if len(fs.pol.Groups) > 0 {
		if fs.groups[arbiter.DefaultGroup] == nil {
			get(arbiter.DefaultGroup, nil)
		}
		fs.none = nil
	} else {
		fs.none = get("", nil)
	}
}

// groupOf returns the group of an allocation by its principal and owner.
func (fs *fairshare) groupOf(principal, owner string) *fsGroup {
	if fs.none != nil {
		return fs.none
	}
	if g := fs.pol.GroupOf(principal, owner); g != nil {
		return fs.groups[g.Name]
	}
	return fs.groups[arbiter.DefaultGroup]
}

// fsGranted counts a granted allocation: its group's GPUs, its quotas,
// its time limit (timelimit.go), whether it is preemptible.
func (e *Engine) fsGranted(a *alloc, now time.Time) {
	if a.a.Position != nil {
		e.fs.qver++ // it leaves the queue: the others move up
	}
	e.fs.etaDirty = true
	a.a.Position, a.a.ETA = nil, nil
	fa := a.fs
	if fa == nil {
		return
	}
	if fa.waiting { // one granted at once never waited
		fa.waiting = false
		fa.group.queued--
	}
	delete(e.fs.victims, a.a.ID)
	fa.quota, fa.resWhy = "", ""
	held := accountedGPUs(a)
	if held {
		e.fsAdvance(fa.group, now)
		a.a.Preemptible = e.fsPreemptible(a, now)
	}
	e.fsLimitGranted(a, now) // timelimit.go; before it counts in its quotas
	if held {
		if a.a.Preemptible {
			e.fs.countPreemptible(a, +1)
		}
		fa.counted = len(a.gpus)
		fa.group.n += fa.counted
		e.fsSaveUsage(fa.group)
		e.quotaCount(a, +1)
	}
}

// fsEnding uncounts an allocation that ends.
func (e *Engine) fsEnding(a *alloc, now time.Time) {
	e.fs.etaDirty = true
	fa := a.fs
	if fa == nil {
		return
	}
	if fa.waiting {
		fa.waiting = false
		fa.group.queued--
	}
	delete(e.fs.victims, a.a.ID) // a request that ends while it waits for its victims
	e.dl.clear(&fa.end)
	e.dl.clear(&fa.notice)
	if a.a.EndsAt != nil {
		e.fs.limited--
	}
	if a.a.Preemptible && fa.counted > 0 {
		e.fs.countPreemptible(a, -1)
	}
	if fa.counted > 0 {
		e.fsAdvance(fa.group, now)
		fa.group.n -= fa.counted
		fa.counted = 0
		e.fsSaveUsage(fa.group)
	}
	e.quotaEnded(a, now) // quota.go: window usage, counts
	e.preemptEnded(a, now)
	if fa.saved {
		fa.saved = false
		e.fsDropEnd(a.a.ID)
	}
}

// countPreemptible counts a live preemptible allocation in or out.
func (fs *fairshare) countPreemptible(a *alloc, d int) {
	fs.preemptible += d
	if fs.prio == nil {
		fs.prio = map[int]int{}
	}
	p := a.a.Priority
	if fs.prio[p] += d; fs.prio[p] <= 0 {
		delete(fs.prio, p)
	}
}

// accountedGPUs reports whether a holds GPUs of its own (not a pool slot).
func accountedGPUs(a *alloc) bool { return a.mach != nil && len(a.gpus) > 0 }

// fsAdvance brings a group's decayed usage forward to now.
func (e *Engine) fsAdvance(g *fsGroup, now time.Time) {
	if g.at.IsZero() {
		g.at = now
		return
	}
	if now.After(g.at) {
		g.u = arbiter.DecayedUsage(g.u, g.n, now.Sub(g.at), e.fs.halfLife())
		g.at = now
	}
}

func (fs *fairshare) halfLife() time.Duration { return secs(fs.pol.HalfLifeS) }

func (e *Engine) fsSaveUsage(g *fsGroup) {
	if e.fs.none != nil {
		return // nothing to share between
	}
	e.putRecord(arbiter.RecordGroupUsage, g.name, arbiter.GroupUsage{Group: g.name, GPUSec: g.u, At: g.at})
}

// fsRank ranks the groups by their factor at now and re-sorts the queue
// when the order of groups changed. It reports the groups' standings in
// the read view.
func (e *Engine) fsRank(now time.Time) {
	fs := &e.fs
	if fs.none != nil || len(fs.glist) < 2 {
		return
	}
	for _, g := range fs.glist {
		e.fsAdvance(g, now)
	}
	changed := rankGroups(fs.glist, func(g *fsGroup) float64 { return g.u })
	if changed {
		sort.SliceStable(e.queue, func(i, j int) bool { return before(e.queue[i], e.queue[j]) })
		fs.qver++
		fs.etaDirty = true
	}
}

// weight is the share g takes of all shares: its share, but none for the
// implicit default group while it holds, waits for and has used nothing,
// so that an empty default group does not thin the configured groups'
// shares (ml = 2 and cv = 1 are two thirds and a third).
func (g *fsGroup) weight() float64 {
	if g.implicit && g.n == 0 && g.queued == 0 && g.u == 0 {
		return 0
	}
	return g.share
}

// rankGroups sets each group's exponent (usage fraction over share
// fraction, arbiter.FairShareExponent) and dense rank from usage(g), and
// reports whether any rank changed.
func rankGroups(gs []*fsGroup, usage func(*fsGroup) float64) bool {
	var total, shares float64
	for _, g := range gs {
		total += usage(g)
		shares += g.weight()
	}
	order := make([]*fsGroup, len(gs))
	copy(order, gs)
	for _, g := range gs {
		uf := 0.0
		if total > 0 {
			uf = usage(g) / total
		}
		g.x = arbiter.FairShareExponent(uf, g.weight()/shares)
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].x < order[j].x })
	changed := false
	rank := 0
	for i, g := range order {
		if i == 0 || g.x != order[i-1].x {
			rank = i + 1
		}
		if g.rank != rank {
			g.rank = rank
			changed = true
		}
	}
	return changed
}

// fsShowStandings shows each group's standing in the read view when it
// changed. Readers bring it forward to their own time
// (arbiter.StandingsAt): usage creeps on with every instant.
func (e *Engine) fsShowStandings(now time.Time) {
	fs := &e.fs
	raw := make([]arbiter.GroupStanding, len(fs.glist))
	for i, g := range fs.glist {
		raw[i] = arbiter.GroupStanding{Group: g.name, Share: g.weight(), UsageGPUSec: g.u, UsageAt: g.at, HalfLifeS: fs.pol.HalfLifeS,
			HeldGPUs: g.n, Queued: g.queued}
	}
	all := arbiter.StandingsAt(raw, now)
	for _, st := range all {
		g := fs.groups[st.Group]
		prev := g.shown
		prev.AsOf = now
		if prev == st {
			continue
		}
		// Usage creeps on with every instant; show it again when something
		// a reader would notice changed (a hundredth of the factor, a GPU).
		if prev.Rank == st.Rank && prev.HeldGPUs == st.HeldGPUs && prev.Queued == st.Queued &&
			abs(prev.Factor-st.Factor) < 0.005 && abs(prev.UsageGPUHours-st.UsageGPUHours) < 0.01 && prev.Share == st.Share {
			continue
		}
		g.shown = st
		e.touchRecord(arbiter.RecordStanding, g.name, st)
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// rankOf is a's group's rank in the queue order (0 without groups).
func rankOf(a *alloc) int {
	if a.fs == nil {
		return 0
	}
	return a.fs.group.rank
}

// fsQueued notes a request that joins the queue.
func (e *Engine) fsQueued(a *alloc) {
	e.fs.qver++
	e.fs.etaDirty = true
	if a.fs != nil && !a.fs.waiting {
		a.fs.waiting = true
		a.fs.group.queued++
	}
}

// fsSetPolicy applies the configuration's policy.
func (e *Engine) fsSetPolicy(p arbiter.FairSharePolicy, now time.Time) error {
	if p.Shares == nil {
		p.Shares = map[string]float64{}
	}
	if err := p.Validate(); err != nil {
		return err
	}
	fs := &e.fs
	fs.init()
	for _, g := range fs.glist {
		e.fsAdvance(g, now)
	}
	fs.pol = p
	old := fs.groups
	fs.setGroups(old)
	e.putRecord(arbiter.RecordFairSharePolicy, "config", p)
	e.fsRebuild(now)
	return nil
}

// fsRebuild works out every live allocation's group and the counts again
// after the policy or the quotas changed, then places what now fits.
func (e *Engine) fsRebuild(now time.Time) {
	e.fsCount(now)
	fs := &e.fs
	fs.qver++
	fs.etaDirty = true
	e.quotaShowAll(now)
	e.clearReserve()
	e.freed = true
	e.schedule(now)
	for _, a := range e.queue {
		e.explain(a, nil)
	}
}

// fsCount works out every live allocation's group and counts what each
// group and quota holds and waits for, then ranks the groups and orders
// the queue.
func (e *Engine) fsCount(now time.Time) {
	fs := &e.fs
	e.quotaBuild()
	fs.on = len(fs.quotas) > 0 || len(fs.res) > 0
	for _, g := range fs.glist {
		g.n, g.queued, g.rank = 0, 0, 0
		if g.at.IsZero() {
			g.at = now
		}
	}
	for _, q := range fs.quotas {
		q.held = 0
	}
	fs.preemptible, fs.prio = 0, nil
	for _, id := range sortedKeys(e.allocs) {
		a := e.allocs[id]
		if a.a.Request.Grid != nil || a.a.Request.Pool != "" {
			continue
		}
		if a.fs == nil {
			e.fsNew(a)
			if a.fs == nil {
				continue
			}
		}
		g := fs.groupOf(a.a.Principal, a.a.Owner)
		a.fs.group = g
		if a.a.Group != g.name {
			a.a.Group = g.name
			e.dirty(a)
		}
		a.fs.quotas, a.fs.qheld, a.fs.counted, a.fs.waiting = nil, nil, 0, false
		switch {
		case a.a.State == arbiter.StateQueued:
			a.fs.waiting = true
			g.queued++
		case accountedGPUs(a):
			a.fs.counted = len(a.gpus)
			g.n += a.fs.counted
			if a.a.Preemptible {
				fs.countPreemptible(a, +1)
			}
			e.quotaCount(a, +1)
		}
	}
	e.fsRank(now)
	sort.SliceStable(e.queue, func(i, j int) bool { return before(e.queue[i], e.queue[j]) })
}

// fsLoad restores the saved policy, quotas, usage and reservations, before
// the queue is first reviewed (New).
func (e *Engine) fsLoad(recs []arbiter.Record, now time.Time) {
	fs := &e.fs
	fs.init()
	usage := map[string]arbiter.GroupUsage{}
	var days []arbiter.UsageDay
	ends := map[int64]*arbiter.AllocationEnd{}
	for _, r := range recs {
		var err error
		switch r.Kind {
		case arbiter.RecordFairSharePolicy:
			var p arbiter.FairSharePolicy
			if err = tasksDecode(r.Value, &p); err == nil {
				if p.Shares == nil {
					p.Shares = map[string]float64{}
				}
				if err = p.Validate(); err == nil {
					fs.pol = p
				}
			}
		case arbiter.RecordQuota:
			var q arbiter.Quota
			if err = tasksDecode(r.Value, &q); err == nil {
				if err = q.Validate(); err == nil {
					q.Source = arbiter.QuotaFromAPI
					fs.api[q.Key()] = q
				}
			}
		case arbiter.RecordGroupUsage:
			var u arbiter.GroupUsage
			if err = tasksDecode(r.Value, &u); err == nil {
				usage[u.Group] = u
			}
		case arbiter.RecordWindowUsage:
			var w arbiter.WindowUsage
			if err = tasksDecode(r.Value, &w); err == nil {
				fs.subjects[w.Subject] = &fsSubject{spans: w.Spans}
			}
		case arbiter.RecordReservation:
			err = e.resLoad(r)
		case arbiter.RecordAllocationEnd:
			var end arbiter.AllocationEnd
			var id int64
			if id, err = strconv.ParseInt(r.Key, 10, 64); err == nil {
				if err = tasksDecode(r.Value, &end); err == nil {
					ends[id] = &end
				}
			}
		case arbiter.RecordUsageDay:
			var d arbiter.UsageDay
			if tasksDecode(r.Value, &d) == nil {
				days = append(days, d)
			}
		}
		if err != nil {
			e.emit(now, arbiter.EventEngineLoadError, "engine", map[string]string{"error": fmt.Sprintf("%s %q: %v", r.Kind, r.Key, err)})
		}
	}
	fs.setGroups(nil)
	for _, g := range fs.glist {
		if u, ok := usage[g.name]; ok {
			g.u, g.at = u.GPUSec, u.At
		}
	}
	e.fsSeedFromDays(days, usage, now)
	for id := range ends {
		if a := e.allocs[id]; a == nil || a.a.EndsAt == nil && a.a.Preempting == nil {
			e.fsDropEnd(id) // of an allocation gone, or without an end
		}
	}
	for _, a := range e.allocs {
		if a.a.EndsAt != nil || a.a.Preempting != nil {
			e.fsRestoreLimit(a, ends[a.a.ID], now) // timelimit.go
		}
		if a.a.Preempting != nil && a.a.Preempting.For != 0 {
			e.fs.addVictim(a)
		}
	}
	e.resArmAll(now)
	e.fsCount(now) // New reviews the queue next
}

// fsSeedFromDays starts the usage of groups that have none saved from the
// accounting's day summaries: each day's GPU time of owners in the group,
// decayed from the middle of its day.
func (e *Engine) fsSeedFromDays(days []arbiter.UsageDay, saved map[string]arbiter.GroupUsage, now time.Time) {
	fs := &e.fs
	if fs.none != nil {
		return
	}
	hl := fs.halfLife()
	for _, d := range days {
		g := fs.groupOf("", d.Owner)
		if _, ok := saved[g.name]; ok {
			continue
		}
		day, err := time.Parse(arbiter.DayLayout, d.Day)
		if err != nil {
			continue
		}
		mid := day.Add(12 * time.Hour)
		if mid.After(now) {
			mid = now
		}
		g.u += d.GPUS * arbiterDecay(now.Sub(mid), hl)
		g.at = now
	}
}

// arbiterDecay is 2^(-d/h).
func arbiterDecay(d, h time.Duration) float64 {
	return arbiter.DecayedUsage(1, 0, d, h)
}

// The capability: commands and records.

func (fs *fairshare) kinds() []string {
	return []string{arbiter.RecordFairSharePolicy, arbiter.RecordQuota, arbiter.RecordGroupUsage, arbiter.RecordWindowUsage,
		arbiter.RecordStanding, arbiter.RecordQuotaStatus, arbiter.RecordReservation, resSeqKind}
}

// load does nothing: New loads fair share (fsLoad) before the queue is
// reviewed, so that no request is placed past a quota or a reservation.
func (fs *fairshare) load(*Engine, []arbiter.Record, time.Time) error { return nil }

func (fs *fairshare) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	fs.init()
	switch c := cmd.(type) {
	case arbiter.SetFairShare:
		return nil, e.fsSetPolicy(c.Policy, now), true
	case arbiter.SetQuota:
		res, err := e.quotaSet(c, now)
		return res, err, true
	case arbiter.DeleteQuota:
		res, err := e.quotaDelete(c, now)
		return res, err, true
	case arbiter.CreateReservation:
		res, err := e.resCreate(c, now)
		return res, err, true
	case arbiter.DeleteReservation:
		res, err := e.resDelete(c, now)
		return res, err, true
	case arbiter.ExtendAllocation:
		res, err := e.extend(c, now)
		return res, err, true
	case arbiter.CreateNotify:
		res, err := e.notifyCreate(c, now)
		return res, err, true
	case arbiter.DeleteNotify:
		res, err := e.notifyDelete(c, now)
		return res, err, true
	}
	return nil, nil, false
}

func (fs *fairshare) records() []arbiter.Record {
	fs.init()
	out := []arbiter.Record{{Kind: arbiter.RecordFairSharePolicy, Key: "config", Value: fs.pol}}
	for _, k := range sortedKeys(fs.api) {
		out = append(out, arbiter.Record{Kind: arbiter.RecordQuota, Key: k, Value: fs.api[k]})
	}
	if fs.none == nil {
		for _, g := range fs.glist {
			out = append(out, arbiter.Record{Kind: arbiter.RecordGroupUsage, Key: g.name, Value: arbiter.GroupUsage{Group: g.name, GPUSec: g.u, At: g.at}})
			if g.shown.Group != "" {
				out = append(out, arbiter.Record{Kind: arbiter.RecordStanding, Key: g.name, Value: g.shown})
			}
		}
	}
	for _, k := range sortedKeys(fs.subjects) {
		out = append(out, arbiter.Record{Kind: arbiter.RecordWindowUsage, Key: k, Value: arbiter.WindowUsage{Subject: k, Spans: fs.subjects[k].spans}})
	}
	for _, q := range fs.quotas {
		out = append(out, arbiter.Record{Kind: arbiter.RecordQuotaStatus, Key: q.key, Value: q.shown})
	}
	out = append(out, fs.resRecords()...)
	return out
}

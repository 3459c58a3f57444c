package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/arbiter-hq/arbiter"
)

// fsEnv is an engine with fair share configured, driven by a fake time.
type fsEnv struct {
	t   *testing.T
	e   *Engine
	now time.Time
	st  *memStore
}

var fsCronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

func fsCron(spec string) (arbiter.CronSchedule, error) {
	s, err := fsCronParser.Parse(spec)
	if err != nil {
		return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q: %v", spec, err)
	}
	return s, nil
}

func newFSEnv(t *testing.T, pol arbiter.FairSharePolicy, ms ...arbiter.Machine) *fsEnv {
	t.Helper()
	return newFSEnvConfig(t, Config{}, pol, ms...)
}

// newFSEnvConfig is newFSEnv with an engine configured by cfg.
func newFSEnvConfig(t *testing.T, cfg Config, pol arbiter.FairSharePolicy, ms ...arbiter.Machine) *fsEnv {
	t.Helper()
	f := &fsEnv{t: t, now: t0, st: newMemStore()}
	cfg.Cron = fsCron
	f.e = New(cfg, &arbiter.State{}, t0)
	f.must(f.e.Apply(arbiter.SyncConfigMachines{Machines: ms}, t0))
	f.must(f.e.Apply(arbiter.SetFairShare{Policy: pol}, t0))
	f.flush()
	return f
}

func (f *fsEnv) must(v any, err error) any {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

func (f *fsEnv) flush() *arbiter.Changes { return f.st.take(f.t, f.e) }

func (f *fsEnv) advance(d time.Duration) {
	f.t.Helper()
	f.now = f.now.Add(d)
	f.must(f.e.Apply(arbiter.Tick{}, f.now))
	f.flush()
}

func (f *fsEnv) alloc(who string, r arbiter.Request) arbiter.Allocation {
	f.t.Helper()
	a, err := f.try(who, r)
	if err != nil {
		f.t.Fatalf("allocate for %s %+v: %v", who, r, err)
	}
	return a
}

func (f *fsEnv) try(who string, r arbiter.Request) (arbiter.Allocation, error) {
	if r.Owner == "" {
		r.Owner = who
	}
	res, err := f.e.Apply(arbiter.Allocate{Caller: arbiter.Caller{Name: who, Role: arbiter.RoleUser}, Request: r}, f.now)
	f.flush()
	if err != nil {
		return arbiter.Allocation{}, err
	}
	return res.(arbiter.Allocation), nil
}

func (f *fsEnv) get(id int64) arbiter.Allocation {
	a, ok := f.e.Allocation(id)
	if !ok {
		f.t.Fatalf("allocation %d is gone", id)
	}
	return a
}

func (f *fsEnv) release(id int64) {
	f.t.Helper()
	f.must(f.e.Apply(arbiter.Release{Caller: admin, ID: id, Reason: "done"}, f.now))
	f.flush()
}

func twoGroups() arbiter.FairSharePolicy {
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{{Name: "ml", Members: []string{"alice", "bob"}}, {Name: "cv", Members: []string{"carol", "dave*"}}}
	return p
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func intp(n int) *int          { return &n }
func f64p(f float64) *float64  { return &f }
func hours(h float64) *float64 { return f64p(h * 3600) }
func hasEvent(c *arbiter.Changes, kind string, id int64) bool {
	for _, ev := range events(c, kind) {
		if ev.Subject == fmt.Sprintf("allocation/%d", id) {
			return true
		}
	}
	return false
}

func kinds(c *arbiter.Changes) []string {
	var out []string
	for _, ev := range c.Events {
		out = append(out, ev.Kind+" "+ev.Subject)
	}
	return out
}

func events(c *arbiter.Changes, kind string) []arbiter.Event {
	var out []arbiter.Event
	for _, ev := range c.Events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func TestGroupsAndFairShareOrder(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 5))
	// ml holds four GPUs for ten hours: its usage is far above its share.
	x := f.alloc("alice", arbiter.Request{GPUs: 4, KeepaliveS: nil})
	if x.Group != "ml" {
		t.Fatalf("alice's allocation is in group %q, want ml", x.Group)
	}
	if y := f.alloc("zed", arbiter.Request{GPUs: 1}); y.Group != arbiter.DefaultGroup {
		t.Fatalf("zed's allocation is in group %q, want %s", y.Group, arbiter.DefaultGroup)
	}
	f.advance(10 * time.Hour)
	bob := f.alloc("bob", arbiter.Request{GPUs: 1}) // ml, older
	f.advance(time.Minute)
	dave := f.alloc("dave2", arbiter.Request{GPUs: 1}) // cv, younger
	if bob.State != arbiter.StateQueued || dave.State != arbiter.StateQueued {
		t.Fatalf("bob %s, dave %s: want both queued", bob.State, dave.State)
	}
	if p := f.get(dave.ID).Position; p == nil || *p != 1 {
		t.Fatalf("dave's position %v, want 1 (cv has used nothing)", deref(p))
	}
	if p := f.get(bob.ID).Position; p == nil || *p != 2 {
		t.Fatalf("bob's position %v, want 2", deref(p))
	}
	st := standings(f)
	if st["cv"].Factor != 1 || st["ml"].Factor >= 0.5 || st["ml"].Rank <= st["cv"].Rank {
		t.Fatalf("standings %+v: want cv at factor 1 ahead of ml below 0.5", st)
	}
	f.release(x.ID)
	if got := f.get(dave.ID); got.State != arbiter.StateReady {
		t.Fatalf("dave %s, want ready first", got.State)
	}
}

// TestStandingsWithNothingQueued: the groups' standings follow what they
// hold also when nothing waits (they were shown only with a queue: "no
// groups" before the first wait, stale numbers after the last).
func TestStandingsWithNothingQueued(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 8))
	if st := standings(f); len(st) == 0 {
		t.Fatal("no standings with groups configured and nothing allocated")
	}
	x := f.alloc("alice", arbiter.Request{GPUs: 2})
	if st := standings(f); st["ml"].HeldGPUs != 2 {
		t.Fatalf("ml holds %d GPUs in its standing, want 2", st["ml"].HeldGPUs)
	}
	f.release(x.ID)
	if st := standings(f); st["ml"].HeldGPUs != 0 {
		t.Fatalf("ml holds %d GPUs in its standing after the release, want 0", st["ml"].HeldGPUs)
	}
}

// TestGroupWaitingCountsOnlyWaits: a request granted at once does not take
// one off its group's count of waiting requests.
func TestGroupWaitingCountsOnlyWaits(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 2), host("b", 1))
	f.alloc("alice", arbiter.Request{GPUs: 2, Machine: "a"})
	f.alloc("alice", arbiter.Request{GPUs: 2, Machine: "a"}) // waits
	f.alloc("bob", arbiter.Request{GPUs: 2, Machine: "a"})   // waits
	if st := standings(f); st["ml"].Queued != 2 {
		t.Fatalf("ml waiting %d, want 2", st["ml"].Queued)
	}
	if a := f.alloc("alice", arbiter.Request{GPUs: 1, Machine: "b"}); a.State != arbiter.StateReady {
		t.Fatalf("a request that fits: %s", a.State)
	}
	if st := standings(f); st["ml"].Queued != 2 {
		t.Fatalf("ml waiting %d after a request granted at once, want still 2", st["ml"].Queued)
	}
}

// standings are the groups' standings as a reader sees them at f.now.
func standings(f *fsEnv) map[string]arbiter.GroupStanding {
	var raw []arbiter.GroupStanding
	for _, r := range f.e.Records() {
		if r.Kind == arbiter.RecordStanding {
			raw = append(raw, r.Value.(arbiter.GroupStanding))
		}
	}
	out := map[string]arbiter.GroupStanding{}
	for _, s := range arbiter.StandingsAt(raw, f.now) {
		out[s.Group] = s
	}
	return out
}

func TestQuotaMaxGPUs(t *testing.T) {
	p := twoGroups()
	p.Quotas = []arbiter.Quota{{Group: "ml", MaxGPUs: intp(2)}}
	f := newFSEnv(t, p, host("a", 8))
	a1 := f.alloc("alice", arbiter.Request{GPUs: 2, TimeLimitS: hours(1)})
	q := f.alloc("bob", arbiter.Request{GPUs: 1})
	if a1.State != arbiter.StateReady || q.State != arbiter.StateQueued {
		t.Fatalf("a1 %s, q %s: want ready, queued", a1.State, q.State)
	}
	why := arbiter.StrOr(f.get(q.ID).WhyQueued, "")
	if !strings.HasPrefix(why, "quota group:ml (max_gpus = 2)") || !strings.Contains(why, "frees at "+t0.Add(time.Hour).Format(time.RFC3339)) {
		t.Fatalf("why_queued %q: want the quota and when it frees", why)
	}
	// Another group's request is granted meanwhile.
	if c := f.alloc("carol", arbiter.Request{GPUs: 4}); c.State != arbiter.StateReady {
		t.Fatalf("carol %s, want ready", c.State)
	}
	// More than the quota allows at once is refused.
	if _, err := f.try("alice", arbiter.Request{GPUs: 3}); arbiter.ErrorCode(err) != arbiter.EForbidden || !strings.Contains(err.Error(), "quota group:ml") {
		t.Fatalf("3 GPUs: %v, want forbidden naming the quota", err)
	}
	f.advance(time.Hour) // a1 reaches its time limit
	if got := f.get(q.ID); got.State != arbiter.StateReady {
		t.Fatalf("bob %s (%s), want ready once alice's allocation ended", got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
	if r := arbiter.StrOr(f.get(a1.ID).Reason, ""); !strings.HasPrefix(r, arbiter.ReasonTimeLimit) {
		t.Fatalf("a1 ended with %q, want a time limit", r)
	}
}

func TestQuotaModelPattern(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "alice", MaxGPUs: intp(1), Model: "*H100*"}}
	a := host("a", 2)
	b := arbiter.Machine{Name: "b", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", GPUs: gpus(2, "NVIDIA A100", 80, "8.0")}
	f := newFSEnv(t, p, a, b)
	x := f.alloc("alice", arbiter.Request{GPUs: 1, Model: "*H100*"})
	y := f.alloc("alice", arbiter.Request{GPUs: 1})
	if x.State != arbiter.StateReady || *x.Machine != "a" {
		t.Fatalf("x %+v: want an H100", x)
	}
	if y.State != arbiter.StateReady || *y.Machine != "b" {
		t.Fatalf("y on %v: want an A100 (no H100 left in the quota)", y.Machine)
	}
	if z := f.alloc("alice", arbiter.Request{GPUs: 1, Model: "*H100*"}); z.State != arbiter.StateQueued {
		t.Fatalf("z %s: want queued behind the H100 quota", z.State)
	}
}

func TestQuotaGPUHours(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "alice", MaxGPUHours: f64p(10), WindowS: 24 * 3600}}
	f := newFSEnv(t, p, host("a", 8))
	a1 := f.alloc("alice", arbiter.Request{GPUs: 2, TimeLimitS: hours(4)}) // 8 GPU-hours
	a2 := f.alloc("alice", arbiter.Request{GPUs: 1, TimeLimitS: hours(3)}) // 3 more: over 10
	if a1.State != arbiter.StateReady || a2.State != arbiter.StateQueued {
		t.Fatalf("a1 %s, a2 %s", a1.State, a2.State)
	}
	why := arbiter.StrOr(f.get(a2.ID).WhyQueued, "")
	if !strings.Contains(why, "max_gpu_hours = 10") || !strings.Contains(why, "2.0 GPU-hours are left") || !strings.Contains(why, "needs 3.0 (1 GPU for its time limit)") {
		t.Fatalf("why %q: want what is left and what it needs", why)
	}
	// Too much for the quota ever: refused.
	if _, err := f.try("alice", arbiter.Request{GPUs: 3, TimeLimitS: hours(4)}); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("12 GPU-hours: %v, want forbidden", err)
	}
	// Releasing early gives back what was committed and not used.
	f.advance(30 * time.Minute)
	f.release(a1.ID)
	got := f.get(a2.ID)
	if got.State != arbiter.StateReady {
		t.Fatalf("a2 %s (%s): want ready (1 used + 3 asked <= 10)", got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
	// No time limit under an hours quota: it gets what is left (10-1-3 = 6
	// GPU-hours, 3 hours on 2 GPUs).
	a3 := f.alloc("alice", arbiter.Request{GPUs: 2})
	if a3.EndsAt == nil || !a3.EndsAt.Equal(f.now.Add(3*time.Hour)) {
		t.Fatalf("a3 ends at %v, want %v", a3.EndsAt, f.now.Add(3*time.Hour))
	}
	// Nothing left: a request without a time limit needs only a minute's
	// worth, said as such rather than as "0.0".
	a4 := f.alloc("alice", arbiter.Request{GPUs: 1})
	if why := arbiter.StrOr(a4.WhyQueued, ""); a4.State != arbiter.StateQueued || !strings.Contains(why, "0.0 GPU-hours are left") ||
		!strings.Contains(why, "needs 0.017 (1 GPU for at least a minute: it has no time limit)") {
		t.Fatalf("a4 %s, why %q", a4.State, why)
	}
}

func TestTimeLimitNoticeEndAndExtend(t *testing.T) {
	p := twoGroups()
	p.Groups[0].TimeLimitS = 7200
	f := newFSEnv(t, p, host("a", 2))
	x := f.alloc("alice", arbiter.Request{GPUs: 1})
	if x.EndsAt == nil || !x.EndsAt.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("ends_at %v: want the group's default two hours", x.EndsAt)
	}
	// Extend while nobody waits.
	res, err := f.e.Apply(arbiter.ExtendAllocation{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, ID: x.ID, ByS: 3600}, f.now)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.(arbiter.Allocation); !got.EndsAt.Equal(t0.Add(3 * time.Hour)) {
		t.Fatalf("extended to %v", got.EndsAt)
	}
	f.flush()
	if _, err := f.e.Apply(arbiter.ExtendAllocation{Caller: arbiter.Caller{Name: "bob", Role: arbiter.RoleUser}, ID: x.ID, ByS: 60}, f.now); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob extends alice's: %v", err)
	}
	// Someone waits for GPUs like these: refused, naming them.
	f.alloc("carol", arbiter.Request{GPUs: 1, KeepaliveS: nil})
	w := f.alloc("dave", arbiter.Request{GPUs: 1})
	_, err = f.e.Apply(arbiter.ExtendAllocation{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, ID: x.ID, ByS: 3600}, f.now)
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), "is waiting") {
		t.Fatalf("extend with someone waiting: %v", err)
	}
	// The notice comes notice_s before the end, then the end.
	f.now = t0.Add(3*time.Hour - 5*time.Minute)
	f.e.Apply(arbiter.Tick{}, f.now)
	c := f.flush()
	if len(events(c, arbiter.EventAllocationTimeLimit)) != 1 {
		t.Fatalf("events %v: want allocation.time_limit", kinds(c))
	}
	f.advance(5 * time.Minute)
	if r := arbiter.StrOr(f.get(x.ID).Reason, ""); !strings.HasPrefix(r, "time limit (3h") {
		t.Fatalf("reason %q", r)
	}
	if got := f.get(w.ID); got.State != arbiter.StateReady {
		t.Fatalf("dave %s", got.State)
	}
}

func TestReservationBackfillAndStart(t *testing.T) {
	p := twoGroups()
	p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
	f := newFSEnv(t, p, host("a", 4))
	old := f.alloc("zed", arbiter.Request{GPUs: 1, KeepaliveS: nil}) // no time limit, before the reservation
	pre := f.alloc("carol", arbiter.Request{GPUs: 1, KeepaliveS: nil, Preemptible: true})
	start := t0.Add(2 * time.Hour)
	res, err := f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 4, Machine: "a", Start: start, DurationS: 3600, Group: "ops"}}, f.now)
	if err != nil {
		t.Fatal(err)
	}
	rv := res.(arbiter.Reservation)
	f.flush()
	if len(rv.Devices) != 4 || rv.ID == "" || rv.Active {
		t.Fatalf("reservation %+v", rv)
	}
	if got := f.get(old.ID); got.EndsAt == nil || !got.EndsAt.Equal(start) || !strings.HasPrefix(got.EndReason, "time limit: reservation") {
		t.Fatalf("old ends %v (%q): want at the start", got.EndsAt, got.EndReason)
	}
	if got := f.get(pre.ID); !strings.HasPrefix(got.EndReason, "preempted by reservation") {
		t.Fatalf("preemptible ends with %q", got.EndReason)
	}
	// Backfill only what ends before the start.
	long := f.alloc("alice", arbiter.Request{GPUs: 1})
	if long.State != arbiter.StateQueued || !strings.Contains(arbiter.StrOr(f.get(long.ID).WhyQueued, ""), "reserved") {
		t.Fatalf("no time limit: %s %q, want queued for the reservation", long.State, arbiter.StrOr(f.get(long.ID).WhyQueued, ""))
	}
	short := f.alloc("bob", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	if short.State != arbiter.StateReady {
		t.Fatalf("1h before a start 2h away: %s", short.State)
	}
	tooLong := f.alloc("bob", arbiter.Request{GPUs: 1, TimeLimitS: hours(3)})
	if tooLong.State != arbiter.StateQueued {
		t.Fatalf("3h: %s", tooLong.State)
	}
	// A member's request inside waits for the start; others may not name it.
	in := f.alloc("olga", arbiter.Request{GPUs: 4, Reservation: rv.ID})
	if in.State != arbiter.StateQueued || in.ETA == nil && f.get(in.ID).ETA == nil {
		t.Fatalf("olga %s eta %v", in.State, f.get(in.ID).ETA)
	}
	if eta := f.get(in.ID).ETA; !eta.Equal(start) {
		t.Fatalf("olga's ETA %v, want the start %v", eta, start)
	}
	if _, err := f.try("alice", arbiter.Request{GPUs: 1, Reservation: rv.ID}); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("a non-member names the reservation: %v", err)
	}
	f.now = start.Add(-5 * time.Minute)
	f.e.Apply(arbiter.Tick{}, f.now)
	c := f.flush()
	if !hasEvent(c, arbiter.EventAllocationPreempting, pre.ID) || !hasEvent(c, arbiter.EventAllocationTimeLimit, old.ID) {
		t.Fatalf("notices before the start: %v", kinds(c))
	}
	f.now = start
	f.e.Apply(arbiter.Tick{}, f.now)
	c = f.flush()
	if len(events(c, arbiter.EventReservationStarted)) != 1 {
		t.Fatalf("no reservation.started in %v", kinds(c))
	}
	if got := f.get(in.ID); got.State != arbiter.StateReady || !got.EndsAt.Equal(start.Add(time.Hour)) {
		t.Fatalf("olga at the start: %s ends %v", got.State, got.EndsAt)
	}
	for _, id := range []int64{old.ID, pre.ID} {
		if got := f.get(id); got.State != arbiter.StateDestroyed {
			t.Fatalf("allocation %d is %s at the start", id, got.State)
		}
	}
	if r := arbiter.StrOr(f.get(pre.ID).Reason, ""); !strings.HasPrefix(r, "preempted by reservation") {
		t.Fatalf("preemptible ended with %q", r)
	}
	f.advance(time.Hour)
	if got := f.get(in.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("olga after the window: %s", got.State)
	}
	if got := f.get(long.ID); got.State != arbiter.StateReady {
		t.Fatalf("alice after the window: %s (%s)", got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
}

func TestRecurringReservation(t *testing.T) {
	p := twoGroups()
	f := newFSEnv(t, p, host("a", 2))
	res := f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 2, Machine: "a",
		Cron: "0 2 * * 0", DurationS: 4 * 3600, Group: "cv"}}, f.now)).(arbiter.Reservation)
	f.flush()
	// t0 is Friday 2026-01-02 03:04: the first window is Sunday 02:00.
	sun := time.Date(2026, 1, 4, 2, 0, 0, 0, time.UTC)
	if res.WindowStart == nil || !res.WindowStart.Equal(sun) {
		t.Fatalf("window starts %v, want %v", res.WindowStart, sun)
	}
	f.now = sun.Add(4 * time.Hour)
	f.e.Apply(arbiter.Tick{}, f.now)
	c := f.flush()
	if len(events(c, arbiter.EventReservationStarted)) != 1 || len(events(c, arbiter.EventReservationEnded)) != 1 {
		t.Fatalf("events %v", kinds(c))
	}
	var rv arbiter.Reservation
	for _, r := range f.e.Records() {
		if r.Kind == arbiter.RecordReservation {
			rv = r.Value.(arbiter.Reservation)
		}
	}
	if rv.WindowStart == nil || !rv.WindowStart.Equal(sun.Add(7*24*time.Hour)) {
		t.Fatalf("next window %v", rv.WindowStart)
	}
	// Another reservation of the same GPUs in overlapping windows: refused.
	_, err := f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a",
		Start: sun.Add(7*24*time.Hour + time.Hour), DurationS: 3600, Group: "ml"}}, f.now)
	if arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("overlap: %v", err)
	}
}

func TestPreemptionByPriority(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy() // no groups: nothing is preemptible unless asked
	p.GraceS, p.MinRuntimeS = 60, 300
	f := newFSEnv(t, p, host("a", 2))
	low := f.alloc("carol", arbiter.Request{GPUs: 1, Preemptible: true, KeepaliveS: nil})
	firm := f.alloc("dave", arbiter.Request{GPUs: 1, KeepaliveS: nil}) // not preemptible
	if !low.Preemptible || firm.Preemptible {
		t.Fatalf("preemptible: low %v, firm %v", low.Preemptible, firm.Preemptible)
	}
	// Too new to be preempted.
	hi := f.alloc("alice", arbiter.Request{GPUs: 1, Priority: 10, KeepaliveS: nil})
	if got := f.get(low.ID); got.Preempting != nil {
		t.Fatal("preempted within min_runtime_s")
	}
	f.advance(5 * time.Minute)
	got := f.get(low.ID)
	if got.Preempting == nil || !got.EndsAt.Equal(f.now.Add(time.Minute)) {
		t.Fatalf("after min_runtime_s: preempting %+v ends %v", got.Preempting, got.EndsAt)
	}
	if f.get(firm.ID).Preempting != nil {
		t.Fatal("non-preemptible work is being preempted")
	}
	f.advance(time.Minute)
	if r := arbiter.StrOr(f.get(low.ID).Reason, ""); !strings.HasPrefix(r, "preempted by allocation") {
		t.Fatalf("low ended with %q", r)
	}
	if got := f.get(hi.ID); got.State != arbiter.StateReady {
		t.Fatalf("hi %s", got.State)
	}
}

func TestETAFromTimeLimits(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 2))
	f.alloc("alice", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	f.alloc("carol", arbiter.Request{GPUs: 1, TimeLimitS: hours(2)})
	q1 := f.alloc("bob", arbiter.Request{GPUs: 2, TimeLimitS: hours(1)})
	q2 := f.alloc("dave", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	e1, e2 := f.get(q1.ID).ETA, f.get(q2.ID).ETA
	if e1 == nil || e2 == nil {
		t.Fatalf("ETAs %v %v", e1, e2)
	}
	// q1 needs both GPUs; q2 backfills alice's at 1h for an hour, and at
	// 2h both are free for q1.
	if !e2.Equal(t0.Add(time.Hour)) || !e1.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("ETAs q1 %v q2 %v", e1, e2)
	}
	if w := arbiter.StrOr(f.get(q1.ID).WhyQueued, ""); !strings.HasSuffix(w, "; ETA "+t0.Add(2*time.Hour).Format(time.RFC3339)) {
		t.Fatalf("why_queued %q: want the ETA", w)
	}
}

func TestNotificationsForAPerson(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 1))
	sub := f.must(f.e.Apply(arbiter.CreateNotify{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, Webhook: arbiter.Webhook{
		URL: "http://example.com/hook", Secret: "whsec_" + strings.Repeat("QUFB", 8), Kinds: []string{arbiter.NotifyReady, arbiter.NotifyGPUFree},
	}}, f.now)).(arbiter.Webhook)
	c := f.flush()
	if sub.Principal != "alice" || sub.ID == "" {
		t.Fatalf("subscription %+v", sub)
	}
	if n := events(c, arbiter.EventNotification); len(n) != 1 || !strings.Contains(string(n[0].Data), `"gpu.free"`) {
		t.Fatalf("gpu.free when subscribing with a free GPU: %v", kinds(c))
	}
	x := f.alloc("alice", arbiter.Request{GPUs: 1})
	c = f.st.last
	var got []arbiter.Notification
	for _, ev := range c.Events {
		if ev.Kind == arbiter.EventNotification {
			var n arbiter.Notification
			if err := json.Unmarshal(ev.Data, &n); err != nil {
				t.Fatal(err)
			}
			if ev.Subject != arbiter.NotifySubject(sub.ID) {
				t.Fatalf("subject %s", ev.Subject)
			}
			got = append(got, n)
		}
	}
	if len(got) != 1 || got[0].Kind != arbiter.NotifyReady || !strings.Contains(got[0].Text, "is ready") {
		t.Fatalf("notifications %+v", got)
	}
	// bob's allocation tells alice nothing; the GPU freeing again does.
	f.release(x.ID)
	if n := events(f.st.last, arbiter.EventNotification); len(n) != 1 || !strings.Contains(string(n[0].Data), "gpu.free") {
		t.Fatalf("after release: %v", kinds(f.st.last))
	}
	if _, err := f.e.Apply(arbiter.DeleteNotify{Caller: arbiter.Caller{Name: "bob", Role: arbiter.RoleUser}, ID: sub.ID}, f.now); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("bob deletes alice's subscription: %v", err)
	}
}

func TestFairShareSurvivesRestart(t *testing.T) {
	p := twoGroups()
	p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
	f := newFSEnv(t, p, host("a", 4))
	f.must(f.e.Apply(arbiter.SetQuota{Caller: admin, Quota: arbiter.Quota{Group: "cv", MaxGPUs: intp(1)}}, f.now))
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 2, Machine: "a", Start: t0.Add(5 * time.Hour), DurationS: 3600, Group: "ops"}}, f.now))
	x := f.alloc("alice", arbiter.Request{GPUs: 2, TimeLimitS: hours(2), KeepaliveS: nil})
	f.alloc("carol", arbiter.Request{GPUs: 1, KeepaliveS: nil})
	q := f.alloc("dave", arbiter.Request{GPUs: 1, KeepaliveS: nil})
	f.advance(time.Hour)
	before := standings(f)
	e2 := New(Config{Cron: fsCron}, f.st.state(), f.now)
	f.e = e2
	f.flush()
	if got := f.get(q.ID); got.State != arbiter.StateQueued || !strings.HasPrefix(arbiter.StrOr(got.WhyQueued, ""), "quota group:cv") {
		t.Fatalf("after restart dave %s %q: want still held by the API quota", got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
	after := standings(f)
	if d := after["ml"].UsageGPUHours - before["ml"].UsageGPUHours; d < -0.01 || d > 0.01 {
		t.Fatalf("ml usage %v before, %v after", before["ml"].UsageGPUHours, after["ml"].UsageGPUHours)
	}
	f.advance(time.Hour)
	if got := f.get(x.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("alice's time limit lost in the restart: %s", got.State)
	}
	var n int
	for _, r := range f.e.Records() {
		if r.Kind == arbiter.RecordReservation {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d reservations after restart", n)
	}
}

// TestPreemptedTaskRequeuedAttemptNotCounted: a task of a preemptible
// group is preempted by a request of higher priority; it goes back to
// pending with its attempt not counted, whether the allocation ends at the
// grace or the worker reports the failure its SIGTERM caused first.
func TestPreemptedTaskRequeuedAttemptNotCounted(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{{Name: "batch", Members: []string{"task:*"}, Preemptible: true}, {Name: "ml", Members: []string{"alice"}}}
	p.GraceS, p.MinRuntimeS = 30, 0
	f := newFSEnv(t, p, host("gpua", 1))
	taskSync(t, f.e, f.now, nil, taskDef("train", func(s *arbiter.TaskSpec) { s.GPUs, s.MaxAttempts = 1, 1 }))
	f.flush()
	for round, viaFail := range []bool{false, true} {
		c := claim(t, f.e, f.now, "gpua", arbiter.Capability{})
		if c == nil || c.Attempts != 1 {
			t.Fatalf("round %d: claim %+v", round, c)
		}
		if a := f.get(c.AllocationID); !a.Preemptible || a.Group != "batch" {
			t.Fatalf("the task's allocation: preemptible %v, group %q", a.Preemptible, a.Group)
		}
		hi := f.alloc("alice", arbiter.Request{GPUs: 1, Priority: 5})
		if got := f.get(c.AllocationID); got.Preempting == nil {
			t.Fatalf("round %d: the task's allocation is not being preempted", round)
		}
		if viaFail {
			if _, err := f.e.Apply(arbiter.FailTask{ID: c.ID, Worker: "gpua", Error: "signal: terminated"}, f.now); err != nil {
				t.Fatal(err)
			}
			f.flush()
		} else {
			f.advance(30 * time.Second)
			if r := arbiter.StrOr(f.get(c.AllocationID).Reason, ""); !strings.HasPrefix(r, "preempted by allocation") {
				t.Fatalf("the task's allocation ended with %q", r)
			}
		}
		tk := taskOf(f.e, "train")
		if tk.Status != arbiter.TaskPending || tk.Attempts != 0 {
			t.Fatalf("round %d: task %s with %d attempts, want pending with none counted (max_attempts 1)", round, tk.Status, tk.Attempts)
		}
		if got := f.get(hi.ID); got.State != arbiter.StateReady {
			t.Fatalf("round %d: alice %s", round, got.State)
		}
		f.release(hi.ID)
	}
}

// TestTaskClaimJudgesPreemptibleAtNow: a task's claim judges whether its
// allocation is preemptible with every group's usage brought to now, not
// as it was when last brought forward.
func TestTaskClaimJudgesPreemptibleAtNow(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{{Name: "batch", Members: []string{"task:*"}}, {Name: "ml", Members: []string{"alice"}}}
	f := newFSEnv(t, p, host("gpua", 8))
	// ml holds 2 GPUs from t0 on; batch uses 4 GPUs for 2 hours.
	f.alloc("alice", arbiter.Request{GPUs: 2, KeepaliveS: nil})
	b := f.alloc("task:warmup", arbiter.Request{GPUs: 4, KeepaliveS: nil})
	f.advance(2 * time.Hour)
	f.release(b.ID)
	// 22 hours on, nothing else happened. ml has used ~35 GPU-hours
	// (decayed), batch ~4: batch is far under its share (1/3).
	f.now = f.now.Add(22 * time.Hour)
	taskSync(t, f.e, f.now, nil, taskDef("train", func(s *arbiter.TaskSpec) { s.GPUs = 1 }))
	f.flush()
	c := claim(t, f.e, f.now, "gpua", arbiter.Capability{})
	if c == nil {
		t.Fatal("no claim")
	}
	f.flush()
	a := f.get(c.AllocationID)
	if a.Preemptible {
		var raw []arbiter.GroupStanding
		for _, g := range f.e.fs.glist {
			raw = append(raw, arbiter.GroupStanding{Group: g.name, Share: g.share, UsageGPUSec: g.u, UsageAt: g.at, HalfLifeS: p.HalfLifeS, HeldGPUs: g.n})
		}
		for _, s := range arbiter.StandingsAt(raw, f.now) {
			t.Logf("at the claim, brought to now: %s usage %.1f GPU-h = %.0f%% of all, share %.0f%%", s.Group, s.UsageGPUHours, s.UsagePct, s.SharePct)
		}
		t.Fatalf("the task's allocation is preemptible although its group batch is under its share")
	}
}

// TestReservationStartedToItsGroupOnly: reservation.started goes to the
// members whose group it is (the first group that lists them), not to one
// listed in it after another group.
func TestReservationStartedToItsGroupOnly(t *testing.T) {
	p := func() arbiter.FairSharePolicy {
		p := twoGroups()
		p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
		return p
	}()
	p.Groups[2].Members = append(p.Groups[2].Members, "alice") // alice: ml first, ops second
	f := newFSEnv(t, p, host("a", 1))
	f.must(f.e.Apply(arbiter.CreateNotify{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, Webhook: arbiter.Webhook{
		URL: "http://example.com/hook", Secret: "whsec_" + strings.Repeat("QUFB", 8), Kinds: []string{arbiter.NotifyReservation},
	}}, f.now))
	f.flush()
	start := t0.Add(time.Hour)
	rv := f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a", Start: start, DurationS: 3600, Group: "ops"}}, f.now)).(arbiter.Reservation)
	f.flush()
	if _, err := f.try("alice", arbiter.Request{GPUs: 1, Reservation: rv.ID}); arbiter.ErrorCode(err) != arbiter.EForbidden {
		t.Fatalf("alice (group ml) allocating in ops' reservation: %v, want forbidden", err)
	}
	f.now = start
	f.e.Apply(arbiter.Tick{}, f.now)
	c := f.flush()
	for _, ev := range events(c, arbiter.EventNotification) {
		var n arbiter.Notification
		json.Unmarshal(ev.Data, &n)
		if n.Kind == arbiter.NotifyReservation {
			t.Fatalf("alice (group ml) told %q", n.Text)
		}
	}
}

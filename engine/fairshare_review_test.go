package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestQuotaBlockedRequestHoldsNoMachines: a request its own quota holds
// back is not waiting for GPUs: past the starvation limit it holds no
// machine against the requests behind it.
func TestQuotaBlockedRequestHoldsNoMachines(t *testing.T) {
	p := twoGroups()
	p.Quotas = []arbiter.Quota{{Principal: "bob", MaxGPUs: intp(1)}}
	f := newFSEnvConfig(t, Config{Starvation: 10 * time.Minute}, p, host("a", 8))
	f.alloc("bob", arbiter.Request{GPUs: 1}) // bob at his quota, no time limit
	q := f.alloc("bob", arbiter.Request{GPUs: 1})
	if q.State != arbiter.StateQueued {
		t.Fatalf("bob %s, want queued by his quota", q.State)
	}
	f.advance(11 * time.Minute)
	c := f.alloc("alice", arbiter.Request{GPUs: 2})
	if got := f.get(c.ID); got.State != arbiter.StateReady {
		t.Fatalf("alice %s (%s): 7 GPUs are free and only bob's own quota holds his request back",
			got.State, arbiter.StrOr(got.WhyQueued, ""))
	}
	if why := arbiter.StrOr(f.get(q.ID).WhyQueued, ""); !strings.Contains(why, "quota") {
		t.Errorf("bob's request: why_queued %q, want his quota", why)
	}
}

// TestReservationsFarAheadDoNotOverlap: two one-off reservations of the
// same GPUs for the same window six weeks out are not both made.
func TestReservationsFarAheadDoNotOverlap(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 2))
	start := t0.Add(42 * 24 * time.Hour)
	mk := func(group string) (any, error) {
		return f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{
			GPUs: 2, Machine: "a", Start: start, DurationS: 6 * 3600, Group: group}}, f.now)
	}
	f.must(mk("ml"))
	if r2, err := mk("cv"); arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("a second reservation of both GPUs for the same window: %v, want conflict; made %+v", err, r2)
	}
}

// TestReservationStartInThePastRefused: a one-off reservation whose start
// passed (beyond a minute's slack) is refused: it would open at once and
// end what runs on its GPUs without notice. "Now" is taken.
func TestReservationStartInThePastRefused(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 4))
	x := f.alloc("alice", arbiter.Request{GPUs: 1})
	f.advance(time.Hour)
	_, err := f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{
		GPUs: 4, Machine: "a", Start: f.now.Add(-time.Hour), DurationS: 6 * 3600, Group: "cv"}}, f.now)
	if arbiter.ErrorCode(err) != arbiter.EInvalid || !strings.Contains(arbiter.ErrorMessage(err), "in the past") {
		t.Fatalf("a start an hour ago: %v, want invalid", err)
	}
	if got := f.get(x.ID); got.State != arbiter.StateReady {
		t.Fatalf("alice's allocation %s after a refused reservation", got.State)
	}
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{
		GPUs: 1, Machine: "a", Start: f.now.Add(-2 * time.Second), DurationS: 3600, Group: "cv"}}, f.now))
}

// TestPreemptedGPUsGoToThePreemptor: what a preemption frees goes to the
// request it was for, not to a lower-priority request that would fit in
// the meantime.
func TestPreemptedGPUsGoToThePreemptor(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.GraceS, p.MinRuntimeS = 300, 0
	f := newFSEnv(t, p, host("a", 4))
	low := f.alloc("carol", arbiter.Request{GPUs: 2, Preemptible: true})
	f.alloc("dave", arbiter.Request{GPUs: 1}) // one GPU stays free
	hi := f.alloc("alice", arbiter.Request{GPUs: 3, Priority: 10})
	if got := f.get(low.ID); got.Preempting == nil || got.Preempting.For != hi.ID {
		t.Fatalf("carol's allocation not preempted for alice's: %+v", got.Preempting)
	}
	f.advance(time.Minute)
	sneak := f.alloc("erin", arbiter.Request{GPUs: 1})
	f.advance(5 * time.Minute) // carol's ends
	if got := f.get(hi.ID); got.State != arbiter.StateReady {
		t.Fatalf("alice's (priority 10) %s after its victim ended (%s); erin's (priority 0) is %s",
			got.State, arbiter.StrOr(got.WhyQueued, ""), f.get(sneak.ID).State)
	}
}

// TestSecondPreemptorPreemptsItsOwn: two requests that each need a
// victim's GPUs preempt one each; the second does not count on the GPUs
// the first's victim frees.
func TestSecondPreemptorPreemptsItsOwn(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.GraceS, p.MinRuntimeS = 300, 0
	f := newFSEnv(t, p, host("a", 4))
	l1 := f.alloc("carol", arbiter.Request{GPUs: 2, Preemptible: true})
	l2 := f.alloc("dave", arbiter.Request{GPUs: 2, Preemptible: true})
	f.advance(time.Minute)
	h1 := f.alloc("alice", arbiter.Request{GPUs: 2, Priority: 10})
	h2 := f.alloc("bob", arbiter.Request{GPUs: 2, Priority: 10})
	if f.get(l1.ID).Preempting == nil || f.get(l2.ID).Preempting == nil {
		t.Fatalf("two requests of priority 10 for 2 GPUs each: preempting %+v and %+v", f.get(l1.ID).Preempting, f.get(l2.ID).Preempting)
	}
	f.advance(301 * time.Second)
	for _, id := range []int64{h1.ID, h2.ID} {
		if got := f.get(id); got.State != arbiter.StateReady {
			t.Errorf("allocation %d %s one grace period after it asked (%s)", id, got.State, arbiter.StrOr(got.WhyQueued, ""))
		}
	}
}

// TestEmptyDefaultGroupTakesNoShare: with groups ml (share 2) and cv
// (share 1), the implicit default group, holding and waiting for nothing,
// takes no share: ml's is two thirds, and ml holding two thirds of the
// cluster is within it (not preemptible). Once default is used it takes
// its share of 1.
func TestEmptyDefaultGroupTakesNoShare(t *testing.T) {
	p := twoGroups()
	p.Shares = map[string]float64{"ml": 2, "cv": 1}
	f := newFSEnv(t, p, host("a", 3))
	x := f.alloc("alice", arbiter.Request{GPUs: 2})
	f.advance(time.Hour)
	st := standings(f)
	if d := st["ml"].SharePct - 200.0/3; d > 0.1 || d < -0.1 {
		t.Errorf("ml share_pct %.1f, want 66.7 (shares ml=2, cv=1); default %+v", st["ml"].SharePct, st[arbiter.DefaultGroup])
	}
	if x.Preemptible {
		t.Errorf("ml's first 2 of 3 GPUs (its share) granted as preemptible")
	}
	f.alloc("zed", arbiter.Request{GPUs: 1}) // in no group: default
	f.advance(time.Minute)
	if st = standings(f); st["ml"].SharePct > 50.1 || st[arbiter.DefaultGroup].SharePct < 24.9 {
		t.Errorf("with default in use: ml %.1f%%, default %.1f%%, want 50 and 25", st["ml"].SharePct, st[arbiter.DefaultGroup].SharePct)
	}
}

// TestExtendNotRefusedForARequestInAReservation: a request inside a
// reservation waits for its window and may only take the reservation's
// GPUs: it does not wait "for GPUs like these", and others may extend.
func TestExtendNotRefusedForARequestInAReservation(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 4))
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{
		GPUs: 1, Machine: "a", Start: t0.Add(72 * time.Hour), DurationS: 3600, Group: "cv"}}, f.now))
	f.flush()
	if w := f.alloc("carol", arbiter.Request{GPUs: 1, Reservation: "r1"}); w.State != arbiter.StateQueued {
		t.Fatalf("carol's request in r1 %s, want queued until the window", w.State)
	}
	x := f.alloc("alice", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	if _, err := f.e.Apply(arbiter.ExtendAllocation{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, ID: x.ID, ByS: 3600}, f.now); err != nil {
		t.Fatalf("extend by an hour with only a reservation's member queued (its window in 3 days): %v", err)
	}
}

// TestModelQuotaThatNeverFitsIsRefused: a model quota masks its model's
// GPUs from a request it cannot take; when no machine has enough other
// GPUs, the request can never fit and is refused at once (403), naming the
// quota.
func TestModelQuotaThatNeverFitsIsRefused(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "alice", MaxGPUs: intp(1), Model: "*H100*"}}
	f := newFSEnv(t, p, host("a", 4)) // all H100
	_, err := f.try("alice", arbiter.Request{GPUs: 2})
	if arbiter.ErrorCode(err) != arbiter.EForbidden || !strings.Contains(arbiter.ErrorMessage(err), "*H100*") {
		t.Fatalf("2 GPUs under max_gpus = 1 of the cluster's only model: %v, want forbidden naming the quota", err)
	}
	if a, err := f.try("alice", arbiter.Request{GPUs: 1}); err != nil || a.State != arbiter.StateReady {
		t.Fatalf("1 GPU under that quota: %+v %v", a, err)
	}
}

// TestHoursQuotaFreesAtWhileItsHolderRuns: why_queued of a request an
// hours quota holds back says when it frees, counting the holder's time up
// to the holder's own end: 10 GPU-h per 24 h, 8 used by 2 GPUs over
// [t0, t0+4h], 3 more needed: at t0+24h30m.
func TestHoursQuotaFreesAtWhileItsHolderRuns(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "alice", MaxGPUHours: f64p(10), WindowS: 24 * 3600}}
	f := newFSEnv(t, p, host("a", 8))
	f.alloc("alice", arbiter.Request{GPUs: 2, TimeLimitS: hours(4)})
	q := f.alloc("alice", arbiter.Request{GPUs: 1, TimeLimitS: hours(3)})
	want := t0.Add(24*time.Hour + 30*time.Minute)
	why := arbiter.StrOr(f.get(q.ID).WhyQueued, "")
	_, rest, _ := strings.Cut(why, "frees at ")
	at, err := time.Parse(time.RFC3339, strings.TrimRight(strings.SplitN(rest, " ", 2)[0], ";"))
	if d := at.Sub(want); err != nil || d < 0 || d > time.Second { // the search is to the second
		t.Fatalf("why_queued %q: want it to free at %s", why, want.Format(time.RFC3339))
	}
}

// TestQuotaForAnUnknownGroupRefused: a quota set through the API for a
// group that is not configured (a typo) is refused, as a reservation is.
func TestQuotaForAnUnknownGroupRefused(t *testing.T) {
	f := newFSEnv(t, twoGroups(), host("a", 4))
	_, err := f.e.Apply(arbiter.SetQuota{Caller: admin, Quota: arbiter.Quota{Group: "mll", MaxGPUs: intp(1)}}, f.now)
	if arbiter.ErrorCode(err) != arbiter.EInvalid || !strings.Contains(arbiter.ErrorMessage(err), "not configured") {
		t.Fatalf("a quota for group mll: %v, want invalid", err)
	}
	f.must(f.e.Apply(arbiter.SetQuota{Caller: admin, Quota: arbiter.Quota{Group: "ml", MaxGPUs: intp(1)}}, f.now))
}

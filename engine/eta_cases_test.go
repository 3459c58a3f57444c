package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// playOut moves the clock from deadline to deadline (as control does)
// until nothing is due or until `until` (zero: no bound).
func (f *fsEnv) playOut(until time.Time) {
	f.t.Helper()
	for i := 0; i < 10000; i++ {
		d := f.e.NextDeadline()
		if d.IsZero() || !until.IsZero() && d.After(until) {
			break
		}
		if d.Before(f.now) {
			d = f.now
		}
		f.now = d
		f.e.Apply(arbiter.Tick{}, d)
		f.flush()
	}
}

// checkETA compares the ETA recorded before playOut with the real start.
func (f *fsEnv) checkETA(id int64, eta *time.Time) {
	f.t.Helper()
	a := f.get(id)
	switch {
	case eta == nil && a.ReadyAt != nil:
		f.t.Errorf("allocation %d had no ETA, yet it started at %s (%s after t0)", id, a.ReadyAt.Format(time.RFC3339), a.ReadyAt.Sub(t0))
	case eta != nil && a.ReadyAt == nil:
		f.t.Errorf("allocation %d: ETA %s (%s after t0), but it has not started by %s; why_queued %q", id, eta.Format(time.RFC3339), eta.Sub(t0),
			f.now.Format(time.RFC3339), arbiter.StrOr(a.WhyQueued, ""))
	case eta != nil && (a.ReadyAt.Sub(*eta) > time.Second || eta.Sub(*a.ReadyAt) > time.Second):
		f.t.Errorf("allocation %d: ETA %s after t0, started %s after t0", id, eta.Sub(t0), a.ReadyAt.Sub(t0))
	}
}

// etaOf is a's ETA, copied (nil: none).
func etaOf(a arbiter.Allocation) *time.Time {
	if a.ETA == nil {
		return nil
	}
	t := *a.ETA
	return &t
}

// TestETAQuotaFreedOnASmallMachine: a request held back only by its
// max_gpus quota, with free GPUs on another machine, gets the time its
// quota frees as ETA, though the end that frees it is on a machine too
// small for it.
func TestETAQuotaFreedOnASmallMachine(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "carol", MaxGPUs: intp(2)}}
	f := newFSEnv(t, p, host("a", 1), host("b", 2))
	h := f.alloc("carol", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	if h.State != arbiter.StateReady || arbiter.StrOr(h.Machine, "") != "a" {
		t.Fatalf("holder: %+v", h)
	}
	q := f.alloc("carol", arbiter.Request{GPUs: 2, TimeLimitS: hours(1)})
	if q.State != arbiter.StateQueued {
		t.Fatalf("want queued: %+v", q)
	}
	q = f.get(q.ID)
	t.Logf("position %v eta %v why %q", deref(q.Position), q.ETA, arbiter.StrOr(q.WhyQueued, ""))
	eta := etaOf(q)
	f.playOut(t0.Add(48 * time.Hour))
	f.checkETA(q.ID, eta)
}

// TestETAQuotaFreedOnASmallMachineNotLate: the same, with an end later
// on: the ETA is the quota's time, not that end's.
func TestETAQuotaFreedOnASmallMachineNotLate(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "carol", MaxGPUs: intp(2)}}
	f := newFSEnv(t, p, host("a", 1), host("b", 2), host("c", 2))
	h := f.alloc("carol", arbiter.Request{GPUs: 1, TimeLimitS: hours(1), Machine: "a"})
	o := f.alloc("zed", arbiter.Request{GPUs: 2, TimeLimitS: hours(3), Machine: "c"})
	if h.State != arbiter.StateReady || o.State != arbiter.StateReady {
		t.Fatalf("holders: %+v %+v", h, o)
	}
	q := f.alloc("carol", arbiter.Request{GPUs: 2, TimeLimitS: hours(1)})
	q = f.get(q.ID)
	t.Logf("position %v eta %v why %q", deref(q.Position), q.ETA, arbiter.StrOr(q.WhyQueued, ""))
	eta := etaOf(q)
	f.playOut(t0.Add(48 * time.Hour))
	f.checkETA(q.ID, eta)
}

// TestETAKnowsTheLimitAnHoursQuotaGives: a request without a time limit
// under an hours quota gets, at its grant, the time limit that spends what
// is left; the simulation gives it that end too, so the request queued
// behind it gets an ETA.
func TestETAKnowsTheLimitAnHoursQuotaGives(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "carol", MaxGPUHours: f64p(4)}}
	f := newFSEnv(t, p, host("a", 1))
	f.alloc("dave", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	x := f.alloc("carol", arbiter.Request{GPUs: 1})
	y := f.alloc("zed", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	x, y = f.get(x.ID), f.get(y.ID)
	t.Logf("x eta %v, y eta %v why %q", x.ETA, y.ETA, arbiter.StrOr(y.WhyQueued, ""))
	ex, ey := etaOf(x), etaOf(y)
	f.playOut(t0.Add(24 * time.Hour))
	t.Logf("x: ready %v ends_at %v", f.get(x.ID).ReadyAt, f.get(x.ID).EndsAt)
	f.checkETA(x.ID, ex)
	f.checkETA(y.ID, ey)
}

// TestPositionAfterAQueuedRelease: a released queued request loses its
// position and ETA, and the one behind it moves up.
func TestPositionAfterAQueuedRelease(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.Quotas = []arbiter.Quota{{Principal: "nobody", MaxGPUs: intp(8)}} // fair share on, no groups
	f := newFSEnv(t, p, host("a", 1))
	f.alloc("dave", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	q1 := f.alloc("alice", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	q2 := f.alloc("bob", arbiter.Request{GPUs: 1, TimeLimitS: hours(1)})
	if got := f.get(q2.ID); got.Position == nil || *got.Position != 2 {
		t.Fatalf("q2 position %v", deref(got.Position))
	}
	f.release(q1.ID)
	d := f.get(q1.ID)
	if d.Position != nil || d.ETA != nil {
		t.Errorf("destroyed allocation %d still shows position %v eta %v", q1.ID, deref(d.Position), d.ETA)
	}
	b := f.get(q2.ID)
	if b.Position == nil || *b.Position != 1 {
		t.Errorf("allocation %d is first in the queue, but shows position %v", q2.ID, deref(b.Position))
	}
	if b.ETA == nil || !b.ETA.Equal(t0.Add(time.Hour)) {
		t.Errorf("allocation %d: eta %v, want %v", q2.ID, b.ETA, t0.Add(time.Hour))
	}
}

// TestETAOfAnHoursQuotaAlone: a request an hours quota holds back until a
// known time gets that ETA, whether or not anything else has an end.
func TestETAOfAnHoursQuotaAlone(t *testing.T) {
	for _, other := range []bool{false, true} {
		p := arbiter.DefaultFairSharePolicy()
		p.Quotas = []arbiter.Quota{{Principal: "carol", MaxGPUHours: f64p(4)}}
		f := newFSEnv(t, p, host("a", 2), host("b", 1))
		used := f.alloc("carol", arbiter.Request{GPUs: 1, TimeLimitS: hours(3), Machine: "a"})
		f.playOut(t0.Add(3 * time.Hour))
		if f.get(used.ID).State != arbiter.StateDestroyed {
			t.Fatal("not ended")
		}
		if other {
			f.alloc("zed", arbiter.Request{GPUs: 1, TimeLimitS: hours(1), Machine: "b"})
		}
		q := f.alloc("carol", arbiter.Request{GPUs: 1, TimeLimitS: hours(2), Machine: "a"})
		q = f.get(q.ID)
		t.Logf("other=%v: eta %v why %q", other, q.ETA, arbiter.StrOr(q.WhyQueued, ""))
		eta := etaOf(q)
		f.playOut(t0.Add(10 * 24 * time.Hour))
		f.checkETA(q.ID, eta)
	}
}

// TestWhyQueuedNamesTheReservationOfItsGPUs: why_queued names the
// reservation of the GPUs the request could use, not an earlier one
// elsewhere.
func TestWhyQueuedNamesTheReservationOfItsGPUs(t *testing.T) {
	p := twoGroups()
	p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
	f := newFSEnv(t, p, host("a", 2), host("b", 2))
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 2, Machine: "a",
		Start: t0.Add(time.Hour), DurationS: 3600, Group: "ops"}}, f.now))
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 2, Machine: "b",
		Start: t0.Add(5 * time.Hour), DurationS: 3600, Group: "ops"}}, f.now))
	f.flush()
	q := f.alloc("alice", arbiter.Request{GPUs: 2, Machine: "b"}) // no time limit: may not take b's GPUs
	q = f.get(q.ID)
	why := arbiter.StrOr(q.WhyQueued, "")
	t.Logf("state %s why %q", q.State, why)
	if q.State == arbiter.StateQueued && !strings.Contains(why, "reservation r2") {
		t.Errorf("allocation %d waits for b, reserved by r2, but why_queued says %q", q.ID, why)
	}
}

// TestPreemptionNeverPostponesAnEnd: preempting an allocation whose time
// limit ends within grace_s leaves its end where it was.
func TestPreemptionNeverPostponesAnEnd(t *testing.T) {
	p := twoGroups()
	p.GraceS = 300
	p.MinRuntimeS = 0
	f := newFSEnv(t, p, host("a", 2))
	v := f.alloc("carol", arbiter.Request{GPUs: 2, TimeLimitS: hours(1), Preemptible: true})
	f.advance(59 * time.Minute)
	q := f.alloc("alice", arbiter.Request{GPUs: 2, Priority: 5, TimeLimitS: hours(1)})
	vv := f.get(v.ID)
	t.Logf("victim ends_at %v (%s), reason %q; q eta %v", vv.EndsAt, vv.EndsAt.Sub(t0), vv.EndReason, f.get(q.ID).ETA)
	if vv.EndsAt.After(t0.Add(time.Hour)) {
		t.Errorf("preempting allocation %d moved its end from its time limit (%s) to %s", v.ID, t0.Add(time.Hour).Sub(t0), vv.EndsAt.Sub(t0))
	}
}

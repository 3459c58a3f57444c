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

// etasHold records the ETA each of ids shows now, plays the clock out to
// until, and checks that each started within a second of its ETA, or had
// none and did not start.
func (f *fsEnv) etasHold(until time.Time, ids ...int64) {
	f.t.Helper()
	etas := make([]*time.Time, len(ids))
	for i, id := range ids {
		etas[i] = f.get(id).ETA
	}
	f.playOut(until)
	for i, id := range ids {
		a, eta := f.get(id), etas[i]
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
	f.etasHold(t0.Add(48*time.Hour), q.ID)
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
	f.etasHold(t0.Add(48*time.Hour), q.ID)
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
	f.etasHold(t0.Add(24*time.Hour), x.ID, y.ID)
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
		f.etasHold(t0.Add(10*24*time.Hour), q.ID)
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
	f.alloc("alice", arbiter.Request{GPUs: 2, Priority: 5, TimeLimitS: hours(1)})
	vv := f.get(v.ID)
	if vv.EndsAt.After(t0.Add(time.Hour)) {
		t.Errorf("preempting allocation %d moved its end from its time limit (%s) to %s", v.ID, t0.Add(time.Hour).Sub(t0), vv.EndsAt.Sub(t0))
	}
}

package engine

import (
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Ends moved by reservations and notices, across restarts and deletions.

// opsPolicy is twoGroups with a group ops (olga), a 600 s grace and a
// 60 s notice.
func opsPolicy() arbiter.FairSharePolicy {
	p := twoGroups()
	p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
	p.GraceS, p.NoticeS = 600, 60
	return p
}

// restart starts a new engine from what was saved.
func (f *fsEnv) restart() {
	f.t.Helper()
	f.e = New(Config{Cron: fsCron}, f.st.state(), f.now)
	f.flush()
}

// A preemptible allocation whose end a reservation imposed must be
// preempted (allocation.preempting, grace_s before the start), also when
// the server restarted in between.
// TestReservationPreemptionKeptAcrossRestart: a preemptible allocation a
// reservation will preempt is still preempted, grace_s before its start,
// after a restart.
func TestReservationPreemptionKeptAcrossRestart(t *testing.T) {
	f := newFSEnv(t, opsPolicy(), host("a", 1))
	pre := f.alloc("carol", arbiter.Request{GPUs: 1, KeepaliveS: nil, Preemptible: true})
	start := t0.Add(2 * time.Hour)
	f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a", Start: start, DurationS: 3600, Group: "ops"}}, f.now))
	f.flush()
	f.advance(time.Hour)
	f.restart()
	// grace_s (10 min) before the start: the preemption notice.
	f.now = start.Add(-10 * time.Minute)
	f.e.Apply(arbiter.Tick{}, f.now)
	c := f.flush()
	if !hasEvent(c, arbiter.EventAllocationPreempting, pre.ID) || f.get(pre.ID).Preempting == nil {
		t.Fatalf("grace_s before the reservation: events %v, preempting %+v; want allocation.preempting", kinds(c), f.get(pre.ID).Preempting)
	}
}

// TestReservationDeletedAfterRestartGivesTheEndBack: deleting a reservation
// after a restart gives the allocations it had moved their own ends back.
func TestReservationDeletedAfterRestartGivesTheEndBack(t *testing.T) {
	f := newFSEnv(t, opsPolicy(), host("a", 1))
	x := f.alloc("alice", arbiter.Request{GPUs: 1, KeepaliveS: nil, TimeLimitS: hours(10)})
	start := t0.Add(2 * time.Hour)
	rv := f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a", Start: start, DurationS: 3600, Group: "ops"}}, f.now)).(arbiter.Reservation)
	f.flush()
	if got := f.get(x.ID); !got.EndsAt.Equal(start) {
		t.Fatalf("ends %v, want the reservation's start", got.EndsAt)
	}
	f.restart()
	f.must(f.e.Apply(arbiter.DeleteReservation{Caller: admin, ID: rv.ID}, f.now))
	f.flush()
	got := f.get(x.ID)
	if got.EndsAt == nil || !got.EndsAt.Equal(t0.Add(10*time.Hour)) {
		t.Fatalf("after deleting the reservation (following a restart): ends %v (%q), want its own end %v", got.EndsAt, got.EndReason, t0.Add(10*time.Hour))
	}
}

// TestTimeLimitNoticeOnceAcrossRestart: a time limit's notice that went out
// is not sent again by a restart.
func TestTimeLimitNoticeOnceAcrossRestart(t *testing.T) {
	f := newFSEnv(t, opsPolicy(), host("a", 1))
	x := f.alloc("alice", arbiter.Request{GPUs: 1, KeepaliveS: nil, TimeLimitS: hours(1)})
	f.now = t0.Add(time.Hour - time.Minute) // notice_s = 60
	f.e.Apply(arbiter.Tick{}, f.now)
	if c := f.flush(); !hasEvent(c, arbiter.EventAllocationTimeLimit, x.ID) {
		t.Fatalf("no notice: %v", kinds(c))
	}
	f.now = f.now.Add(10 * time.Second)
	f.e = New(Config{Cron: fsCron}, f.st.state(), f.now)
	c := f.flush()
	if hasEvent(c, arbiter.EventAllocationTimeLimit, x.ID) {
		t.Fatalf("allocation.time_limit sent again after a restart: %v", kinds(c))
	}
}

// TestPreemptingOnceAcrossRestart: a preemption's notice that went out is
// not sent again by a restart.
func TestPreemptingOnceAcrossRestart(t *testing.T) {
	p := arbiter.DefaultFairSharePolicy()
	p.GraceS, p.MinRuntimeS = 600, 0
	f := newFSEnv(t, p, host("a", 1))
	low := f.alloc("carol", arbiter.Request{GPUs: 1, Preemptible: true, KeepaliveS: nil})
	f.advance(time.Minute)
	f.alloc("alice", arbiter.Request{GPUs: 1, Priority: 10, KeepaliveS: nil})
	if f.get(low.ID).Preempting == nil {
		t.Fatal("not preempted")
	}
	f.now = f.now.Add(time.Minute)
	f.e = New(Config{Cron: fsCron}, f.st.state(), f.now)
	c := f.flush()
	if hasEvent(c, arbiter.EventAllocationPreempting, low.ID) {
		t.Fatalf("allocation.preempting sent again after a restart: %v", kinds(c))
	}
}

// TestQuotaEndKeptWhenReservationDeleted: the end a GPU-hours quota gave is
// given back when the reservation that moved it earlier is deleted.
func TestQuotaEndKeptWhenReservationDeleted(t *testing.T) {
	p := opsPolicy()
	p.Quotas = []arbiter.Quota{{Principal: "alice", MaxGPUHours: f64p(4), WindowS: 24 * 3600}}
	f := newFSEnv(t, p, host("a", 1))
	x := f.alloc("alice", arbiter.Request{GPUs: 1, KeepaliveS: nil})
	if x.EndsAt == nil || !x.EndsAt.Equal(t0.Add(4*time.Hour)) {
		t.Fatalf("ends %v, want after the 4 GPU-hours left", x.EndsAt)
	}
	rv := f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a", Start: t0.Add(2 * time.Hour), DurationS: 3600, Group: "ops"}}, f.now)).(arbiter.Reservation)
	f.flush()
	f.must(f.e.Apply(arbiter.DeleteReservation{Caller: admin, ID: rv.ID}, f.now))
	f.flush()
	got := f.get(x.ID)
	if got.EndsAt == nil || got.EndsAt.After(t0.Add(4*time.Hour)) {
		t.Fatalf("after the reservation was deleted: ends %v (%q): the quota's 4 GPU-hours are no longer enforced", got.EndsAt, got.EndReason)
	}
	f.advance(10 * time.Hour)
	if got := f.get(x.ID); got.State != arbiter.StateDestroyed {
		t.Fatalf("alice still holds her GPU after 10 h under a 4 GPU-hour quota: %s", got.State)
	}
}

// TestExtensionKeptWhenReservationDeleted: an extended end is given back
// when the reservation that moved it earlier is deleted.
func TestExtensionKeptWhenReservationDeleted(t *testing.T) {
	f := newFSEnv(t, opsPolicy(), host("a", 1))
	x := f.alloc("alice", arbiter.Request{GPUs: 1, KeepaliveS: nil, TimeLimitS: hours(1)})
	f.must(f.e.Apply(arbiter.ExtendAllocation{Caller: arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}, ID: x.ID, ByS: 3 * 3600}, f.now))
	f.flush()
	own := t0.Add(4 * time.Hour)
	if got := f.get(x.ID); !got.EndsAt.Equal(own) {
		t.Fatalf("extended to %v", got.EndsAt)
	}
	rv := f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 1, Machine: "a", Start: t0.Add(30 * time.Minute), DurationS: 3600, Group: "ops"}}, f.now)).(arbiter.Reservation)
	f.flush()
	f.must(f.e.Apply(arbiter.DeleteReservation{Caller: admin, ID: rv.ID}, f.now))
	f.flush()
	if got := f.get(x.ID); got.EndsAt == nil || !got.EndsAt.Equal(own) {
		t.Fatalf("after the reservation was deleted: ends %v (%q), want its own (extended) end %v", got.EndsAt, got.EndReason, own)
	}
}

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

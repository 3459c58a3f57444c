package engine

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestETAAccuracySimulation is the deterministic simulation the ETA is
// judged by: a burst of requests of every shape (sizes, time limits,
// priorities, groups, pinned machines, reservations) lands on a busy
// cluster at once; every holder runs to its time limit; the clock moves
// from deadline to deadline as control moves it. Each request's ETA,
// read right after the burst, must be its actual start within one
// scheduling step (a second here: the engine acts at each deadline).
func TestETAAccuracySimulation(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		for _, starve := range []time.Duration{0, 20 * time.Minute} {
			t.Run(fmt.Sprintf("%d/starvation=%s", seed, starve), func(t *testing.T) {
				etaRun(t, seed, starve)
			})
		}
	}
}

func etaRun(t *testing.T, seed int64, starve time.Duration) {
	rng := rand.New(rand.NewSource(seed))
	p := twoGroups()
	p.Groups = append(p.Groups, arbiter.Group{Name: "ops", Members: []string{"olga"}})
	p.Shares = map[string]float64{"ml": 2, "cv": 1, "ops": 1}
	p.Quotas = []arbiter.Quota{{Group: "cv", MaxGPUs: intp(3)}}
	p.HalfLifeS = 3600
	f := &fsEnv{t: t, now: t0, st: newMemStore()}
	f.e = New(Config{Cron: fsCron, Starvation: starve}, &arbiter.State{}, t0)
	f.must(f.e.Apply(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{host("a", 4), host("b", 4), host("c", 8)}}, t0))
	f.must(f.e.Apply(arbiter.SetFairShare{Policy: p}, t0))
	f.flush()
	people := []string{"alice", "bob", "carol", "dave", "zed"}
	limit := func() *float64 { return f64p(float64(10+rng.Intn(110)) * 60) }
	// A busy cluster: holders with time limits.
	for i := 0; i < 10; i++ {
		f.try(people[rng.Intn(len(people))], arbiter.Request{GPUs: 1 + rng.Intn(3), TimeLimitS: limit(), KeepaliveS: nil})
	}
	if rng.Intn(2) == 0 {
		f.must(f.e.Apply(arbiter.CreateReservation{Caller: admin, Reservation: arbiter.Reservation{GPUs: 4, Machine: "b",
			Start: t0.Add(time.Duration(30+rng.Intn(90)) * time.Minute), DurationS: 3600, Group: "ops"}}, f.now))
		f.flush()
	}
	// The burst.
	var burst []int64
	for i := 0; i < 25; i++ {
		r := arbiter.Request{GPUs: 1 + rng.Intn(4), TimeLimitS: limit(), Priority: rng.Intn(3) - 1, KeepaliveS: nil}
		who := people[rng.Intn(len(people))]
		if rng.Intn(6) == 0 {
			r.Machine = []string{"a", "b", "c"}[rng.Intn(3)]
		}
		if rng.Intn(8) == 0 {
			who, r.Reservation = "olga", "r1"
		}
		if a, err := f.try(who, r); err == nil && a.State == arbiter.StateQueued {
			burst = append(burst, a.ID)
		}
	}
	f.flush()
	eta := map[int64]time.Time{}
	for _, id := range burst {
		if e := f.get(id).ETA; e != nil {
			eta[id] = *e
		}
	}
	f.playOut(time.Time{}) // the clock jumps from deadline to deadline
	within, unknown := 0, 0
	for _, id := range burst {
		a := f.get(id)
		e, ok := eta[id]
		switch {
		case !ok && a.ReadyAt == nil:
			within++ // no ETA, and indeed it never started (its reservation ended first)
		case !ok:
			unknown++
			t.Errorf("allocation %d (%+v) had no ETA; it started at %v", id, a.Request, a.ReadyAt)
		case a.ReadyAt == nil:
			t.Errorf("allocation %d never started (ETA %v): %s", id, e, arbiter.StrOr(a.Reason, ""))
		case a.ReadyAt.Sub(e) > time.Second || e.Sub(*a.ReadyAt) > time.Second:
			t.Errorf("allocation %d (%s, %d GPUs, priority %d): ETA %s, started %s", id, a.Group, a.Request.GPUs, a.Priority,
				e.Format("15:04:05"), a.ReadyAt.Format("15:04:05"))
		default:
			within++
		}
	}
	t.Logf("%d of %d queued requests started within a second of their ETA, or had none and never started (%d without one that did)", within, len(burst), unknown)
}

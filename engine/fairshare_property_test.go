package engine

import (
	"fmt"
	"math/rand"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestFairSharePropertyRandomCommands applies random command sequences —
// requests of people in groups with time limits, priorities, preemptible
// or not, inside reservations or not; releases, extends, reservations
// made and deleted, time passing — with a fake clock that, like control,
// wakes the engine at each deadline, and checks after every step:
//   - no GPU is held twice, and the held map agrees with the allocations;
//   - no quota is exceeded: max_gpus (of its model) held at once, and the
//     GPU time its subject held in any window of max_gpu_hours (counted
//     from the allocations' own ready and destroyed times);
//   - no reservation's GPUs are held, while its window is open, by an
//     allocation that is not inside it;
//   - only preemptible allocations are preempted (reason "preempted by",
//     allocation.preempting);
//   - replaying the same commands at the same times gives the same state.
func TestFairSharePropertyRandomCommands(t *testing.T) {
	seeds := 30
	if testing.Short() {
		seeds = 6
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cmds, times := genFairShare(seed, 300)
			e1 := runFairShare(t, cmds, times, true)
			e2 := runFairShare(t, cmds, times, false)
			if !reflect.DeepEqual(e1.Allocations(), e2.Allocations()) {
				t.Fatal("replay reached a different state")
			}
		})
	}
}

var fsPeople = []string{"alice", "bob", "carol", "dave", "olga", "zed"}

func fsPropertyPolicy() arbiter.FairSharePolicy {
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{
		{Name: "ml", Members: []string{"alice", "bob"}},
		{Name: "cv", Members: []string{"carol", "dave"}, TimeLimitS: 40},
		{Name: "ops", Members: []string{"olga"}},
	}
	p.Shares = map[string]float64{"ml": 2, "cv": 1, "ops": 1}
	p.Quotas = []arbiter.Quota{
		{Group: "ml", MaxGPUs: intp(3)},
		{Group: "cv", MaxGPUs: intp(1), Model: "*A100*"},
		{Principal: "carol", MaxGPUHours: f64p(0.05), WindowS: 300}, // 180 GPU-seconds per 5 minutes
		{Principal: "dave", MaxGPUHours: f64p(0.02), WindowS: 120},
	}
	p.HalfLifeS, p.NoticeS, p.GraceS, p.MinRuntimeS = 600, 3, 5, 8
	return p
}

func genFairShare(seed int64, n int) ([]arbiter.Command, []time.Time) {
	rng := rand.New(rand.NewSource(seed))
	var cmds []arbiter.Command
	var times []time.Time
	now := t0
	add := func(c arbiter.Command) {
		cmds = append(cmds, c)
		times = append(times, now)
	}
	ms := []arbiter.Machine{host("h1", 4), host("h2", 2),
		{Name: "h3", Kind: arbiter.KindGPU, Source: arbiter.SourceConfig, CUDA: "12.4", Tags: []string{"default", "a100"}, GPUs: gpus(3, "NVIDIA A100", 40, "8.0")}}
	add(arbiter.SyncConfigMachines{Machines: ms})
	add(arbiter.SetFairShare{Policy: fsPropertyPolicy()})
	resIDs := 0
	for i := 0; i < n; i++ {
		now = now.Add(time.Duration(rng.Intn(4000)) * time.Millisecond)
		who := fsPeople[rng.Intn(len(fsPeople))]
		caller := arbiter.Caller{Name: who, Role: arbiter.RoleUser}
		id := int64(1 + rng.Intn(i+1))
		switch k := rng.Intn(100); {
		case k < 45:
			r := arbiter.Request{Owner: who, GPUs: 1 + rng.Intn(3), Priority: rng.Intn(3) - 1}
			if rng.Intn(3) > 0 {
				r.TimeLimitS = f64p(float64(5 + rng.Intn(60)))
			}
			if rng.Intn(3) == 0 {
				r.Preemptible = true
			}
			if rng.Intn(5) == 0 {
				r.Model = "*A100*"
			}
			if rng.Intn(4) == 0 && resIDs > 0 {
				r.Reservation = fmt.Sprintf("r%d", 1+rng.Intn(resIDs))
			}
			if rng.Intn(3) == 0 {
				r.KeepaliveS = ka(float64(10 + rng.Intn(60)))
			}
			add(arbiter.Allocate{Caller: caller, Request: r})
		case k < 65:
			add(arbiter.Release{Caller: admin, ID: id, Reason: "done"})
		case k < 75:
			add(arbiter.ExtendAllocation{Caller: admin, ID: id, ByS: float64(5 + rng.Intn(40))})
		case k < 82:
			r := arbiter.Reservation{GPUs: 1 + rng.Intn(2), Machine: []string{"h1", "h2", "h3"}[rng.Intn(3)],
				Start: now.Add(time.Duration(rng.Intn(60)) * time.Second), DurationS: float64(60 + rng.Intn(60)),
				Group: []string{"ops", "ml"}[rng.Intn(2)]}
			if rng.Intn(4) == 0 {
				r.Start, r.Cron = time.Time{}, "*/3 * * * *"
			}
			resIDs++
			r.ID = fmt.Sprintf("r%d", resIDs)
			add(arbiter.CreateReservation{Caller: admin, Reservation: r})
		case k < 85 && resIDs > 0:
			add(arbiter.DeleteReservation{Caller: admin, ID: fmt.Sprintf("r%d", 1+rng.Intn(resIDs))})
		case k < 90:
			add(arbiter.Keepalive{ID: id})
		default:
			now = now.Add(time.Duration(rng.Intn(30)) * time.Second)
			add(arbiter.Tick{})
		}
	}
	return cmds, times
}

// runFairShare applies the commands, waking the engine at each deadline
// before each command as control does, and checks the invariants.
func runFairShare(t *testing.T, cmds []arbiter.Command, times []time.Time, check bool) *Engine {
	t.Helper()
	e := New(Config{History: 100000, Starvation: 30 * time.Second, Cron: fsCron}, &arbiter.State{}, t0)
	pol := fsPropertyPolicy()
	var last time.Time = t0
	step := func(now time.Time, what string) {
		e.Flush()
		if check {
			if err := checkFairShare(e, &pol, now); err != nil {
				t.Fatalf("%s at %s: %v", what, now.Format("15:04:05.000"), err)
			}
		}
	}
	for i, c := range cmds {
		for d := e.NextDeadline(); !d.IsZero() && !d.After(times[i]); d = e.NextDeadline() {
			if d.Before(last) {
				d = last
			}
			e.Apply(arbiter.Tick{}, d)
			last = d
			step(d, fmt.Sprintf("deadline before command %d", i))
			if e.NextDeadline().Equal(d) {
				break // several due at d fire in the same Tick; a deadline at d left over is set anew
			}
		}
		e.Apply(c, times[i])
		last = times[i]
		step(times[i], fmt.Sprintf("command %d (%T %+v)", i, c, c))
	}
	return e
}

func checkFairShare(e *Engine, pol *arbiter.FairSharePolicy, now time.Time) error {
	all := e.Allocations()
	byID := map[int64]arbiter.Allocation{}
	owner := map[string]int64{}
	for _, a := range all {
		byID[a.ID] = a
		if a.State != arbiter.StateReady {
			continue
		}
		for _, d := range a.Devices {
			key := fmt.Sprintf("%s/%d", d.Machine, d.Index)
			if prev, ok := owner[key]; ok {
				return fmt.Errorf("GPU %s is in allocations %d and %d", key, prev, a.ID)
			}
			owner[key] = a.ID
		}
	}
	for _, mc := range e.ms {
		for p, id := range mc.held {
			key := fmt.Sprintf("%s/%d", mc.m.Name, mc.m.GPUs[p].Index)
			if id > 0 && owner[key] != id || id == 0 && owner[key] != 0 {
				return fmt.Errorf("held map says %s is %d, allocations say %d", key, id, owner[key])
			}
		}
	}
	person := func(a *arbiter.Allocation) string {
		if a.Principal != "" {
			return a.Principal
		}
		return a.Owner
	}
	for _, q := range pol.Quotas {
		applies := func(a *arbiter.Allocation) bool {
			if q.Group != "" {
				return a.Group == q.Group
			}
			return person(a) == q.Principal
		}
		if q.MaxGPUs != nil {
			n := 0
			for _, a := range all {
				if a.State != arbiter.StateReady || !applies(&a) {
					continue
				}
				for _, d := range a.Devices {
					if ok, _ := path.Match(q.Model, d.Model); q.Model == "" || ok {
						n++
					}
				}
			}
			if n > *q.MaxGPUs {
				return fmt.Errorf("quota %s: %d GPUs held, max_gpus %d", q.Key(), n, *q.MaxGPUs)
			}
		}
		if q.MaxGPUHours != nil {
			from := now.Add(-q.Window())
			used := 0.0
			for _, a := range all {
				if a.ReadyAt == nil || !applies(&a) {
					continue
				}
				end := now
				if a.DestroyedAt != nil {
					end = *a.DestroyedAt
				}
				used += float64(len(a.Devices)) * overlap(*a.ReadyAt, end, from, now)
			}
			if used > *q.MaxGPUHours*3600+0.01 {
				return fmt.Errorf("quota %s: %.2f GPU-seconds used in the window, max %.0f", q.Key(), used, *q.MaxGPUHours*3600)
			}
		}
	}
	resvs := map[string]arbiter.Reservation{}
	for _, id := range sortedKeys(e.fs.res) {
		resvs[id] = e.fs.res[id].r
	}
	for _, rv := range resvs {
		if rv.WindowStart == nil || now.Before(*rv.WindowStart) || !now.Before(*rv.WindowEnd) {
			continue
		}
		for _, d := range rv.Devices {
			id := owner[fmt.Sprintf("%s/%d", d.Machine, d.Index)]
			if id != 0 && byID[id].Request.Reservation != rv.ID {
				return fmt.Errorf("reservation %s is open (%s to %s) and allocation %d, not inside it, holds %s/%d",
					rv.ID, rv.WindowStart.Format("15:04:05"), rv.WindowEnd.Format("15:04:05"), id, d.Machine, d.Index)
			}
		}
	}
	for _, a := range all {
		if rv, exists := resvs[a.Request.Reservation]; exists && a.State == arbiter.StateReady {
			for _, d := range a.Devices {
				ok := false
				for _, rd := range rv.Devices {
					ok = ok || rd.Machine == d.Machine && rd.Index == d.Index
				}
				if !ok {
					return fmt.Errorf("allocation %d inside reservation %s holds %s/%d, not one of its GPUs", a.ID, a.Request.Reservation, d.Machine, d.Index)
				}
			}
		}
		if strings.HasPrefix(arbiter.StrOr(a.Reason, ""), arbiter.ReasonPreemptedBy) && !a.Preemptible {
			return fmt.Errorf("allocation %d is not preemptible and was %s", a.ID, *a.Reason)
		}
		if a.Preempting != nil && !a.Preemptible {
			return fmt.Errorf("allocation %d is not preemptible and is being preempted by %s", a.ID, a.Preempting.By)
		}
	}
	return nil
}

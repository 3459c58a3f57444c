package engine

import (
	"fmt"
	"math/rand"
	"path"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestPropertyRandomCommands applies random command sequences with a fake
// clock and checks the engine's invariants after every command:
//   - no GPU is in two live allocations, and the engine's own held map
//     agrees with the allocations;
//   - no GPU is granted while a process of its previous holder (of any
//     ended allocation) is reported on it, and releasing, unhealthy,
//     drained and unmanaged GPUs take nothing new (random agent reports);
//   - a queued request that fits is never left waiting unless machines are
//     held for a starving request ahead of it;
//   - replaying the same commands at the same times gives the same state.
func TestPropertyRandomCommands(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 10
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cmds, times := genCommands(seed, 400)
			e1 := runCommands(t, cmds, times, true)
			e2 := runCommands(t, cmds, times, false)
			if !reflect.DeepEqual(e1.Allocations(), e2.Allocations()) {
				t.Fatal("replay reached a different state")
			}
		})
	}
}

var models = []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090"}

func genMachine(rng *rand.Rand, name string, source string) arbiter.Machine {
	n := 1 + rng.Intn(4)
	gs := make([]arbiter.GPU, n)
	for i := range gs {
		mi := rng.Intn(len(models))
		gs[i] = arbiter.GPU{Index: i, Model: models[mi], VRAMGiB: []float64{80, 40, 24}[mi], Compute: []string{"9.0", "8.0", "8.9"}[mi], Healthy: rng.Intn(10) > 0}
	}
	cuda := "12.4"
	if rng.Intn(4) == 0 {
		cuda = ""
	}
	tags := []string{"default"}
	if rng.Intn(2) == 0 {
		tags = append(tags, "fast")
	}
	return arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: source, CUDA: cuda, Tags: tags, GPUs: gs}
}

func genCommands(seed int64, n int) ([]arbiter.Command, []time.Time) {
	rng := rand.New(rand.NewSource(seed))
	var cmds []arbiter.Command
	var times []time.Time
	now := t0
	add := func(c arbiter.Command) {
		cmds = append(cmds, c)
		times = append(times, now)
	}
	add(arbiter.SyncConfigMachines{Machines: []arbiter.Machine{genMachine(rng, "c1", arbiter.SourceConfig), genMachine(rng, "c2", arbiter.SourceConfig)}})
	add(arbiter.SyncPools{Pools: []arbiter.Pool{{Name: "p", Backing: arbiter.Request{GPUs: 1}, Slots: 2, GraceTimeS: 5, MinRetentionS: 2, MaxAgeS: 60}}})
	pol := arbiter.DefaultGPUPolicy()
	pol.ReleasingTimeoutS, pol.UnmanagedGraceS, pol.HealthyAfterS, pol.IdleAfterS, pol.IdleGraceS = 20, 5, 30, 15, 10
	if seed%2 == 0 {
		pol.Enforce, pol.Unmanaged, pol.IdleAction = arbiter.EnforceWait, arbiter.UnmanagedKill, arbiter.IdleRelease
	}
	add(arbiter.SetGPUPolicy{Policy: pol})
	names := []string{"c1", "c2", "w1", "w2"}
	for i := 0; i < n; i++ {
		now = now.Add(time.Duration(rng.Intn(3000)) * time.Millisecond)
		id := int64(1 + rng.Intn(i+1))
		switch k := rng.Intn(140); {
		case k >= 110 && k < 130:
			add(genReport(rng, names[2+rng.Intn(2)], i))
		case k >= 130 && k < 135:
			add(arbiter.SetGPUDrained{Machine: names[rng.Intn(4)], Index: rng.Intn(2), Drained: rng.Intn(2) == 0})
		case k >= 135:
			add(arbiter.FreeGPU{Machine: names[rng.Intn(4)], Index: rng.Intn(2)})
		case k >= 100:
			r := arbiter.Request{Owner: "nb", Pool: "p"}
			if rng.Intn(2) == 0 {
				r.KeepaliveS = ka(float64(3 + rng.Intn(20)))
			}
			add(arbiter.Allocate{Request: r})
		case k < 40:
			r := arbiter.Request{Owner: "u", GPUs: 1 + rng.Intn(4), Priority: rng.Intn(3) - 1}
			if rng.Intn(4) == 0 {
				r.MinVRAMGiB = []float64{30, 50}[rng.Intn(2)]
			}
			if rng.Intn(6) == 0 {
				r.Model = "*A100*"
			}
			if rng.Intn(6) == 0 {
				r.RequireCUDA = true
			}
			if rng.Intn(8) == 0 {
				r.MinCompute = "8.5"
			}
			if rng.Intn(8) == 0 {
				r.Tags = []string{"fast"}
			}
			if rng.Intn(6) == 0 {
				r.Machine = names[rng.Intn(2)]
			}
			if rng.Intn(3) > 0 {
				r.KeepaliveS = ka(float64(5 + rng.Intn(30)))
			}
			add(arbiter.Allocate{Request: r})
		case k < 62:
			add(arbiter.Release{ID: id})
		case k < 72:
			add(arbiter.Keepalive{ID: id})
		case k < 80:
			add(arbiter.Tick{})
		case k < 85:
			add(arbiter.SetDraining{Name: names[rng.Intn(2)], Draining: rng.Intn(2) == 0})
		case k < 90:
			add(arbiter.RegisterMachine{Machine: genMachine(rng, names[2+rng.Intn(2)], arbiter.SourceAgent)})
		case k < 97:
			add(arbiter.Heartbeat{Name: names[rng.Intn(4)]})
		default:
			ms := []arbiter.Machine{genMachine(rng, "c1", arbiter.SourceConfig)}
			if rng.Intn(2) == 0 {
				ms = append(ms, genMachine(rng, "c2", arbiter.SourceConfig))
			}
			add(arbiter.SyncConfigMachines{Machines: ms})
		}
	}
	return cmds, times
}

// seenAll in a generated report stands for the engine's last sequence
// number when it is applied: a sample taken after everything so far.
const seenAll = -1

// genReport is an agent's report of up to two GPUs of a machine, with
// processes of random allocations (or none), random utilization and now and
// then an XID or a GPU gone missing.
func genReport(rng *rand.Rand, machine string, i int) arbiter.ReportGPUs {
	r := arbiter.GPUReport{SeenSeq: seenAll, Full: rng.Intn(4) == 0}
	if rng.Intn(5) == 0 {
		r.SeenSeq = 0 // sampled before the agent heard anything
	}
	for idx := 0; idx < 2; idx++ {
		if rng.Intn(3) == 0 {
			continue
		}
		if rng.Intn(30) == 0 {
			r.GPUs = append(r.GPUs, arbiter.GPUReading{Index: idx, Missing: true})
			continue
		}
		util := rng.Intn(101)
		g := arbiter.GPUReading{Index: idx, UtilPct: &util, MemUsedMiB: int64(rng.Intn(80000)), MemTotalMiB: 81559, Processes: []arbiter.GPUProcess{}}
		for n := rng.Intn(3); n > 0; n-- {
			p := arbiter.GPUProcess{PID: 100 + rng.Intn(20), User: "u"}
			if rng.Intn(4) > 0 {
				a := int64(1 + rng.Intn(i+2))
				p.Allocation = &a
			}
			dup := false
			for _, q := range g.Processes {
				dup = dup || q.PID == p.PID
			}
			if !dup {
				g.Processes = append(g.Processes, p)
			}
		}
		if rng.Intn(25) == 0 {
			g.XIDs = []int{79}
		}
		r.GPUs = append(r.GPUs, g)
	}
	return arbiter.ReportGPUs{Machine: machine, Report: r}
}

func runCommands(t *testing.T, cmds []arbiter.Command, times []time.Time, check bool) *Engine {
	t.Helper()
	e := New(Config{History: 50, Starvation: 20 * time.Second, HeartbeatTimeout: 40 * time.Second}, &arbiter.State{}, t0)
	for i, c := range cmds {
		c = stamped(e, c, times[i])
		// Deadlines first, so that what they grant is checked against the
		// state before the command.
		before := heldMap(e)
		e.Apply(arbiter.Tick{}, times[i])
		e.Flush()
		if check {
			if err := checkGrants(e, before); err != nil {
				t.Fatalf("at the deadlines before command %d: %v", i, err)
			}
		}
		before = heldMap(e)
		e.Apply(c, times[i])
		e.Flush()
		if check {
			if err := checkInvariants(e, times[i]); err != nil {
				t.Fatalf("after command %d (%T %+v): %v", i, c, c, err)
			}
			if err := checkGrants(e, before); err != nil {
				t.Fatalf("after command %d (%T %+v): %v", i, c, c, err)
			}
		}
	}
	return e
}

// heldMap is which allocation holds each GPU ("machine/index").
func heldMap(e *Engine) map[string]int64 {
	out := map[string]int64{}
	for _, mc := range e.ms {
		for p, id := range mc.held {
			out[fmt.Sprintf("%s/%d", mc.m.Name, mc.m.GPUs[p].Index)] = id
		}
	}
	return out
}

// checkGrants: a GPU granted by the last command was clean and usable: not
// releasing, unhealthy, drained or unmanaged, with no process of an ended
// allocation in its latest reading.
func checkGrants(e *Engine, before map[string]int64) error {
	for _, mc := range e.ms {
		gm := e.gt.ms[mc.m.Name]
		for p, id := range mc.held {
			idx := mc.m.GPUs[p].Index
			if id <= 0 || before[fmt.Sprintf("%s/%d", mc.m.Name, idx)] == id || gm == nil {
				continue
			}
			gg := gm.gpus[idx]
			if gg == nil {
				continue
			}
			switch {
			case gg.releasing != nil:
				return fmt.Errorf("GPU %s/%d granted to %d while releasing for %d", mc.m.Name, idx, id, gg.releasing.Allocation)
			case gg.unhealthy != nil || gg.drained != nil:
				return fmt.Errorf("GPU %s/%d granted to %d while unhealthy or drained", mc.m.Name, idx, id)
			case len(gg.unmanaged) > 0:
				return fmt.Errorf("GPU %s/%d granted to %d with unmanaged processes %v", mc.m.Name, idx, id, gg.unmanaged)
			}
			if gg.usage != nil {
				for _, pr := range gg.usage.Processes {
					if pr.Allocation != nil && *pr.Allocation != id && e.allocs[*pr.Allocation] == nil {
						return fmt.Errorf("GPU %s/%d granted to %d while pid %d of ended allocation %d is on it", mc.m.Name, idx, id, pr.PID, *pr.Allocation)
					}
				}
			}
		}
	}
	return nil
}

func checkInvariants(e *Engine, now time.Time) error {
	// No GPU in two live allocations; the held map agrees.
	owner := map[string]int64{}
	for _, a := range e.allocs {
		if a.a.Backing != nil {
			continue // a pool slot uses its backing's GPUs (checkPools)
		}
		if a.a.State == arbiter.StateReady {
			for _, d := range a.a.Devices {
				key := fmt.Sprintf("%s/%d", d.Machine, d.Index)
				if prev, ok := owner[key]; ok {
					return fmt.Errorf("GPU %s is in allocations %d and %d", key, prev, a.a.ID)
				}
				owner[key] = a.a.ID
			}
		} else if len(a.a.Devices) != 0 {
			return fmt.Errorf("queued allocation %d has devices", a.a.ID)
		}
	}
	for _, mc := range e.ms {
		gm := e.gt.ms[mc.m.Name]
		for p, id := range mc.held {
			key := fmt.Sprintf("%s/%d", mc.m.Name, mc.m.GPUs[p].Index)
			blocked := false
			if gm != nil {
				if gg := gm.gpus[mc.m.GPUs[p].Index]; gg != nil {
					blocked = gg.blocked()
				}
			}
			switch {
			case id == heldBlocked && (owner[key] != 0 || !blocked):
				return fmt.Errorf("held map blocks %s, but allocation %d holds it or nothing blocks it", key, owner[key])
			case id == 0 && blocked:
				return fmt.Errorf("%s is free in the held map but should be blocked", key)
			case id >= 0 && owner[key] != id:
				return fmt.Errorf("held map says %s is %d, allocations say %d", key, id, owner[key])
			}
		}
	}
	// The counts that let a release skip the queue agree with the queue.
	bySize := map[int]int{}
	for _, a := range e.queue {
		bySize[a.a.Request.GPUs]++
	}
	for n, c := range e.queuedBySize {
		if c != bySize[n] {
			return fmt.Errorf("%d queued requests want %d GPUs, the counts say %d", bySize[n], n, c)
		}
	}
	// A queued request that fits is placed unless held back by a starving
	// request ahead of it. This re-derives the rule independently.
	if err := checkPools(e); err != nil {
		return err
	}
	queued := []*alloc{}
	for _, a := range e.allocs {
		if a.a.State == arbiter.StateQueued && a.a.Backing == nil {
			queued = append(queued, a)
		}
	}
	if len(queued) != len(e.queue) {
		return fmt.Errorf("%d queued allocations, queue holds %d", len(queued), len(e.queue))
	}
	sort.Slice(queued, func(i, j int) bool { return before(queued[i], queued[j]) })
	reserved := map[string]bool{}
	for _, q := range queued {
		r := &q.a.Request
		for _, mc := range e.ms {
			if mc.m.Down || mc.m.Draining || reserved[mc.m.Name] || !machineMatches(&mc.m, r) {
				continue
			}
			free := 0
			for p, g := range mc.m.GPUs {
				if mc.held[p] == 0 && g.Healthy && gpuMatches(&g, r) {
					free++
				}
			}
			if free >= r.GPUs {
				return fmt.Errorf("queued allocation %d fits on %s (%d free) and nothing holds it back", q.a.ID, mc.m.Name, free)
			}
		}
		if now.Sub(q.a.CreatedAt) >= e.cfg.Starvation {
			for _, mc := range e.ms {
				if !mc.m.Down && !mc.m.Draining && machineMatches(&mc.m, r) {
					n := 0
					for _, g := range mc.m.GPUs {
						if gpuMatches(&g, r) {
							n++
						}
					}
					if n >= r.GPUs {
						reserved[mc.m.Name] = true
					}
				}
			}
		}
	}
	return nil
}

func machineMatches(m *arbiter.Machine, r *arbiter.Request) bool {
	if r.Machine != "" && r.Machine != m.Name || r.RequireCUDA && m.CUDA == "" {
		return false
	}
	for _, t := range r.Tags {
		ok := false
		for _, mt := range m.Tags {
			ok = ok || mt == t
		}
		if !ok {
			return false
		}
	}
	return true
}

func gpuMatches(g *arbiter.GPU, r *arbiter.Request) bool {
	if g.VRAMGiB < r.MinVRAMGiB {
		return false
	}
	if r.MinCompute != "" && arbiter.CompareCompute(g.Compute, r.MinCompute) < 0 {
		return false
	}
	if r.Model != "" {
		ok, _ := path.Match(r.Model, g.Model)
		return ok
	}
	return true
}

// checkPools: every live slot sits on a live backing that records it, ready
// exactly when its backing is, with the backing's devices; an empty backing
// is always on its way back.
func checkPools(e *Engine) error {
	for _, a := range e.allocs {
		if a.a.Backing == nil {
			continue
		}
		b := e.pools.backings[*a.a.Backing]
		if b == nil || b.slots[*a.a.Slot] != a.a.ID {
			return fmt.Errorf("slot %d is not recorded on backing %d", a.a.ID, *a.a.Backing)
		}
		ba := e.allocs[b.id]
		if ba == nil || ba.a.State != a.a.State {
			return fmt.Errorf("slot %d is %s but its backing %d is %v", a.a.ID, a.a.State, b.id, ba)
		}
		if a.a.State == arbiter.StateReady && !reflect.DeepEqual(a.a.Devices, ba.a.Devices) {
			return fmt.Errorf("slot %d has devices %v, its backing %v", a.a.ID, a.a.Devices, ba.a.Devices)
		}
	}
	for id, b := range e.pools.backings {
		if e.allocs[id] == nil {
			return fmt.Errorf("backing %d is listed but not live", id)
		}
		for i, sid := range b.slots {
			if s := e.allocs[sid]; sid != 0 && (s == nil || *s.a.Backing != id || *s.a.Slot != i) {
				return fmt.Errorf("backing %d slot %d names allocation %d, which is not that slot", id, i, sid)
			}
		}
		if b.empty() && b.release.pos < 0 {
			return fmt.Errorf("backing %d is empty and not on its way back", id)
		}
	}
	return nil
}

// stamped is a generated command as it is sent at `at`: a GPU report is
// sampled then, and one that has seen everything has seen e's last event.
func stamped(e *Engine, c arbiter.Command, at time.Time) arbiter.Command {
	if r, ok := c.(arbiter.ReportGPUs); ok {
		r.Report.SampledAt = at
		if r.Report.SeenSeq == seenAll {
			r.Report.SeenSeq = e.LastSeq()
		}
		return r
	}
	return c
}

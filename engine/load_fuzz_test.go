package engine

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// fuzzKinds are the record kinds a store hands back at start.
var fuzzKinds = []string{
	arbiter.RecordFairSharePolicy, arbiter.RecordQuota, arbiter.RecordGroupUsage, arbiter.RecordWindowUsage,
	arbiter.RecordStanding, arbiter.RecordQuotaStatus, arbiter.RecordReservation, resSeqKind,
	arbiter.RecordService, arbiter.RecordCatalog, arbiter.RecordSwap, swapSeqKind,
	arbiter.RecordGridMachine, arbiter.RecordGridJob, arbiter.RecordSession, arbiter.RecordSchedule,
	arbiter.RecordPool, arbiter.RecordLock, lockFenceKind, arbiter.RecordWebhook, webhookSeqKind,
	arbiter.RecordGPUState, arbiter.RecordGPUSample, arbiter.RecordUsageDay,
	arbiter.KindTask, arbiter.KindWorker, arbiter.KindArtifact, arbiter.KindTaskManifest, arbiter.RecordAudit,
	arbiter.RecordAllocationEnd, "unknown.kind",
}

// fuzzBaseState is a stored state reached by random commands (machines,
// allocations live and retired, pools, GPU truth), as a store keeps it.
func fuzzBaseState(tb testing.TB) *memStore {
	cmds, times := genCommands(3, 120)
	e := New(Config{History: 50}, &arbiter.State{}, t0)
	s := newMemStore()
	for i, c := range cmds {
		c = stamped(e, c, times[i])
		e.Apply(arbiter.Tick{}, times[i])
		e.Apply(c, times[i])
		s.take(tb, e)
	}
	return s
}

// FuzzLoadState: a stored state with one record of any kind holding any
// bytes, and one machine and one allocation decoded from any JSON, as a
// damaged or hand-edited database hands them back at start. Building the
// engine never panics, and what it then saves, loaded again, saves the
// same (the repairs of the first load are a fixed point).
func FuzzLoadState(f *testing.F) {
	base := fuzzBaseState(f)
	for i, k := range fuzzKinds {
		var seed []byte
		for r, v := range base.records {
			if r.Kind == k {
				seed = v
				break
			}
		}
		if seed == nil {
			seed = []byte(`{}`)
		}
		f.Add(uint8(i), "1", seed, []byte(nil), []byte(nil))
	}
	var m, a []byte
	for _, x := range base.machines {
		m, _ = json.Marshal(x)
		break
	}
	for _, x := range base.allocs {
		a, _ = json.Marshal(x)
		break
	}
	f.Add(uint8(0), "", []byte(`null`), m, a)
	f.Add(uint8(17), "x", []byte(`{"name":"x","holder":"a","token":"t","expires_at":"2026-01-02T03:04:05Z"}`), []byte(`{"name":"c1","gpus":[{"index":0},{"index":0}]}`), []byte(`{"id":1,"state":"ready","machine":"c1","gpus":[0,0,7]}`))
	later := t0.Add(time.Hour)
	f.Fuzz(func(t *testing.T, kind uint8, key string, value, mach, alloc []byte) {
		st := base.state()
		st.Records = append(st.Records, arbiter.Record{Kind: fuzzKinds[int(kind)%len(fuzzKinds)], Key: key, Value: json.RawMessage(value)})
		var mc arbiter.Machine
		if len(mach) > 0 && json.Unmarshal(mach, &mc) == nil {
			st.Machines = append(st.Machines, mc)
		}
		var al arbiter.Allocation
		if len(alloc) > 0 && json.Unmarshal(alloc, &al) == nil {
			st.Allocations = append(st.Allocations, al)
		}
		// First start from the damaged state: everything it saves goes to
		// a fresh store holding what the first load kept.
		s1 := newMemStore()
		for _, x := range st.Machines {
			s1.machines[x.Name] = x
		}
		for _, x := range st.Allocations {
			s1.allocs[x.ID] = x
		}
		for _, r := range st.Records {
			s1.records[arbiter.RecordRef{Kind: r.Kind, Key: r.Key}] = r.Value.(json.RawMessage)
		}
		s1.nextID, s1.nextSeq = st.NextAllocationID, st.NextEventSeq
		e1 := New(Config{History: 50}, st, later)
		s1.take(t, e1)
		e1.Apply(arbiter.Tick{}, later)
		s1.take(t, e1)
		_ = e1.Records()
		_ = e1.Machines()
		_ = e1.Allocations()
		// Second start from what the first one left.
		e2 := New(Config{History: 50}, s1.state(), later)
		s1.take(t, e2)
		e2.Apply(arbiter.Tick{}, later)
		s1.take(t, e2)
		e3 := New(Config{History: 50}, s1.state(), later)
		e3.Apply(arbiter.Tick{}, later)
		if !reflect.DeepEqual(e2.Allocations(), e3.Allocations()) {
			t.Fatalf("a second restart changed the allocations:\n%+v\n%+v", e2.Allocations(), e3.Allocations())
		}
	})
}

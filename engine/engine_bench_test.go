package engine

import (
	"fmt"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// BenchmarkAllocateRelease measures an allocate + release cycle (two engine
// decisions, events included) on 1,000 machines × 8 GPUs: with 10,000 live
// allocations — 6,000 single-GPU ones ready and 4,000 whole-machine requests
// queued for machines that are full, which every release re-examines — and
// with 7,999 holders and no queue.
func BenchmarkAllocateRelease(b *testing.B) {
	b.Run("queue=4000", func(b *testing.B) { benchAllocateRelease(b, 6000, 4000) })
	b.Run("queue=0", func(b *testing.B) { benchAllocateRelease(b, 7999, 0) })
}

// benchEngine is an engine with n configured machines of 8 GPUs, m0000…
func benchEngine(b *testing.B, n int) *Engine {
	ms := make([]arbiter.Machine, n)
	for i := range ms {
		ms[i] = host(fmt.Sprintf("m%04d", i), 8)
	}
	e := New(Config{History: 1200}, &arbiter.State{}, t0)
	if _, err := e.Apply(arbiter.SyncConfigMachines{Machines: ms}, t0); err != nil {
		b.Fatal(err)
	}
	return e
}

func benchAllocateRelease(b *testing.B, holders, queued int) {
	e := benchEngine(b, 1000)
	for i := 0; i < holders; i++ {
		e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "load", GPUs: 1}}, t0)
	}
	for i := 0; i < queued; i++ {
		e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "big", GPUs: 8, Machine: fmt.Sprintf("m%04d", i%700)}}, t0)
	}
	e.Flush()
	if len(e.allocs) != holders+queued {
		b.Fatalf("%d live allocations, want %d", len(e.allocs), holders+queued)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		allocateRelease(b, e, func() {})
		if i%64 == 63 {
			e.Flush()
		}
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// BenchmarkAllocateReleaseFlushed is a lone client's path: each decision
// is flushed into a batch of its own, as the control loop commits one
// command at a time when nothing else waits (10 machines × 8 GPUs).
func BenchmarkAllocateReleaseFlushed(b *testing.B) {
	e := benchEngine(b, 10)
	e.Flush()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		allocateRelease(b, e, func() {
			if c := e.Flush(); len(c.Allocations) != 1 {
				b.Fatalf("%d allocations in the batch, want 1", len(c.Allocations))
			}
		})
		e.Flush()
	}
}

// allocateRelease allocates one GPU on e, runs between, and releases it.
func allocateRelease(b *testing.B, e *Engine, between func()) {
	res, err := e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "bench", GPUs: 1}}, t0)
	if err != nil {
		b.Fatal(err)
	}
	between()
	if _, err := e.Apply(arbiter.Release{ID: res.(arbiter.Allocation).ID}, t0); err != nil {
		b.Fatal(err)
	}
}

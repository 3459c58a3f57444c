package engine

import (
	"fmt"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// BenchmarkAllocateReleaseFairShare is BenchmarkAllocateRelease with fair
// share in play: three groups, a max_gpus quota, every holder with a time
// limit (so each batch plays the ETA simulation), 4,000 queued
// whole-machine requests. Flushes (where positions and ETAs are worked
// out) come every 64 cycles, as in the plain benchmark.
func BenchmarkAllocateReleaseFairShare(b *testing.B) {
	b.Run("queue=4000", func(b *testing.B) { benchFairShare(b, 6000, 4000) })
	b.Run("queue=0", func(b *testing.B) { benchFairShare(b, 7999, 0) })
}

func benchFairShare(b *testing.B, holders, queued int) {
	e := benchEngine(b, 1000) // engine_bench_test.go
	p := arbiter.DefaultFairSharePolicy()
	p.Groups = []arbiter.Group{{Name: "a", Members: []string{"load*"}}, {Name: "b", Members: []string{"big*"}}, {Name: "c", Members: []string{"bench*"}}}
	p.Quotas = []arbiter.Quota{{Group: "c", MaxGPUs: intp(100000)}}
	if _, err := e.Apply(arbiter.SetFairShare{Policy: p}, t0); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < holders; i++ {
		e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "load", GPUs: 1, TimeLimitS: f64p(float64(3600 + i))}}, t0)
	}
	for i := 0; i < queued; i++ {
		e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "big", GPUs: 8, Machine: fmt.Sprintf("m%04d", i%700), TimeLimitS: f64p(3600)}}, t0)
	}
	e.Flush()
	if len(e.allocs) != holders+queued {
		b.Fatalf("%d live allocations, want %d", len(e.allocs), holders+queued)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "bench", GPUs: 1, TimeLimitS: f64p(60)}}, t0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Apply(arbiter.Release{ID: res.(arbiter.Allocation).ID}, t0); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			e.Flush()
		}
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "decisions/s")
}

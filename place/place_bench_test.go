package place

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// BenchmarkBest1000x8 measures one GPU placement decision on 1,000 machines
// of 8 GPUs with about 10,000 GPUs' worth of demand: most GPUs held, the
// rest scattered, mixed models.
func BenchmarkBest1000x8(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	c := &Cluster{Index: NewIndex(1000)}
	for i := 0; i < 1000; i++ {
		model := []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}[i%2]
		m := &arbiter.Machine{Name: fmt.Sprintf("m%04d", i), CUDA: "12.4", Tags: []string{"default"}}
		held := make([]int64, 8)
		free := 0
		for g := 0; g < 8; g++ {
			m.GPUs = append(m.GPUs, arbiter.GPU{Index: g, Model: model, VRAMGiB: 80, Compute: "9.0", Healthy: true})
			if rng.Intn(10) < 8 {
				held[g] = int64(1 + rng.Intn(10000))
			} else {
				free++
			}
		}
		c.Machines = append(c.Machines, m)
		c.Held = append(c.Held, held)
		c.Index.Set(i, free)
	}
	reqs := []arbiter.Request{
		{GPUs: 1},
		{GPUs: 2, MinVRAMGiB: 40},
		{GPUs: 4, Model: "*H100*"},
		{GPUs: 1, RequireCUDA: true, MinCompute: "8.0", Tags: []string{"default"}},
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := &reqs[i%len(reqs)]
		if mi, _ := c.Best(r, nil); mi < 0 && r.GPUs < 4 {
			b.Fatal("no placement")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

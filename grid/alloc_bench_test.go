package grid

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// benchMachine is a 100×100-triad machine (30,000 boards) with 1% of its
// boards and links dead.
func benchMachine(tb testing.TB, rng *rand.Rand) *Allocator {
	const w, h = 100, 100
	var dead []arbiter.Board
	var links []arbiter.BoardLink
	for i := 0; i < w*h*3/100; i++ {
		dead = append(dead, arbiter.Board{X: rng.IntN(w), Y: rng.IntN(h), Z: rng.IntN(3)})
		links = append(links, arbiter.BoardLink{Board: arbiter.Board{X: rng.IntN(w), Y: rng.IntN(h), Z: rng.IntN(3)}, Link: arbiter.Link(rng.IntN(arbiter.NumLinks))})
	}
	a, err := NewAllocator(w, h, dead, links)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// benchRequest is a mix of what users ask: half single boards, then blocks
// of up to 4×4 triads, n boards up to 48, with constraints now and then,
// and a few large requests that do not fit and search the whole tree.
func benchRequest(rng *rand.Rand) arbiter.GridRequest {
	var r arbiter.GridRequest
	switch p := rng.IntN(100); {
	case p < 50:
		r = arbiter.GridRequest{Form: arbiter.GridOneBoard}
	case p < 75:
		r = arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1 + rng.IntN(4), Height: 1 + rng.IntN(4)}
	case p < 97:
		r = arbiter.GridRequest{Form: arbiter.GridBoards, Boards: 2 + rng.IntN(47), MinRatio: 0.333}
	default:
		r = arbiter.GridRequest{Form: arbiter.GridBlock, Width: 60 + rng.IntN(40), Height: 60 + rng.IntN(40)}
	}
	if r.Form != arbiter.GridOneBoard && rng.IntN(4) == 0 {
		zero := 0
		r.MaxDeadBoards, r.MaxDeadLinks = &zero, &zero
	}
	return r
}

// BenchmarkPacker measures one packer decision (Allocate, placed or not) on
// a 100×100-triad machine holding about 1,000 live allocations: each
// iteration frees a random allocation, then decides one new request. It
// reports the median and 99th percentile of the decisions.
func BenchmarkPacker(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	a := benchMachine(b, rng)
	var live []int64
	next := int64(1)
	for len(live) < 1000 {
		r := benchRequest(rng)
		if a.Allocate(next, &r) != nil {
			live = append(live, next)
		}
		next++
	}
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(live) >= 1000 {
			k := rng.IntN(len(live))
			a.Free(live[k])
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		r := benchRequest(rng)
		start := time.Now()
		p := a.Allocate(next, &r)
		times = append(times, time.Since(start))
		if p != nil {
			live = append(live, next)
		}
		next++
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(times[len(times)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(float64(a.Len()), "live")
}

// BenchmarkPossible measures the possibility test of the same requests.
func BenchmarkPossible(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := benchMachine(b, rng)
	reqs := make([]arbiter.GridRequest, 1024)
	for i := range reqs {
		reqs[i] = benchRequest(rng)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.Possible(&reqs[i%len(reqs)])
	}
}

package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// BenchmarkGPUReport measures the engine's cost of one agent's GPU report
// on 1,000 agent machines × 8 GPUs, half of them held by 4,000 two-GPU
// allocations, every GPU with a process: a report of the 2 GPUs whose
// reading changed (what agents send), one of all 8 (after a restart), and,
// as the do-nothing baseline, a heartbeat. Each op is applied and flushed
// on its own (a batch of one, the worst case for the control loop), with
// the clock moving 5 ms per op so that reports keep landing on fresh
// readings and accounting saves fall due now and then, as they would.
func BenchmarkGPUReport(b *testing.B) {
	b.Run("delta=2", func(b *testing.B) { benchGPUReport(b, 2) })
	b.Run("full=8", func(b *testing.B) { benchGPUReport(b, 8) })
	b.Run("baseline=heartbeat", func(b *testing.B) { benchGPUReport(b, 0) })
}

func benchGPUReport(b *testing.B, n int) {
	const hosts = 1000
	e := New(Config{History: 1200, HeartbeatTimeout: 1000 * time.Hour}, &arbiter.State{}, t0)
	names := make([]string, hosts)
	for i := range names {
		names[i] = fmt.Sprintf("m%04d", i)
		m := host(names[i], 8)
		m.Source = arbiter.SourceAgent
		for k := range m.GPUs { // a GPU's UUID is on one machine only
			m.GPUs[k].UUID = fmt.Sprintf("GPU-%s-%d", names[i], k)
		}
		if _, err := e.Apply(arbiter.RegisterMachine{Machine: m}, t0); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.Apply(arbiter.SetGPUPolicy{Policy: arbiter.DefaultGPUPolicy()}, t0); err != nil {
		b.Fatal(err)
	}
	owner := map[string][]int64{} // machine → allocation holding GPUs 0-1, 2-3
	for _, name := range names {
		for k := 0; k < 2; k++ {
			res, err := e.Apply(arbiter.Allocate{Request: arbiter.Request{Owner: "u", GPUs: 2, Machine: name}}, t0)
			if err != nil {
				b.Fatal(err)
			}
			owner[name] = append(owner[name], res.(arbiter.Allocation).ID)
		}
	}
	reading := func(name string, idx, util int) arbiter.GPUReading {
		p := arbiter.GPUProcess{PID: 1000 + idx, User: "u", MemMiB: 4096, Command: "python train.py --config big.yaml"}
		if idx < 4 {
			id := owner[name][idx/2]
			p.Allocation = &id
		} else {
			p.Allocation = nil // unattributed on a free GPU: unmanaged, flagged once
		}
		u := util
		return arbiter.GPUReading{Index: idx, UtilPct: &u, MemUsedMiB: 40000, MemTotalMiB: 81559, Processes: []arbiter.GPUProcess{p}}
	}
	now := t0
	for _, name := range names { // every machine reports once, in full
		r := arbiter.GPUReport{SeenSeq: e.LastSeq(), Full: true, SampledAt: now}
		for g := 0; g < 8; g++ {
			r.GPUs = append(r.GPUs, reading(name, g, 50))
		}
		if _, err := e.Apply(arbiter.ReportGPUs{Machine: name, Report: r}, now); err != nil {
			b.Fatal(err)
		}
	}
	e.Flush()
	// Prebuilt reports, so the benchmark measures the engine, not the
	// test building them.
	reports := make([]arbiter.ReportGPUs, 64)
	for i := range reports {
		name := names[(i*37)%hosts]
		r := arbiter.GPUReport{Full: n == 8}
		for g := 0; g < n; g++ {
			r.GPUs = append(r.GPUs, reading(name, (i+g)%8, 10+(i*7+g)%90))
		}
		reports[i] = arbiter.ReportGPUs{Machine: name, Report: r}
	}
	writes := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(5 * time.Millisecond)
		var err error
		if n == 0 {
			_, err = e.Apply(arbiter.Heartbeat{Name: names[i%hosts]}, now)
		} else {
			c := reports[i%len(reports)]
			c.Machine = names[i%hosts]
			c.Report.SeenSeq = e.LastSeq()
			c.Report.SampledAt = now
			_, err = e.Apply(c, now)
		}
		if err != nil {
			b.Fatal(err)
		}
		if e.Flush().Durable() {
			writes++
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
	b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
}

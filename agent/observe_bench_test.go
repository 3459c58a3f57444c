package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
)

// BenchmarkSample measures the agent's cost of one sample at 8 GPUs, NVML
// off: nvidia-smi (the fake, a shell script, which reports 16 real
// processes, 2 on each GPU, 8 of them with an allocation) run twice, its
// output parsed, each process attributed through /proc, and the report
// built. cpu-ms/op is the agent's own CPU (user + system), child-cpu-ms/op
// that of the nvidia-smi it ran. "attribute" is the agent's part alone on
// a sample taken once: parsing excluded, attribution in its steady state
// (cached by process start time) and cold (every process read afresh).
func BenchmarkSample(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads /proc")
	}
	fakeNvidiaSMI(b, "h100x8")
	b.Setenv("FAKE_GPU_HOST", fmt.Sprintf("bench-%d", os.Getpid()))
	b.Setenv("FAKE_GPU_STATE", b.TempDir())
	for i := 0; i < 16; i++ {
		c := exec.Command("sleep", "600")
		c.Env = append(os.Environ(), fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d", i%8))
		if i%2 == 0 {
			c.Env = append(c.Env, fmt.Sprintf("%s=%d", gpu.AllocationEnv, 100+i))
		}
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	s, smp := benchSampler(b, true)
	procs := 0
	for _, g := range smp.GPUs {
		procs += len(g.Processes)
	}
	if len(smp.GPUs) != 8 || procs != 16 {
		b.Fatalf("sampled %d GPUs with %d processes, want 8 and 16", len(smp.GPUs), procs)
	}
	// The fake reports this namespace's pids.
	newObs := func() *observer { return benchObserver(s, smp, true) }
	b.Run("sample+attribute", func(b *testing.B) { sampleAndAttribute(b, s, newObs(), 8) })
	b.Run("attribute/steady", func(b *testing.B) {
		o := newObs()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			o.full = true
			o.build(smp, 0, time.Now())
		}
	})
	b.Run("attribute/cold", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			o := newObs()
			o.build(smp, 0, time.Now())
		}
	})
}

// benchSampler opens a sampler (noNVML: through nvidia-smi), closed when
// b ends, and takes a first sample.
func benchSampler(b *testing.B, noNVML bool) (*gpu.Sampler, gpu.Sample) {
	b.Helper()
	s, err := gpu.NewSampler(gpu.SampleOptions{DisableNVML: noNVML, XIDLog: gpu.NoXIDLog})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	smp, err := s.Sample(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return s, smp
}

// benchObserver observes through s the GPUs smp found, as the agent
// would (trustPIDs: ObserveConfig.TrustPIDs).
func benchObserver(s *gpu.Sampler, smp gpu.Sample, trustPIDs bool) *observer {
	var gs []arbiter.GPU
	for _, g := range smp.GPUs {
		gs = append(gs, arbiter.GPU{Index: g.Index, UUID: g.UUID})
	}
	return newObserver(ObserveConfig{Sampler: s, TrustPIDs: trustPIDs}, nil, "bench", slog.New(slog.DiscardHandler),
		func() []arbiter.GPU { return gs }, time.Second, time.Second, time.Second, nil)
}

// sampleAndAttribute is one sample of s, attributed and built into a full
// report by o, per op, with the agent's CPU and its children's reported.
func sampleAndAttribute(b *testing.B, s *gpu.Sampler, o *observer, gpus int) {
	ctx := context.Background()
	self0, child0 := rusage()
	for i := 0; i < b.N; i++ {
		smp, err := s.Sample(ctx)
		if err != nil {
			b.Fatal(err)
		}
		o.full = true
		r, _ := o.build(smp, 0, time.Now())
		if len(r.GPUs) != gpus {
			b.Fatalf("report of %d GPUs, want %d", len(r.GPUs), gpus)
		}
	}
	self1, child1 := rusage()
	b.ReportMetric(float64((self1-self0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64((child1-child0).Microseconds())/1000/float64(b.N), "child-cpu-ms/op")
}

// BenchmarkSampleRealGPU is BenchmarkSample's sample+attribute on this
// host's real GPUs, through NVML and through nvidia-smi; it runs only with
// ARBITER_TEST_REAL_GPU=1 (docs/guides/gpus.md). What it costs depends on
// the processes on the GPUs: start some first.
func BenchmarkSampleRealGPU(b *testing.B) {
	if os.Getenv("ARBITER_TEST_REAL_GPU") != "1" {
		b.Skip("needs an NVIDIA GPU: set ARBITER_TEST_REAL_GPU=1 on a GPU host")
	}
	for _, path := range []struct {
		name   string
		noNVML bool
	}{{gpu.SourceNVML, false}, {gpu.SourceNvidiaSMI, true}} {
		b.Run(path.name, func(b *testing.B) {
			s, smp := benchSampler(b, path.noNVML)
			if s.Source() != path.name {
				b.Fatalf("sampling through %s, want %s", s.Source(), path.name)
			}
			sampleAndAttribute(b, s, benchObserver(s, smp, false), len(smp.GPUs))
		})
	}
}

// rusage returns the CPU time this process and its waited-for children
// used so far.
func rusage() (self, children time.Duration) {
	var s, c syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &s)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &c)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(s.Utime) + tv(s.Stime), tv(c.Utime) + tv(c.Stime)
}

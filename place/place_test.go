package place

import (
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func mach(name string, cuda string, tags []string, gs ...arbiter.GPU) *arbiter.Machine {
	for i := range gs {
		gs[i].Index = i
		gs[i].Healthy = !strings.HasPrefix(gs[i].UUID, "sick")
	}
	return &arbiter.Machine{Name: name, CUDA: cuda, Tags: tags, GPUs: gs}
}

var (
	h100 = arbiter.GPU{Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Compute: "9.0"}
	a100 = arbiter.GPU{Model: "NVIDIA A100-SXM4-40GB", VRAMGiB: 40, Compute: "8.0"}
	t4   = arbiter.GPU{Model: "Tesla T4", VRAMGiB: 16, Compute: "7.5"}
	sick = arbiter.GPU{UUID: "sick", Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Compute: "9.0"}
)

func TestGPUOK(t *testing.T) {
	cases := []struct {
		name string
		g    arbiter.GPU
		r    arbiter.Request
		want bool
	}{
		{"plain", t4, arbiter.Request{GPUs: 1}, true},
		{"vram ok", a100, arbiter.Request{MinVRAMGiB: 40}, true},
		{"vram short", a100, arbiter.Request{MinVRAMGiB: 41}, false},
		{"compute ok", a100, arbiter.Request{MinCompute: "8.0"}, true},
		{"compute minor", a100, arbiter.Request{MinCompute: "8.6"}, false},
		{"compute major", h100, arbiter.Request{MinCompute: "8.6"}, true},
		{"compute unknown", arbiter.GPU{Model: "x"}, arbiter.Request{MinCompute: "1.0"}, false},
		{"model match", h100, arbiter.Request{Model: "*H100*"}, true},
		{"model miss", t4, arbiter.Request{Model: "*H100*"}, false},
	}
	for _, c := range cases {
		if got := GPUOK(&c.g, &c.r); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestMachineOK(t *testing.T) {
	m := mach("a", "12.4", []string{"fast", "default"}, h100)
	noCUDA := mach("b", "", nil, h100)
	cases := []struct {
		name string
		m    *arbiter.Machine
		r    arbiter.Request
		want bool
	}{
		{"tags subset", m, arbiter.Request{Tags: []string{"fast"}}, true},
		{"tag missing", m, arbiter.Request{Tags: []string{"fast", "big"}}, false},
		{"named", m, arbiter.Request{Machine: "a"}, true},
		{"named other", m, arbiter.Request{Machine: "b"}, false},
		{"cuda", m, arbiter.Request{RequireCUDA: true}, true},
		{"no cuda", noCUDA, arbiter.Request{RequireCUDA: true}, false},
	}
	for _, c := range cases {
		if got := MachineOK(c.m, &c.r); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestFitGPUs(t *testing.T) {
	m := mach("a", "12.4", nil, h100, t4, a100, sick, t4)
	cases := []struct {
		name string
		held []int64
		r    arbiter.Request
		want []int
	}{
		{"smallest first", make([]int64, 5), arbiter.Request{GPUs: 2}, []int{1, 4}},
		{"vram floor", make([]int64, 5), arbiter.Request{GPUs: 2, MinVRAMGiB: 20}, []int{0, 2}},
		{"skips held", []int64{0, 7, 0, 0, 0}, arbiter.Request{GPUs: 2}, []int{2, 4}},
		{"skips unhealthy", make([]int64, 5), arbiter.Request{GPUs: 2, Model: "*H100*"}, nil},
		{"too many", make([]int64, 5), arbiter.Request{GPUs: 5}, nil},
	}
	for _, c := range cases {
		got := FitGPUs(m, c.held, &c.r)
		if !equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestIndexVisitOrder(t *testing.T) {
	x := NewIndex(130)
	x.Set(129, 3)
	x.Set(5, 1)
	x.Set(64, 3)
	x.Set(7, 8)
	x.Set(9, -1)
	var got []int
	x.Visit(2, func(i int) bool { got = append(got, i); return true })
	if want := []int{64, 129, 7}; !equal(got, want) {
		t.Fatalf("visit order %v, want %v (fewest free, then position)", got, want)
	}
	if x.MaxFree() != 8 {
		t.Fatalf("max free %d, want 8", x.MaxFree())
	}
	x.Set(7, 0)
	if x.MaxFree() != 3 {
		t.Fatalf("after update: max free %d, want 3", x.MaxFree())
	}
}

func cluster(ms ...*arbiter.Machine) *Cluster {
	c := &Cluster{Machines: ms, Index: NewIndex(len(ms))}
	for i, m := range ms {
		c.Held = append(c.Held, make([]int64, len(m.GPUs)))
		c.Index.Set(i, len(m.GPUs))
	}
	return c
}

func TestBestBinPacks(t *testing.T) {
	c := cluster(mach("a", "12", nil, h100, h100, h100, h100), mach("b", "12", nil, h100, h100), mach("c", "12", nil, h100, h100))
	if mi, _ := c.Best(&arbiter.Request{GPUs: 2}, nil); mi != 1 {
		t.Fatalf("got machine %d, want 1 (b: exact fit, first by name)", mi)
	}
	if mi, _ := c.Best(&arbiter.Request{GPUs: 2}, func(i int) bool { return i == 1 }); mi != 2 {
		t.Fatalf("with b skipped: got %d, want 2", mi)
	}
	if mi, _ := c.Best(&arbiter.Request{GPUs: 3}, nil); mi != 0 {
		t.Fatalf("3 GPUs: got %d, want 0", mi)
	}
	if mi, _ := c.Best(&arbiter.Request{GPUs: 5}, nil); mi != -1 {
		t.Fatalf("5 GPUs: got %d, want -1", mi)
	}
}

func TestImpossibleNamesTheConstraint(t *testing.T) {
	ms := []*arbiter.Machine{mach("a", "12.4", []string{"x"}, h100, h100), mach("b", "", nil, t4, t4, t4)}
	cases := []struct {
		name string
		r    arbiter.Request
		want string
	}{
		{"fits", arbiter.Request{GPUs: 2}, ""},
		{"count", arbiter.Request{GPUs: 4}, "no machine has 4 GPUs (the most is 3, on b)"},
		{"vram", arbiter.Request{GPUs: 1, MinVRAMGiB: 96}, "no machine has 1 GPU with at least 96 GiB of VRAM (the largest GPU has 80 GiB)"},
		{"vram count", arbiter.Request{GPUs: 3, MinVRAMGiB: 20}, "the most is 2, on a"},
		{"compute", arbiter.Request{GPUs: 1, MinCompute: "10.0"}, "the highest is 9.0"},
		{"model", arbiter.Request{GPUs: 1, Model: "*B200*"}, `"Tesla T4"`},
		{"tags", arbiter.Request{GPUs: 1, Tags: []string{"y"}}, "tags [y]"},
		{"cuda", arbiter.Request{GPUs: 3, RequireCUDA: true}, "no machine has 3 GPUs"},
		{"machine", arbiter.Request{GPUs: 1, Machine: "zz"}, `machine "zz" is not known`},
	}
	for _, c := range cases {
		got := Impossible(ms, &c.r)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%s: got %q, want it to contain %q", c.name, got, c.want)
		}
	}
}

func TestWhyQueued(t *testing.T) {
	c := cluster(mach("a", "12", nil, h100, h100), mach("b", "12", nil, h100, h100))
	r := &arbiter.Request{GPUs: 2}
	none := func(int) int64 { return 0 }
	if got := c.WhyQueued(r, none); !strings.Contains(got, "2 free GPUs on one of the 2 machines") {
		t.Errorf("plain: %q", got)
	}
	if got := c.WhyQueued(r, func(i int) int64 { return 9 }); !strings.Contains(got, "held for allocation 9") {
		t.Errorf("held: %q", got)
	}
	c.Index.Set(0, -1)
	c.Index.Set(1, -1)
	if got := c.WhyQueued(r, none); !strings.Contains(got, "down or draining") {
		t.Errorf("down: %q", got)
	}
}

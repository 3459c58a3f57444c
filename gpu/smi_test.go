package gpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func h100(i int, uuidTail string) arbiter.GPU {
	return arbiter.GPU{Index: i, UUID: "GPU-9c1b2f7e-3a4d-5e6f-8a9b-0c1d2e3f4a5" + uuidTail, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 79.65, Compute: "9.0", Healthy: true}
}

func TestParseNvidiaSMIFixtures(t *testing.T) {
	var h100x8 []arbiter.GPU
	for i := range 8 {
		h100x8 = append(h100x8, h100(i, string(rune('0'+i))))
	}
	tests := []struct {
		fixture string
		want    []arbiter.GPU
		driver  string
		notes   int
	}{
		{"h100x8", h100x8, "550.54.15", 0},
		{"mixed", []arbiter.GPU{
			{Index: 0, UUID: "GPU-4f6e2d1c-0b9a-8f7e-6d5c-4b3a2f1e0d90", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Compute: "8.0", Healthy: true},
			{Index: 1, UUID: "GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d", Model: "NVIDIA GeForce RTX 4090", VRAMGiB: 23.99, Compute: "8.9", Healthy: true},
			{Index: 2, UUID: "GPU-d0e1f2a3-b4c5-d6e7-f8a9-b0c1d2e3f4a5", Model: "Tesla T4", VRAMGiB: 15, Compute: "7.5", Healthy: true},
		}, "535.183.01", 0},
		{"h200", []arbiter.GPU{
			// Recorded on a real H200 (driver 580.159.04, 2026-11-28).
			{Index: 0, UUID: "GPU-a090fa8b-bae9-e7db-4515-3e967f32b204", Model: "NVIDIA H200", VRAMGiB: 140.4, Compute: "9.0", Healthy: true},
		}, "580.159.04", 0},
		{"gb10", []arbiter.GPU{
			// Unified memory: [N/A] memory is healthy, VRAM filled in by Detect.
			{Index: 0, UUID: "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5", Model: "NVIDIA GB10", VRAMGiB: 0, Compute: "12.1", Healthy: true},
		}, "580.126.09", 0},
		{"a100-mig-disabled", []arbiter.GPU{
			{Index: 0, UUID: "GPU-7e1d5a3c-92b4-4c1f-a6e8-3d0b9f2c7a11", Model: "NVIDIA A100-SXM4-40GB", VRAMGiB: 40, Compute: "8.0", Healthy: true},
			{Index: 1, UUID: "GPU-7e1d5a3c-92b4-4c1f-a6e8-3d0b9f2c7a12", Model: "NVIDIA A100-SXM4-40GB", VRAMGiB: 40, Compute: "8.0", Healthy: true},
		}, "535.104.05", 0},
		{"fallen-off-bus", []arbiter.GPU{
			h100(0, "0"), h100(1, "1"),
			{Index: 2, Healthy: false}, // the lost GPU keeps its place
			h100(3, "3"),
		}, "550.54.15", 1},
		{"unhealthy", []arbiter.GPU{
			{Index: 0, UUID: "GPU-4f6e2d1c-0b9a-8f7e-6d5c-4b3a2f1e0d90", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Compute: "8.0", Healthy: true},
			{Index: 1, UUID: "GPU-4f6e2d1c-0b9a-8f7e-6d5c-4b3a2f1e0d91", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 0, Compute: "8.0", Healthy: false},
			{Index: 2, UUID: "GPU-4f6e2d1c-0b9a-8f7e-6d5c-4b3a2f1e0d92", Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Compute: "", Healthy: false},
		}, "535.183.01", 2},
		{"empty", nil, "", 0},
		{"no-devices", nil, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			out, err := os.ReadFile(filepath.Join("testdata", tt.fixture+".csv"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := parseSMI(out)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(res.GPUs) != len(tt.want) {
				t.Fatalf("got %d GPUs, want %d: %+v", len(res.GPUs), len(tt.want), res.GPUs)
			}
			for i := range tt.want {
				if res.GPUs[i] != tt.want[i] {
					t.Errorf("gpu %d: got %+v, want %+v", i, res.GPUs[i], tt.want[i])
				}
			}
			if res.Driver != tt.driver {
				t.Errorf("driver: got %q, want %q", res.Driver, tt.driver)
			}
			if len(res.Notes) != tt.notes {
				t.Errorf("got %d notes, want %d: %q", len(res.Notes), tt.notes, res.Notes)
			}
			// The exported form agrees.
			gpus, err := ParseNvidiaSMI(out)
			if err != nil || len(gpus) != len(tt.want) {
				t.Errorf("ParseNvidiaSMI: got %d GPUs, %v; want %d", len(gpus), err, len(tt.want))
			}
		})
	}
}

func TestParseNvidiaSMIErrors(t *testing.T) {
	const ok = "0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15, 00000000:18:00.0\n"
	tests := []struct {
		name string
		in   string
		want string // in the error
	}{
		{"few fields", "0, GPU-a, NVIDIA H100, 81559\n", "line 1"},
		{"many fields", "0, GPU-a, NVIDIA H100, 81559, 9.0, 550, 0000:18:00.0, extra\n", "want 7"},
		{"header", "index, uuid, name, memory.total [MiB], compute_cap, driver_version, pci.bus_id\n", "index \"index\""},
		{"units", "0, GPU-a, NVIDIA H100, 81559 MiB, 9.0, 550.54.15, 0000:18:00.0\n", "memory.total"},
		{"negative index", "-1, GPU-a, NVIDIA H100, 81559, 9.0, 550.54.15, 0000:18:00.0\n", "index"},
		{"plus index", "+1, GPU-a, NVIDIA H100, 81559, 9.0, 550.54.15, 0000:18:00.0\n", "index"},
		{"repeated index", ok + ok, "line 2"},
		{"bad compute", "0, GPU-a, NVIDIA H100, 81559, nine, 550.54.15, 0000:18:00.0\n", "compute_cap"},
		{"no dot compute", "0, GPU-a, NVIDIA H100, 81559, 9, 550.54.15, 0000:18:00.0\n", "compute_cap"},
		{"empty name", "0, GPU-a, , 81559, 9.0, 550.54.15, 0000:18:00.0\n", "name"},
		{"mixed drivers", ok + "1, GPU-b, NVIDIA H100 80GB HBM3, 81559, 9.0, 535.1, 00000000:2A:00.0\n", "driver version"},
		{"no driver", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n", "cannot talk to the driver"},
		{"garbage line", ok + "hello\n", "line 2 \"hello\""},
		{"no devices after gpus", ok + "No devices were found\n", "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gpus, err := ParseNvidiaSMI([]byte(tt.in))
			if err == nil {
				t.Fatalf("got %+v, want an error", gpus)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestParseNvidiaSMILostIndex(t *testing.T) {
	// The lost GPU's position (1) is taken by a later explicit row, so it
	// gets the lowest free index instead.
	in := "0, GPU-a, T4, 15360, 7.5, 535.1, 0000:01:00.0\n" +
		"Unable to determine the device handle for GPU0000:02:00.0: GPU is lost\n" +
		"1, GPU-b, T4, 15360, 7.5, 535.1, 0000:03:00.0\n"
	gpus, err := ParseNvidiaSMI([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for _, g := range gpus {
		idx = append(idx, g.Index)
	}
	if len(idx) != 3 || idx[0] != 0 || idx[1] != 2 || idx[2] != 1 {
		t.Errorf("got indices %v, want [0 2 1]", idx)
	}
	if gpus[1].Healthy {
		t.Errorf("got lost GPU healthy, want unhealthy")
	}
}

func TestParseCUDAVersion(t *testing.T) {
	tests := []struct {
		fixture string
		want    string
	}{
		{"h100x8.q.txt", "12.4"},
		{"gb10.txt", "13.0"},
		{"h200.q.txt", "13.0"},
		{"h200.txt", "13.0"},
		{"a100-mig-disabled.txt", "12.2"},
		{"h100x8.csv", ""},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			out, err := os.ReadFile(filepath.Join("testdata", tt.fixture))
			if err != nil {
				t.Fatal(err)
			}
			if got := parseCUDAVersion(out); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzParseNvidiaSMI(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.csv"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n0, a, b, 1, 1.0, 1, c\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		gpus, err := ParseNvidiaSMI(in)
		if err != nil {
			return
		}
		seen := make(map[int]bool)
		for _, g := range gpus {
			if g.Index < 0 || seen[g.Index] {
				t.Fatalf("index %d negative or repeated in %+v", g.Index, gpus)
			}
			seen[g.Index] = true
			if g.VRAMGiB < 0 {
				t.Fatalf("negative VRAM in %+v", g)
			}
			if g.Compute != "" {
				if _, _, ok := arbiter.ParseCompute(g.Compute); !ok {
					t.Fatalf("bad compute %q", g.Compute)
				}
			}
		}
	})
}

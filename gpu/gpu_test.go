package gpu

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// fakePATH makes a directory holding nvidia-smi (a link to the fake) the
// only PATH entry, and selects fixture.
func fakePATH(t *testing.T, fixture string) {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", "fake-nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(script, filepath.Join(dir, "nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	// The fake needs sh, cat, dirname and readlink from the real PATH.
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_NVIDIA_SMI", fixture)
}

func TestDetect(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the fake nvidia-smi is a shell script")
	}
	ram, _ := hostRAM()
	tests := []struct {
		fixture string
		n       int
		cuda    string
		driver  string
		vram0   float64
		notes   int
	}{
		{"h100x8", 8, "12.4", "550.54.15", 79.65, 0},
		{"gb10", 1, "13.0", "580.126.09", ram, 0},   // CUDA from the plain header; VRAM from RAM
		{"h200", 1, "13.0", "580.159.04", 140.4, 0}, // recorded on a real H200 (2026-11-28)
		{"mixed", 3, "", "535.183.01", 80, 0},       // no CUDA version anywhere
		{"fallen-off-bus", 4, "12.4", "550.54.15", 79.65, 2},
		{"empty", 0, "", "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			fakePATH(t, tt.fixture)
			h, err := Detect(context.Background(), Options{DisableNVML: true})
			if err != nil {
				t.Fatalf("detect: %v", err)
			}
			if len(h.GPUs) != tt.n {
				t.Fatalf("got %d GPUs, want %d", len(h.GPUs), tt.n)
			}
			if h.CUDA != tt.cuda || h.Driver != tt.driver {
				t.Errorf("got cuda %q driver %q, want %q %q", h.CUDA, h.Driver, tt.cuda, tt.driver)
			}
			if tt.n > 0 && h.GPUs[0].VRAMGiB != tt.vram0 {
				t.Errorf("got gpu 0 VRAM %v, want %v", h.GPUs[0].VRAMGiB, tt.vram0)
			}
			if len(h.Notes) != tt.notes {
				t.Errorf("got notes %q, want %d", h.Notes, tt.notes)
			}
			if h.Source != SourceNvidiaSMI {
				t.Errorf("got source %q, want %q", h.Source, SourceNvidiaSMI)
			}
			if h.Hostname == "" || h.Cores < 1 {
				t.Errorf("got hostname %q cores %d, want both set", h.Hostname, h.Cores)
			}
		})
	}
}

func TestDetectFailures(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the fake nvidia-smi is a shell script")
	}
	t.Run("no driver", func(t *testing.T) {
		fakePATH(t, "no-driver")
		_, err := Detect(context.Background(), Options{DisableNVML: true})
		if err == nil || !strings.Contains(err.Error(), "couldn't communicate") {
			t.Errorf("got %v, want the driver failure", err)
		}
	})
	t.Run("named missing", func(t *testing.T) {
		_, err := Detect(context.Background(), Options{DisableNVML: true, NvidiaSMI: filepath.Join(t.TempDir(), "nvidia-smi")})
		if err == nil {
			t.Errorf("got nil error, want one for a missing named nvidia-smi")
		}
	})
	t.Run("garbage", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "bad.csv"), []byte("what is this\n"), 0o644)
		fakePATH(t, "bad")
		t.Setenv("FAKE_NVIDIA_SMI_DIR", dir)
		_, err := Detect(context.Background(), Options{DisableNVML: true})
		if err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("got %v, want a parse error naming line 1", err)
		}
	})
}

func TestDetectNothing(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no nvidia-smi
	h, err := Detect(context.Background(), Options{DisableNVML: true})
	if err != nil {
		t.Fatalf("got %v, want no error without nvidia-smi", err)
	}
	if len(h.GPUs) != 0 || h.Source != "" {
		t.Errorf("got %d GPUs from %q, want none", len(h.GPUs), h.Source)
	}
	h, err = Detect(context.Background(), Options{DisableNVML: true, NvidiaSMI: NoNvidiaSMI})
	if err != nil || len(h.GPUs) != 0 {
		t.Errorf("got %d GPUs, %v with nvidia-smi disabled, want none", len(h.GPUs), err)
	}
}

func TestDetectNVMLAbsent(t *testing.T) {
	// Without libnvidia-ml (as on build machines) NVML falls back quietly.
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("a real NVIDIA driver is present")
	}
	t.Setenv("PATH", t.TempDir())
	h, err := Detect(context.Background(), Options{})
	if err != nil || len(h.GPUs) != 0 {
		t.Errorf("got %d GPUs, %v, want none and no error", len(h.GPUs), err)
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want float64
		err  bool
	}{
		{"dgx spark", "MemTotal:       125483652 kB\nMemFree:        1000 kB\n", 119.67, false},
		{"second line", "Foo: 1 kB\nMemTotal: 1048576 kB\n", 1, false},
		{"missing", "MemFree: 1 kB\n", 0, true},
		{"bad unit", "MemTotal: 1048576 MB\n", 0, true},
		{"bad number", "MemTotal: lots kB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMeminfo([]byte(tt.in))
			if (err != nil) != tt.err || got != tt.want {
				t.Errorf("got %v, %v; want %v, error %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	t4 := arbiter.GPU{Model: "Tesla T4", VRAMGiB: 15, Healthy: true}
	a100 := arbiter.GPU{Model: "NVIDIA A100-SXM4-80GB", VRAMGiB: 80, Healthy: true}
	tests := []struct {
		name string
		in   []arbiter.GPU
		want string
	}{
		{"none", nil, "no GPUs"},
		{"same", []arbiter.GPU{t4, t4}, "2× Tesla T4 (15 GiB)"},
		{"mixed", []arbiter.GPU{a100, t4, a100, {}}, "2× NVIDIA A100-SXM4-80GB (80 GiB), 1× Tesla T4 (15 GiB), 1 unhealthy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summary(tt.in); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

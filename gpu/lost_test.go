package gpu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// TestXIDLineOfAMIGInstance: on a MIG GPU the driver names the instance
// after the bus (open-gpu-kernel-modules, kernel_rc: "NVRM: Xid
// (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, ..."); the XID is the
// GPU's on that bus.
func TestXIDLineOfAMIGInstance(t *testing.T) {
	for _, line := range []string{
		"NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
		"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 95, pid=9, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No",
	} {
		ev, ok := ParseXIDLine("3,1234,5678,-;" + line)
		if !ok || ev.BusID != "0000:3b:00" || (ev.XID != 94 && ev.XID != 95) {
			t.Errorf("ParseXIDLine(%q) = %+v, %v; want the XID on bus 0000:3b:00", line, ev, ok)
		}
	}
}

// TestComputeAppsWithALostGPU, TestSampleWithALostGPU: a lost GPU makes
// nvidia-smi print its "Unable to determine the device handle" line for
// every query, the compute-apps one too; the other GPUs are sampled, and
// the lost one left out (so reported missing).
func TestComputeAppsWithALostGPU(t *testing.T) {
	out := []byte("GPU-aaaa, 4242, 1024\nUnable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n")
	apps, err := ParseComputeApps(out)
	if err != nil || len(apps) != 1 {
		t.Fatalf("ParseComputeApps: %v, %v; want the one process and no error", apps, err)
	}
}

func TestSampleWithALostGPU(t *testing.T) {
	script := `#!/bin/sh
case "$1" in
--query-gpu=*)
	echo "0, GPU-aaaa, 00000000:1B:00.0, 50, 1024, 81559, 40, 100.5, 0"
	echo "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
	exit 15 ;;
--query-compute-apps=*)
	echo "GPU-aaaa, $$, 1024"
	echo "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
	exit 15 ;;
esac
exit 2
`
	smp, err := sampleWith(t, script)
	if err != nil {
		t.Fatalf("Sample failed: %v; want GPU 0 sampled and GPU 1 left out (missing)", err)
	}
	if len(smp.GPUs) != 1 || len(smp.GPUs[0].Processes) != 1 {
		t.Fatalf("sample: %+v", smp.GPUs)
	}
}

// TestSampleWhenTheOnlyGPUIsLost: when every GPU of the host is lost (a
// one-GPU workstation whose GPU fell off the bus), nvidia-smi prints only
// the "Unable to determine the device handle" line and exits 15; the
// sample comes back empty, so the GPU is reported missing.
func TestSampleWhenTheOnlyGPUIsLost(t *testing.T) {
	script := `#!/bin/sh
echo "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
exit 15
`
	smp, err := sampleWith(t, script)
	if err != nil {
		t.Fatalf("Sample failed: %v; want an empty sample (the GPU left out, so reported missing)", err)
	}
	if len(smp.GPUs) != 0 {
		t.Fatalf("sample: %+v", smp.GPUs)
	}
}

// TestReportedUser: a long or odd user name is reported as the server
// takes it: valid text of at most 64 bytes.
func TestReportedUser(t *testing.T) {
	for _, name := range []string{strings.Repeat("a", 63) + "é", strings.Repeat("é", 40), "eve\u202e", "plain"} {
		got := reportedUser(name)
		if len(got) > 64 || arbiter.ValidateText("user", got, 64) != nil {
			t.Errorf("reportedUser(%q) = %q: not what the server takes", name, got)
		}
	}
	if got := reportedUser("plain"); got != "plain" {
		t.Errorf("reportedUser(plain) = %q", got)
	}
}

// sampleWith takes one sample through script as nvidia-smi (no NVML).
func sampleWith(t *testing.T, script string) (Sample, error) {
	t.Helper()
	smi := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewSampler(SampleOptions{NvidiaSMI: smi, DisableNVML: true, XIDLog: NoXIDLog})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return s.Sample(context.Background())
}

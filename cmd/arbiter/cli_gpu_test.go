package main

import (
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestCLIGPUAndReport(t *testing.T) {
	_, url := startServer(t, "[server]\nlocal = false\n[[machines]]\nname = \"gpu1\"\ngpus = [{ model = \"L4\", vram_gib = 24, count = 2 }]\n", nil)
	out, errs, code := cmdline(t, url, "gpu", "drain", "gpu1:1", "--reason", "fan")
	if code != 0 || !strings.Contains(out, "GPU 1 of gpu1: drained (fan)") {
		t.Fatalf("gpu drain: %d %q %q", code, out, errs)
	}
	ms := cliJSON[[]arbiter.MachineStatus](t, url, "status")
	if ms[0].Free != 1 || ms[0].Devices[1].State != "drained" {
		t.Fatalf("status after drain: %+v", ms[0])
	}
	out, _, _ = cmdline(t, url, "status")
	if !strings.Contains(out, "drained") || !strings.Contains(out, "GPU 1 drained: fan") {
		t.Errorf("status table:\n%s", out)
	}
	// free ends releasing and unhealthy, not a drain: it says so.
	if out, errs, code := cmdline(t, url, "gpu", "free", "gpu1:1"); code != 0 || !strings.Contains(out, "drained") || !strings.Contains(errs, "arbiter gpu undrain gpu1:1") {
		t.Fatalf("free of a drained GPU: %d %q %q, want a hint to undrain", code, out, errs)
	}
	if out, _, code := cmdline(t, url, "gpu", "undrain", "gpu1:1"); code != 0 || !strings.Contains(out, "free") {
		t.Fatalf("undrain: %d %s", code, out)
	}
	if _, errs, code := cmdline(t, url, "gpu", "free", "gpu1:7"); code != 1 || !strings.Contains(errs, "has no GPU 7") {
		t.Fatalf("free GPU 7: %d %s", code, errs)
	}
	if _, _, code := cmdline(t, url, "gpu", "reboot", "gpu1:1"); code != 2 {
		t.Fatalf("unknown verb: exit %d", code)
	}
	a := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--owner", "ann", "--keepalive", "never")
	if _, _, code := cmdline(t, url, "release", "1"); code != 0 {
		t.Fatal("release")
	}
	rep := cliJSON[arbiter.UsageReport](t, url, "report", "--by", "model")
	if len(rep.Rows) != 1 || rep.Rows[0].Key != "L4" || rep.Rows[0].Allocations != 1 || a.ID != 1 {
		t.Fatalf("report: %+v", rep)
	}
	out, _, code = cmdline(t, url, "report", "-o", "csv")
	if code != 0 || !strings.HasPrefix(out, "key,gpu_hours,busy_gpu_hours,idle_gpu_hours,allocations,mean_wait_s\nann,") {
		t.Fatalf("csv: %q", out)
	}
	out, _, _ = cmdline(t, url, "report")
	if !strings.Contains(out, "ann") || !strings.Contains(out, "total") {
		t.Fatalf("table: %s", out)
	}
	if _, _, code := cmdline(t, url, "report", "--by", "team"); code != 2 {
		t.Fatalf("--by team: exit %d", code)
	}
}

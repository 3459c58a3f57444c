package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// TestDashboardGPUTruth runs the real server and a real agent whose fake
// nvidia-smi reports real processes, and checks in the browser, at laptop
// and phone widths, that a GPU's tile shows its utilisation and memory and
// its process, that an idle holder, an unmanaged process and a drained GPU
// are marked, that nothing overflows, and that the Usage page draws its
// charts.
func TestDashboardGPUTruth(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake nvidia-smi reads /proc")
	}
	uiChromium(t)
	bin := buildBinary(t)
	_, url := startServer(t, uiConfig(t, gpuConfig(`sample_s = 0.2
idle_after_s = 1
idle_grace_s = 3600
`)), nil)
	h := startGPUHost(t, bin, url, "host-a", "--token", uiAdminSecret)
	admin := client.New(url, uiAdminSecret)
	ctx := context.Background()
	poll.Until(t, 30*time.Second, "host-a reporting its GPUs", func() bool {
		m, err := admin.Machine(ctx, "host-a")
		return err == nil && len(m.Devices) == 8 && m.Devices[0].Usage != nil
	})

	// alice trains at 87 %; bob holds a GPU and does nothing with it;
	// someone runs on a third without asking; a fourth is drained.
	_, _, said := startAllocCmd(t, bin, url, h, "--token", uiUserSecret, "--owner", "alice", "--machine", "host-a", "--gpus", "1")
	var a, b, rogueGPU, drained int
	if err := poll.Try(20*time.Second, func() error {
		as, err := admin.Allocations(ctx, arbiter.AllocationFilter{Owner: "alice", State: arbiter.StateReady})
		if err == nil && len(as) != 1 {
			err = fmt.Errorf("alice has %d ready allocations", len(as))
		}
		if err == nil {
			a = as[0].Devices[0].Index
		}
		return err
	}); err != nil {
		t.Fatalf("alice's command: %v; arbiter alloc said: %s", err, said())
	}
	if err := os.WriteFile(filepath.Join(h.state, fmt.Sprintf("util.%d", a)), []byte("87"), 0o600); err != nil {
		t.Fatal(err)
	}
	bob, err := admin.Allocate(ctx, arbiter.Request{Owner: "bob", GPUs: 1, Machine: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	b = bob.Devices[0].Index
	for i := 0; i < 8; i++ {
		if i != a && i != b {
			if rogueGPU == drained {
				rogueGPU = i
			} else {
				drained = i
				break
			}
		}
	}
	t.Logf("alice on GPU %d, bob on %d, a rogue process on %d, %d drained", a, b, rogueGPU, drained)
	rogue := exec.Command("sh", "-c", "exec sleep 300")
	rogue.Env = h.env(fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d", rogueGPU))
	if err := rogue.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rogue.Process.Kill(); rogue.Wait() })
	if _, err := admin.SetGPUDrained(ctx, "host-a", drained, true, "fan noise"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the tiles' facts on the server", func() bool {
		m, err := admin.Machine(ctx, "host-a")
		if err != nil {
			return false
		}
		ab, _ := admin.Allocation(ctx, bob.ID)
		u := m.Devices[a].Usage
		return u != nil && u.UtilPct != nil && *u.UtilPct == 87 && len(u.Processes) == 1 && m.Devices[rogueGPU].Unmanaged &&
			m.Devices[drained].State == arbiter.GPUDrained && ab.IdleSince != nil
	})

	for _, size := range uiSizes {
		t.Run(size.name, func(t *testing.T) {
			bctx := uiBrowserAt(t, size)
			if err := chromedp.Do(bctx, uiLogin(url, uiAdminSecret)); err != nil {
				t.Fatal(err)
			}
			tile := func(i int) string { return uiText(t, bctx, fmt.Sprintf("#g-host-a-%d", i)) }
			if s := tile(a); !strings.Contains(s, "alice") || !strings.Contains(s, "1 proc") {
				t.Errorf("alice's tile: %q, want its holder and its process", s)
			}
			for i, want := range map[int]string{a: "held", b: "idle", drained: "drained", rogueGPU: "foreign"} {
				if c := uiEval[string](t, bctx, fmt.Sprintf(`document.getElementById("g-host-a-%d").className`, i)); !strings.Contains(c, want) {
					t.Errorf("tile %d class %q, want %q", i, c, want)
				}
			}
			if bar := uiEval[string](t, bctx, fmt.Sprintf(`document.querySelector("#g-host-a-%d .bar").className`, a)); bar != "bar u8" {
				t.Errorf("alice's bar: %q, want u8 (87 %%)", bar)
			}
			// A tap shows the processes.
			procs := fmt.Sprintf("#g-host-a-%d .gpu-procs", a)
			if err := chromedp.Do(bctx, chromedp.Click(chromedp.CSS(procs+" summary"))); err != nil {
				t.Fatal(err)
			}
			if s := uiText(t, bctx, procs+" ul"); !strings.Contains(s, "allocation ") || !strings.Contains(s, "sleep") {
				t.Errorf("alice's processes: %q", s)
			}
			uiNoOverflow(t, bctx)
			uiScreenshotOf(t, bctx, "#m-host-a", "dashboard-gpu-truth-"+size.name)

			if err := chromedp.Do(bctx, chromedp.Navigate(url+"/usage"), chromedp.WaitVisible(chromedp.CSS(".panel-usage-machines svg"))); err != nil {
				t.Fatal(err)
			}
			if n := uiEval[int](t, bctx, `document.querySelectorAll(".chart svg rect.held").length`); n == 0 {
				t.Errorf("the Usage page draws no held GPU-hours")
			}
			// bob's allocation was made with the admin token: its owner is ops (issue 12).
			if s := uiText(t, bctx, ".panel-usage-table tbody"); !strings.Contains(s, "alice") || !strings.Contains(s, "ops") {
				t.Errorf("usage totals: %q", s)
			}
			uiNoOverflow(t, bctx)
			uiScreenshot(t, bctx, "usage-"+size.name)
		})
	}
}

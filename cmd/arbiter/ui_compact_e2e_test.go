package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// TestDashboardCompactFleet: past 48 GPU hosts the machines panel shows
// one compact row per host (a cell per GPU), which lines up, follows an
// allocation live and drains from its button; the grid machine keeps its map.
func TestDashboardCompactFleet(t *testing.T) {
	var cfg strings.Builder
	for i := 1; i <= 60; i++ {
		n, tags := 8, `["h100", "ib"]`
		if i%7 == 0 {
			n, tags = 4, `["a100"]`
		}
		fmt.Fprintf(&cfg, "[[machines]]\nname = \"gpu%02d\"\ntags = %s\ngpus = [ { model = \"NVIDIA H100 80GB HBM3\", vram_gib = 80, count = %d } ]\n\n", i, tags, n)
	}
	_, url := startServer(t, uiConfig(t, cfg.String()+uiLabGridMachine), nil)
	bg := context.Background()
	admin := client.New(url, uiAdminSecret)
	for i, owner := range []string{"alice", "bob", "carol", "dave", "erin", "frank"} {
		if _, err := admin.Allocate(bg, arbiter.Request{Owner: owner, GPUs: 8 - i, Machine: fmt.Sprintf("gpu%02d", 3*i+1), KeepaliveS: uiKeepalive(600)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.SetDraining(bg, "gpu05", true); err != nil {
		t.Fatal(err)
	}
	for _, size := range uiSizes {
		t.Run(size.name, func(t *testing.T) {
			ctx := uiBrowserAt(t, size)
			if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret), chromedp.WaitVisible(chromedp.CSS("#m-gpu01.mrow #g-gpu01-0.cell.held"))); err != nil {
				t.Fatal(err)
			}
			uiNoOverflow(t, ctx)
			// Every row as tall as the others, its cells where the others' are.
			if got := uiEval[string](t, ctx, `(() => {
				const rows = [...document.querySelectorAll("article.mrow")];
				const h = new Set(rows.map(r => Math.round(r.getBoundingClientRect().height)));
				const x = new Set(rows.map(r => Math.round(r.querySelector(".cells").getBoundingClientRect().left)));
				return rows.length + " rows, " + h.size + " heights, " + x.size + " cell columns";
			})()`); got != "60 rows, 1 heights, 1 cell columns" {
				t.Errorf("compact rows: %s", got)
			}
			if n := uiEval[int](t, ctx, `document.querySelectorAll("#m-spin5 .boardmap").length`); n != 1 {
				t.Errorf("the grid machine shows %d board maps, want 1", n)
			}
			if size.name == "laptop" {
				// Live: an allocation colours its cells without a reload; drain from the row.
				// (With tokens the owner is the token's name, ops; "grace" is its label.)
				a, err := admin.Allocate(bg, arbiter.Request{Owner: "grace", GPUs: 4, Machine: "gpu60"})
				if err != nil {
					t.Fatal(err)
				}
				if err := chromedp.Do(ctx,
					chromedp.WaitVisible(chromedp.CSS("#g-gpu60-3.cell.held")),
					chromedp.Click(chromedp.CSS(`#m-gpu60 button[data-action="drain"]`)),
					chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
					chromedp.Click(chromedp.ID("confirm-ok")),
					chromedp.WaitVisible(chromedp.CSS(`#m-gpu60.mrow.state-draining`)),
				); err != nil {
					t.Fatal(err)
				}
				if l := uiEval[string](t, ctx, `document.getElementById("g-gpu60-0").getAttribute("aria-label")`); l != fmt.Sprintf("GPU 0: ops, #%d", a.ID) {
					t.Errorf("cell label %q", l)
				}
			}
			uiScreenshotOf(t, ctx, "#p-machines", "compact-machines-"+size.name)
		})
	}
}

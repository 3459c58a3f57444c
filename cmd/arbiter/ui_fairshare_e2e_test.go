package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// TestDashboardFairShare checks in the browser that the dashboard shows
// the queue in its order with positions, groups' factors and ETAs, the
// groups' standings and quotas, and the reservations on a timeline — and
// that they follow changes without a reload.
func TestDashboardFairShare(t *testing.T) {
	ctx := uiBrowser(t, 1440, 1000)
	// With tokens the owner is the token's name: the user token alice is
	// in ml, the admin token ops in cv.
	_, url := startServer(t, uiConfig(t, twoHosts+`
[[groups]]
name = "ml"
members = ["alice"]

[[groups]]
name = "cv"
members = ["ops"]

[[quotas]]
group = "cv"
max_gpus = 12
`), nil)
	if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret)); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	uiEval[bool](t, ctx, `window.arbiterNoReload = true`)
	api := client.New(url, uiAdminSecret)
	user := client.New(url, uiUserSecret)
	bg := context.Background()
	hour := func(h float64) *float64 { v := h * 3600; return &v }
	if a, err := user.Allocate(bg, arbiter.Request{Owner: "alice", GPUs: 8, Machine: "gpu1", TimeLimitS: hour(1)}); err != nil || a.State != arbiter.StateReady {
		t.Fatalf("alice: %+v %v", a, err)
	}
	held, err := api.Allocate(bg, arbiter.Request{Owner: "ops", GPUs: 8, Machine: "gpu2", TimeLimitS: hour(2)})
	if err != nil || held.State != arbiter.StateReady {
		t.Fatalf("ops: %+v %v", held, err)
	}
	bob, err := user.Allocate(bg, arbiter.Request{Owner: "alice", GPUs: 4, TimeLimitS: hour(1)})
	if err != nil || bob.State != arbiter.StateQueued {
		t.Fatalf("alice's second: %+v %v", bob, err)
	}
	dave, err := api.Allocate(bg, arbiter.Request{Owner: "ops", GPUs: 8, TimeLimitS: hour(1)})
	if err != nil || dave.State != arbiter.StateQueued {
		t.Fatalf("ops's second: %+v %v", dave, err)
	}
	if _, err := api.Reserve(bg, arbiter.Reservation{GPUs: 8, Machine: "gpu2", Start: time.Now().Add(3 * time.Hour), DurationS: 3600, Group: "ml"}); err != nil {
		t.Fatal(err)
	}
	bq, dq := "#q-"+strconv.FormatInt(bob.ID, 10), "#q-"+strconv.FormatInt(dave.ID, 10)
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(bq)),
		chromedp.WaitVisible(chromedp.CSS(dq)),
		chromedp.WaitVisible(chromedp.CSS(`#p-fairshare #g-ml`)),
		chromedp.WaitVisible(chromedp.CSS(`#p-reservations #r-r1 .resv-bar`)),
	); err != nil {
		t.Fatalf("fair share on the page: %v", err)
	}
	// The queue: positions in the engine's order, the group and its factor,
	// an ETA.
	a1, _ := api.Allocation(bg, bob.ID)
	a2, _ := api.Allocation(bg, dave.ID)
	// ops's second (cv) waits for its first 8 GPUs to end (quota 12), at
	// 2h; alice's for her first, at 1h.
	if a2.ETA == nil || !a2.ETA.Equal(*held.EndsAt) {
		t.Fatalf("ops's second ETA %v, want its first's end %v", a2.ETA, held.EndsAt)
	}
	for _, c := range []struct {
		sel string
		a   arbiter.Allocation
	}{{bq, a1}, {dq, a2}} {
		if c.a.Position == nil || c.a.ETA == nil {
			t.Fatalf("allocation %d: position %v eta %v", c.a.ID, c.a.Position, c.a.ETA)
		}
		if pos := strings.TrimSpace(uiText(t, ctx, c.sel+" td.num")); pos != strconv.Itoa(*c.a.Position) {
			t.Errorf("%s shows position %q, want %d", c.sel, pos, *c.a.Position)
		}
		if g := uiText(t, ctx, c.sel+` td[data-label="group"]`); !strings.Contains(g, c.a.Group+" · F ") {
			t.Errorf("%s shows group %q, want %s and its factor", c.sel, g, c.a.Group)
		}
		if eta := uiText(t, ctx, c.sel+` td[data-label="eta"]`); !strings.HasPrefix(eta, "in ") {
			t.Errorf("%s shows ETA %q, want one", c.sel, eta)
		}
		if why := uiText(t, ctx, c.sel+" td.why"); strings.Contains(why, "ETA") {
			t.Errorf("%s repeats the ETA in its reason: %q", c.sel, why)
		}
	}
	// Standings and quotas.
	if f := uiEval[string](t, ctx, `document.querySelector("#g-ml").dataset.factor`); f == "" {
		t.Errorf("ml shows no factor")
	}
	if q := uiText(t, ctx, `#p-fairshare table.quotas`); !strings.Contains(q, "group:cv") || !strings.Contains(q, "8 GPUs") {
		t.Errorf("quotas table: %q", q)
	}
	// The timeline: r1's window 3 to 4 hours into the next 7 days.
	x := uiEval[float64](t, ctx, `parseFloat(document.querySelector("#r-r1 .resv-bar").getAttribute("x"))`)
	w := uiEval[float64](t, ctx, `document.querySelector("#r-r1 .resv-bar").getBoundingClientRect().width`)
	if x < 10 || x > 30 || w <= 0 {
		t.Errorf("r1's bar at x=%v (of 1000 for the week, want about 18), %vpx wide", x, w)
	}
	uiScreenshot(t, ctx, "dashboard-fairshare")

	// A change shows without a reload: bob's request leaves the queue.
	if _, err := api.Release(bg, bob.ID, "changed my mind"); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitNotPresent(chromedp.CSS(bq))); err != nil {
		t.Fatalf("bob still queued on the page: %v", err)
	}
	if pos := strings.TrimSpace(uiText(t, ctx, dq+" td.num")); pos != "1" {
		t.Errorf("dave's position %q after bob left, want 1", pos)
	}
	if !uiEval[bool](t, ctx, `window.arbiterNoReload === true`) {
		t.Errorf("the page was reloaded")
	}
}

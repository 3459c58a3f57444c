package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// A grid machine's board map on the dashboard, driven in headless Chromium.

// uiLabGridMachine is a four-by-two-triad grid machine with one dead board.
const uiLabGridMachine = `
[[grid_machines]]
name = "spin5"
width = 4
height = 2
locations = "identity"
base_ip = "10.11.0.0"
power_delay_s = 2
dead_boards = [[3, 1, 2]]
`

// uiGridRequest asks for boards of spin5: args as spalloc's create_job.
func uiGridRequest(owner string, keepalive *float64, args ...int) arbiter.Request {
	gr, _ := arbiter.GridRequestOf(args...) // the server refuses a bad one
	return arbiter.Request{Owner: owner, Machine: "spin5", KeepaliveS: keepalive, Grid: &gr}
}

// uiWaitState waits until allocation id is in state.
func uiWaitState(t *testing.T, api *client.Client, id int64, state string) {
	t.Helper()
	poll.Until(t, 30*time.Second, fmt.Sprintf("allocation %d to be %s", id, state), func() bool {
		a, err := api.Allocation(context.Background(), id)
		return err == nil && a.State == state
	})
}

// uiLabGrid gives spin5 three holders whose boards are on, one allocation
// that ended (its boards switched off, waiting to be freed) and one being
// switched on.
func uiLabGrid(t *testing.T, url string) {
	t.Helper()
	bg := context.Background()
	api := client.New(url, uiAdminSecret)
	var ids []int64
	for _, r := range []arbiter.Request{
		uiGridRequest("alice", uiKeepalive(60), 2, 1),
		uiGridRequest("bob", nil, 1),
		uiGridRequest("carol", uiKeepalive(60), 3),
		uiGridRequest("dave", nil, 2),
	} {
		a, err := api.Allocate(bg, r)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ID)
	}
	for _, id := range ids {
		uiWaitState(t, api, id, arbiter.StateReady)
	}
	if _, err := api.Release(bg, ids[3], "run finished"); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Allocate(bg, uiGridRequest("erin", nil, 1)); err != nil {
		t.Fatal(err)
	}
}

// TestDashboardGridBoardMap draws a grid machine's boards: a grid
// allocation made through the API appears on the map without a reload,
// first switching on then on; a tap tells a board's holder; released from
// the page, its boards wait switched off and are shown free again when the
// settling time is over, though no event says so.
func TestDashboardGridBoardMap(t *testing.T) {
	_, url := startServer(t, uiConfig(t, twoHosts+`
[[grid_machines]]
name = "spin5"
width = 2
height = 1
locations = "identity"
base_ip = "10.11.0.0"
power_delay_s = 1
dead_boards = [[1, 0, 2]]

[spalloc]
seconds_before_free = 2
`), nil)
	ctx := uiBrowser(t, 1366, 1000)
	if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret), chromedp.WaitVisible(chromedp.CSS("#m-spin5 .boardmap"))); err != nil {
		t.Fatal(err)
	}
	uiEval[bool](t, ctx, `window.arbiterNoReload = true`)
	count := func(sel string) int {
		t.Helper()
		return uiEval[int](t, ctx, `document.querySelectorAll(`+strconv.Quote(sel)+`).length`)
	}
	if f, d, tr := count("#m-spin5 .triads .gboard.free"), count("#m-spin5 .triads .gboard.dead"), count("#m-spin5 .triad"); f != 5 || d != 1 || tr != 2 {
		t.Fatalf("map of spin5: %d free, %d dead boards, %d triads; want 5, 1, 2", f, d, tr)
	}
	if s := uiText(t, ctx, "#p-summary .stat-boards"); !strings.Contains(s, "5") || !strings.Contains(s, "of 6") {
		t.Errorf("summary says %q, want 5 of 6 boards free", s)
	}

	api := client.New(url, uiUserSecret)
	a, err := api.Allocate(context.Background(), uiGridRequest("alice", uiKeepalive(600), 3))
	if err != nil {
		t.Fatal(err)
	}
	label := "#" + strconv.FormatInt(a.ID, 10)
	if err := chromedp.Do(ctx, uiWaitText("#m-spin5 .triads", label)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#m-spin5 .triads .gboard.held.pw-on"))); err != nil {
		t.Fatalf("the boards were not shown powered on: %v", err)
	}
	if n := count("#m-spin5 .triads .gboard.held.pw-on"); n != 3 {
		t.Errorf("%d boards shown held and on, want 3", n)
	}
	if h := uiText(t, ctx, "#m-spin5 .holders"); !strings.Contains(h, "alice") || !strings.Contains(h, "power on") {
		t.Errorf("legend says %q, want alice, power on", h)
	}
	// A tap tells the board's place, address and holder.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#m-spin5 .triads .gboard.held"))); err != nil {
		t.Fatal(err)
	}
	if info := uiText(t, ctx, "#m-spin5 .board-info"); !strings.Contains(info, "held by alice, allocation "+label) || !strings.Contains(info, "10.11.0.") {
		t.Errorf("after a tap: %q", info)
	}
	uiScreenshot(t, ctx, "dashboard-grid-held")

	// Release it from the page: the boards wait switched off, then are free.
	row := "#l-" + strconv.FormatInt(a.ID, 10)
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(row+` button[data-action="release"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
		chromedp.Click(chromedp.ID("confirm-ok")),
		chromedp.WaitVisible(chromedp.CSS("#m-spin5 .triads .gboard.held.pw-settling")),
	); err != nil {
		t.Fatal(err)
	}
	lastSeq := uiEval[string](t, ctx, `document.querySelector("#p-events .event") ? document.querySelector("#p-events .event").id : ""`)
	start := time.Now()
	if err := chromedp.Do(ctx, chromedp.WaitNotPresent(chromedp.CSS("#m-spin5 .triads .gboard.held"))); err != nil {
		t.Fatalf("the boards were not freed on the page: %v", err)
	}
	t.Logf("boards shown free %v after they were shown settling", time.Since(start).Round(10*time.Millisecond))
	if f := count("#m-spin5 .triads .gboard.free"); f != 5 {
		t.Errorf("%d boards free after the settling time, want 5", f)
	}
	if now := uiEval[string](t, ctx, `document.querySelector("#p-events .event").id`); now != lastSeq {
		t.Logf("an event came meanwhile (%s after %s): %s", now, lastSeq, uiText(t, ctx, "#p-events .events"))
	}
	if !uiEval[bool](t, ctx, `window.arbiterNoReload === true`) {
		t.Errorf("the page was reloaded")
	}
}

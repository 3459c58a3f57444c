package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// The dashboard driven in a real headless Chromium against the real server.
// The tests skip when no Chromium is installed (Debian: apt-get install
// chromium); ARBITER_CHROMIUM names another binary. Screenshots go to the
// test's temporary directory and, when ARBITER_SCREENSHOT_DIR is set, there.

const (
	uiAdminSecret = "ops-secret-0123456789abcdef"
	uiUserSecret  = "alice-secret-0123456789abcdef"
)

// uiChromium returns the Chromium binary or skips the test.
func uiChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ARBITER_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium binary found (apt-get install chromium, or set ARBITER_CHROMIUM)")
	return ""
}

// uiBrowser starts a fresh headless Chromium with the given window size and
// returns a tab's context; the browser is stopped when the test ends. The
// test fails if the page writes an error to the console or throws: a
// script error, a refused resource, a breach of the page's CSP.
func uiBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(uiChromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // start the browser now
		t.Fatalf("start chromium: %v", err)
	}
	var mu sync.Mutex
	var errs []string
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range chromedp.Console(cctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s %s:%d %s", m.Type, m.URL, m.Line, m.Text))
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, e := range errs {
			// The one error a test causes on purpose: the cross-site page's
			// POST refused for want of credentials.
			// And the swap the test asks for while the swap lock is held (423).
			if !strings.Contains(e, "/api/v1/allocations:0 Failed to load resource: the server responded with a status of 401") &&
				!strings.Contains(e, "/swaps:0 Failed to load resource: the server responded with a status of 423") {
				t.Errorf("browser console: %s", e)
			}
		}
	})
	return ctx
}

// uiConfig is a configuration with an admin and a user token, read from
// files in a temporary directory.
func uiConfig(t *testing.T, machines string) string {
	t.Helper()
	dir := t.TempDir()
	admin, user := filepath.Join(dir, "ops"), filepath.Join(dir, "alice")
	if err := os.WriteFile(admin, []byte(uiAdminSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(user, []byte(uiUserSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return machines + fmt.Sprintf(`
[[tokens]]
name = "ops"
role = "admin"
token_file = %q

[[tokens]]
name = "alice"
role = "user"
token_file = %q
`, admin, user)
}

// uiLogin signs in through the page's form and waits for the live page.
func uiLogin(url, secret string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), secret),
		chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID("p-machines")),
		chromedp.WaitVisible(chromedp.CSS(`#conn[data-state="live"]`)),
	)
}

// uiEval evaluates a JavaScript expression in the page.
func uiEval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// uiText returns the text of the element a CSS selector finds.
func uiText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// uiScreenshot saves a full-page PNG in the test's directory and, when
// uiSize is a window the dashboard is checked at.
type uiSize struct {
	name string
	w, h int
	dark bool
}

var uiSizes = []uiSize{{"laptop", 1440, 900, false}, {"phone", 390, 844, false}, {"laptop-dark", 1440, 900, true}}

// uiBrowserAt is uiBrowser at size s: its viewport emulated (a phone's is
// narrower than a headless window may be), in dark mode when s asks.
func uiBrowserAt(t *testing.T, s uiSize) context.Context {
	t.Helper()
	ctx := uiBrowser(t, s.w, s.h)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(s.w), int64(s.h), chromedp.EmulateMobile)); err != nil {
		t.Fatal(err)
	}
	if s.dark {
		dark := emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}}
		if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, dark); err != nil {
			t.Fatal(err)
		}
	}
	return ctx
}

// ARBITER_SCREENSHOT_DIR is set, there too.
func uiScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	// From the top, so the sticky header is where a reader sees it.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.scrollTo(0, 0), true`)); err != nil {
		t.Fatalf("scroll: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	uiSavePNG(t, name, png)
}

// uiScreenshotOf saves a PNG of the element sel finds, like uiScreenshot.
func uiScreenshotOf(t *testing.T, ctx context.Context, sel, name string) {
	t.Helper()
	// The live stream may render the panel again between finding its node
	// and capturing it; then the node is gone ("No node with given id
	// found") and the next try finds the new one.
	var png []byte
	var err error
	poll.Until(t, 10*time.Second, "a screenshot of "+sel+" while the page renders it again", func() bool {
		png, err = chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
		return err == nil || !strings.Contains(err.Error(), "No node with given id found")
	})
	if err != nil {
		t.Fatalf("screenshot of %s: %v", sel, err)
	}
	uiSavePNG(t, name, png)
}

func uiSavePNG(t *testing.T, name string, png []byte) {
	t.Helper()
	dirs := []string{t.TempDir()}
	if d := os.Getenv("ARBITER_SCREENSHOT_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(d, name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s (%d bytes)", p, len(png))
	}
}

func uiKeepalive(s float64) *float64 { return &s }

// uiPost sends a JSON body with a bearer token and fails the test unless
// the answer is 2xx.
func uiPost(t *testing.T, url, secret, path, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
	}
}

// uiNoOverflow fails the test if the page is wider than the window: at
// every width the page scrolls down, never sideways (tables scroll inside
// their panel).
func uiNoOverflow(t *testing.T, ctx context.Context) {
	t.Helper()
	wide := uiEval[[]string](t, ctx, `(() => {
		const w = document.documentElement.clientWidth, out = [];
		if (document.documentElement.scrollWidth <= w) return out;
		for (const el of document.querySelectorAll("body *")) {
			const r = el.getBoundingClientRect();
			if (r.right <= w + 1) continue;
			let clipped = false;
			for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
				if (getComputedStyle(p).overflowX !== "visible") { clipped = true; break; }
			}
			if (!clipped) out.push(el.tagName + (el.id ? "#" + el.id : "") + "." + el.className + " right " + Math.round(r.right));
		}
		return out.length ? out.slice(0, 10) : ["page " + document.documentElement.scrollWidth + " > " + w];
	})()`)
	if len(wide) > 0 {
		t.Errorf("the page is wider than the window %d: %v", len(wide), wide)
	}
}

// TestDashboardLiveAllocationAndRelease signs in as an admin, sees an
// allocation made through the API appear without a reload, and releases it
// from the page.
func TestDashboardLiveAllocationAndRelease(t *testing.T) {
	ctx := uiBrowser(t, 1366, 900)
	_, url := startServer(t, uiConfig(t, twoHosts), nil)

	if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret)); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	// The cookie keeps the session from scripts and from other sites, and
	// is not the token (issue 12, finding 7).
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, c := range res.Cookies {
		if c.Name == "arbiter_session" {
			found = true
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
				t.Errorf("cookie: HttpOnly %v SameSite %q, want HttpOnly and Strict", c.HTTPOnly, c.SameSite)
			}
			if dec, _ := base64.RawURLEncoding.DecodeString(c.Value); strings.Contains(c.Value, uiAdminSecret) || strings.Contains(string(dec), uiAdminSecret) {
				t.Errorf("the cookie holds the token: %q", c.Value)
			}
		}
	}
	if !found {
		t.Fatalf("no arbiter_session cookie after sign-in: %+v", res.Cookies)
	}
	uiEval[bool](t, ctx, `window.arbiterNoReload = true`)
	if free := uiText(t, ctx, "#m-gpu1 .free-count"); !strings.HasPrefix(free, "8/8") {
		t.Errorf("gpu1 shows %q, want 8/8 free", free)
	}

	// An allocation made through the API appears without a reload.
	api := client.New(url, uiUserSecret)
	a, err := api.Allocate(context.Background(), arbiter.Request{Owner: "alice", GPUs: 2, KeepaliveS: uiKeepalive(600)})
	if err != nil || a.State != arbiter.StateReady {
		t.Fatalf("allocate: %+v, %v", a, err)
	}
	row := "#l-" + strconv.FormatInt(a.ID, 10)
	tile := fmt.Sprintf("#g-%s-%d", a.Devices[0].Machine, a.Devices[0].Index)
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(tile+".held")),
	); err != nil {
		t.Fatalf("waiting for allocation %d on the page: %v", a.ID, err)
	}
	if owner := uiText(t, ctx, tile+" .gpu-owner"); owner != "alice" {
		t.Errorf("tile %s shows owner %q, want alice", tile, owner)
	}
	if !uiEval[bool](t, ctx, `window.arbiterNoReload === true`) {
		t.Errorf("the page was reloaded")
	}
	uiScreenshot(t, ctx, "dashboard-held")

	// Release it from the page, as the admin, through the confirmation.
	hist := "#h-" + strconv.FormatInt(a.ID, 10)
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(row+` button[data-action="release"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
		chromedp.Click(chromedp.ID("confirm-ok")),
		chromedp.WaitNotPresent(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(hist)),
		chromedp.WaitVisible(chromedp.CSS(tile+".free")),
	); err != nil {
		t.Fatalf("release from the page: %v", err)
	}
	if reason := uiText(t, ctx, hist+" td.why"); !strings.Contains(reason, "released by ops") {
		t.Errorf("history reason %q, want released by ops", reason)
	}
	if !uiEval[bool](t, ctx, `window.arbiterNoReload === true`) {
		t.Errorf("the page was reloaded")
	}
	got, err := api.Allocation(context.Background(), a.ID)
	if err != nil || got.State != arbiter.StateDestroyed {
		t.Errorf("allocation after release: %+v, %v; want destroyed", got, err)
	}
	uiScreenshot(t, ctx, "dashboard-released")

	// Drain a machine and undrain it again.
	for _, step := range []struct{ action, state string }{{"drain", "draining"}, {"undrain", "up"}} {
		if err := chromedp.Do(ctx,
			chromedp.Click(chromedp.CSS(`#m-gpu2 button[data-action="`+step.action+`"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
			chromedp.Click(chromedp.ID("confirm-ok")),
			chromedp.WaitVisible(chromedp.CSS(`#m-gpu2.state-`+step.state)),
		); err != nil {
			t.Fatalf("%s gpu2 from the page: %v", step.action, err)
		}
		m, err := api.Machine(context.Background(), "gpu2")
		if err != nil || m.State != step.state {
			t.Errorf("after %s: gpu2 is %q (%v), want %s", step.action, m.State, err, step.state)
		}
	}
}

// TestDashboardUserSeesNoAdminButtons signs in with a user token: it may
// release its own allocation but sees no drain buttons and no release
// buttons on allocations that are not its own. A page of another site
// cannot act with the cookie.
func TestDashboardUserSeesNoAdminButtons(t *testing.T) {
	ctx := uiBrowser(t, 1280, 900)
	_, url := startServer(t, uiConfig(t, twoHosts), nil)
	bg := context.Background()
	mine, err := client.New(url, uiUserSecret).Allocate(bg, arbiter.Request{Owner: "alice", GPUs: 1, KeepaliveS: uiKeepalive(600)})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := client.New(url, uiAdminSecret).Allocate(bg, arbiter.Request{Owner: "bob", GPUs: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		uiLogin(url, uiUserSecret),
		chromedp.WaitVisible(chromedp.CSS("#l-"+strconv.FormatInt(theirs.ID, 10))),
	); err != nil {
		t.Fatal(err)
	}
	admin := uiEval[int](t, ctx, `document.querySelectorAll(".admin").length`)
	drain := uiEval[int](t, ctx, `document.querySelectorAll('[data-action="drain"], [data-action="undrain"]').length`)
	mineBtn := uiEval[int](t, ctx, `document.querySelectorAll('#l-`+strconv.FormatInt(mine.ID, 10)+` [data-action="release"]').length`)
	theirsBtn := uiEval[int](t, ctx, `document.querySelectorAll('#l-`+strconv.FormatInt(theirs.ID, 10)+` [data-action="release"]').length`)
	role := uiText(t, ctx, ".user .role")
	if admin != 0 || drain != 0 || theirsBtn != 0 || mineBtn != 1 || role != "user" {
		t.Errorf("user sees %d admin buttons, %d drain buttons, %d release on bob's, %d on its own, role %q; want 0, 0, 0, 1, user",
			admin, drain, theirsBtn, mineBtn, role)
	}

	// Another site's page (localhost is a different site from 127.0.0.1)
	// posts to the server: the Strict cookie is not sent, nothing happens.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><title>evil</title><link rel="icon" href="data:,"><script>`+
			`fetch(%q, {method: "POST", credentials: "include", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: '{"owner":"mallory","gpus":1}'})`+
			`.finally(() => { document.title = "sent"; });</script>`, url+"/api/v1/allocations")
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)
	if err := chromedp.Do(ctx, chromedp.Navigate(evilURL)); err != nil {
		t.Fatalf("cross-site page: %v", err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.title === "sent"`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("cross-site page did not post: %v", err)
	}
	as, err := client.New(url, uiAdminSecret).Allocations(bg, arbiter.AllocationFilter{Owner: "mallory"})
	if err != nil || len(as) != 0 {
		t.Errorf("a cross-site POST created allocations %+v (%v)", as, err)
	}
}

// TestDashboardLockBanner shows a lock taken through the API as a banner at
// once, and lets an admin force its release from the page.
func TestDashboardLockBanner(t *testing.T) {
	ctx := uiBrowser(t, 1280, 900)
	_, url := startServer(t, uiConfig(t, twoHosts), nil)
	if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret)); err != nil {
		t.Fatal(err)
	}
	if n := uiEval[int](t, ctx, `document.querySelectorAll("#p-locks:not([hidden])").length`); n != 0 {
		t.Fatalf("a lock banner with no lock held")
	}
	uiPost(t, url, uiUserSecret, "/api/v1/locks/swap", `{"holder":"cron-swapper","ttl_s":600,"note":"nightly swap"}`)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#lock-swap"))); err != nil {
		t.Fatalf("no lock banner: %v", err)
	}
	if text := uiText(t, ctx, "#lock-swap .lock-text"); !strings.Contains(text, "cron-swapper") || !strings.Contains(text, "nightly swap") || !strings.Contains(text, "expires in 9 min") {
		t.Errorf("banner says %q, want holder, note and time left", text)
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#lock-swap button[data-action="lock-release"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
		chromedp.Click(chromedp.ID("confirm-ok")),
		chromedp.WaitNotVisible(chromedp.ID("p-locks")),
	); err != nil {
		t.Fatalf("force release from the page: %v", err)
	}
}

// TestDashboardCrossSiteWithCookieRefused sends what a browser would send
// if it attached the cookie to another site's request: refused, and so is a
// request with the cookie that lacks the page's header.
func TestDashboardCrossSiteWithCookieRefused(t *testing.T) {
	_, url := startServer(t, uiConfig(t, twoHosts), nil)
	cookie := signInCookie(t, url, uiAdminSecret)
	post := func(site, origin string, csrf bool) int {
		req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/machines/gpu1/drain", nil)
		req.AddCookie(cookie)
		if site != "" {
			req.Header.Set("Sec-Fetch-Site", site)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if csrf {
			req.Header.Set("X-Arbiter-CSRF", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("cross-site", "https://evil.example", true); got != http.StatusForbidden {
		t.Errorf("cross-site POST with the cookie: got %d, want 403", got)
	}
	if got := post("", "https://evil.example", true); got != http.StatusForbidden {
		t.Errorf("POST with the cookie from another Origin: got %d, want 403", got)
	}
	if got := post("same-origin", url, false); got != http.StatusForbidden {
		t.Errorf("POST with the cookie without X-Arbiter-CSRF: got %d, want 403", got)
	}
	m, err := client.New(url, uiAdminSecret).Machine(context.Background(), "gpu1")
	if err != nil || m.State != arbiter.MachineUp {
		t.Fatalf("gpu1 after refused requests: %s, %v; want up", m.State, err)
	}
	if got := post("same-origin", url, true); got != http.StatusOK {
		t.Errorf("the page's own POST: got %d, want 200", got)
	}
}

// threeHosts is a small lab: two 8-GPU H100 hosts and a 4-GPU A100 host.
const threeHosts = `
[[machines]]
name = "gpu1"
tags = ["h100"]
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8 } ]

[[machines]]
name = "gpu2"
tags = ["h100"]
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8 } ]

[[machines]]
name = "gpu3"
tags = ["a100"]
cuda = "12.2"
gpus = [ { model = "NVIDIA A100-SXM4-40GB", vram_gib = 40, compute = "8.0", count = 4 } ]
`

// TestDashboardScreenshotThreeHosts renders a busy lab at laptop and phone
// widths, for a person to judge: who holds what, what waits and why — three
// GPU hosts, a grid machine, a vLLM service with its swaps and webhooks.
func TestDashboardScreenshotThreeHosts(t *testing.T) {
	_, url := startServer(t, uiConfig(t, threeHosts+uiLabGridMachine+uiLabServices), nil)
	bg := context.Background()
	admin := client.New(url, uiAdminSecret)
	user := client.New(url, uiUserSecret)
	must := func(a arbiter.Allocation, err error) arbiter.Allocation {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	must(user.Allocate(bg, arbiter.Request{Owner: "alice", GPUs: 4, Tags: []string{"h100"}, KeepaliveS: uiKeepalive(60)}))
	must(admin.Allocate(bg, arbiter.Request{Owner: "bob", GPUs: 8, Tags: []string{"h100"}}))
	must(admin.Allocate(bg, arbiter.Request{Owner: "carol", GPUs: 2, Machine: "gpu3", KeepaliveS: uiKeepalive(300)}))
	done := must(admin.Allocate(bg, arbiter.Request{Owner: "dave", GPUs: 1, Machine: "gpu3", KeepaliveS: uiKeepalive(300)}))
	if _, err := admin.Release(bg, done.ID, "job finished"); err != nil {
		t.Fatal(err)
	}
	must(admin.Allocate(bg, arbiter.Request{Owner: "erin", GPUs: 6, Tags: []string{"h100"}, Priority: 10, KeepaliveS: uiKeepalive(120)}))
	must(admin.Allocate(bg, arbiter.Request{Owner: "frank", GPUs: 2, MinVRAMGiB: 80, KeepaliveS: uiKeepalive(120)}))
	must(admin.Allocate(bg, arbiter.Request{Owner: "grace", GPUs: 8, Model: "*A100*"}))
	must(admin.Allocate(bg, arbiter.Request{Owner: "heidi", GPUs: 4, Tags: []string{"h100"}, KeepaliveS: uiKeepalive(120)}))
	if _, err := admin.SetDraining(bg, "gpu3", true); err != nil {
		t.Fatal(err)
	}
	must(admin.Allocate(bg, arbiter.Request{Owner: "ivan", GPUs: 1, Model: "*A100*", KeepaliveS: uiKeepalive(120)}))
	// A task's allocation is owned by "task:" and 64 hex digits: the page
	// shows a short id, at every width.
	must(admin.Allocate(bg, arbiter.Request{Owner: arbiter.TaskOwnerPrefix + strings.Repeat("9f3c2e71", 8), GPUs: 1, Machine: "gpu1"}))
	uiLabGrid(t, url)
	uiLabCoordination(t, url) // takes the swap lock
	uiPost(t, url, uiUserSecret, "/api/v1/schedules", `{"id":"nightly-eval","name":"Nightly eval","owner":"ml-platform","cron":"0 2 * * *","description":"Swaps gpu2's vLLM model, runs the eval suite, swaps back."}`)
	for _, size := range uiSizes {
		t.Run(size.name, func(t *testing.T) {
			ctx := uiBrowserAt(t, size)
			if err := chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("token"))); err != nil {
				t.Fatal(err)
			}
			uiScreenshot(t, ctx, "dashboard-sign-in-"+size.name)
			if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret)); err != nil {
				t.Fatal(err)
			}
			uiNoOverflow(t, ctx)
			uiScreenshot(t, ctx, "dashboard-"+size.name)
			uiScreenshotOf(t, ctx, "#m-spin5", "dashboard-grid-"+size.name)
			uiScreenshotOf(t, ctx, "#p-services", "dashboard-services-"+size.name)
		})
	}
}

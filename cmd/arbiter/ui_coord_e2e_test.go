package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// The dashboard's coordination panels in headless Chromium: a swap started
// from the page runs on the real agent against a fake vLLM endpoint and its
// log streams into the page; a held swap lock refuses the next one with the
// server's 423 message; the webhook delivery panel follows the dispatcher.

const uiAgentSecret = "node1-secret-0123456789abcdef"

// uiCoordConfig is the coordination rig's configuration (service vllm on
// node1) with the dashboard's tokens and an agent token for node1.
func uiCoordConfig(t *testing.T, rig *coordRig) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "node1")
	if err := os.WriteFile(f, []byte(uiAgentSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return uiConfig(t, rig.config) + fmt.Sprintf(`
[[tokens]]
name = "node1"
role = "agent"
token_file = %q
`, f)
}

// uiStartAgent runs the real `arbiter agent` binary as node1 with the agent
// token and a fake nvidia-smi, until the test ends.
func uiStartAgent(t *testing.T, url string) {
	t.Helper()
	bin := buildBinary(t)
	pathDir := fakeSMIDir(t)
	cmd := exec.Command(bin, "agent", "--url", url, "--name", "node1", "--heartbeat", "200ms", "--no-nvml", "--work-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "PATH="+pathDir+":"+os.Getenv("PATH"), "FAKE_NVIDIA_SMI=h100x8", "ARBITER_TOKEN="+uiAgentSecret)
	runProcess(t, cmd, "agent", 10*time.Second)
	c := client.New(url, uiAdminSecret)
	poll.Until(t, 30*time.Second, "the agent to register node1", func() bool { _, err := c.Machine(context.Background(), "node1"); return err == nil })
}

// uiSlowLaunch replaces the rig's launch script with one that takes two
// seconds between its first lines and its last, so the test can see the log
// arrive while the swap still runs.
func uiSlowLaunch(t *testing.T, rig *coordRig) {
	t.Helper()
	if err := os.WriteFile(rig.script, []byte(`#!/bin/sh
echo "stopping the old server"
echo "loading $1 onto 8 GPUs"
sleep 2
echo "starting vllm serve $1 $3 $4" >&2
case "$1" in *broken*) echo "cannot load $1"; exit 4;; esac
(sleep 0.2; echo "$1" > "$2") &
echo "launched"
`), 0o755); err != nil {
		t.Fatal(err)
	}
}

// uiWaitText waits until the text of sel contains want.
func uiWaitText(sel, want string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want)
	return uiWaitJS(js, fmt.Sprintf("%q in %s", want, sel))
}

// uiWaitDataState waits until the element sel carries data-state="want".
func uiWaitDataState(sel, want string) chromedp.Action[chromedp.Void] {
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.dataset.state === %q; })()`, sel, want)
	return uiWaitJS(js, fmt.Sprintf("%s to be %s", sel, want))
}

// uiWaitJS polls the page until the expression js is true.
func uiWaitJS(js, what string) chromedp.Action[chromedp.Void] {
	poll := chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		if _, err := poll(ctx, tg); err != nil {
			return chromedp.Void{}, fmt.Errorf("waiting for %s: %w", what, err)
		}
		return chromedp.Void{}, nil
	}
}

// TestDashboardSwapFromThePage signs in as a user, swaps the service to a
// catalog model from the page, watches the log stream in while the swap
// runs on the real agent, then meets a swap lock held by someone else.
func TestDashboardSwapFromThePage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ctx := uiBrowser(t, 1366, 1000)
	rig := newCoordRig(t, "")
	uiSlowLaunch(t, rig)
	_, url := startServer(t, uiCoordConfig(t, rig), nil, "--no-local")
	uiStartAgent(t, url)

	if err := chromedp.Do(ctx,
		uiLogin(url, uiUserSecret),
		chromedp.WaitVisible(chromedp.ID("svc-vllm")),
	); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	uiEval[bool](t, ctx, `window.arbiterNoReload = true`)
	if s := uiText(t, ctx, "#svc-vllm .serving"); !strings.Contains(s, "unknown") {
		t.Errorf("before any swap the service shows %q, want unknown", s)
	}
	if n := uiEval[int](t, ctx, `document.querySelectorAll("#swap-to-vllm option").length`); n != 3 {
		t.Errorf("the swap control lists %d models, want the catalog's 3", n)
	}

	// Swap to gemma from the page, through the confirmation.
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("swap-to-vllm"), "gemma"),
		chromedp.Click(chromedp.CSS(`#svc-vllm button[data-action="swap"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
	); err != nil {
		t.Fatal(err)
	}
	if title := uiText(t, ctx, "#confirm-title"); title != "Swap vllm to gemma?" {
		t.Errorf("confirmation asks %q", title)
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("confirm-ok"))); err != nil {
		t.Fatal(err)
	}
	// The first lines arrive while the swap still runs (the script sleeps
	// before its last line).
	if err := chromedp.Do(ctx, uiWaitText("#swaplog pre", "loading google/gemma-3-27b-it onto 8 GPUs")); err != nil {
		t.Fatal(err)
	}
	// The log streams on its own connection; the swap list is re-rendered
	// after the "running" event, so it may trail the first lines a little.
	if text := uiText(t, ctx, "#swaplog pre"); strings.Contains(text, "launched") {
		t.Errorf("when the first lines showed the log already held the last one:\n%s", text)
	}
	if err := chromedp.Do(ctx, uiWaitDataState("#sw-1", arbiter.SwapRunning)); err != nil {
		t.Fatal(err)
	}
	if text := uiText(t, ctx, "#swaplog pre"); strings.Contains(text, "launched") {
		t.Errorf("the swap showed running only after its last line:\n%s", text)
	}
	if head := uiText(t, ctx, "#swaplog .swaplog-head"); !strings.Contains(head, "swap #1 · vllm → gemma") || !strings.Contains(head, "live") {
		t.Errorf("log heading %q, want swap #1 · vllm → gemma, live", head)
	}
	uiScreenshot(t, ctx, "dashboard-swap-running")
	if err := chromedp.Do(ctx,
		uiWaitText("#swaplog pre", "launched"),
		uiWaitText("#sw-1", "complete"),
		uiWaitText("#svc-vllm .serving", "gemma"),
		uiWaitText("#swaplog .swaplog-head", "complete"),
	); err != nil {
		t.Fatal(err)
	}
	text := uiText(t, ctx, "#swaplog pre")
	for _, want := range []string{"stopping the old server", "starting vllm serve google/gemma-3-27b-it --max-model-len 8192", "launched", "serves gemma"} {
		if !strings.Contains(text, want) {
			t.Errorf("the page's log lacks %q:\n%s", want, text)
		}
	}
	if n := strings.Count(text, "stopping the old server"); n != 1 {
		t.Errorf("a line shows %d times:\n%s", n, text)
	}
	sw, err := client.New(url, uiUserSecret).Swap(context.Background(), "1")
	if err != nil || sw.State != arbiter.SwapComplete || sw.RequestedBy != "alice" {
		t.Fatalf("swap 1: %+v, %v; want complete, requested by alice", sw, err)
	}
	uiScreenshot(t, ctx, "dashboard-swap-complete")

	// Someone else takes the service's swap lock: the page says so, and a
	// swap from the page is refused with the server's message.
	uiPost(t, url, uiAdminSecret, "/api/v1/locks/swap:vllm", `{"holder":"nightly-eval","ttl_s":1800,"note":"eval suite on gemma"}`)
	if err := chromedp.Do(ctx,
		uiWaitText("#svc-vllm .svc-lock", "nightly-eval"),
		chromedp.SetValue(chromedp.ID("swap-to-vllm"), "ten31"),
		chromedp.Click(chromedp.CSS(`#svc-vllm button[data-action="swap"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm[open]`)),
		chromedp.Click(chromedp.ID("confirm-ok")),
		uiWaitText("#swapmsg-vllm", `held by "nightly-eval"`),
	); err != nil {
		t.Fatal(err)
	}
	if msg := uiText(t, ctx, "#swapmsg-vllm"); !strings.Contains(msg, "X-Swap-Lock-Token") {
		t.Errorf("refusal says %q, want the server's 423 message", msg)
	}
	if n := uiEval[int](t, ctx, `document.querySelectorAll('#svc-vllm input[name="force"]').length`); n != 0 {
		t.Errorf("a user is offered to override the lock")
	}
	uiScreenshot(t, ctx, "dashboard-swap-locked")
	// The message stays through the refreshes that follow events.
	uiPost(t, url, uiAdminSecret, "/api/v1/schedules", `{"id":"x","name":"x","cron":"@daily"}`)
	if _, err := client.New(url, uiAdminSecret).Allocate(context.Background(), arbiter.Request{Owner: "bob", GPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#p-live tbody tr"))); err != nil {
		t.Fatal(err)
	}
	if msg := uiText(t, ctx, "#swapmsg-vllm"); !strings.Contains(msg, "nightly-eval") {
		t.Errorf("the refusal vanished after a refresh: %q", msg)
	}
	if _, err := client.New(url, uiUserSecret).Swap(context.Background(), "2"); err == nil {
		t.Errorf("a swap was made past the lock")
	}
	// The log of the first swap is still there, and picking it again from
	// the table shows it whole.
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#sw-1 button[data-action="swap-log"]`)),
		uiWaitText("#swaplog pre", "serves gemma"),
	); err != nil {
		t.Fatal(err)
	}
	if !uiEval[bool](t, ctx, `window.arbiterNoReload === true`) {
		t.Errorf("the page was reloaded")
	}
}

// TestDashboardWebhookDeliveries shows an admin the delivery attempts of a
// subscription whose receiver fails, then succeeds, without a reload; a
// user sees no delivery panel.
func TestDashboardWebhookDeliveries(t *testing.T) {
	recv := coordNewHookReceiver(t)
	recv.status.Store(500)
	_, url := startServer(t, uiConfig(t, twoHosts+`
[webhooks]
retry_min_s = 3
retry_max_s = 3
`), nil)
	ctx := uiBrowser(t, 1366, 1000)
	if err := chromedp.Do(ctx, uiLogin(url, uiAdminSecret)); err != nil {
		t.Fatal(err)
	}
	if n := uiEval[int](t, ctx, `document.querySelectorAll("#p-deliveries:not([hidden])").length`); n != 0 {
		t.Errorf("a delivery panel without subscriptions")
	}
	uiPost(t, url, uiAdminSecret, "/api/v1/webhooks", fmt.Sprintf(`{"id":"chat","url":%q,"kinds":["lock.*"]}`, recv.URL+"/hook"))
	uiPost(t, url, uiUserSecret, "/api/v1/locks/swap", `{"holder":"nightly","ttl_s":600}`)
	// The first attempt fails with 500: the page shows it and the retry.
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.ID("p-deliveries")),
		uiWaitText("#p-deliveries tbody", "500 Internal Server Error"),
	); err != nil {
		t.Fatal(err)
	}
	row := strings.ToLower(uiText(t, ctx, "#p-deliveries tbody tr")) // badges are upper case on screen
	for _, want := range []string{"lock.acquired", "chat", "pending", "500 internal server error", "in "} {
		if !strings.Contains(row, want) {
			t.Errorf("delivery row %q lacks %q", row, want)
		}
	}
	uiScreenshot(t, ctx, "dashboard-deliveries-failing")
	// The receiver recovers: the retry is delivered and the page shows it.
	recv.status.Store(200)
	if err := chromedp.Do(ctx, uiWaitText("#p-deliveries tbody", "delivered")); err != nil {
		t.Fatal(err)
	}
	if row := uiText(t, ctx, "#p-deliveries tbody tr"); !strings.Contains(row, "200 OK") || !strings.Contains(row, "\t2\t") {
		t.Errorf("after the retry the row says %q, want attempt 2, 200 OK", row)
	}
	uiScreenshot(t, ctx, "dashboard-deliveries")

	// A user's page has no delivery panel.
	uctx := uiBrowser(t, 1024, 800)
	if err := chromedp.Do(uctx, uiLogin(url, uiUserSecret)); err != nil {
		t.Fatal(err)
	}
	if n := uiEval[int](t, uctx, `document.querySelectorAll("#p-deliveries:not([hidden]), #p-deliveries tbody tr").length`); n != 0 {
		t.Errorf("a user sees the delivery panel")
	}
}

// uiCall sends one API request with a bearer token and returns the status
// and the decoded answer; hdr holds extra headers as "Name: value".
func uiCall(t *testing.T, url, secret, method, path, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// uiLabServices is a vLLM service on gpu2 of threeHosts with a catalog of
// three models. Its agent is the test itself (uiLabCoordination claims and
// reports the swaps through the API), so the endpoint is never asked.
const uiLabServices = `
[[services]]
name = "vllm"
machine = "gpu2"
kind = "vllm"
endpoint = "http://127.0.0.1:8000"
swap_command = ["/opt/vllm/launch.sh", "{model}", "{args}"]
default = true

[[services.catalog]]
key = "llama-8b"
repo = "meta-llama/Llama-3.1-8B-Instruct"

[[services.catalog]]
key = "llama-70b"
repo = "meta-llama/Llama-3.3-70B-Instruct"
args = ["--tensor-parallel-size", "8"]

[[services.catalog]]
key = "gemma"
repo = "google/gemma-3-27b-it"
args = ["--max-model-len", "8192"]
`

// uiLabCoordination gives the lab a history of swaps (one complete, one
// failed, one running under the nightly job's lock) and two webhook
// subscriptions, one of whose receivers fails.
func uiLabCoordination(t *testing.T, url string) {
	t.Helper()
	ok := coordNewHookReceiver(t)
	down := coordNewHookReceiver(t)
	down.status.Store(503)
	uiPost(t, url, uiAdminSecret, "/api/v1/webhooks", fmt.Sprintf(`{"id":"chat","url":%q,"kinds":["swap.*"]}`, ok.URL+"/arbiter"))
	uiPost(t, url, uiAdminSecret, "/api/v1/webhooks", fmt.Sprintf(`{"id":"pager","url":%q,"kinds":["swap.failed","lock.acquired"]}`, down.URL+"/alert"))
	run := func(key string, lines []string, finish string, hdr ...string) {
		t.Helper()
		code, sw := uiCall(t, url, uiAdminSecret, "POST", "/api/v1/services/vllm/swaps", fmt.Sprintf(`{"model_key":%q}`, key), hdr...)
		if code != http.StatusAccepted {
			t.Fatalf("swap to %s: %d %v", key, code, sw)
		}
		id := sw["id"].(string)
		if code, c := uiCall(t, url, uiAdminSecret, "POST", "/api/v1/machines/gpu2/swaps/claim", ""); code != 200 || c["id"] != id {
			t.Fatalf("claim swap %s: %d %v", id, code, c)
		}
		b, _ := json.Marshal(map[string]any{"machine": "gpu2", "lines": lines})
		if code, _ := uiCall(t, url, uiAdminSecret, "POST", "/api/v1/swaps/"+id+"/log", string(b)); code != http.StatusNoContent {
			t.Fatalf("log of swap %s: %d", id, code)
		}
		if finish != "" {
			if code, f := uiCall(t, url, uiAdminSecret, "POST", "/api/v1/swaps/"+id+"/finish", finish); code != 200 {
				t.Fatalf("finish swap %s: %d %v", id, code, f)
			}
		}
	}
	run("llama-8b", []string{"stopping the old server", "starting vllm serve meta-llama/Llama-3.1-8B-Instruct", "launched",
		"arbiter agent: the swap command exited with status 0", "arbiter agent: http://127.0.0.1:8000/v1/models serves llama-8b"},
		`{"machine":"gpu2","ok":true,"returncode":0}`)
	run("gemma", []string{"stopping the old server", "starting vllm serve google/gemma-3-27b-it --max-model-len 8192",
		"ValueError: The model's max seq len (8192) is larger than the maximum number of tokens that can be stored in KV cache", "arbiter agent: the swap command exited with status 1"},
		`{"machine":"gpu2","ok":false,"returncode":1,"reason":"the swap command exited with status 1"}`)
	code, lock := uiCall(t, url, uiAdminSecret, "POST", "/api/v1/locks/swap", `{"holder":"nightly-eval","ttl_s":1800,"note":"swapping gpu2's vLLM to llama-70b"}`)
	if code != 200 {
		t.Fatalf("lock: %d %v", code, lock)
	}
	run("llama-70b", []string{"stopping the old server", "starting vllm serve meta-llama/Llama-3.3-70B-Instruct --tensor-parallel-size 8",
		"INFO 06-18 02:00:41 Loading safetensors checkpoint shards:  34% Completed | 10/30"}, "", "X-Swap-Lock-Token: "+lock["token"].(string))
}

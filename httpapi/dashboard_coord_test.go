package httpapi

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// The dashboard's coordination and grid panels, rendered by the real
// server over the real control loop (coordEnv) or the fake plane.

func TestUIServicesPanel(t *testing.T) {
	e := newCoordEnv(t)
	// No swap yet: each role sees the service; users and admins the control.
	for _, tc := range []struct {
		secret  string
		control bool
	}{{testAdmin, true}, {testUser, true}, {testAgent, false}} {
		p := uiPanelsAnswer(t, e.s, tc.secret, "?p=services")["services"]
		if !strings.Contains(p, `id="svc-vllm"`) || !strings.Contains(p, "no swap has completed yet") || !strings.Contains(p, "No swap yet") {
			t.Fatalf("services panel:\n%s", p)
		}
		has := strings.Contains(p, `data-action="swap" data-service="vllm"`)
		if has != tc.control || has != strings.Contains(p, `<option value="gemma" data-model="google/gemma-3-27b-it">`) {
			t.Errorf("token %s: swap control shown %v, want %v:\n%s", tc.secret, has, tc.control, p)
		}
	}

	// A complete swap, then one in progress.
	user := arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}
	agent := arbiter.Caller{Name: "gpu1", Role: arbiter.RoleAgent}
	sw := e.do(arbiter.RequestSwap{Caller: user, Service: "vllm", ModelKey: "gemma"}).(arbiter.Swap)
	e.do(arbiter.ClaimSwap{Caller: agent, Machine: "gpu1"})
	e.do(arbiter.AppendSwapLog{Caller: agent, ID: sw.ID, Machine: "gpu1", Lines: []string{"one", "two"}})
	rc := 0
	e.do(arbiter.FinishSwap{Caller: agent, ID: sw.ID, Machine: "gpu1", OK: true, ReturnCode: &rc})
	sw2 := e.do(arbiter.RequestSwap{Caller: user, Service: "vllm", ModelKey: "ten31"}).(arbiter.Swap)
	p := uiPanelsAnswer(t, e.s, testUser, "?p=services")["services"]
	for _, want := range []string{
		"Swapping from <strong>gemma</strong> to", `<strong class="model">ten31</strong>`, "waiting for the agent on gpu1",
		`id="sw-` + sw2.ID + `" data-swap="` + sw2.ID + `" data-service="vllm" data-key="ten31" data-state="pending"`,
		`id="sw-` + sw.ID + `"`, "exit 0", `title="show its log: 2 lines"`,
		// The log shown by default is the swap in progress.
		`id="swaplog" data-keep data-default="` + sw2.ID + `"`,
		"the next can start when #" + sw2.ID + " ends",
	} {
		if !strings.Contains(p, want) {
			t.Errorf("services panel lacks %q:\n%s", want, p)
		}
	}
	if strings.Index(p, `id="sw-`+sw2.ID+`"`) > strings.Index(p, `id="sw-`+sw.ID+`"`) {
		t.Errorf("swaps: want the newest first")
	}
	if strings.Contains(p, `data-action="swap" `) {
		t.Errorf("a swap control while a swap is in progress:\n%s", p)
	}

	// A held swap lock: everyone is told; only an admin may override it.
	e.do(arbiter.AcquireLock{Caller: user, Name: "swap:vllm", Holder: "nightly", TTL: 30 * time.Minute, Note: "eval", NewToken: "0123456789abcdef0123456789abcdef"})
	agentC := arbiter.Caller{Name: "gpu1", Role: arbiter.RoleAgent}
	e.do(arbiter.ClaimSwap{Caller: agentC, Machine: "gpu1"})
	e.do(arbiter.FinishSwap{Caller: agentC, ID: sw2.ID, Machine: "gpu1", OK: false, Reason: "exit 4"})
	admin := uiPanelsAnswer(t, e.s, testAdmin, "?p=services")["services"]
	userP := uiPanelsAnswer(t, e.s, testUser, "?p=services")["services"]
	for _, h := range []string{admin, userP} {
		if !strings.Contains(h, "Lock <strong>swap:vllm</strong> is held by <strong>nightly</strong>") || !strings.Contains(h, ">in 30 min</time>") {
			t.Errorf("no lock notice:\n%s", h)
		}
		if !strings.Contains(h, `<option value="gemma" data-model="google/gemma-3-27b-it">gemma — google/gemma-3-27b-it (serving now)</option>`) {
			t.Errorf("the model served now is not marked:\n%s", h)
		}
		if !strings.Contains(h, `id="swaplog" data-keep data-default="`+sw2.ID+`"`) {
			t.Errorf("with no swap in progress the latest's log is the default:\n%s", h)
		}
	}
	if !strings.Contains(admin, `name="force"`) || strings.Contains(userP, `name="force"`) {
		t.Errorf("override offered to the admin %v, to the user %v; want only the admin", strings.Contains(admin, `name="force"`), strings.Contains(userP, `name="force"`))
	}
}

func TestUIServicesPanelAbsent(t *testing.T) {
	s, _ := testServer(t, nil)
	if p := uiPanelsAnswer(t, s, testAdmin, "?p=services&p=deliveries"); p["services"] != "" || p["deliveries"] != "" {
		t.Errorf("panels of a capability that is not configured: %q", p)
	}
}

func TestUIDeliveriesPanel(t *testing.T) {
	e := newCoordEnv(t)
	watch := ui.WatchDeliveries(e.s.coord.Deliveries)
	e.s = NewServer(Options{Plane: e.loop, Tokens: testTokens, Version: "test",
		Coordination: CoordOptions{Deliveries: watch, Now: e.clk.Now}})
	e.s.sseHeartbeat = 50 * time.Millisecond
	if p := uiPanelsAnswer(t, e.s, testAdmin, "?p=deliveries")["deliveries"]; p != "" {
		t.Errorf("a delivery panel with no subscription:\n%s", p)
	}
	admin := arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	e.do(arbiter.CreateWebhook{Caller: admin, Webhook: arbiter.Webhook{ID: "chat", URL: "http://10.0.0.7/hook", Kinds: []string{"swap.*"}, Format: arbiter.WebhookStandard, Secret: secret}})
	p := uiPanelsAnswer(t, e.s, testAdmin, "?p=deliveries")["deliveries"]
	if !strings.Contains(p, "<strong>chat</strong>") || !strings.Contains(p, "10.0.0.7") || !strings.Contains(p, "Nothing delivered yet") {
		t.Errorf("deliveries with a subscription and no delivery:\n%s", p)
	}

	ctx := context.Background()
	changed := watch.Changed()
	now := e.clk.Now()
	next := now.Add(30 * time.Second)
	d := arbiter.Delivery{ID: "d1", Webhook: "chat", EventSeq: 7, EventKind: "swap.complete", Body: []byte("{}"), State: arbiter.DeliveryPending, NextAttemptAt: &now, CreatedAt: now, UpdatedAt: now}
	if err := watch.EnqueueDeliveries(ctx, []arbiter.Delivery{d}, 7); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Errorf("enqueueing did not tell the watchers")
	}
	changed = watch.Changed()
	d.Attempts, d.NextAttemptAt, d.LastStatus, d.LastError = 1, &next, 503, "the receiver answered 503 Service Unavailable"
	if err := watch.RecordAttempt(ctx, d, arbiter.DeliveryAttempt{N: 1, At: now, Status: 503, Error: d.LastError, DurationMS: 12}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Errorf("an attempt did not tell the watchers")
	}
	p = uiPanelsAnswer(t, e.s, testAdmin, "?p=deliveries")["deliveries"]
	for _, want := range []string{`id="dl-d1"`, "swap.complete", "#7", "badge-dl-pending", "503 Service Unavailable", "12 ms", `<td class="num" data-label="attempt">1</td>`, ">in 30 s</time>", "1 pending"} {
		if !strings.Contains(p, want) {
			t.Errorf("deliveries lack %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "the receiver answered") {
		t.Errorf("the status is said twice:\n%s", p)
	}
	if u := uiPanelsAnswer(t, e.s, testUser, "?p=deliveries")["deliveries"]; u != "" {
		t.Errorf("a user sees the deliveries:\n%s", u)
	}

	// The page's stream tells an admin, not a user, that the log changed.
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	open := func(secret string) <-chan string {
		req, _ := http.NewRequest("GET", ts.URL+"/ui/events", nil)
		req.AddCookie(&http.Cookie{Name: ui.CookieName, Value: uiSession(t, e.s, secret)})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		ch := uiSSE(t, resp.Body)
		uiNext(t, ch, "retry:")
		return ch
	}
	// Each stream takes the watch's channel before its first frame.
	adminCh, userCh := open(testAdmin), open(testUser)
	d.Attempts, d.State, d.NextAttemptAt = 2, arbiter.DeliveryDelivered, nil
	if err := watch.RecordAttempt(ctx, d, arbiter.DeliveryAttempt{N: 2, At: now, Status: 200}); err != nil {
		t.Fatal(err)
	}
	if f := uiNext(t, adminCh, "event: stale"); !strings.Contains(f, `"panels":["deliveries"]`) {
		t.Errorf("stale frame %q", f)
	}
	// A user's stream does not watch the delivery log at all, so there is no
	// event to wait for: a short window gives a wrong one the chance to show.
	select {
	case f := <-userCh:
		if strings.Contains(f, "stale") {
			t.Errorf("a user's stream got %q", f)
		}
	case <-time.After(100 * time.Millisecond):
	}
}

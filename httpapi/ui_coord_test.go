package httpapi

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// The dashboard's coordination and grid panels, rendered by the real
// server over the real control loop (coordEnv) or the fake plane.

func TestUIServicesPanel(t *testing.T) {
	e := newCoordEnv(t)
	// No swap yet: each role sees the service; users and admins the control.
	for _, tc := range []struct {
		secret  string
		control bool
	}{{srvTestAdmin, true}, {srvTestUser, true}, {srvTestAgent, false}} {
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
	p := uiPanelsAnswer(t, e.s, srvTestUser, "?p=services")["services"]
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
	admin := uiPanelsAnswer(t, e.s, srvTestAdmin, "?p=services")["services"]
	userP := uiPanelsAnswer(t, e.s, srvTestUser, "?p=services")["services"]
	for _, h := range []string{admin, userP} {
		if !strings.Contains(h, "Lock <strong>swap:vllm</strong> is held by <strong>nightly</strong>") || !strings.Contains(h, ">in 29 min</time>") {
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
	s, _ := srvTestServer(t, nil)
	if p := uiPanelsAnswer(t, s, srvTestAdmin, "?p=services&p=deliveries"); p["services"] != "" || p["deliveries"] != "" {
		t.Errorf("panels of a capability that is not configured: %q", p)
	}
}

func TestUIDeliveriesPanel(t *testing.T) {
	e := newCoordEnv(t)
	st := e.s.coord.Deliveries
	watch := WatchDeliveries(st)
	e.s.coord.Deliveries = watch
	if p := uiPanelsAnswer(t, e.s, srvTestAdmin, "?p=deliveries")["deliveries"]; p != "" {
		t.Errorf("a delivery panel with no subscription:\n%s", p)
	}
	admin := arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}
	secret := "whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	e.do(arbiter.CreateWebhook{Caller: admin, Webhook: arbiter.Webhook{ID: "chat", URL: "http://10.0.0.7/hook", Kinds: []string{"swap.*"}, Format: arbiter.WebhookStandard, Secret: secret}})
	p := uiPanelsAnswer(t, e.s, srvTestAdmin, "?p=deliveries")["deliveries"]
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
	p = uiPanelsAnswer(t, e.s, srvTestAdmin, "?p=deliveries")["deliveries"]
	for _, want := range []string{`id="dl-d1"`, "swap.complete", "#7", "badge-dl-pending", "503 Service Unavailable", "12 ms", `<td class="num" data-label="attempt">1</td>`, ">in 29 s</time>", "1 pending"} {
		if !strings.Contains(p, want) {
			t.Errorf("deliveries lack %q:\n%s", want, p)
		}
	}
	if strings.Contains(p, "the receiver answered") {
		t.Errorf("the status is said twice:\n%s", p)
	}
	if u := uiPanelsAnswer(t, e.s, srvTestUser, "?p=deliveries")["deliveries"]; u != "" {
		t.Errorf("a user sees the deliveries:\n%s", u)
	}

	// The page's stream tells an admin, not a user, that the log changed.
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	open := func(secret string) <-chan string {
		req, _ := http.NewRequest("GET", ts.URL+"/ui/events", nil)
		req.AddCookie(&http.Cookie{Name: uiCookieName, Value: base64.RawURLEncoding.EncodeToString([]byte(secret))})
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
	adminCh, userCh := open(srvTestAdmin), open(srvTestUser)
	d.Attempts, d.State, d.NextAttemptAt = 2, arbiter.DeliveryDelivered, nil
	if err := watch.RecordAttempt(ctx, d, arbiter.DeliveryAttempt{N: 2, At: now, Status: 200}); err != nil {
		t.Fatal(err)
	}
	if f := uiNext(t, adminCh, "event: stale"); !strings.Contains(f, `"panels":["deliveries"]`) {
		t.Errorf("stale frame %q", f)
	}
	select {
	case f := <-userCh:
		if strings.Contains(f, "stale") {
			t.Errorf("a user's stream got %q", f)
		}
	case <-time.After(100 * time.Millisecond):
	}
}

func TestUIBoardMap(t *testing.T) {
	f := srvNewFakePlane()
	v := &uiView{ctx: context.Background(), plane: f, Admin: true, Now: srvFakeNow}
	owner := "alice"
	id := int64(4)
	on := true
	live := map[int64]*arbiter.Allocation{4: {ID: 4, Owner: "alice", State: arbiter.StateReady, Power: &on, Boards: []arbiter.Board{{X: 1, Y: 0, Z: 1}}}}
	m := arbiter.MachineStatus{Name: "spin", Kind: arbiter.KindGrid, Grid: &arbiter.GridInfo{Width: 2, Height: 2}}
	for x := 0; x < 2; x++ {
		for y := 0; y < 2; y++ {
			for z := 0; z < 3; z++ {
				d := arbiter.DeviceStatus{Index: (x*2+y)*3 + z, Model: "board", Healthy: true,
					Board: &arbiter.BoardDevice{X: x, Y: y, Z: z, Cabinet: 0, Frame: 0, Slot: (x*2+y)*3 + z, IP: "10.0.0.1"}}
				switch {
				case x == 1 && y == 0 && z == 1:
					d.Allocation, d.Owner = &id, &owner
				case x == 0 && y == 1 && z == 2:
					d.Healthy, d.Board.Dead = false, true
				case x == 1 && y == 1 && z == 0:
					ended := int64(3)
					d.Allocation, d.Board.Settling = &ended, true
				}
				m.Devices = append(m.Devices, d)
			}
		}
	}
	bm := v.boardMap(&m, live)
	if len(bm.Rows) != 2 || bm.Rows[0].Y != 1 || bm.Rows[1].Y != 0 {
		t.Fatalf("rows %+v: want y = 1 on top", bm.Rows)
	}
	if bm.Free != 9 || bm.Held != 2 || bm.Dead != 1 || bm.Settling != 1 {
		t.Errorf("counts free %d held %d dead %d settling %d, want 9 2 1 1", bm.Free, bm.Held, bm.Dead, bm.Settling)
	}
	b := bm.Rows[1].Triads[1].Boards[1]
	if !strings.HasPrefix(b.Class, "gboard held o") || !strings.HasSuffix(b.Class, " pw-on") || b.Label != "#4" ||
		!strings.Contains(b.Title, "board (1,0,1)") || !strings.Contains(b.Title, "held by alice, allocation #4") {
		t.Errorf("held board %+v", b)
	}
	if b := bm.Rows[0].Triads[0].Boards[2]; b.Class != "gboard dead" || b.Label != "✕" {
		t.Errorf("dead board %+v", b)
	}
	if b := bm.Rows[0].Triads[1].Boards[0]; !strings.HasSuffix(b.Class, "pw-settling") || !strings.Contains(b.Title, "freed soon") {
		t.Errorf("settling board %+v", b)
	}
	if len(bm.Holders) != 2 || bm.Holders[0].ID != 3 || bm.Holders[1].Power != "on" || bm.Holders[0].Power != "settling" {
		t.Errorf("holders %+v", bm.Holders)
	}

	for _, tc := range []struct {
		a     *arbiter.Allocation
		power string
	}{
		{&arbiter.Allocation{State: arbiter.StatePower, Power: &on}, "switching on"},
		{&arbiter.Allocation{State: arbiter.StatePower, Power: new(bool)}, "switching off"},
		{&arbiter.Allocation{State: arbiter.StateReady, Power: new(bool)}, "off"},
		{&arbiter.Allocation{State: arbiter.StateReady, Power: &on}, "on"},
		{&arbiter.Allocation{State: arbiter.StateDestroyed}, "settling"},
		{nil, "settling"},
	} {
		if got := uiPower(tc.a, false); got != tc.power {
			t.Errorf("uiPower(%+v) = %q, want %q", tc.a, got, tc.power)
		}
	}
}

func TestUICoordHelpers(t *testing.T) {
	three := 3
	for _, tc := range []struct {
		r    arbiter.Request
		want string
	}{
		{arbiter.Request{Grid: &arbiter.GridRequest{}}, "1 board"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Args: []int{8}}, Machine: "spin5"}, "8 boards · on spin5"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Args: []int{2, 1}, RequireTorus: true}}, "2 × 1 triads · torus"},
		{arbiter.Request{Grid: &arbiter.GridRequest{Args: []int{1, 0, 2}, MaxDeadBoards: &three}}, "board (1,0,2) · ≤ 3 dead boards"},
		{arbiter.Request{Pool: "small"}, "a slot of pool small"},
		{arbiter.Request{GPUs: 2}, "2 GPUs"},
	} {
		if got := uiWants(tc.r); got != tc.want {
			t.Errorf("uiWants(%+v) = %q, want %q", tc.r, got, tc.want)
		}
	}
	spin := "spin5"
	if got := uiHolds(arbiter.Allocation{Machine: &spin, Boards: make([]arbiter.Board, 6)}); got != "spin5: 6 boards" {
		t.Errorf("uiHolds grid = %q", got)
	}
	if got := uiHolds(arbiter.Allocation{Devices: []arbiter.DeviceRef{{Machine: "gpu1", Index: 0}, {Machine: "gpu1", Index: 1}}}); got != "gpu1: 0, 1" {
		t.Errorf("uiHolds GPUs = %q", got)
	}
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond: "850 ms", 42 * time.Second: "42 s", 3 * time.Minute: "3 min",
		185 * time.Second: "3 min 5 s", 130 * time.Minute: "2 h 10 min", -time.Second: "—",
	} {
		if got := uiDuration(d); got != want {
			t.Errorf("uiDuration(%v) = %q, want %q", d, got, want)
		}
	}
	rc := 1
	fin := srvFakeNow.Add(90 * time.Second)
	s := uiSwap{State: arbiter.SwapFailed, ReturnCode: &rc, Reason: "the swap command exited with status 1", CreatedAt: srvFakeNow, FinishedAt: &fin, Forced: true}
	if got := s.Result(); got != "exit 1 · the swap command exited with status 1 · forced past the lock" {
		t.Errorf("Result = %q", got)
	}
	if got := s.Took(); got != "1 min 30 s" {
		t.Errorf("Took = %q", got)
	}
	for _, tc := range []struct {
		d    uiDelivery
		want string
	}{
		{uiDelivery{Last: &arbiter.DeliveryAttempt{Status: 200}}, "200 OK"},
		{uiDelivery{Last: &arbiter.DeliveryAttempt{Status: 500, Error: "the receiver answered 500 Internal Server Error"}}, "500 Internal Server Error"},
		{uiDelivery{Last: &arbiter.DeliveryAttempt{Status: 410, Error: "the receiver answered 410 Gone: the subscription is disabled"}}, "410 Gone · the subscription is disabled"},
		{uiDelivery{Last: &arbiter.DeliveryAttempt{Error: "dial tcp 10.0.0.7:80: connection refused"}}, "dial tcp 10.0.0.7:80: connection refused"},
		{uiDelivery{Delivery: arbiter.Delivery{LastError: "subscription deleted"}}, "subscription deleted"},
	} {
		if got := tc.d.Outcome(); got != tc.want {
			t.Errorf("Outcome(%+v) = %q, want %q", tc.d.Last, got, tc.want)
		}
	}
}

// uiGridPlane is the fake plane with one more machine status of any kind.
type uiGridPlane struct {
	*srvFakePlane
	extra []arbiter.MachineStatus
}

func (p *uiGridPlane) Machines() []arbiter.MachineStatus {
	return append(p.srvFakePlane.Machines(), p.extra...)
}

// uiBigGrid is a w × h-triad grid machine whose boards are held, a block
// of 2 × 2 triads by each allocation, by every other block.
func uiBigGrid(w, h int) (arbiter.MachineStatus, []arbiter.Allocation) {
	m := arbiter.MachineStatus{Name: "spinn1m", Kind: arbiter.KindGrid, State: arbiter.MachineUp, Grid: &arbiter.GridInfo{Width: w, Height: h}}
	var as []arbiter.Allocation
	on := true
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				d := arbiter.DeviceStatus{Index: (x*h+y)*3 + z, Model: "board", Healthy: true,
					Board: &arbiter.BoardDevice{X: x, Y: y, Z: z, Cabinet: x / 5, Frame: y / 5, Slot: z, IP: "10.2.0.1"}}
				if block := (x/2)*(h/2) + y/2; block%2 == 0 {
					id := int64(block + 1)
					owner := "user" + strconv.Itoa(block%11)
					d.Allocation, d.Owner = &id, &owner
				}
				m.Devices = append(m.Devices, d)
			}
		}
	}
	for b := 0; b < (w/2)*(h/2); b += 2 {
		as = append(as, arbiter.Allocation{ID: int64(b + 1), Owner: "user" + strconv.Itoa(b%11), State: arbiter.StateReady, Power: &on})
	}
	return m, as
}

// BenchmarkUIBoardMap renders the machines panel of a 1,200-board machine
// (20 × 20 triads), half of it held by 50 allocations.
func BenchmarkUIBoardMap(b *testing.B) {
	f := srvNewFakePlane()
	m, as := uiBigGrid(20, 20)
	f.mu.Lock()
	for _, a := range as {
		f.allocs[a.ID] = a
	}
	f.mu.Unlock()
	s := NewServer(Options{Plane: &uiGridPlane{srvFakePlane: f, extra: []arbiter.MachineStatus{m}}, Tokens: srvTestTokens})
	r := httptest.NewRequest("GET", "/ui/panels?p=machines", nil)
	p := uiPanelNamed("machines")
	b.ReportAllocs()
	var n int
	for b.Loop() {
		v := s.uiNewView(r, arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin})
		h, show, err := s.uiRenderPanel(v, p)
		if err != nil || !show {
			b.Fatal(err)
		}
		n = len(h)
	}
	b.ReportMetric(float64(n)/1024, "KiB")
}

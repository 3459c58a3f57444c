package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/webhook"
)

// Fair shares for small teams end to end (docs/guides/fair-share.md): the
// real server, its CLI, a fake clock; agents and real processes where
// processes must be stopped.

const fsMachine = `
[[machines]]
name = "gpu1"
tags = ["default"]
cuda = "12.4"
gpus = [ { model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 4 } ]
`

const fsGroups = `
[[groups]]
name = "ml"
members = ["alice", "bob"]

[[groups]]
name = "cv"
members = ["carol", "dave"]

[[groups]]
name = "ops"
members = ["olga"]
`

// waitFor polls an allocation until ok says so.
func waitFor(t *testing.T, c *client.Client, id int64, what string, ok func(arbiter.Allocation) bool) arbiter.Allocation {
	t.Helper()
	var a arbiter.Allocation
	err := poll.Try(10*time.Second, func() error {
		var err error
		if a, err = c.Allocation(context.Background(), id); err != nil {
			return err
		}
		if !ok(a) {
			return fmt.Errorf("allocation %d: %s, why_queued %q, eta %v, reason %q", id, a.State, arbiter.StrOr(a.WhyQueued, ""), a.ETA, arbiter.StrOr(a.Reason, ""))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return a
}

func ready(a arbiter.Allocation) bool     { return a.State == arbiter.StateReady }
func destroyed(a arbiter.Allocation) bool { return a.State == arbiter.StateDestroyed }

func TestEndToEndQuotaExtendAndQueue(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	_, url := startServer(t, fsMachine+fsGroups+`
[[quotas]]
group = "ml"
max_gpus = 2
`, clk)
	c := client.New(url, "")
	ctx := context.Background()

	// A group at its quota queues with the quota named, and when it frees;
	// another group's request is granted meanwhile.
	a := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "2", "--owner", "alice", "--keepalive", "never", "--time-limit", "1h")
	if a.State != arbiter.StateReady || a.Group != "ml" || a.EndsAt == nil || !a.EndsAt.Equal(clk.Now().Add(time.Hour)) {
		t.Fatalf("alice: %s group %q ends %v", a.State, a.Group, a.EndsAt)
	}
	b := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--owner", "bob", "--keepalive", "never", "--no-wait")
	why := arbiter.StrOr(b.WhyQueued, "")
	if b.State != arbiter.StateQueued || !strings.HasPrefix(why, "quota group:ml (max_gpus = 2)") ||
		!strings.Contains(why, "frees at "+a.EndsAt.UTC().Format(time.RFC3339)) {
		t.Fatalf("bob: %s, why_queued %q", b.State, why)
	}
	cr := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--owner", "carol", "--keepalive", "never", "--time-limit", "2h")
	if cr.State != arbiter.StateReady {
		t.Fatalf("carol (cv): %s", cr.State)
	}
	qs := cliJSON[[]arbiter.QuotaStatus](t, url, "quotas")
	if len(qs) != 1 || qs[0].Key != "group:ml" || qs[0].HeldGPUs != 2 || qs[0].Source != "config" {
		t.Fatalf("quotas: %+v", qs)
	}
	if _, errs, code := cmdline(t, url, "alloc", "--gpus", "3", "--owner", "alice", "--no-wait"); code != 1 || !strings.Contains(errs, "over quota") {
		t.Fatalf("3 GPUs for ml: exit %d: %s", code, errs)
	}

	// Extend: allowed while nobody waits for these GPUs (bob waits for his
	// quota, not for GPUs), refused with the reason once someone does.
	out, errs, code := cmdline(t, url, "extend", strconv.FormatInt(a.ID, 10), "--by", "30m")
	if code != 0 || !strings.Contains(out, "now ends at "+clk.Now().Add(90*time.Minute).UTC().Format(time.RFC3339)) {
		t.Fatalf("extend: exit %d: %s%s", code, out, errs)
	}
	d := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "2", "--owner", "dave", "--keepalive", "never", "--no-wait", "--time-limit", "1h")
	if d.State != arbiter.StateQueued {
		t.Fatalf("dave: %s", d.State)
	}
	if _, errs, code := cmdline(t, url, "extend", strconv.FormatInt(a.ID, 10), "--by", "30m"); code != 1 || !strings.Contains(errs, "is waiting for GPUs like these") {
		t.Fatalf("extend with dave waiting: exit %d: %s", code, errs)
	}

	// The queue, its order, its ETAs.
	poll.Until(t, 5*time.Second, "positions and ETAs shown", func() bool {
		x, err := c.Allocation(ctx, d.ID)
		return err == nil && x.Position != nil && x.ETA != nil
	})
	out, _, _ = cmdline(t, url, "ps", "--queue")
	for _, want := range []string{"POS", "FACTOR", "ETA", "dave", "bob", "quota group:ml"} {
		if !strings.Contains(out, want) {
			t.Errorf("ps --queue lacks %q:\n%s", want, out)
		}
	}
	dq, _ := c.Allocation(ctx, d.ID)
	// dave needs 2 GPUs: alice's 2 free at 1h30 (extended), when bob takes
	// one of the 3 then free.
	if at := a.EndsAt.Add(30 * time.Minute).UTC(); !dq.ETA.Equal(at) || !strings.HasSuffix(arbiter.StrOr(dq.WhyQueued, ""), "; ETA "+at.Format(time.RFC3339)) {
		t.Fatalf("dave's ETA %v (%q), want %v", dq.ETA, arbiter.StrOr(dq.WhyQueued, ""), at)
	}
	fsOut, _, _ := cmdline(t, url, "fairshare")
	if !strings.Contains(fsOut, "ml") || !strings.Contains(fsOut, "FACTOR") {
		t.Fatalf("fairshare:\n%s", fsOut)
	}
	// An admin changes the quota through the API: bob goes in.
	if _, errs, code := cmdline(t, url, "quotas", "set", "--group", "ml", "--max-gpus", "3"); code != 0 {
		t.Fatalf("quotas set: %s", errs)
	}
	waitFor(t, c, b.ID, "bob granted under the raised quota", ready)
}

// TestEndToEndFairShareConverges runs two groups that always have work
// waiting, over a simulated day: their GPU-hours converge to their shares.
func TestEndToEndFairShareConverges(t *testing.T) {
	start := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(start)
	m, url := startServer(t, fsMachine+fsGroups+`
[fairshare]
half_life_s = 21600
shares = { ml = 3, cv = 1 }
`, clk)
	c := client.New(url, "")
	ctx := context.Background()
	waiting := func(owner string) int {
		as, err := c.Allocations(ctx, arbiter.AllocationFilter{Owner: owner, State: arbiter.StateQueued})
		if err != nil {
			t.Fatal(err)
		}
		return len(as)
	}
	limit := 3600.0
	for hour := 0; hour < 24; hour++ {
		for _, who := range []string{"alice", "carol"} { // ml, cv: each always has work waiting
			for n := waiting(who); n < 4; n++ {
				if _, err := c.Allocate(ctx, arbiter.Request{Owner: who, GPUs: 1, TimeLimitS: &limit}); err != nil {
					t.Fatal(err)
				}
			}
		}
		tick(m, clk, time.Hour)
		now := clk.Now()
		poll.Until(t, 10*time.Second, fmt.Sprintf("hour %d served", hour+1), func() bool {
			as, err := c.Allocations(ctx, arbiter.AllocationFilter{State: arbiter.StateReady})
			if err != nil || len(as) != 4 {
				return false
			}
			for _, a := range as {
				if a.ReadyAt == nil || !a.ReadyAt.Equal(now) {
					return false
				}
			}
			return true
		})
	}
	end := clk.Now()
	all, _ := c.Allocations(ctx, arbiter.AllocationFilter{})
	used := map[string]float64{}
	for _, a := range all {
		if a.ReadyAt == nil {
			continue
		}
		to := end
		if a.DestroyedAt != nil && a.DestroyedAt.Before(end) {
			to = *a.DestroyedAt
		}
		used[a.Group] += to.Sub(*a.ReadyAt).Hours() * float64(len(a.Devices))
	}
	total := used["ml"] + used["cv"]
	frac := used["ml"] / total
	t.Logf("over a day: ml %.0f GPU-hours, cv %.0f (ml %.0f%%, its share 75%%)", used["ml"], used["cv"], 100*frac)
	if total < 90 || frac < 0.65 || frac > 0.85 {
		t.Fatalf("ml used %.0f of %.0f GPU-hours (%.0f%%), want about 75%%", used["ml"], total, 100*frac)
	}
	st := cliJSON[client.FairShare](t, url, "fairshare")
	if len(st.Groups) < 2 || st.Groups[0].Group == "" {
		t.Fatalf("fairshare: %+v", st)
	}
}

func TestEndToEndReservation(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	m, url := startServer(t, fsMachine+fsGroups, clk)
	c := client.New(url, "")
	startAt := clk.Now().Add(2 * time.Hour)
	rv := cliJSON[arbiter.Reservation](t, url, "reserve", "--gpus", "4", "--machine", "gpu1", "--start", startAt.Format(time.RFC3339),
		"--duration", "1h", "--for", "ops")
	if rv.ID != "r1" || len(rv.Devices) != 4 || rv.Active {
		t.Fatalf("reserve: %+v", rv)
	}
	// Backfill only work that ends before the start.
	open := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--owner", "alice", "--keepalive", "never", "--no-wait")
	if open.State != arbiter.StateQueued || !strings.Contains(arbiter.StrOr(open.WhyQueued, ""), "reserved (reservation r1 of group ops") {
		t.Fatalf("no time limit: %s %q", open.State, arbiter.StrOr(open.WhyQueued, ""))
	}
	short := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "2", "--owner", "bob", "--keepalive", "never", "--time-limit", "1h")
	if short.State != arbiter.StateReady {
		t.Fatalf("1h before a start 2h away: %s", short.State)
	}
	long := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "1", "--owner", "carol", "--keepalive", "never", "--time-limit", "3h", "--no-wait")
	if long.State != arbiter.StateQueued {
		t.Fatalf("3h: %s", long.State)
	}
	in := cliJSON[arbiter.Allocation](t, url, "alloc", "--gpus", "4", "--owner", "olga", "--keepalive", "never", "--reservation", "r1", "--no-wait")
	if in.State != arbiter.StateQueued {
		t.Fatalf("olga inside r1: %s", in.State)
	}
	if _, errs, code := cmdline(t, url, "alloc", "--owner", "alice", "--reservation", "r1", "--no-wait"); code != 1 || !strings.Contains(errs, "is for group ops") {
		t.Fatalf("alice names r1: exit %d %s", code, errs)
	}
	x := waitFor(t, c, in.ID, "olga's ETA", func(a arbiter.Allocation) bool { return a.ETA != nil })
	if !x.ETA.Equal(startAt) {
		t.Fatalf("olga's ETA %v, want the start %v", x.ETA, startAt)
	}
	out, _, _ := cmdline(t, url, "reservations")
	if !strings.Contains(out, "r1") || !strings.Contains(out, "ops") || !strings.Contains(out, "#") {
		t.Fatalf("reservations:\n%s", out)
	}
	// At the start: the reservation's GPUs are olga's.
	tick(m, clk, time.Hour)
	waitFor(t, c, short.ID, "bob's hour over", destroyed)
	tick(m, clk, time.Hour)
	got := waitFor(t, c, in.ID, "olga granted at the start", ready)
	if !got.ReadyAt.Equal(startAt) || !got.EndsAt.Equal(startAt.Add(time.Hour)) {
		t.Fatalf("olga: ready %v ends %v", got.ReadyAt, got.EndsAt)
	}
	if ev := gpuEvents(t, url, arbiter.EventReservationStarted); len(ev) != 1 {
		t.Fatalf("reservation.started: %d events", len(ev))
	}
	ms, _ := c.Machines(context.Background())
	for _, d := range ms[0].Devices {
		if d.Allocation == nil || *d.Allocation != in.ID {
			t.Fatalf("GPU %d of gpu1 held by %v at the start, not olga's %d", d.Index, d.Allocation, in.ID)
		}
	}
	// At the end: the window's allocations end, the others go in.
	tick(m, clk, time.Hour)
	waitFor(t, c, in.ID, "olga's window over", destroyed)
	waitFor(t, c, open.ID, "alice granted after the window", ready)
	waitFor(t, c, long.ID, "carol granted after the window", ready)
	if ev := gpuEvents(t, url, arbiter.EventReservationEnded); len(ev) != 1 {
		t.Fatalf("reservation.ended: %d events", len(ev))
	}
}

// TestEndToEndPreemption: a higher-priority request preempts a preemptible
// allocation whose process, run by `arbiter alloc -- CMD` on a host with a
// real agent, gets SIGTERM at once and is stopped within the grace; the
// allocation ends "preempted by …" and the GPUs go to the request.
func TestEndToEndPreemption(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake nvidia-smi reads /proc")
	}
	bin := buildBinary(t)
	_, url := startServer(t, gpuConfig(`sample_s = 0.2
kill_grace_s = 1
[preemption]
grace_s = 3
min_runtime_s = 0
`), nil)
	c := client.New(url, "")
	ctx := context.Background()
	h := startGPUHost(t, bin, url, "host-a")
	poll.Until(t, 30*time.Second, "host-a reporting", func() bool {
		m, err := c.Machine(ctx, "host-a")
		return err == nil && len(m.Devices) == 8 && m.Devices[0].Usage != nil
	})
	// CMD notes the SIGTERM and ignores it, so that the end of the grace is
	// what stops it.
	dir := t.TempDir()
	pidFile, termFile := filepath.Join(dir, "pid"), filepath.Join(dir, "term")
	cmd := exec.Command(bin, "alloc", "--url", url, "--machine", "host-a", "--gpus", "8", "--owner", "carol", "--preemptible", "--keepalive", "30",
		"--", "sh", "-c", "echo $$ > "+pidFile+"; trap 'date +%s.%N > "+termFile+"' TERM; while :; do sleep 0.05; done")
	cmd.Env = h.env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := readPID(t, pidFile, 30*time.Second)
	var held arbiter.Allocation
	poll.Until(t, 10*time.Second, "carol's CMD reported on her GPUs", func() bool {
		as, err := c.Allocations(ctx, arbiter.AllocationFilter{Owner: "carol", State: "live"})
		if err != nil || len(as) != 1 || as[0].State != arbiter.StateReady {
			return false
		}
		held = as[0]
		m, _ := c.Machine(ctx, "host-a")
		u := m.Devices[0].Usage
		return u != nil && len(u.Processes) > 0 && u.Processes[0].Allocation != nil && *u.Processes[0].Allocation == held.ID
	})
	if !held.Preemptible {
		t.Fatalf("carol's allocation is not preemptible: %+v", held)
	}
	boss, err := c.Allocate(ctx, arbiter.Request{Owner: "boss", GPUs: 2, Machine: "host-a", Priority: 10, IdleExempt: true})
	if err != nil || boss.State != arbiter.StateQueued {
		t.Fatalf("boss: %+v %v", boss, err)
	}
	asked := time.Now()
	p := waitFor(t, c, held.ID, "carol's allocation preempting", func(a arbiter.Allocation) bool { return a.Preempting != nil })
	if want := fmt.Sprintf("allocation %d (priority 10)", boss.ID); p.Preempting.By != want {
		t.Fatalf("preempting by %q, want %q", p.Preempting.By, want)
	}
	poll.Until(t, 3*time.Second, "SIGTERM to carol's CMD", func() bool { _, err := os.Stat(termFile); return err == nil })
	t.Logf("SIGTERM %s after the request", time.Since(asked).Round(time.Millisecond))
	poll.Until(t, 8*time.Second, "carol's CMD stopped", func() bool { return !alive(pid) })
	stopped := time.Since(asked)
	if stopped > 3*time.Second+1500*time.Millisecond {
		t.Fatalf("CMD stopped %s after the request; the grace is 3s", stopped)
	}
	t.Logf("CMD stopped %s after the request (grace 3s)", stopped.Round(time.Millisecond))
	gone := waitFor(t, c, held.ID, "carol's allocation ended", destroyed)
	if r := arbiter.StrOr(gone.Reason, ""); !strings.HasPrefix(r, "preempted by allocation") && !strings.HasPrefix(r, "released") {
		t.Fatalf("carol's allocation ended with %q", r)
	}
	poll.Until(t, 10*time.Second, "boss granted", func() bool {
		b, err := c.Allocation(ctx, boss.ID)
		return err == nil && b.State == arbiter.StateReady
	})
	if ev := gpuEvents(t, url, arbiter.EventAllocationPreempting); len(ev) != 1 || ev[0].Subject != fmt.Sprintf("allocation/%d", held.ID) {
		t.Fatalf("allocation.preempting: %+v", ev)
	}
}

// notifyReceiver collects signed deliveries and checks their signatures.
type notifyReceiver struct {
	t      *testing.T
	secret string
	// known is closed once secret is set: a delivery that comes first
	// (the subscription's own gpu.free, sent the moment it exists) waits
	// for it rather than be judged against no secret.
	known, done chan struct{}
	mu          sync.Mutex
	got         []arbiter.Notification
	bad         []string
	texts       []string
	srv         *httptest.Server
}

func newNotifyReceiver(t *testing.T) *notifyReceiver {
	r := &notifyReceiver{t: t, known: make(chan struct{}), done: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-r.known:
		case <-r.done:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		body, _ := io.ReadAll(req.Body)
		ts, _ := strconv.ParseInt(req.Header.Get(webhook.HeaderTimestamp), 10, 64)
		r.mu.Lock()
		defer r.mu.Unlock()
		want, err := webhook.SignStandard(r.secret, req.Header.Get(webhook.HeaderID), time.Unix(ts, 0), body)
		if err != nil || req.Header.Get(webhook.HeaderSignature) != want {
			r.bad = append(r.bad, string(body))
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if req.URL.Path == "/slack" {
			var s struct {
				Text string `json:"text"`
			}
			json.Unmarshal(body, &s)
			r.texts = append(r.texts, s.Text)
			return
		}
		var b struct {
			Type string               `json:"type"`
			Data arbiter.Notification `json:"data"`
		}
		if err := json.Unmarshal(body, &b); err != nil || b.Type != arbiter.EventNotification {
			r.bad = append(r.bad, string(body))
			return
		}
		r.got = append(r.got, b.Data)
	}))
	t.Cleanup(func() {
		close(r.done)
		r.srv.Close()
	})
	return r
}

// setSecret is the subscription's secret, known once it was answered.
func (r *notifyReceiver) setSecret(secret string) {
	r.mu.Lock()
	r.secret = secret
	r.mu.Unlock()
	close(r.known)
}

func (r *notifyReceiver) has(kind string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.got {
		if n.Kind == kind {
			return true
		}
	}
	return false
}

const fsTasksManifest = `name = "notify-e2e"

[[jobs]]
model = "done"
mode = "short"
gpus = 0
max_attempts = 1
command = ["true"]

[[jobs]]
model = "boom"
mode = "short"
gpus = 0
max_attempts = 1
command = ["false"]
`

// TestEndToEndNotifications: a person subscribes once and a signed
// notification arrives for each kind, Slack-compatible too.
func TestEndToEndNotifications(t *testing.T) {
	dir := t.TempDir()
	manifest := filepath.Join(dir, "tasks.toml")
	if err := os.WriteFile(manifest, []byte(fsTasksManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now().UTC().Truncate(time.Second))
	m, url := startServer(t, fsGroups+`
[server]
local = false
[agents]
heartbeat_timeout_s = 86400
[gpus]
sample_s = 60
idle_after_s = 120
[fairshare]
notice_s = 300
[preemption]
grace_s = 60
min_runtime_s = 0
[tasks]
manifest = "`+manifest+`"
`, clk)
	c := client.New(url, "")
	ctx := context.Background()
	host := arbiter.Machine{Name: "h1", Kind: arbiter.KindGPU, CUDA: "12.4", Tags: []string{}, GPUs: []arbiter.GPU{
		{Index: 0, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Healthy: true}, {Index: 1, Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80, Healthy: true}}}
	if _, err := c.RegisterMachine(ctx, host); err != nil {
		t.Fatal(err)
	}
	rx := newNotifyReceiver(t)
	sub := cliJSON[arbiter.Webhook](t, url, "notify", "add", rx.srv.URL+"/std", "--for", "alice", "--gpus", "2")
	rx.setSecret(sub.Secret)
	if sub.Principal != "alice" || len(sub.Kinds) != len(arbiter.NotifyKinds()) || !strings.HasPrefix(sub.Secret, "whsec_") {
		t.Fatalf("subscription: %+v", sub)
	}
	slack := cliJSON[arbiter.Webhook](t, url, "notify", "add", rx.srv.URL+"/slack", "--slack", "--for", "alice", "--kind", "allocation.ready",
		"--secret", sub.Secret)
	if slack.Format != arbiter.WebhookSlack {
		t.Fatalf("slack subscription: %+v", slack)
	}
	expect := func(kind string) {
		t.Helper()
		poll.Until(t, 10*time.Second, "a signed "+kind+" notification", func() bool { return rx.has(kind) })
	}
	expect(arbiter.NotifyGPUFree) // two GPUs were free when she subscribed

	// allocation.ready, then allocation.time_limit notice_s before its end.
	limit := 600.0
	a, err := c.Allocate(ctx, arbiter.Request{Owner: "alice", GPUs: 1, TimeLimitS: &limit, Machine: "h1"})
	if err != nil || a.State != arbiter.StateReady {
		t.Fatalf("alice: %+v %v", a, err)
	}
	expect(arbiter.NotifyReady)
	poll.Until(t, 10*time.Second, "the Slack-compatible form", func() bool {
		rx.mu.Lock()
		defer rx.mu.Unlock()
		return len(rx.texts) > 0 && strings.Contains(rx.texts[0], "is ready")
	})
	tick(m, clk, 301*time.Second)
	expect(arbiter.NotifyTimeLimit)

	// allocation.idle: the agent's readings say her GPU is idle.
	zero := 0
	report := func() {
		t.Helper()
		hl, err := c.Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen, _ := hl["last_seq"].(float64) // a sample taken after everything so far
		r := arbiter.GPUReport{SampledAt: clk.Now(), SeenSeq: int64(seen), Full: true, GPUs: []arbiter.GPUReading{
			{Index: 0, UtilPct: &zero, MemTotalMiB: 81559, Processes: []arbiter.GPUProcess{}},
			{Index: 1, UtilPct: &zero, MemTotalMiB: 81559, Processes: []arbiter.GPUProcess{}}}}
		if _, err := c.ReportGPUs(ctx, "h1", r); err != nil {
			t.Fatal(err)
		}
	}
	report()
	tick(m, clk, 121*time.Second)
	report()
	expect(arbiter.NotifyIdle)

	// allocation.preempting: her preemptible allocation, a request of
	// higher priority.
	if _, err := c.Release(ctx, a.ID, "done"); err != nil {
		t.Fatal(err)
	}
	report() // her GPU is clean
	p, err := c.Allocate(ctx, arbiter.Request{Owner: "alice", GPUs: 2, Machine: "h1", Preemptible: true, IdleExempt: false})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, c, p.ID, "alice's preemptible allocation", ready)
	if _, err := c.Allocate(ctx, arbiter.Request{Owner: "carol", GPUs: 1, Priority: 5}); err != nil {
		t.Fatal(err)
	}
	expect(arbiter.NotifyPreempting)

	// reservation.started, for a reservation of her group.
	if _, err := c.Reserve(ctx, arbiter.Reservation{GPUs: 1, Machine: "h1", Start: clk.Now().Add(time.Hour), DurationS: 600, Group: "ml"}); err != nil {
		t.Fatal(err)
	}
	tick(m, clk, time.Hour)
	expect(arbiter.NotifyReservation)

	// task.completed and task.failed.
	worker := "w1"
	cp := arbiter.Capability{Hostname: worker, Cores: 4, RAMGiB: 8}
	for i := 0; i < 2; i++ {
		tk, err := c.ClaimTask(ctx, worker, cp, client.ClaimOptions{NoGPU: true})
		if err != nil || tk == nil {
			t.Fatalf("claim: %v %v", tk, err)
		}
		if tk.Spec.Model == "boom" {
			if _, err := c.FailTask(ctx, tk.ID, worker, tk.Claim, "exit status 1", false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		blob := []byte("weights")
		sum := sha256.Sum256(blob)
		art, _, err := c.UploadArtifact(ctx, tk.ID, worker, hex.EncodeToString(sum[:]), bytes.NewReader(blob), int64(len(blob)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CompleteTask(ctx, tk.ID, worker, tk.Claim, art.ID); err != nil {
			t.Fatal(err)
		}
	}
	expect(arbiter.NotifyTaskDone)
	expect(arbiter.NotifyTaskFailed)

	rx.mu.Lock()
	defer rx.mu.Unlock()
	if len(rx.bad) > 0 {
		t.Fatalf("deliveries with a bad signature or body: %q", rx.bad)
	}
	for _, n := range rx.got {
		if n.Principal != "alice" || n.Subscription != sub.ID || n.Text == "" {
			t.Fatalf("notification %+v", n)
		}
	}
	out, _, _ := cmdline(t, url, "notify", "list")
	if !strings.Contains(out, sub.ID) || !strings.Contains(out, "alice") {
		t.Fatalf("notify list:\n%s", out)
	}
	// Without a token and --for, the subscription is for the owner the
	// CLI gives allocations made from this shell.
	mine := cliJSON[arbiter.Webhook](t, url, "notify", "add", rx.srv.URL+"/mine")
	if !strings.Contains(mine.Principal, "@") {
		t.Fatalf("notify add without --for: for %q, want the shell's owner (user@host)", mine.Principal)
	}
	if _, errs, code := cmdline(t, url, "notify", "-h"); code != 0 || !strings.Contains(errs, "add URL") || !strings.Contains(errs, "rm ID") {
		t.Fatalf("notify -h: %d %q, want add and rm named", code, errs)
	}
}

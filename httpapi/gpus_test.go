package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// gpuCountingStore is the real SQLite store, counting the saves that reach
// it: the proof that GPU reports write nothing per sample.
type gpuCountingStore struct {
	arbiter.Store
	saves atomic.Int64
}

func (s *gpuCountingStore) Save(ctx context.Context, c *arbiter.Changes) error {
	s.saves.Add(1)
	return s.Store.Save(ctx, c)
}

type gpuEnv struct {
	t     testing.TB
	s     *Server
	loop  *control.Loop
	clk   *clock.Fake
	store *gpuCountingStore
}

// newGPUEnv is the real server over the real loop and SQLite, with an
// agent machine w of 2 GPUs and a declared machine c.
func newGPUEnv(t testing.TB) *gpuEnv {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "a.db"), sqlite.Options{Synchronous: "normal"})
	if err != nil {
		t.Fatal(err)
	}
	cs := &gpuCountingStore{Store: st}
	clk := clock.NewFake(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC))
	loop, err := control.Open(context.Background(), control.Options{Store: cs, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(); st.Close() })
	g := &gpuEnv{t: t, loop: loop, clk: clk, store: cs, s: NewServer(Options{Plane: loop, Tokens: testTokens})}
	ctx := context.Background()
	gs := []arbiter.GPU{{Index: 0, UUID: "GPU-0", Model: "H100", VRAMGiB: 80, Healthy: true}, {Index: 1, UUID: "GPU-1", Model: "H100", VRAMGiB: 80, Healthy: true}}
	if _, err := loop.Do(ctx, arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "w", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, GPUs: gs}}); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Do(ctx, arbiter.SyncConfigMachines{Machines: []arbiter.Machine{{Name: "c", GPUs: gs}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := loop.Do(ctx, arbiter.SetGPUPolicy{Policy: arbiter.DefaultGPUPolicy()}); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *gpuEnv) call(method, path, token string, body any) answer {
	g.t.Helper()
	return call(g.t.(*testing.T), g.s, method, path, token, body)
}

func gpuReport(seen int64, full bool, util int, procs ...arbiter.GPUProcess) arbiter.GPUReport {
	if procs == nil {
		procs = []arbiter.GPUProcess{}
	}
	u := util
	return arbiter.GPUReport{SeenSeq: seen, Full: full, SampledAt: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC),
		GPUs: []arbiter.GPUReading{{Index: 0, UtilPct: &u, MemUsedMiB: 100, MemTotalMiB: 81559, Processes: procs},
			{Index: 1, UtilPct: &u, MemUsedMiB: 100, MemTotalMiB: 81559, Processes: []arbiter.GPUProcess{}}}}
}

func TestGPUReportAndMachineView(t *testing.T) {
	g := newGPUEnv(t)
	a := g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, gpuReport(0, true, 87,
		arbiter.GPUProcess{PID: 4242, User: "alice", MemMiB: 61000, Command: "python train.py"}))
	if a.status != 200 {
		t.Fatalf("report: %d %s", a.status, a.body)
	}
	var o arbiter.GPUOrders
	a.decode(t, &o)
	if o.Policy.SampleS != 5 || o.Policy.Enforce != "kill" || o.Seq == 0 || o.Ended == nil || o.Kill == nil {
		t.Fatalf("orders: %+v", o)
	}
	// The machine shows it: GPU 0 free but unmanaged (a process, no allocation).
	a = g.call("GET", "/api/v1/machines/w", testUser, nil)
	var raw map[string]any
	a.decode(t, &raw)
	d0 := raw["devices"].([]any)[0].(map[string]any)
	u := d0["usage"].(map[string]any)
	p := u["processes"].([]any)[0].(map[string]any)
	if d0["state"] != "free" || d0["unmanaged"] != true || u["util_pct"] != 87.0 || u["mem_total_mib"] != 81559.0 ||
		p["pid"] != 4242.0 || p["allocation"] != nil || d0["health"].(map[string]any)["ok"] != true || raw["free"] != 1.0 {
		t.Fatalf("machine view: %s", a.body)
	}
	// The declared machine has no usage: absent.
	a = g.call("GET", "/api/v1/machines/c", testUser, nil)
	if strings.Contains(string(a.body), `"usage"`) || !strings.Contains(string(a.body), `"state":"free"`) {
		t.Fatalf("declared machine: %s", a.body)
	}
	// Roles: a user may not report; unknown machine; bad report.
	if a := g.call("POST", "/api/v1/machines/w/gpus/report", testUser, gpuReport(0, true, 1)); a.status != 403 {
		t.Errorf("user report: %d", a.status)
	}
	if a := g.call("POST", "/api/v1/machines/nope/gpus/report", testAgent, gpuReport(0, true, 1)); a.status != 404 {
		t.Errorf("unknown machine: %d", a.status)
	}
	for _, body := range []string{`{"sampled_at":"2026-11-25T10:00:00Z","gpus":[{"index":7}]}`, `{"sampled_at":"x"}`,
		`{"sampled_at":"2026-11-25T10:00:00Z","gpus":[{"index":0,"processes":[{"pid":0}]}]}`, `{"sampled_at":"2026-11-25T10:00:00Z","bogus":1}`} {
		if a := g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, body); a.status != 400 {
			t.Errorf("%s: %d %s", body, a.status, a.body)
		}
	}
}

// TestGPUReportsWriteNothing proves through HTTP, on the real loop and
// SQLite, that reports which only change readings reach the store at most
// once a minute (the allocation's accounting), whatever their number.
func TestGPUReportsWriteNothing(t *testing.T) {
	g := newGPUEnv(t)
	g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, gpuReport(0, true, 0))
	var al arbiter.Allocation
	g.call("POST", "/api/v1/allocations", testAdmin, `{"owner":"bob","gpus":2,"machine":"w","keepalive_s":null}`).decode(t, &al)
	before := g.store.saves.Load()
	const n = 300
	for i := 0; i < n; i++ {
		g.clk.Advance(time.Second)
		g.s.gpus.limit = gpuLimiter{} // the test sends faster than an agent may
		a := g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, gpuReport(0, i%10 == 0, 10+i%80,
			arbiter.GPUProcess{PID: 77, User: "bob", MemMiB: int64(1000 + i), Command: "python x.py", Allocation: &al.ID}))
		if a.status != 200 {
			t.Fatalf("report %d: %d %s", i, a.status, a.body)
		}
	}
	saves := g.store.saves.Load() - before
	t.Logf("%d reports over %s: %d store saves", n, time.Duration(n)*time.Second, saves)
	if saves > n/60+1 {
		t.Fatalf("%d reports made %d saves; want at most one a minute (%d)", n, saves, n/60+1)
	}
	// The view has the latest reading and the allocation's usage.
	var m arbiter.MachineStatus
	g.call("GET", "/api/v1/machines/w", testUser, nil).decode(t, &m)
	if u := m.Devices[0].Usage; u == nil || *u.UtilPct != 10+(n-1)%80 || u.Processes[0].MemMiB != 1000+n-1 || m.Devices[0].State != "held" {
		t.Fatalf("device 0: %+v", m.Devices[0])
	}
	g.call("GET", fmt.Sprintf("/api/v1/allocations/%d", al.ID), testUser, nil).decode(t, &al)
	// The first second ran under the idle reading before the allocation.
	if al.Usage == nil || al.Usage.GPUS != 2*n || al.Usage.BusyGPUS != 2*n-2 || al.Usage.IdleGPUS != 2 || al.Usage.PeakMemMiB != 200 {
		t.Fatalf("usage: %+v", al.Usage)
	}
}

func TestGPUReportFlood(t *testing.T) {
	g := newGPUEnv(t)
	got503 := 0
	for i := 0; i < 40; i++ {
		a := g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, gpuReport(0, true, 1))
		if a.status == 503 {
			got503++
			if code, msg := a.errorBody(t); code != "unavailable" || !strings.Contains(msg, "faster than") {
				t.Fatalf("flood answer: %s %s", code, msg)
			}
		}
	}
	if got503 < 15 {
		t.Fatalf("40 reports at once: %d refused, want most beyond the burst of %g", got503, gpuReportBurst)
	}
}

func TestGPUOrdersLongPoll(t *testing.T) {
	g := newGPUEnv(t)
	ts := httptest.NewServer(g.s.Handler())
	defer ts.Close()
	c := client.New(ts.URL, testAgent)
	admin := client.New(ts.URL, testAdmin)
	ctx := context.Background()
	o, err := c.WaitGPUOrders(ctx, "w", -1, 0)
	if err != nil || !o.WantFull {
		t.Fatalf("orders before any report: %+v %v", o, err)
	}
	if o, err = c.ReportGPUs(ctx, "w", gpuReport(o.Seq, true, 50)); err != nil {
		t.Fatal(err)
	}
	a, err := admin.Allocate(ctx, arbiter.Request{Owner: "bob", GPUs: 1, Machine: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReportGPUs(ctx, "w", gpuReport(o.Seq, false, 50, arbiter.GPUProcess{PID: 9, User: "bob", Allocation: &a.ID})); err != nil {
		t.Fatal(err)
	}
	since := g.loop.LastSeq()
	// Nothing happens: the long-poll waits its full second.
	start := time.Now()
	if _, err := c.WaitGPUOrders(ctx, "w", since, time.Second); err != nil || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("idle long-poll answered after %s: %v", time.Since(start), err)
	}
	// A release wakes it at once, with the kill order.
	done := make(chan arbiter.GPUOrders, 1)
	go func() {
		o, err := c.WaitGPUOrders(ctx, "w", since, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- o
	}()
	// Whether the long-poll has subscribed yet or not, the release wakes
	// it: it waits for events after since. Woken, it answers well before
	// its 30 s; how soon is a matter for a benchmark, not a pass/fail
	// bound that a busy machine can overrun.
	start = time.Now()
	if _, err := admin.Release(ctx, a.ID, "cancelled"); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if len(o.Ended) != 1 || o.Ended[0] != a.ID || len(o.Kill) != 1 || o.Kill[0].PID != 9 {
			t.Fatalf("woken orders after %s: %+v", time.Since(start), o)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not wake the long-poll")
	}
	if a := g.call("GET", "/api/v1/machines/w/gpus/orders?since=x", testAgent, nil); a.status != 400 {
		t.Errorf("bad since: %d", a.status)
	}
}

func TestGPUAdminRoutes(t *testing.T) {
	g := newGPUEnv(t)
	a := g.call("POST", "/api/v1/machines/c/gpus/1/drain?reason=fan", testAdmin, nil)
	var m arbiter.MachineStatus
	a.decode(t, &m)
	if a.status != 200 || m.Devices[1].State != "drained" || m.Devices[1].StateReason != "fan" || m.Free != 1 {
		t.Fatalf("drain: %d %s", a.status, a.body)
	}
	if a := g.call("POST", "/api/v1/machines/c/gpus/1/drain", testUser, nil); a.status != 403 {
		t.Errorf("user drain: %d", a.status)
	}
	if a := g.call("POST", "/api/v1/machines/c/gpus/9/drain", testAdmin, nil); a.status != 404 {
		t.Errorf("drain GPU 9: %d", a.status)
	}
	if a := g.call("POST", "/api/v1/machines/c/gpus/x/drain", testAdmin, nil); a.status != 400 {
		t.Errorf("drain GPU x: %d", a.status)
	}
	g.call("POST", "/api/v1/machines/c/gpus/1/undrain", testAdmin, nil).decode(t, &m)
	if m.Devices[1].State != "free" || m.Free != 2 {
		t.Fatalf("undrain: %+v", m.Devices[1])
	}
	if a := g.call("POST", "/api/v1/machines/c/gpus/0/free?reason=x", testAdmin, nil); a.status != 400 {
		t.Errorf("free takes no reason: %d", a.status)
	}
	if a := g.call("POST", "/api/v1/machines/c/gpus/0/free", testAdmin, nil); a.status != 200 {
		t.Errorf("free: %d %s", a.status, a.body)
	}
}

func TestUsageRoute(t *testing.T) {
	g := newGPUEnv(t)
	var a1 arbiter.Allocation
	// Owners are the tokens' names (issue 12): alice's, then ops's.
	g.call("POST", "/api/v1/allocations", testUser, `{"gpus":2,"machine":"c","keepalive_s":null}`).decode(t, &a1)
	g.clk.Advance(90 * time.Minute)
	g.call("DELETE", fmt.Sprintf("/api/v1/allocations/%d", a1.ID), testAdmin, nil)
	var a2 arbiter.Allocation
	g.call("POST", "/api/v1/allocations", testAdmin, `{"owner":"carol","gpus":1,"machine":"c","keepalive_s":null}`).decode(t, &a2)
	g.clk.Advance(30 * time.Minute) // ops's (labelled carol) is live: counted up to now
	var rep arbiter.UsageReport
	a := g.call("GET", "/api/v1/usage", testUser, nil)
	a.decode(t, &rep)
	if a.status != 200 || rep.By != "owner" || rep.Until != "2026-11-25" || rep.Since != "2026-10-27" || len(rep.Rows) != 2 {
		t.Fatalf("usage: %d %s", a.status, a.body)
	}
	if b, c := rep.Rows[0], rep.Rows[1]; b.Key != "alice" || b.GPUHours != 3 || b.Allocations != 1 || c.Key != "ops" || c.GPUHours != 0.5 {
		t.Fatalf("rows: %+v", rep.Rows)
	}
	g.call("GET", "/api/v1/usage?by=machine&since=2026-11-25&until=2026-11-25T23:00:00Z", testUser, nil).decode(t, &rep)
	if len(rep.Rows) != 1 || rep.Rows[0].Key != "c" || rep.Rows[0].GPUHours != 3.5 || rep.Rows[0].Allocations != 2 {
		t.Fatalf("by machine: %+v", rep)
	}
	g.call("GET", "/api/v1/usage?since=2026-11-26&until=2026-11-30", testUser, nil).decode(t, &rep)
	if len(rep.Rows) != 0 {
		t.Fatalf("a range without usage: %+v", rep.Rows)
	}
	for _, q := range []string{"by=team", "since=yesterday", "since=2026-11-26&until=2026-11-25", "since=2000-01-01", "x=1"} {
		if a := g.call("GET", "/api/v1/usage?"+q, testUser, nil); a.status != 400 {
			t.Errorf("%s: %d", q, a.status)
		}
	}
}

// FuzzGPUReport: any body is answered 200 or 4xx, never 500, and the
// server stays consistent.
func FuzzGPUReport(f *testing.F) {
	good, _ := json.Marshal(gpuReport(0, true, 50, arbiter.GPUProcess{PID: 1, User: "u", Command: "c"}))
	f.Add(string(good))
	f.Add(`{"sampled_at":"2026-11-25T10:00:00Z","gpus":[{"index":1,"missing":true}]}`)
	f.Add(`{"sampled_at":"2126-11-25T10:00:00Z","gpus":[{"index":0,"xids":[79],"ecc_uncorrected":3}]}`)
	f.Add(`{"seen_seq":-1}`)
	g := newGPUEnv(f)
	f.Fuzz(func(t *testing.T, body string) {
		g.s.gpus.limit = gpuLimiter{}
		a := call(t, g.s, "POST", "/api/v1/machines/w/gpus/report", testAgent, body)
		if a.status != 200 && (a.status < 400 || a.status > 499) {
			t.Fatalf("%q: %d %s", body, a.status, a.body)
		}
		_, _ = io.Discard.Write(a.body)
	})
}

// TestParseUsageRange: the defaults, and days before the year 1 refused
// or, for the default start, clamped to it.
func TestParseUsageRange(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		since, until string
		want         string // "since..until", or "" for an invalid error
	}{
		{"", "", "2026-10-27..2026-11-25"},
		{"2026-11-01", "2026-11-30T23:30:00-01:00", "2026-11-01..2026-12-01"},
		{"", "0001-01-05", "0001-01-01..0001-01-05"},
		{"", "0000-01-10", ""},
		{"0000-12-31", "0001-01-02", ""},
		{"", "0001-01-01T00:00:00+01:00", ""},
		{"2026-11-26", "2026-11-25", ""},
		{"2016-11-18", "2026-11-25", "2016-11-18..2026-11-25"}, // 3,660 days, both ends counted
		{"2016-11-17", "2026-11-25", ""},                       // 3,661
	} {
		rep, err := ParseUsageRange(tt.since, tt.until, "", now)
		switch {
		case tt.want == "" && arbiter.ErrorCode(err) != arbiter.EInvalid:
			t.Errorf("%q..%q: got %+v, %v, want an invalid error", tt.since, tt.until, rep, err)
		case tt.want != "" && (err != nil || rep.Since+".."+rep.Until != tt.want):
			t.Errorf("%q..%q: got %+v, %v, want %s", tt.since, tt.until, rep, err, tt.want)
		}
	}
}

// FuzzParseUsageRange: any query is a report range or an invalid error.
func FuzzParseUsageRange(f *testing.F) {
	f.Add("2026-11-01", "2026-11-30", "owner")
	f.Add("2026-11-25T10:00:00Z", "", "day")
	f.Add("", "", "")
	f.Add("x", "2026-13-01", "team")
	f.Add("", "0000-01-10", "")                // the year 0: refused
	f.Add("", "0001-01-05", "")                // since would fall in the year 0: the first day
	f.Add("", "0001-01-01T00:00:00+01:00", "") // the year 0 in UTC
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, since, until, by string) {
		rep, err := ParseUsageRange(since, until, by, now)
		if err != nil {
			if arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Fatalf("%q %q %q: %v", since, until, by, err)
			}
			return
		}
		if rep.Since > rep.Until || len(rep.Since) != 10 || rep.Rows == nil {
			t.Fatalf("%q %q %q: %+v", since, until, by, rep)
		}
	})
}

func TestGPUGauges(t *testing.T) {
	g := newGPUEnv(t)
	g.call("POST", "/api/v1/machines/w/gpus/report", testAgent, gpuReport(0, true, 87))
	g.call("POST", "/api/v1/machines/c/gpus/1/drain", testAdmin, nil)
	mt := NewMetrics(g.loop)
	w := httptest.NewRecorder()
	mt.Handler().ServeHTTP(w, testRequest("GET", "/metrics", nil))
	body := w.Body.String()
	for _, want := range []string{
		`arbiter_gpu_utilization_percent{gpu="0",machine="w"} 87`,
		`arbiter_gpu_memory_total_bytes{gpu="1",machine="w"} 8.5520809984e+10`,
		`arbiter_gpu_state{gpu="1",machine="c",state="drained"} 1`,
		`arbiter_gpu_state{gpu="1",machine="c",state="free"} 0`,
		`arbiter_gpu_state{gpu="0",machine="w",state="free"} 1`,
		`arbiter_gpu_unmanaged{gpu="0",machine="w"} 0`,
		`arbiter_gpu_power_watts`,
	} {
		if want == `arbiter_gpu_power_watts` {
			if strings.Contains(body, want+"{") {
				t.Errorf("a power gauge without a power reading")
			}
			continue
		}
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

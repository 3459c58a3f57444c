package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/poll"
	"github.com/arbiter-hq/arbiter/sqlite"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestSignStandardVerifiesWithTheOfficialLibrary(t *testing.T) {
	body := []byte(`{"type":"swap.complete","data":{"id":"1"}}`)
	ts := time.Now()
	sig, err := SignStandard(testSecret, "msg_1_wh1", ts, body)
	if err != nil {
		t.Fatal(err)
	}
	wh, err := standardwebhooks.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(HeaderID, "msg_1_wh1")
	h.Set(HeaderTimestamp, itoa(ts.Unix()))
	h.Set(HeaderSignature, sig)
	if err := wh.Verify(body, h); err != nil {
		t.Fatalf("official verifier: %v", err)
	}
	// The library's own signature is the same string.
	want, _ := wh.Sign("msg_1_wh1", ts, body)
	if sig != want {
		t.Fatalf("got %s, want %s", sig, want)
	}
	// Any change breaks it.
	if err := wh.Verify(append(body, ' '), h); err == nil {
		t.Fatal("a changed body verified")
	}
	if _, err := SignStandard("whsec_!!!", "x", ts, body); err == nil {
		t.Fatal("a bad secret signed")
	}
}

func TestSignSpark(t *testing.T) {
	// Computed with Python's hmac, as seed 000 does.
	body := []byte(`{"event":"swap_complete","job_id":"7"}`)
	want := "sha256=6dec8cd7b2946e67b2c4b6fa076666520079774be54c5546660f8326ef88fc85"
	if got := SignSpark("s3cret", body); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if !VerifySpark("s3cret", body, want) || VerifySpark("other", body, want) {
		t.Fatal("VerifySpark disagrees")
	}
}

func TestBody(t *testing.T) {
	rc := 0
	started := time.Date(2026, 6, 18, 7, 0, 0, 0, time.UTC)
	finished := started.Add(time.Minute)
	sw := arbiter.Swap{ID: "12", Service: "vllm", ModelKey: "gemma", State: arbiter.SwapComplete, ReturnCode: &rc, StartedAt: &started, FinishedAt: &finished}
	data, _ := json.Marshal(sw)
	ev := arbiter.Event{Seq: 5, Time: finished, Kind: arbiter.EventSwapComplete, Subject: "swap/12", Data: data}
	b, ok := Body(arbiter.WebhookSpark, &ev)
	if !ok {
		t.Fatal("spark: no body")
	}
	// Times as seed 000's isoformat() writes them: +00:00, microseconds
	// only when there are some (readable by datetime.fromisoformat < 3.11).
	want := `{"event":"swap_complete","job_id":"12","model_key":"gemma","state":"complete","returncode":0,"started_at":"2026-06-18T07:00:00+00:00","finished_at":"2026-06-18T07:01:00+00:00","dry_run":false}`
	if string(b) != want {
		t.Fatalf("spark body\ngot  %s\nwant %s", b, want)
	}
	frac := started.Add(123456789 * time.Nanosecond).In(time.FixedZone("CEST", 2*3600))
	if got := *PyISOTime(&frac); got != "2026-06-18T07:00:00.123456+00:00" {
		t.Fatalf("PyISOTime: %s", got)
	}
	if PyISOTime(nil) != nil {
		t.Fatal("PyISOTime(nil) is not nil")
	}
	b, _ = Body(arbiter.WebhookStandard, &ev)
	var sb StandardBody
	if json.Unmarshal(b, &sb) != nil || sb.Type != "swap.complete" || sb.Seq != 5 || sb.Subject != "swap/12" || !strings.Contains(string(sb.Data), `"model_key":"gemma"`) {
		t.Fatalf("standard body %s", b)
	}
	// Dry runs fire nothing; the spark form carries swap ends only.
	sw.DryRun = true
	data, _ = json.Marshal(sw)
	dry := arbiter.Event{Seq: 6, Kind: arbiter.EventSwapComplete, Data: data}
	if _, ok := Body(arbiter.WebhookStandard, &dry); ok {
		t.Fatal("a dry run has a body")
	}
	lock := arbiter.Event{Seq: 7, Kind: arbiter.EventLockAcquired, Data: json.RawMessage(`{}`)}
	if _, ok := Body(arbiter.WebhookSpark, &lock); ok {
		t.Fatal("spark form of a lock event")
	}
}

func TestClientRefusesLinkLocal(t *testing.T) {
	c := NewClient(false)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://[fe80::1]:80/", "http://0.0.0.0:9/"} {
		_, err := c.Get(u)
		if err == nil || !strings.Contains(err.Error(), "refused to connect") {
			t.Errorf("%s: got %v, want refused", u, err)
		}
	}
}

// TestClientRefusesLoopbackForPersonalSubscriptions: the client of a
// subscription a person made without the admin role refuses the server's
// loopback at connection time (a name resolving there too), with or
// without allow_link_local; the usual client connects.
func TestClientRefusesLoopbackForPersonalSubscriptions(t *testing.T) {
	rcv := newReceiver(t, 204)
	name := strings.Replace(rcv.URL, "127.0.0.1", "localhost", 1)
	for _, allow := range []bool{false, true} {
		c := newClient(allow, true)
		for _, u := range []string{rcv.URL, name} {
			_, err := c.Post(u, "application/json", strings.NewReader("{}"))
			if err == nil || !strings.Contains(err.Error(), "the server's loopback") {
				t.Errorf("allow_link_local %v, %s: got %v, want refused", allow, u, err)
			}
		}
	}
	if resp, err := NewClient(false).Post(rcv.URL, "application/json", strings.NewReader("{}")); err != nil {
		t.Errorf("the usual client: %v", err)
	} else {
		resp.Body.Close()
	}
}

// receiver is a webhook receiver for tests: it records every request and
// answers what status says.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []*captured
	status atomic.Int32
	hang   chan struct{} // when not nil, requests wait for it to close
}

type captured struct {
	h    http.Header
	body []byte
	at   time.Time
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{}
	r.status.Store(int32(status))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, &captured{h: req.Header.Clone(), body: b, at: time.Now()})
		hang := r.hang
		r.mu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-req.Context().Done():
			}
		}
		w.WriteHeader(int(r.status.Load()))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []*captured {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*captured(nil), r.got...)
}

// wait waits until the receiver has got at least n requests and returns
// them.
func (r *receiver) wait(t *testing.T, n int) []*captured {
	t.Helper()
	var got []*captured
	err := poll.Try(20*time.Second, func() error {
		if got = r.requests(); len(got) < n {
			return fmt.Errorf("receiver got %d requests, want %d", len(got), n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// plane is a control loop over a SQLite file, as the server runs it.
type plane struct {
	*control.Loop
	store *sqlite.Store
}

func openPlane(t *testing.T, path string) *plane {
	t.Helper()
	st, err := sqlite.Open(path, sqlite.Options{Synchronous: "normal"})
	if err != nil {
		t.Fatal(err)
	}
	loop, err := control.Open(context.Background(), control.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	p := &plane{Loop: loop, store: st}
	t.Cleanup(p.close)
	return p
}

func (p *plane) close() {
	p.Loop.Close()
	p.store.Close()
}

var admin = arbiter.Caller{Name: "ops", Role: arbiter.RoleAdmin}

func (p *plane) do(t *testing.T, cmd arbiter.Command) any {
	t.Helper()
	res, err := p.Do(context.Background(), cmd)
	if err != nil {
		t.Fatalf("%T: %v", cmd, err)
	}
	return res
}

func (p *plane) subscribe(t *testing.T, w arbiter.Webhook) arbiter.Webhook {
	t.Helper()
	return p.do(t, arbiter.CreateWebhook{Caller: admin, Webhook: w}).(arbiter.Webhook)
}

func (p *plane) acquire(t *testing.T, name string) {
	t.Helper()
	p.do(t, arbiter.AcquireLock{Caller: admin, Name: name, Holder: "test", TTL: time.Minute, NewToken: strings.Repeat("a", 32)})
}

// swap runs a complete swap on service vllm of machine gpu1.
func (p *plane) swap(t *testing.T, ok bool) arbiter.Swap {
	t.Helper()
	p.do(t, arbiter.RegisterMachine{Machine: arbiter.Machine{Name: "gpu1", Kind: arbiter.KindGPU, Source: arbiter.SourceAgent, Tags: []string{}, GPUs: []arbiter.GPU{}}})
	p.do(t, arbiter.SyncServices{
		Services: []arbiter.Service{{Name: "vllm", Machine: "gpu1", Kind: arbiter.ServiceVLLM, Endpoint: "http://127.0.0.1:1",
			SwapCommand: []string{"/bin/true", "{model}"}, ReadyTimeoutS: 10, SwapTimeoutS: 60}},
		Catalog: []arbiter.CatalogEntry{{Service: "vllm", Key: "gemma", Repo: "google/gemma-3-27b-it"}},
	})
	p.do(t, arbiter.RequestSwap{Caller: admin, ModelKey: "gemma", DryRun: true})
	s := p.do(t, arbiter.RequestSwap{Caller: admin, ModelKey: "gemma"}).(arbiter.Swap)
	p.do(t, arbiter.ClaimSwap{Machine: "gpu1"})
	rc := 0
	if !ok {
		rc = 3
	}
	return p.do(t, arbiter.FinishSwap{ID: s.ID, Machine: "gpu1", ReturnCode: &rc, OK: ok, Reason: "exit 3"}).(arbiter.Swap)
}

func startDispatcher(t *testing.T, p *plane, o Options) (*Dispatcher, context.CancelFunc) {
	t.Helper()
	if o.Plane == nil {
		o.Plane = p
	}
	o.Log = p.store
	if o.MinBackoff == 0 {
		o.MinBackoff = 10 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 40 * time.Millisecond
	}
	o.AllowLinkLocal = false
	d := New(o)
	d.refillEvery = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	}
	t.Cleanup(func() {
		select {
		case <-ctx.Done():
		default:
			stop()
		}
	})
	return d, stop
}

func deliveries(t *testing.T, p *plane, f arbiter.DeliveryFilter) []arbiter.Delivery {
	t.Helper()
	ds, err := p.store.Deliveries(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func waitIdle(t *testing.T, d *Dispatcher, p *plane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Settle(ctx, p.LastSeq()); err != nil {
		t.Fatalf("dispatcher did not settle: %v", err)
	}
}

func TestDispatcherDeliversBothFormats(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	std := newReceiver(t, 204)
	spark := newReceiver(t, 200)
	p.subscribe(t, arbiter.Webhook{URL: std.URL + "/hook", Secret: testSecret, Kinds: []string{"swap.*", "lock.acquired"}})
	p.subscribe(t, arbiter.Webhook{URL: spark.URL, Format: arbiter.WebhookSpark, Secret: "s3cret"})
	d, _ := startDispatcher(t, p, Options{})
	p.acquire(t, "maint")
	sw := p.swap(t, true)

	// standard: lock.acquired, swap.pending, swap.running, swap.complete
	// (the dry run fires nothing); all verify with the official library.
	got := std.wait(t, 4)
	wh, _ := standardwebhooks.NewWebhook(testSecret)
	var types []string
	for _, r := range got {
		if err := wh.Verify(r.body, r.h); err != nil {
			t.Fatalf("standard delivery does not verify: %v\n%s", err, r.body)
		}
		var b StandardBody
		json.Unmarshal(r.body, &b)
		types = append(types, b.Type)
		if r.h.Get("Content-Type") != "application/json" || !strings.HasPrefix(r.h.Get(HeaderID), "msg_") {
			t.Errorf("headers %v", r.h)
		}
	}
	sort.Strings(types) // deliveries run in parallel: order is not promised (seq is in the body)
	if strings.Join(types, " ") != "lock.acquired swap.complete swap.pending swap.running" {
		t.Fatalf("standard types: %v", types)
	}
	// spark: one swap_complete, signed over the exact body.
	sg := spark.wait(t, 1)[0]
	if sg.h.Get(HeaderSparkEvt) != "swap_complete" || !VerifySpark("s3cret", sg.body, sg.h.Get(HeaderSparkSig)) {
		t.Fatalf("spark delivery: %v %s", sg.h, sg.body)
	}
	var sb SparkBody
	if err := json.Unmarshal(sg.body, &sb); err != nil || sb.JobID != sw.ID || sb.ModelKey != "gemma" || sb.State != "complete" || *sb.ReturnCode != 0 || sb.DryRun {
		t.Fatalf("spark body %s", sg.body)
	}
	waitIdle(t, d, p)
	ds := deliveries(t, p, arbiter.DeliveryFilter{})
	if len(ds) != 5 {
		t.Fatalf("log holds %d deliveries, want 5", len(ds))
	}
	for _, dl := range ds {
		if dl.State != arbiter.DeliveryDelivered || dl.Attempts != 1 || len(dl.History) != 1 {
			t.Errorf("delivery %+v", dl)
		}
	}
	// Settled: every event was read and every delivery ended, so what spark
	// got is all it will get.
	if n := len(spark.requests()); n != 1 {
		t.Fatalf("spark got %d requests, want 1 (dry runs fire nothing)", n)
	}
}

// TestSubscriptionCreatedWhileIdle: with no subscription the dispatcher
// reads events late and in bulk; one created meanwhile still gets every
// event after it, and none from before.
func TestSubscriptionCreatedWhileIdle(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	d, _ := startDispatcher(t, p, Options{})
	for i := range 20 {
		p.acquire(t, "before"+itoa(int64(i)))
	}
	subscribeThenAcquire(t, d, p, "after")
}

// subscribeThenAcquire subscribes a receiver to acquired locks, acquires
// lock name, and checks that this one acquisition is all it gets.
func subscribeThenAcquire(t *testing.T, d *Dispatcher, p *plane, name string) {
	t.Helper()
	rcv := newReceiver(t, 204)
	p.subscribe(t, arbiter.Webhook{URL: rcv.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	p.acquire(t, name)
	rcv.wait(t, 1)
	waitIdle(t, d, p)
	if got := rcv.requests(); len(got) != 1 || !strings.Contains(string(got[0].body), `"`+name+`"`) {
		t.Fatalf("got %d deliveries, want the one lock acquired after subscribing: %s", len(got), got[0].body)
	}
}

// watchedPlane records where the dispatcher subscribes from, and can end
// its subscription as the hub ends a lagging one.
type watchedPlane struct {
	*plane
	mu     sync.Mutex
	since  []int64
	cancel context.CancelFunc
}

func (w *watchedPlane) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	w.mu.Lock()
	w.since, w.cancel = append(w.since, since), cancel
	w.mu.Unlock()
	return w.plane.Subscribe(ctx, since)
}

// subscribed waits for the dispatcher's nth subscription and returns where
// it started.
func (w *watchedPlane) subscribed(t *testing.T, n int) int64 {
	t.Helper()
	var since int64
	err := poll.Try(20*time.Second, func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.since) < n {
			return fmt.Errorf("%d subscriptions, want %d", len(w.since), n)
		}
		since = w.since[n-1]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return since
}

func (w *watchedPlane) drop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
}

// TestNothingToReadWithoutSubscriptions: with no subscription enabled, the
// dispatcher follows the events from the last one, at start and after its
// subscription was dropped, rather than have the old ones read back from
// the store; a subscription created afterwards still gets its events.
func TestNothingToReadWithoutSubscriptions(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	for i := range 5 {
		p.acquire(t, "early"+itoa(int64(i)))
	}
	w := &watchedPlane{plane: p}
	d, _ := startDispatcher(t, p, Options{Plane: w})
	if since, last := w.subscribed(t, 1), p.LastSeq(); since != last {
		t.Fatalf("the first subscription starts after event %d, want the last, %d", since, last)
	}
	for i := range 5 {
		p.acquire(t, "lagged"+itoa(int64(i)))
	}
	last := p.LastSeq()
	w.drop()
	if since := w.subscribed(t, 2); since < last {
		t.Fatalf("after a drop the subscription starts after event %d, want at least %d", since, last)
	}
	subscribeThenAcquire(t, d, p, "wanted")
}

func TestDispatcherRetriesThenDelivers(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	rcv := newReceiver(t, 500)
	p.subscribe(t, arbiter.Webhook{URL: rcv.URL, Secret: testSecret, Kinds: []string{"lock.*"}})
	d, _ := startDispatcher(t, p, Options{})
	p.acquire(t, "l")
	rcv.wait(t, 3)
	rcv.status.Store(200)
	got := rcv.wait(t, 4)
	waitIdle(t, d, p)
	// Every attempt carries the same webhook-id.
	for _, r := range got {
		if r.h.Get(HeaderID) != got[0].h.Get(HeaderID) {
			t.Fatalf("webhook-id changed across retries: %s, %s", got[0].h.Get(HeaderID), r.h.Get(HeaderID))
		}
	}
	ds := deliveries(t, p, arbiter.DeliveryFilter{})
	if len(ds) != 1 || ds[0].State != arbiter.DeliveryDelivered || ds[0].Attempts < 4 || len(ds[0].History) != ds[0].Attempts {
		t.Fatalf("deliveries: %+v", ds)
	}
	if h := ds[0].History[0]; h.Status != 500 || !strings.Contains(h.Error, "500") {
		t.Fatalf("first attempt: %+v", h)
	}
}

func TestDispatcherGivesUpAndGone(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	down := newReceiver(t, 503)
	gone := newReceiver(t, 410)
	p.subscribe(t, arbiter.Webhook{ID: "down", URL: down.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	p.subscribe(t, arbiter.Webhook{ID: "gone", URL: gone.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	d, _ := startDispatcher(t, p, Options{RetryFor: 150 * time.Millisecond})
	p.acquire(t, "l")
	waitIdle(t, d, p)
	dd := deliveries(t, p, arbiter.DeliveryFilter{Webhook: "down"})
	if len(dd) != 1 || dd[0].State != arbiter.DeliveryFailed || !strings.Contains(dd[0].LastError, "gave up after") || dd[0].Attempts < 1 {
		t.Fatalf("down: %+v", dd)
	}
	gd := deliveries(t, p, arbiter.DeliveryFilter{Webhook: "gone"})
	if len(gd) != 1 || gd[0].State != arbiter.DeliveryFailed || gd[0].Attempts != 1 || gd[0].LastStatus != 410 {
		t.Fatalf("gone: %+v", gd)
	}
	v, _ := p.Record(arbiter.RecordWebhook, "gone")
	if w := v.(arbiter.Webhook); w.Enabled || !strings.Contains(w.DisabledReason, "410") {
		t.Fatalf("subscription after 410: %+v", w)
	}
	// A disabled subscription gets nothing more.
	p.acquire(t, "m")
	waitIdle(t, d, p)
	if n := len(gone.requests()); n != 1 {
		t.Fatalf("gone got %d requests after being disabled, want 1", n)
	}
}

// TestSlowReceiverNeverDelaysDecisions hangs the receiver and checks that
// commands keep being decided and saved at their usual speed meanwhile.
func TestSlowReceiverNeverDelaysDecisions(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	rcv := newReceiver(t, 200)
	rcv.hang = make(chan struct{})
	defer close(rcv.hang)
	// Two subscriptions: one may hold only half the workers.
	p.subscribe(t, arbiter.Webhook{ID: "a", URL: rcv.URL, Secret: testSecret, Kinds: []string{"*"}})
	p.subscribe(t, arbiter.Webhook{ID: "b", URL: rcv.URL, Secret: testSecret, Kinds: []string{"*"}})
	startDispatcher(t, p, Options{Timeout: 30 * time.Second, Workers: 2})
	var worst time.Duration
	for i := 0; i < 40; i++ {
		start := time.Now()
		p.acquire(t, "l"+itoa(int64(i)))
		worst = max(worst, time.Since(start))
	}
	rcv.wait(t, 2) // both workers are stuck on the receiver
	start := time.Now()
	p.acquire(t, "after")
	worst = max(worst, time.Since(start))
	if worst > 5*time.Second { // coupled, a command would wait out the 30s timeout
		t.Fatalf("a command took %v while the receiver hung", worst)
	}
	if n := len(p.Records(arbiter.RecordLock)); n != 41 {
		t.Fatalf("%d locks held, want 41", n)
	}
}

// TestDeliveriesSurviveACrash stops the dispatcher and the control loop
// while deliveries are pending (the receiver is down), and events are
// committed that it never read; after a restart on the same file all of
// them are delivered, with the same webhook-ids.
func TestDeliveriesSurviveACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.db")
	rcv := newReceiver(t, 500)
	p := openPlane(t, path)
	p.subscribe(t, arbiter.Webhook{URL: rcv.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	_, stop := startDispatcher(t, p, Options{MinBackoff: time.Hour, MaxBackoff: time.Hour})
	// The receiver holds its answer until the dispatcher is gone, so the
	// attempt is cut in flight rather than recorded (with an hour's backoff)
	// first, however the two goroutines are scheduled.
	rcv.mu.Lock()
	rcv.hang = make(chan struct{})
	rcv.mu.Unlock()
	p.acquire(t, "a")
	first := rcv.wait(t, 1)[0]
	stop() // the dispatcher dies with the delivery pending
	rcv.mu.Lock()
	close(rcv.hang)
	rcv.hang = nil
	rcv.mu.Unlock()
	p.acquire(t, "b") // committed while no dispatcher runs
	p.close()

	rcv.status.Store(200)
	p2 := openPlane(t, path)
	d2, _ := startDispatcher(t, p2, Options{})
	waitIdle(t, d2, p2)
	got := rcv.requests()
	ids := map[string]int{}
	for _, r := range got {
		ids[r.h.Get(HeaderID)]++
	}
	if len(ids) != 2 || ids[first.h.Get(HeaderID)] != 2 {
		t.Fatalf("webhook-ids after restart: %v, want the first twice and one more", ids)
	}
	for _, dl := range deliveries(t, p2, arbiter.DeliveryFilter{}) {
		if dl.State != arbiter.DeliveryDelivered {
			t.Fatalf("after restart: %+v", dl)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestDispatcherSparkUnsignedAndFailed: without a secret the spark form
// carries no x-spark-signature (seed 000 signs only when a secret is set);
// a failed swap is x-spark-event swap_failed with its returncode; the
// headers are exactly those a receiver of seed 000 reads.
func TestDispatcherSparkUnsignedAndFailed(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	rcv := newReceiver(t, 200)
	p.subscribe(t, arbiter.Webhook{URL: rcv.URL, Format: arbiter.WebhookSpark})
	d, _ := startDispatcher(t, p, Options{})
	sw := p.swap(t, false)
	got := rcv.wait(t, 1)[0]
	waitIdle(t, d, p)
	if _, signed := got.h[http.CanonicalHeaderKey(HeaderSparkSig)]; signed {
		t.Fatalf("unsigned subscription sent %s: %v", HeaderSparkSig, got.h)
	}
	if got.h.Get("Content-Type") != "application/json" || got.h.Get(HeaderSparkEvt) != "swap_failed" {
		t.Fatalf("headers: %v", got.h)
	}
	var b map[string]any
	if err := json.Unmarshal(got.body, &b); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, " ") != "dry_run event finished_at job_id model_key returncode started_at state" {
		t.Fatalf("spark body keys %v: %s", keys, got.body)
	}
	if b["event"] != "swap_failed" || b["job_id"] != sw.ID || b["state"] != "failed" || b["returncode"] != 3.0 || b["dry_run"] != false {
		t.Fatalf("spark body %s", got.body)
	}
	if n := len(rcv.requests()); n != 1 {
		t.Fatalf("got %d requests, want 1", n)
	}
}

// TestDispatcherRetriesATimeout: a receiver that does not answer within
// the timeout is retried like one that answers 500, with the same
// webhook-id, and the attempt records the timeout.
func TestDispatcherRetriesATimeout(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	rcv := newReceiver(t, 200)
	hang := make(chan struct{})
	rcv.mu.Lock()
	rcv.hang = hang
	rcv.mu.Unlock()
	p.subscribe(t, arbiter.Webhook{URL: rcv.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	d, _ := startDispatcher(t, p, Options{Timeout: 100 * time.Millisecond})
	p.acquire(t, "l")
	rcv.wait(t, 2)
	rcv.mu.Lock()
	rcv.hang = nil
	rcv.mu.Unlock()
	close(hang)
	waitIdle(t, d, p)
	ds := deliveries(t, p, arbiter.DeliveryFilter{})
	if len(ds) != 1 || ds[0].State != arbiter.DeliveryDelivered || ds[0].Attempts < 2 {
		t.Fatalf("deliveries: %+v", ds)
	}
	if h := ds[0].History[0]; h.Status != 0 || !strings.Contains(h.Error, "no answer within") {
		t.Fatalf("first attempt: %+v", h)
	}
	got := rcv.requests()
	for _, r := range got {
		if r.h.Get(HeaderID) != got[0].h.Get(HeaderID) {
			t.Fatalf("webhook-id changed across retries")
		}
	}
}

// TestDeletedSubscriptionsDeliveryNotForItsSuccessor: a delivery still
// pending when its subscription is deleted ends failed, and does not go
// to a later subscription given the same id.
func TestDeletedSubscriptionsDeliveryNotForItsSuccessor(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	old := newReceiver(t, 500)
	succ := newReceiver(t, 200)
	p.subscribe(t, arbiter.Webhook{ID: "ops", URL: old.URL, Secret: testSecret, Kinds: []string{"lock.*"}})
	d, _ := startDispatcher(t, p, Options{MinBackoff: 400 * time.Millisecond, MaxBackoff: 400 * time.Millisecond})
	p.acquire(t, "l") // lock.acquired: a delivery to old, which fails and waits to be retried
	old.wait(t, 1)
	p.do(t, arbiter.DeleteWebhook{Caller: admin, ID: "ops"})
	p.subscribe(t, arbiter.Webhook{ID: "ops", URL: succ.URL, Secret: "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3OA==", Kinds: []string{"swap.complete"}})
	waitIdle(t, d, p)
	if got := succ.requests(); len(got) != 0 {
		t.Fatalf("the new subscription (created after the event, kinds swap.complete) got %d request(s): %s", len(got), got[0].body)
	}
}

// pendingDelivery is the pending delivery of event seq to subscription
// webhook, due at due.
func pendingDelivery(seq int64, webhook string, due time.Time) arbiter.Delivery {
	return arbiter.Delivery{ID: "msg_" + itoa(seq) + "_" + webhook, Webhook: webhook, EventSeq: seq, EventKind: "lock.acquired",
		Body: []byte(`{}`), State: arbiter.DeliveryPending, NextAttemptAt: &due, CreatedAt: due, UpdatedAt: due}
}

// deadAndOK are a receiver that never answers (until the test ends) and
// one that answers 204, subscribed as "dead" and, unless later, "ok".
func deadAndOK(t *testing.T, p *plane, later bool) (dead, ok *receiver) {
	dead = newReceiver(t, 200)
	dead.hang = make(chan struct{})
	t.Cleanup(func() { close(dead.hang) })
	ok = newReceiver(t, 204)
	p.subscribe(t, arbiter.Webhook{ID: "dead", URL: dead.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	if !later {
		p.subscribe(t, arbiter.Webhook{ID: "ok", URL: ok.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	}
	return dead, ok
}

// TestHangingReceiverHoldsUpNoOther: a subscription whose receiver never
// answers (a black-holed host) holds half the workers at most, and one
// once its attempts go unanswered; another subscription's deliveries go
// on meanwhile. Before, it took every worker for the whole timeout.
func TestHangingReceiverHoldsUpNoOther(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	dead, ok := deadAndOK(t, p, false)
	startDispatcher(t, p, Options{Timeout: time.Hour}) // 8 workers
	const n = 20
	for i := range n {
		p.acquire(t, "l"+itoa(int64(i)))
	}
	ok.wait(t, n)
	if got := len(dead.requests()); got > DefaultWorkers/2 {
		t.Errorf("the hanging receiver has %d attempts in flight, want at most %d", got, DefaultWorkers/2)
	}
}

// TestPendingBeyondWhatIsHeld: deliveries past what the dispatcher holds
// in memory wait in the log and are read from it as the held ones finish,
// at start and while running. Before, those past the first 100,000 read at
// start were never attempted.
func TestPendingBeyondWhatIsHeld(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	rcv := newReceiver(t, 204)
	p.subscribe(t, arbiter.Webhook{ID: "ok", URL: rcv.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	now := time.Now().UTC()
	var ds []arbiter.Delivery
	for i := range 25 {
		// For a subscription that is gone: each is failed at once, no POST.
		ds = append(ds, pendingDelivery(int64(i+1), "gone", now))
	}
	ds = append(ds, pendingDelivery(99, "ok", now.Add(time.Millisecond)))
	if err := p.store.EnqueueDeliveries(t.Context(), ds, 0); err != nil {
		t.Fatal(err)
	}
	d, _ := startDispatcher(t, p, Options{Held: 4, Workers: 2})
	for i := range 12 { // while running: more than it holds at once
		p.acquire(t, "l"+itoa(int64(i)))
	}
	waitIdle(t, d, p)
	if got := rcv.requests(); len(got) != 13 {
		t.Errorf("the receiver got %d deliveries, want 13 (1 from the log, 12 new)", len(got))
	}
	if left := deliveries(t, p, arbiter.DeliveryFilter{State: arbiter.DeliveryPending}); len(left) != 0 {
		t.Errorf("%d deliveries still pending after the dispatcher settled", len(left))
	}
}

// slowRefillLog delays each PendingDeliveries after the first until the
// store holds at most want pending deliveries: the interleaving where the
// workers have recorded their attempts but the loop has not yet read
// their results when it refills.
type slowRefillLog struct {
	arbiter.DeliveryLog
	calls atomic.Int32
	want  int
}

func (l *slowRefillLog) PendingDeliveries(ctx context.Context, limit int, skip []string) ([]arbiter.Delivery, error) {
	if l.calls.Add(1) > 1 {
		_ = poll.Try(5*time.Second, func() error {
			ds, err := l.DeliveryLog.PendingDeliveries(ctx, 1000, nil)
			if err != nil || len(ds) > l.want {
				return context.DeadlineExceeded
			}
			return nil
		})
	}
	return l.DeliveryLog.PendingDeliveries(ctx, limit, skip)
}

// TestRefillKeepsWhatDidNotFit: a refill that reads fewer than Held
// deliveries, some of which do not fit beside those still held (attempted,
// their results not read yet), leaves the dispatcher behind: those are
// attempted too, and Settle waits for them.
func TestRefillKeepsWhatDidNotFit(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	now := time.Now().UTC()
	var ds []arbiter.Delivery
	for i := range 7 {
		// For subscriptions that are gone (one each, so the per-subscription
		// limit does not apply): each is failed at once, no POST.
		ds = append(ds, pendingDelivery(int64(i+1), "gone"+itoa(int64(i)), now))
	}
	if err := p.store.EnqueueDeliveries(t.Context(), ds, 0); err != nil {
		t.Fatal(err)
	}
	p.acquire(t, "l") // an event for Settle to wait for: the dispatcher has started
	o := Options{Held: 4, Workers: 4, Plane: p, Log: &slowRefillLog{DeliveryLog: p.store, want: 3}}
	d := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitIdle(t, d, p)
	if left := deliveries(t, p, arbiter.DeliveryFilter{State: arbiter.DeliveryPending}); len(left) != 0 {
		t.Errorf("%d deliveries still pending after the dispatcher settled (never attempted)", len(left))
	}
}

// TestOneSubscriptionDoesNotFillMemory: a subscription whose deliveries
// pile up (its receiver hangs) holds no more than its share of what is
// held: another's new deliveries are held and delivered, not left in the
// log until the first's are given up.
func TestOneSubscriptionDoesNotFillMemory(t *testing.T) {
	p := openPlane(t, filepath.Join(t.TempDir(), "a.db"))
	_, ok := deadAndOK(t, p, true)
	startDispatcher(t, p, Options{Timeout: time.Hour, Held: 8, Workers: 2})
	for i := range 20 {
		p.acquire(t, "d"+itoa(int64(i)))
	}
	p.subscribe(t, arbiter.Webhook{ID: "ok", URL: ok.URL, Secret: testSecret, Kinds: []string{"lock.acquired"}})
	for i := range 5 {
		p.acquire(t, "o"+itoa(int64(i)))
	}
	ok.wait(t, 5)
}

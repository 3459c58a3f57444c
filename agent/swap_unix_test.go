//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/poll"
)

// testRunner is a swap runner for srv with short waits.
func testRunner(t *testing.T, srv SwapServer) *swapRunner {
	return &swapRunner{srv: srv, machine: "gpu1", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		minBackoff: 10 * time.Millisecond, maxBackoff: 50 * time.Millisecond, callTimeout: 5 * time.Second,
		http: probeClient(time.Second), dir: t.TempDir(), killGrace: 200 * time.Millisecond}
}

// TestSwapTimeoutStopsTheWholeGroup: a swap command past its timeout is
// stopped with its children, even one that ignores SIGTERM.
func TestSwapTimeoutStopsTheWholeGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	sh := script(t, `trap '' TERM; sleep 120 & echo $! > `+pidFile+`; echo started; wait`)
	sw := vllmSwap([]string{sh}, "")
	sw.TimeoutS = 0.5
	f := &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if f.result == nil || f.result.OK || !strings.Contains(f.result.Reason, "did not finish within") {
		t.Fatalf("got %+v", f.result)
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("no child pid: %q", b)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	poll.Until(t, 5*time.Second, "the command's child to be gone", func() bool { return processGone(pid) })
}

// finishFailsFirst answers the first FinishSwap as an unreachable server
// would, and records the claims that follow.
type finishFailsFirst struct {
	mu       sync.Mutex
	finishes int
	claims   int
	sw       *arbiter.Swap
}

func (f *finishFailsFirst) ClaimSwap(ctx context.Context, _ string, _ time.Duration) (*arbiter.Swap, error) {
	f.mu.Lock()
	f.claims++
	n := f.claims
	f.mu.Unlock()
	if n == 1 {
		return f.sw, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

func (f *finishFailsFirst) AppendSwapLog(context.Context, string, string, []string) error { return nil }

func (f *finishFailsFirst) FinishSwap(_ context.Context, id string, _ client.SwapResult) (arbiter.Swap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finishes++
	if f.finishes == 1 {
		return arbiter.Swap{}, errors.New("cannot reach arbiter: connection reset by peer")
	}
	return arbiter.Swap{ID: id}, nil
}

// TestSwapEndReportedAgain: a report of a swap's end that does not reach
// the server is sent again before the runner claims the next swap (whose
// claim would fail a swap still running here).
func TestSwapEndReportedAgain(t *testing.T) {
	f := &finishFailsFirst{sw: vllmSwap([]string{script(t, `echo ok`)}, "")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go testRunner(t, f).run(ctx)
	poll.Until(t, 10*time.Second, "the runner to claim again", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.claims >= 2
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finishes < 2 {
		t.Fatalf("FinishSwap tried %d time(s) before the next claim", f.finishes)
	}
}

// smallBodyServer refuses a log batch over limit bytes, as a server with
// a small max_body_bytes does.
type smallBodyServer struct {
	fakeSwapServer
	limit int
}

func (s *smallBodyServer) AppendSwapLog(ctx context.Context, id, machine string, lines []string) error {
	n := 0
	for _, l := range lines {
		n += len(l) + 3
	}
	if n > s.limit {
		return arbiter.Errorf(arbiter.ETooLarge, "request body is larger than the limit of %d bytes", s.limit)
	}
	return s.fakeSwapServer.AppendSwapLog(ctx, id, machine, lines)
}

// TestSwapLogOfLongLinesArrivesWhole: a command writing long lines has
// every one of them logged: batches stay under the server's body limit,
// and one the server still finds too large goes in halves.
func TestSwapLogOfLongLinesArrivesWhole(t *testing.T) {
	sh := script(t, `i=0; while [ $i -lt 600 ]; do printf '%04d %04000d\n' $i 0; i=$((i+1)); done`)
	f := &smallBodyServer{fakeSwapServer: fakeSwapServer{done: make(chan struct{})}, limit: 64 << 10}
	testRunner(t, f).runSwap(context.Background(), vllmSwap([]string{sh}, ""))
	n := 0
	for _, l := range f.lines {
		if len(l) > 4000 {
			n++
		}
	}
	if n != 600 {
		t.Fatalf("%d of 600 long lines logged", n)
	}
}

// modelList serves GET /v1/models with one model {id, root}.
func modelList(t *testing.T, id, root string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]any{{"id": id, "root": root, "object": "model"}}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestSwapTimeoutBoundsTheWholeSwap: swap_timeout_s bounds the command and
// the endpoint wait together, as the server counts it, so the agent does
// not work on a swap the server has already failed.
func TestSwapTimeoutBoundsTheWholeSwap(t *testing.T) {
	vllm := modelList(t, "old/model", "old/model") // never the new model
	sw := vllmSwap([]string{script(t, "exit 0")}, vllm.URL)
	now := time.Now()
	sw.CreatedAt, sw.StartedAt = now.Add(-29*time.Second), &now // claimed 29 s into its 30 s
	sw.ReadyTimeoutS = 60
	f := &fakeSwapServer{done: make(chan struct{})}
	start := time.Now()
	testRunner(t, f).runSwap(context.Background(), sw)
	if took := time.Since(start); took > 10*time.Second || f.result == nil || f.result.OK {
		t.Fatalf("a swap with 1 s of its timeout left ran %s on the agent; result %+v", took.Round(100*time.Millisecond), f.result)
	}
}

// endedServer answers a swap's log and end as the server does once it has
// failed the swap: 409.
type endedServer struct {
	mu       sync.Mutex
	finished bool
}

func (c *endedServer) ClaimSwap(context.Context, string, time.Duration) (*arbiter.Swap, error) {
	return nil, nil
}
func (c *endedServer) AppendSwapLog(context.Context, string, string, []string) error {
	return arbiter.Errorf(arbiter.EConflict, "swap 7 is failed, not running")
}
func (c *endedServer) FinishSwap(context.Context, string, client.SwapResult) (arbiter.Swap, error) {
	c.mu.Lock()
	c.finished = true
	c.mu.Unlock()
	return arbiter.Swap{}, arbiter.Errorf(arbiter.EConflict, "swap 7 is failed, not running")
}

// TestSwapStopsWhenTheServerEndedIt: once the server answers that the swap
// is no longer running, the agent stops its command (and what the command
// started) rather than run it to its own timeout.
func TestSwapStopsWhenTheServerEndedIt(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	sw := vllmSwap([]string{script(t, `sleep 120 & echo $! > `+pidFile+`; while :; do echo loading; sleep 0.1; done`)}, "")
	sw.TimeoutS = 120
	done := make(chan struct{})
	go func() { testRunner(t, &endedServer{}).runSwap(context.Background(), sw); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the swap command still ran 20 s after the server answered 409 to its log")
	}
	b, _ := os.ReadFile(pidFile)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
		poll.Until(t, 5*time.Second, "the command's child to be gone", func() bool { return processGone(pid) })
	}
}

// TestReadinessWantsTheSwapsModel: entries sharing one served name are
// told apart by the model's root, so the previous server, still up and
// listing the same name, is not taken for the new one.
func TestReadinessWantsTheSwapsModel(t *testing.T) {
	vllm := modelList(t, "chat", "old/model")
	sw := vllmSwap([]string{script(t, "exit 0")}, vllm.URL)
	sw.ServedNames, sw.Repo = []string{"chat"}, "google/gemma-3-27b-it"
	sw.ReadyTimeoutS = 1
	f := &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if f.result.OK || !strings.Contains(f.log(), "chat (old/model)") {
		t.Fatalf("swap to google/gemma-3-27b-it while the endpoint serves root old/model: %+v; log:\n%s", f.result, f.log())
	}
	ok := modelList(t, "chat", "google/gemma-3-27b-it/")
	sw.Endpoint = ok.URL
	f = &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if !f.result.OK {
		t.Fatalf("the endpoint serves chat with root google/gemma-3-27b-it/: %+v; log:\n%s", f.result, f.log())
	}
}

// TestReadinessFollowsNoRedirect: an endpoint that only redirects to
// another server does not itself serve the model.
func TestReadinessFollowsNoRedirect(t *testing.T) {
	other := modelList(t, "google/gemma-3-27b-it", "google/gemma-3-27b-it")
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(redir.Close)
	sw := vllmSwap([]string{script(t, "exit 0")}, redir.URL)
	sw.ReadyTimeoutS = 1
	f := &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if f.result.OK || !strings.Contains(f.log(), "302") {
		t.Fatalf("endpoint %s only redirects, yet the swap is %+v; log:\n%s", redir.URL, f.result, f.log())
	}
}

// TestSwapCommandGetsNoAgentCredentials: the swap command, and what it
// runs, do not inherit the agent's token (a launch script that prints its
// environment would put it in the swap log, which everyone may read).
func TestSwapCommandGetsNoAgentCredentials(t *testing.T) {
	t.Setenv("ARBITER_TOKEN", "agent-secret-123")
	t.Setenv("ARBITER_LOCK_TOKEN", "lock-secret-456")
	t.Setenv("ARBITER_URL", "http://arbiter.lab:7070")
	sw := vllmSwap([]string{script(t, `echo "token=$ARBITER_TOKEN lock=$ARBITER_LOCK_TOKEN url=$ARBITER_URL"`)}, "")
	f := &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if log := f.log(); strings.Contains(log, "secret") || !strings.Contains(log, "url=http://arbiter.lab:7070") {
		t.Fatalf("the swap command's environment:\n%s", log)
	}
}

// TestFailedSwapStopsWhatItLaunched: a launch script that leaves a server
// running in the background and exits 0, the server never ready: the swap
// fails and the server it launched is stopped, not left holding GPUs.
func TestFailedSwapStopsWhatItLaunched(t *testing.T) {
	vllm := modelList(t, "old/model", "old/model")
	pidFile := filepath.Join(t.TempDir(), "child")
	sw := vllmSwap([]string{script(t, `sleep 120 & echo $! > `+pidFile+`; exit 0`)}, vllm.URL)
	sw.ReadyTimeoutS = 1
	f := &fakeSwapServer{done: make(chan struct{})}
	testRunner(t, f).runSwap(context.Background(), sw)
	if f.result.OK {
		t.Fatal("setup: the swap should fail")
	}
	b, _ := os.ReadFile(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("no child pid: %q", b)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	poll.Until(t, 10*time.Second, "the launched server to be stopped", func() bool { return processGone(pid) })
	if !strings.Contains(f.log(), "stopped what the swap command left running") {
		t.Errorf("the log does not say so:\n%s", f.log())
	}
}

// agent instance: the swap it runs, while it is not finished, is handed
// out again (engine/swaps.go claim). Its first FinishSwap fails.
type reclaimServer struct {
	mu       sync.Mutex
	sw       arbiter.Swap
	finished bool
	finishes int
	claims   int
	cancel   context.CancelFunc
}

func (f *reclaimServer) ClaimSwap(context.Context, string, time.Duration) (*arbiter.Swap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims++
	if f.claims > 3 {
		f.cancel()
	}
	if f.finished {
		return nil, nil
	}
	s := f.sw
	return &s, nil
}

func (f *reclaimServer) AppendSwapLog(context.Context, string, string, []string) error { return nil }

func (f *reclaimServer) FinishSwap(_ context.Context, id string, r client.SwapResult) (arbiter.Swap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finishes++
	if f.finishes == 1 {
		return arbiter.Swap{}, arbiter.Errorf(arbiter.EUnauthorized, "the agent's token is not known (yet) to this leader")
	}
	f.finished = true
	return arbiter.Swap{ID: id}, nil
}

// TestSwapNotRunAgainAfterAFailedFinish: the end of a swap could not be
// reported; the runner's next claim, from the same process, gets the same
// running swap back, and the runner reports its end again rather than run
// its command a second time (restarting the service again).
func TestSwapNotRunAgainAfterAFailedFinish(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "runs")
	sh := script(t, `echo run >> "$1"`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &reclaimServer{cancel: cancel, sw: arbiter.Swap{ID: "7", Service: "vllm", Machine: "gpu1", ModelKey: "gemma",
		Command: []string{sh, count}, Kind: arbiter.ServiceCommand, TimeoutS: 30, State: arbiter.SwapRunning}}
	r := &swapRunner{srv: f, machine: "gpu1", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		minBackoff: 10 * time.Millisecond, maxBackoff: 50 * time.Millisecond, callTimeout: 5 * time.Second,
		http: probeClient(time.Second), dir: t.TempDir()}
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("runner did not stop")
	}
	b, _ := os.ReadFile(count)
	if n := strings.Count(string(b), "run"); n != 1 {
		t.Fatalf("the swap command ran %d times for one swap", n)
	}
}

// TestSwapEndedByServerStopsWhatItLeftRunning: the command exits 0 at
// once, leaving its server in the background; the agent learns the swap
// had ended only when its last log lines are answered 409: what the
// command left running is stopped all the same.
func TestSwapEndedByServerStopsWhatItLeftRunning(t *testing.T) {
	dir := t.TempDir()
	pidf := filepath.Join(dir, "pid")
	sh := script(t, `sleep 60 & echo $! > "$1"`)
	testRunner(t, &endedServer{}).runSwap(context.Background(), &arbiter.Swap{ID: "7", Service: "svc", Machine: "gpu1", ModelKey: "m",
		Command: []string{sh, pidf}, Kind: arbiter.ServiceCommand, TimeoutS: 30})
	b, err := os.ReadFile(pidf)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(n, syscall.SIGKILL) })
	poll.Until(t, 10*time.Second, "the swap's background process to be stopped", func() bool { return processGone(n) })
}

// cancelledServer answers a swap's log as the server does once the swap
// was cancelled: every line posted before the cancel is taken; the first
// post after it, lines or none, is answered 409.
type cancelledServer struct {
	fakeSwapServer
	cancelled atomic.Bool
}

func (c *cancelledServer) AppendSwapLog(ctx context.Context, id, machine string, lines []string) error {
	if c.cancelled.Load() {
		return arbiter.Errorf(arbiter.EConflict, "swap %s is failed, not running", id)
	}
	return c.fakeSwapServer.AppendSwapLog(ctx, id, machine, lines)
}

// TestSilentSwapLearnsItWasCancelled: a swap whose command says nothing
// for long (a model loading) still asks the server every few seconds
// whether it runs, and stops its command once it was cancelled.
func TestSilentSwapLearnsItWasCancelled(t *testing.T) {
	sw := vllmSwap([]string{script(t, `echo started; sleep 120`)}, "")
	sw.TimeoutS = 300
	c := &cancelledServer{fakeSwapServer: fakeSwapServer{done: make(chan struct{})}}
	done := make(chan struct{})
	go func() { testRunner(t, c).runSwap(context.Background(), sw); close(done) }()
	poll.Until(t, 10*time.Second, "the command to start", func() bool { return strings.Contains(c.log(), "started") })
	c.cancelled.Store(true)
	select {
	case <-done:
	case <-time.After(swapLogPing + 15*time.Second):
		t.Fatal("a cancelled swap's silent command still runs")
	}
}

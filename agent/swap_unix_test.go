//go:build unix

package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

package poll_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/poll"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int64
	go func() {
		for range 5 {
			n.Add(1)
		}
	}()
	start := time.Now()
	poll.Until(t, 10*time.Second, "five increments", func() bool { return n.Load() == 5 })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v for a condition that holds at once", d)
	}
}

func TestTryChecksAtOnce(t *testing.T) {
	calls := 0
	if err := poll.Try(time.Hour, func() error { calls++; return nil }); err != nil || calls != 1 {
		t.Fatalf("got %v after %d calls, want nil after 1", err, calls)
	}
}

func TestTryBacksOff(t *testing.T) {
	// In 200ms a 1ms poll would check about 200 times; doubling up to 20ms
	// checks about 15 times.
	calls := 0
	err := poll.Try(200*time.Millisecond, func() error { calls++; return errors.New("no") })
	if err == nil {
		t.Fatal("got nil, want a timeout")
	}
	if calls < 2 || calls > 60 {
		t.Errorf("checked %d times in 200ms, want a few dozen at most", calls)
	}
}

func TestTryReportsTheLastError(t *testing.T) {
	calls := 0
	err := poll.Try(30*time.Millisecond, func() error { calls++; return fmt.Errorf("state is %d", calls) })
	if err == nil {
		t.Fatal("got nil, want a timeout")
	}
	if want := fmt.Sprintf("state is %d", calls); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "timed out after 30ms") {
		t.Errorf("got %q, want the timeout and the last error %q", err, want)
	}
}

// recorder is a testing.TB that notes a failure instead of ending the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestUntilFailsWithWhat(t *testing.T) {
	r := &recorder{TB: t}
	poll.Until(r, 20*time.Millisecond, "the moon to turn blue", func() bool { return false })
	if r.failed != "timed out after 20ms waiting for the moon to turn blue" {
		t.Errorf("got failure %q", r.failed)
	}
}

// TestExeced: once Execed returns, a process just started, directly or
// through a shell that execs it, shows its command line.
func TestExeced(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	for i := range 20 {
		c := exec.Command("sleep", "30")
		if i%2 == 1 {
			c = exec.Command("sh", "-c", "exec sleep 30")
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		poll.Execed(t, "sleep", c.Process.Pid)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Process.Pid))
		c.Process.Kill()
		c.Wait()
		if err != nil || string(b) != "sleep\x0030\x00" {
			t.Fatalf("after Execed: command line %q, %v", b, err)
		}
	}
}

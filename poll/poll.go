// Package poll waits for a condition by checking it again and again until
// a deadline: the one way the tests of this module wait for something
// another goroutine or process does.
//
// A fixed sleep waits too long on a fast machine and too little on a busy
// one; a poll returns as soon as the condition holds and fails only after a
// generous deadline. The interval starts at a millisecond and doubles up to
// 20ms, so a quick condition costs almost nothing and a slow one does not
// spin. Waiting for a deadline of the code under test is not a poll: drive a
// fake clock (package clock) instead.
package poll

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The interval between two checks starts at firstInterval and doubles up
// to maxInterval.
const (
	firstInterval = time.Millisecond
	maxInterval   = 20 * time.Millisecond
)

// errNotYet is what Until's condition reports while it does not hold.
var errNotYet = errors.New("condition does not hold")

// Until checks cond until it returns true. If timeout passes first, it
// fails t (t.Fatalf, so call it from the test's goroutine) with a message
// that names what was awaited: "timed out after 10s waiting for <what>".
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Try(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Try calls try until it returns nil and then returns nil. If timeout
// passes first, it returns try's last error, wrapped with the timeout, so
// the error says why the wait failed. try is called at least once, and
// once more at the deadline, so a wait that overran on a busy machine is
// not reported as a failure.
func Try(timeout time.Duration, try func() error) error {
	deadline := time.Now().Add(timeout)
	interval := firstInterval
	for {
		err := try()
		if err == nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("timed out after %v: %w", timeout, err)
		}
		time.Sleep(min(interval, left))
		interval = min(2*interval, maxInterval)
	}
}

// Execed waits until each of pids runs program name (the first word of
// its command line in /proc). A process just started (exec.Cmd.Start has
// returned) shows neither arguments nor environment for a moment — exec
// sets them last — and a shell that will exec the program still shows
// itself: a test that reads them at once reads the wrong thing.
// Elsewhere than Linux it returns at once.
func Execed(t testing.TB, name string, pids ...int) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	for _, pid := range pids {
		Until(t, 10*time.Second, fmt.Sprintf("process %d to run %s", pid, name), func() bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			first, _, _ := strings.Cut(string(b), "\x00")
			return first == name
		})
	}
}

//go:build unix

package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// signalProcess sends SIGTERM, or SIGKILL when kill is set, to p; it fails
// with os.ErrProcessDone when p has ended.
func signalProcess(p *os.Process, kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	return p.Signal(sig)
}

// processGone reports whether pid no longer runs: it does not exist, or is
// a zombie waiting for its parent. A process whose main thread exited
// while others run shows its main thread's zombie state too: it runs
// while it has more than one thread.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrPermission) && os.IsNotExist(err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return false
	}
	// After COMM: state(3) … num_threads(20), i.e. f[0] … f[17].
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 18 || (f[0] != "Z" && f[0] != "X") {
		return false
	}
	return f[17] == "1" || f[17] == "0"
}

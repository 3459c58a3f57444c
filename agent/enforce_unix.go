//go:build unix

package agent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// signalProcess sends SIGTERM, or SIGKILL when kill is set, to pid.
func signalProcess(pid int, kill bool) error {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	return syscall.Kill(pid, sig)
}

// processGone reports whether pid no longer runs: it does not exist, or is
// a zombie waiting for its parent.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrPermission) && os.IsNotExist(err)
	}
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] == 'Z' || b[i+2] == 'X'
	}
	return false
}

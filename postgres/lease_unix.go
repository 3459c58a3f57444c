//go:build unix

package postgres

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// processAlive reports whether a process with this id runs on this host
// (or might: a process of another user answers EPERM). A zombie — killed,
// not yet reaped by a parent that does not reap, as in some containers —
// does not run.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	return !zombie(pid)
}

// zombie reports whether /proc says pid has exited and waits to be
// reaped; false where there is no /proc.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state …: comm may hold spaces and parentheses, the
	// state follows the last ")".
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

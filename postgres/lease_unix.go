//go:build unix

package postgres

import (
	"errors"
	"syscall"
)

// processAlive reports whether a process with this id runs on this host
// (or might: a process of another user answers EPERM).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

//go:build unix

package batchlog

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on f without waiting; closing f
// releases it.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}

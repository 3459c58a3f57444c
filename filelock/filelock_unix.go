//go:build unix

package filelock

import (
	"errors"
	"os"
	"syscall"
)

// Exclusive opens (creating) the file at path for reading and writing and
// takes an exclusive flock on it without waiting. Errors: ErrHeld when
// another open file holds it; the file system's.
func Exclusive(path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrHeld
		}
		return nil, err
	}
	return f, nil
}

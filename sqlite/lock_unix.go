//go:build unix

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

// lockExclusive opens (creating) the file at path and takes an exclusive
// flock on it without waiting: errLockHeld when another open file holds it.
// flock locks belong to the open file, so they are released when it is
// closed or its process dies.
func lockExclusive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
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
			return nil, errLockHeld
		}
		return nil, err
	}
	return f, nil
}

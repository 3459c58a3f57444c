package batchlog

import (
	"errors"
	"os"
	"syscall"
)

// datasync makes f's data durable, and only the metadata needed to read
// it back: for an overwrite within a written file, none.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// openDirect opens path for direct writes that return once durable.
// Errors: EINVAL (wrapped) where the file system has no direct I/O.
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT|syscall.O_DSYNC, 0)
}

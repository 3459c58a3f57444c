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

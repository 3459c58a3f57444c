//go:build !linux

package batchlog

import (
	"errors"
	"os"
)

// datasync makes f's data durable.
func datasync(f *os.File) error { return f.Sync() }

// openDirect fails: direct I/O is used on Linux only.
func openDirect(string) (*os.File, error) {
	return nil, errors.New("no direct I/O on this system")
}

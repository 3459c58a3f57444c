//go:build !unix && !windows

package filelock

import "os"

// Exclusive has no exclusive lock to take on this system: the file is
// only opened, and keeping to one writer is the operator's care.
func Exclusive(path string, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, perm)
}

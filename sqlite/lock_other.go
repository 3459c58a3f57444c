//go:build !unix && !windows

package sqlite

import "os"

// lockExclusive has no exclusive lock to take on this system: the file is
// only opened, and running one server per database is the operator's care.
func lockExclusive(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}

//go:build !unix

package batchlog

import "os"

// lockFile does nothing where flock is missing: one server per data
// directory is then the operator's care.
func lockFile(*os.File) error { return nil }

//go:build !linux

package batchlog

import "os"

// datasync makes f's data durable.
func datasync(f *os.File) error { return f.Sync() }

//go:build !linux

package sqlite

import "runtime"

// yieldCPU lets other goroutines run; elsewhere than Linux the writer does
// not offer its thread to the system.
func yieldCPU() { runtime.Gosched() }

//go:build !linux

package bench

// onRAMDisk reports whether dir is on a RAM disk; only Linux is told.
func onRAMDisk(string) bool { return false }

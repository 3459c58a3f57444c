//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package procgroup

import (
	"os"
	"syscall"
	"unsafe"
)

// Foreground reports whether f is a terminal whose foreground process
// group is this process's: a command run in this group then gets the
// terminal's Ctrl-C directly, and must stay in it to read the terminal.
func Foreground(f *os.File) bool {
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp)))
	return errno == 0 && int(pgrp) == syscall.Getpgrp()
}

//go:build unix

package client

import (
	"net"
	"syscall"
)

// closedByPeer reports whether the server has closed c, or sent bytes
// nobody asked for, while it was idle: a look at the socket that does not
// block (recv with MSG_PEEK|MSG_DONTWAIT), one system call.
func closedByPeer(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var rerr error
	var one [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait: the answer is in rerr
	}); err != nil {
		return true
	}
	// Open and quiet: nothing to read yet. Otherwise the server closed it
	// (nil: a read of 0 bytes), reset it, or wrote to it unasked.
	return rerr != syscall.EAGAIN && rerr != syscall.EWOULDBLOCK && rerr != syscall.EINTR
}

//go:build windows

package filelock

import (
	"errors"
	"os"
	"syscall"
)

// Exclusive opens (creating) the file at path for reading and writing with
// others allowed only to read it: a second writer's open fails with a
// sharing violation (ErrHeld) until this handle is closed or its process
// ends. perm is not used.
func Exclusive(path string, _ os.FileMode) (*os.File, error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE, syscall.FILE_SHARE_READ, nil,
		syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		const errSharingViolation syscall.Errno = 32
		if errors.Is(err, errSharingViolation) {
			return nil, ErrHeld
		}
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}

//go:build windows

package sqlite

import (
	"errors"
	"os"
	"syscall"
)

// lockExclusive opens (creating) the file at path for writing with others
// allowed only to read it: a second writer's open fails with a sharing
// violation (errLockHeld) until this handle is closed or its process ends.
func lockExclusive(path string) (*os.File, error) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return nil, err
	}
	h, err := syscall.CreateFile(p, syscall.GENERIC_READ|syscall.GENERIC_WRITE, syscall.FILE_SHARE_READ, nil,
		syscall.OPEN_ALWAYS, syscall.FILE_ATTRIBUTE_NORMAL, 0)
	if err != nil {
		const errSharingViolation syscall.Errno = 32
		if errors.Is(err, errSharingViolation) {
			return nil, errLockHeld
		}
		return nil, err
	}
	return os.NewFile(uintptr(h), path), nil
}

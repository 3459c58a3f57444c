//go:build unix

package gpu

import (
	"errors"
	"fmt"
	"io"
	"syscall"
)

// rawFile reads a file descriptor directly, non-blocking: the Go runtime
// would otherwise park a read of /dev/kmsg until the next kernel message.
type rawFile struct{ fd int }

func openXIDFile(path string) (xidFile, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if _, err := syscall.Seek(fd, 0, io.SeekEnd); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("seek to the end of %s: %w", path, err)
	}
	return &rawFile{fd: fd}, nil
}

func (f *rawFile) read(p []byte) (int, error) {
	for {
		n, err := syscall.Read(f.fd, p)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN):
			return 0, nil
		case errors.Is(err, syscall.EPIPE):
			continue // /dev/kmsg: records were overwritten before we read them
		case err != nil:
			return 0, err
		}
		return max(n, 0), nil
	}
}

func (f *rawFile) close() error {
	if f.fd < 0 {
		return nil
	}
	err := syscall.Close(f.fd)
	f.fd = -1
	return err
}

package gpu

import (
	"bytes"
	"strconv"
	"strings"
)

// XIDEvent is one XID error from the kernel log: the GPU's PCI address
// (as NormalizeBusID writes it) and the XID.
type XIDEvent struct {
	BusID string
	XID   int
}

// xidMarker starts the NVIDIA driver's XID report in the kernel log:
//
//	NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
//
// (from /dev/kmsg with a "3,1234,5678,-;" prefix, from dmesg without).
const xidMarker = "NVRM: Xid (PCI:"

// ParseXIDLine reads one kernel log line. ok is false for a line that is
// not an XID report, or one it cannot read.
func ParseXIDLine(line string) (ev XIDEvent, ok bool) {
	i := strings.Index(line, xidMarker)
	if i < 0 {
		return XIDEvent{}, false
	}
	rest := line[i+len(xidMarker):]
	bus, rest, found := strings.Cut(rest, "):")
	if !found || bus == "" || len(bus) > 64 {
		return XIDEvent{}, false
	}
	// On a MIG GPU the bus is followed by the instance: "0000:3b:00
	// GPU-I:05 GPU-CI:02". The XID is the GPU's.
	bus, _, _ = strings.Cut(bus, " ")
	rest = strings.TrimLeft(rest, " ")
	j := 0
	for j < len(rest) && j < 6 && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	if j == 0 || (j < len(rest) && rest[j] != ',' && rest[j] != ' ') {
		return XIDEvent{}, false
	}
	x, err := strconv.Atoi(rest[:j])
	if err != nil || x <= 0 || x > 1000 {
		return XIDEvent{}, false
	}
	id := NormalizeBusID(bus)
	if id == "" || strings.Trim(id, "0123456789abcdef:.") != "" {
		return XIDEvent{}, false
	}
	return XIDEvent{BusID: id, XID: x}, true
}

// XIDReader follows a kernel log for XID reports, from where it was
// opened on: /dev/kmsg, or a file that lines are appended to. Read never
// blocks. It is not safe for concurrent use.
type XIDReader struct {
	f       xidFile
	partial []byte // a line not yet ended
}

// xidFile is the log opened for reads that never block (xid_unix.go).
type xidFile interface {
	// read returns what is there now; n == 0 with a nil error when nothing is.
	read(p []byte) (int, error)
	close() error
}

// OpenXIDLog opens path for XID reports, skipping what it already holds.
// Errors: the log cannot be opened (on /dev/kmsg: not root and
// kernel.dmesg_restrict set).
func OpenXIDLog(path string) (*XIDReader, error) {
	f, err := openXIDFile(path)
	if err != nil {
		return nil, err
	}
	return &XIDReader{f: f}, nil
}

// Read returns the XID reports logged since the last Read.
func (x *XIDReader) Read() ([]XIDEvent, error) {
	var evs []XIDEvent
	buf := make([]byte, 8192) // /dev/kmsg returns one whole record per read
	for reads := 0; reads < 1024; reads++ {
		n, err := x.f.read(buf)
		if n > 0 {
			x.partial = append(x.partial, buf[:n]...)
			for {
				i := bytes.IndexByte(x.partial, '\n')
				if i < 0 {
					break
				}
				if ev, ok := ParseXIDLine(string(x.partial[:i])); ok {
					evs = append(evs, ev)
				}
				x.partial = x.partial[i+1:]
			}
			if len(x.partial) > 64<<10 {
				x.partial = nil // not a log of lines
			}
		}
		if err != nil {
			return evs, err
		}
		if n == 0 {
			break
		}
	}
	x.partial = append([]byte(nil), x.partial...)
	return evs, nil
}

// Close closes the log.
func (x *XIDReader) Close() error { return x.f.close() }

package spalloc

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// MaxLineBytes is the longest request line accepted, without its "\n". The
// longest request real clients send is a create_job of a few hundred
// bytes; a line longer than this closes the connection.
const MaxLineBytes = 64 << 10

// ErrLineTooLong is returned by ReadLine for a line longer than the limit;
// the connection should be closed.
var ErrLineTooLong = errors.New("spalloc: request line too long")

// LineReader splits a connection's bytes into request lines.
type LineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewLineReader reads lines of at most max bytes (MaxLineBytes when max
// ≤ 0) from r.
func NewLineReader(r io.Reader, max int) *LineReader {
	if max <= 0 {
		max = MaxLineBytes
	}
	return &LineReader{r: bufio.NewReaderSize(r, 4096), max: max}
}

// ReadLine returns the next line without its "\n" or trailing "\r". The
// slice is valid until the next call. Errors: ErrLineTooLong (the rest of
// the connection cannot be framed: close it), io.EOF at the end of input
// (a last line without "\n" is dropped: the client went away mid-request),
// or the reader's error.
func (lr *LineReader) ReadLine() ([]byte, error) {
	lr.buf = lr.buf[:0]
	for {
		chunk, err := lr.r.ReadSlice('\n')
		if err != nil && len(lr.buf)+len(chunk) > lr.max+1 { // room for a "\r"
			return nil, ErrLineTooLong
		}
		switch {
		case err == nil:
			var line []byte
			if len(lr.buf) == 0 {
				line = chunk // no copy in the common case
			} else {
				lr.buf = append(lr.buf, chunk...)
				line = lr.buf
			}
			line = line[:len(line)-1]
			line = bytes.TrimSuffix(line, []byte{'\r'})
			if len(line) > lr.max {
				return nil, ErrLineTooLong
			}
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			lr.buf = append(lr.buf, chunk...)
		case errors.Is(err, io.EOF):
			return nil, io.EOF
		default:
			return nil, err
		}
	}
}

//go:build unix

package batchlog

import (
	"bytes"
	"syscall"
	"testing"
)

// TestFailedLargeRecordKeepsTheSegment: a record larger than a segment
// whose write fails (a full disk; here the file size limit) leaves the
// current segment as it was: the records appended after it are in the
// log. It used to truncate and remove that segment when both had the
// same name.
func TestFailedLargeRecordKeepsTheSegment(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Skip(err)
	}
	lim := old
	lim.Cur = 8192 // the prepared segment fits; the large record does not
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skip(err)
	}
	err := l.Append(1, bytes.Repeat([]byte("B"), 20000))
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("a record past the file size limit was appended")
	}
	for seq, p := range []string{"one", "two", "three"} {
		appendT(t, l, uint64(seq+1), p)
	}
	l.Close()
	got, last := replay(t, openT(t, dir, Options{}), 0)
	if last != 3 || len(got) != 3 {
		t.Fatalf("replay after the failed record: %v (last %d), want the three after it", got, last)
	}
}

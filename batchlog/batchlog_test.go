package batchlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func openT(t *testing.T, dir string, o Options) *Log {
	t.Helper()
	l, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// replay returns the payloads Replay gives after after, and its last seq.
func replay(t *testing.T, l *Log, after uint64) ([]string, uint64) {
	t.Helper()
	var got []string
	last, err := l.Replay(after, func(seq uint64, p []byte) error {
		got = append(got, fmt.Sprintf("%d:%s", seq, p))
		return nil
	})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	return got, last
}

func appendT(t *testing.T, l *Log, seq uint64, p string) {
	t.Helper()
	if err := l.Append(seq, []byte(p)); err != nil {
		t.Fatalf("Append(%d): %v", seq, err)
	}
}

func TestAppendReplay(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if got, last := replay(t, l, 0); len(got) != 0 || last != 0 {
		t.Fatalf("empty log replays %v (last %d), want nothing", got, last)
	}
	if err := l.Start(1); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3; i++ {
		appendT(t, l, i, fmt.Sprint("batch-", i))
	}
	if err := l.Append(7, []byte("x")); err == nil {
		t.Error("Append out of sequence succeeded, want an error")
	}
	l.Close()

	l = openT(t, dir, Options{})
	got, last := replay(t, l, 0)
	if want := []string{"1:batch-1", "2:batch-2", "3:batch-3"}; !reflect.DeepEqual(got, want) || last != 3 {
		t.Errorf("replay: got %v (last %d), want %v (last 3)", got, last, want)
	}
	got, last = replay(t, l, 2)
	if want := []string{"3:batch-3"}; !reflect.DeepEqual(got, want) || last != 3 {
		t.Errorf("replay after 2: got %v (last %d), want %v", got, last, want)
	}
	// Start drops what was replayed; the next records continue the sequence.
	if err := l.Start(4); err != nil {
		t.Fatal(err)
	}
	appendT(t, l, 4, "batch-4")
	l.Close()
	l = openT(t, dir, Options{})
	if got, last := replay(t, l, 3); !reflect.DeepEqual(got, []string{"4:batch-4"}) || last != 4 {
		t.Errorf("after Start(4): got %v (last %d), want only batch 4", got, last)
	}
}

// TestTornTail cuts the last record in every possible place: replay gives
// the records before it and nothing of it.
func TestTornTail(t *testing.T) {
	src := t.TempDir()
	l := openT(t, src, Options{SegmentBytes: 4096})
	l.Start(1)
	appendT(t, l, 1, "first")
	appendT(t, l, 2, "second, to be torn")
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(src, "*"+segSuffix))
	if len(segs) != 1 {
		t.Fatalf("got segments %v, want one", segs)
	}
	data, _ := os.ReadFile(segs[0])
	secondAt := segHeader + recHeader + len("first")
	secondEnd := secondAt + recHeader + len("second, to be torn")
	for cut := secondAt; cut < secondEnd; cut++ {
		dir := t.TempDir()
		torn := append([]byte(nil), data[:cut]...)
		torn = append(torn, make([]byte, len(data)-cut)...) // the preallocated zeros
		os.WriteFile(filepath.Join(dir, filepath.Base(segs[0])), torn, 0o600)
		l := openT(t, dir, Options{})
		if got, last := replay(t, l, 0); !reflect.DeepEqual(got, []string{"1:first"}) || last != 1 {
			t.Fatalf("cut at %d: got %v (last %d), want only the first record", cut, got, last)
		}
	}
	// A flipped byte in the payload is a torn record too.
	dir := t.TempDir()
	bad := append([]byte(nil), data...)
	bad[secondEnd-1] ^= 1
	os.WriteFile(filepath.Join(dir, filepath.Base(segs[0])), bad, 0o600)
	if got, _ := replay(t, openT(t, dir, Options{}), 0); len(got) != 1 {
		t.Errorf("corrupt payload: got %v, want only the first record", got)
	}
}

// TestReplayGap: records of a later segment that follow a damaged one
// are not replayed, and Gap says how many and which; a log without a gap
// says nothing.
func TestReplayGap(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	pad := strings.Repeat("x", 1200)
	for seq := uint64(1); seq <= 6; seq++ {
		appendT(t, l, seq, fmt.Sprint(seq, pad))
	}
	l.Close()
	l = openT(t, dir, Options{})
	if _, last := replay(t, l, 0); last != 6 || l.Gap() != "" {
		t.Fatalf("whole log: last %d, gap %q, want 6 and none", last, l.Gap())
	}
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if len(segs) < 2 {
		t.Fatalf("got segments %v, want at least two", segs)
	}
	data, _ := os.ReadFile(segs[0])
	data[segHeader+recHeader+len(pad)+recHeader+5] ^= 1 // record 2's payload
	os.WriteFile(segs[0], data, 0o600)
	l = openT(t, dir, Options{})
	got, last := replay(t, l, 0)
	if last != 1 || len(got) != 1 {
		t.Fatalf("replay past a damaged record 2: last %d, %d records, want only record 1", last, len(got))
	}
	if g := l.Gap(); !strings.Contains(g, "to 6 follow the end of the log at seq 1 (record 2") {
		t.Fatalf("Gap() = %q, want the records up to 6 after record 1 named", g)
	}
}

// TestDamageInsideASegment: whole records that follow a damaged one in the
// same segment — the usual case, a segment holding thousands — are found
// and described by Gap, whether the damage is in the payload, the length
// or the whole record; they are not replayed.
func TestDamageInsideASegment(t *testing.T) {
	src := t.TempDir()
	l := openT(t, src, Options{})
	l.Start(1)
	for seq := uint64(1); seq <= 10; seq++ {
		appendT(t, l, seq, fmt.Sprintf("batch-%02d", seq))
	}
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(src, "*"+segSuffix))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	data, _ := os.ReadFile(segs[0])
	rec := recHeader + len("batch-01")
	fifth := segHeader + 4*rec
	for name, damage := range map[string]func(b []byte){
		"payload": func(b []byte) { b[fifth+recHeader] ^= 0x20 },
		"length":  func(b []byte) { b[fifth] = 0xff; b[fifth+1] = 0x7f },
		"zeros":   func(b []byte) { clear(b[fifth : fifth+rec]) },
	} {
		dir := t.TempDir()
		b := append([]byte(nil), data...)
		damage(b)
		os.WriteFile(filepath.Join(dir, filepath.Base(segs[0])), b, 0o600)
		l := openT(t, dir, Options{})
		got, last := replay(t, l, 0)
		if last != 4 || len(got) != 4 {
			t.Errorf("%s: replayed %v (last %d), want records 1 to 4", name, got, last)
		}
		if g := l.Gap(); !strings.Contains(g, "5 records with seqs 6 to 10 follow the end of the log at seq 4") {
			t.Errorf("%s: Gap() = %q, want records 6 to 10 named", name, g)
		}
	}
}

// TestRotation fills segments: records continue in new ones, replay reads
// across them, and Release removes the full ones the caller made durable.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	payload := string(make([]byte, 1000))
	for i := uint64(1); i <= 10; i++ {
		appendT(t, l, i, payload)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	if len(segs) < 3 {
		t.Fatalf("got %d segments for 10 records of 1016 bytes in segments of 4096, want several", len(segs))
	}
	last, ok := l.Releasable()
	if !ok || last == 0 {
		t.Fatalf("Releasable: %d, %v; want a full segment", last, ok)
	}
	if err := l.Release(last); err != nil {
		t.Fatal(err)
	}
	if after, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix)); len(after) >= len(segs) {
		t.Errorf("Release(%d) left %d of %d segments, want one fewer", last, len(after), len(segs))
	}
	l.Close()
	l = openT(t, dir, Options{})
	got, end := replay(t, l, last)
	if end != 10 || len(got) != int(10-last) {
		t.Errorf("replay after %d: %d records, last %d; want %d, last 10", last, len(got), end, 10-last)
	}
}

// TestStaleSegment: a segment whose removal did not survive a crash holds
// records the caller already took; replay skips them and goes on.
func TestStaleSegment(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	for i := uint64(1); i <= 6; i++ {
		appendT(t, l, i, string(make([]byte, 1000)))
	}
	l.Close()
	l = openT(t, dir, Options{})
	got, last := replay(t, l, 4)
	if last != 6 || len(got) != 2 {
		t.Errorf("replay after 4: got %d records, last %d; want 2, last 6", len(got), last)
	}
}

// TestScan: Scan gives every whole record the log holds, those a
// replay would skip too, and stops at a torn tail.
func TestScan(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(3)
	for i := uint64(3); i <= 8; i++ {
		appendT(t, l, i, fmt.Sprintf("r%d%s", i, make([]byte, 900)))
	}
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	last := segs[len(segs)-1]
	data, _ := os.ReadFile(last)
	os.WriteFile(last, append(data, 0x10, 0, 0, 0, 1, 2), 0o640) // a torn record
	l = openT(t, dir, Options{})
	var got []uint64
	if err := l.Scan(func(seq uint64, p []byte) error {
		if !bytes.HasPrefix(p, []byte(fmt.Sprintf("r%d", seq))) {
			t.Errorf("record %d holds %.4q", seq, p)
		}
		got = append(got, seq)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []uint64{3, 4, 5, 6, 7, 8}) {
		t.Errorf("Scan gave %v, want 3 to 8", got)
	}
	stop := errors.New("stop")
	n := 0
	if err := l.Scan(func(uint64, []byte) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("Scan with a failing fn: %v after %d records, want the error after 1", err, n)
	}
}

// TestLocked: one log per directory.
func TestLocked(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{})
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: got %v, want ErrLocked", err)
	}
}

func TestDiscard(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	l.Start(1)
	appendT(t, l, 1, "x")
	if err := l.Discard(); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(2, []byte("y")); err == nil {
		t.Error("Append after Discard succeeded")
	}
	l.Close()
	if got, _ := replay(t, openT(t, dir, Options{}), 0); len(got) != 0 {
		t.Errorf("after Discard: replay gives %v, want nothing", got)
	}
}

func BenchmarkAppend(b *testing.B) {
	for _, sync := range []bool{true, false} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			l, err := Open(b.TempDir(), Options{NoSync: !sync})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			l.Start(1)
			p := make([]byte, 600)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := l.Append(uint64(i+1), p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestLargeRecord: a record larger than a segment gets a segment of its
// own, and the records after it go on in the next.
func TestLargeRecord(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	appendT(t, l, 1, "small")
	big := string(bytes.Repeat([]byte("big "), 5000))
	appendT(t, l, 2, big)
	appendT(t, l, 3, "after")
	appendT(t, l, 4, big)
	appendT(t, l, 5, "last")
	l.Close()
	l = openT(t, dir, Options{})
	got, last := replay(t, l, 0)
	if last != 5 || len(got) != 5 || got[1] != "2:"+big || got[4] != "5:last" {
		t.Fatalf("replay: last %d, %d records", last, len(got))
	}
}

// TestLargeRecordFirst: a record larger than a segment that comes first
// in a segment (here right after Start) takes the place of the empty
// segment named like it; no segment is left to release before it, so the
// records survive a release of what the tables took (nothing).
func TestLargeRecordFirst(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 4096})
	l.Start(1)
	big := string(bytes.Repeat([]byte("big "), 5000))
	appendT(t, l, 1, big)
	appendT(t, l, 2, "after")
	if upTo, ok := l.Releasable(); ok && upTo < 1 {
		t.Fatalf("Releasable() = %d: a segment before the first record waits for release", upTo)
	}
	if err := l.Release(0); err != nil {
		t.Fatal(err)
	}
	l.Close()
	got, last := replay(t, openT(t, dir, Options{}), 0)
	if last != 2 || len(got) != 2 || got[0] != "1:"+big {
		t.Fatalf("replay: last %d, %d records, want the large one and the one after", last, len(got))
	}
}

// FuzzReplay: a segment of any bytes replays what it holds whole, or
// nothing, never a panic.
func FuzzReplay(f *testing.F) {
	src := f.TempDir()
	l, _ := Open(src, Options{SegmentBytes: 4096})
	l.Start(1)
	l.Append(1, []byte("one"))
	l.Append(2, []byte("two"))
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(src, "*"+segSuffix))
	seed, _ := os.ReadFile(segs[0])
	f.Add(seed[:200])
	f.Add([]byte(magic + "\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "0000000000000001"+segSuffix), data, 0o600)
		l, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		prev := uint64(0)
		if _, err := l.Replay(0, func(seq uint64, p []byte) error {
			if seq != prev+1 {
				t.Fatalf("record %d after %d", seq, prev)
			}
			prev = seq
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRecordsOfEverySize: records of many sizes, most crossing a 4 KiB
// page and some several, over segment rotations, replay byte for byte in
// a log opened afresh.
func TestRecordsOfEverySize(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SegmentBytes: 64 << 10})
	if err := l.Start(1); err != nil {
		t.Fatal(err)
	}
	var want []string
	sizes := []int{1, 4095, 4096, 4097, 17, 8191, 9000, 3, 4080, 16, 12288, 600}
	for i := uint64(1); i <= 200; i++ {
		n := sizes[int(i)%len(sizes)] + int(i)
		p := bytes.Repeat([]byte{byte('a' + i%26)}, n)
		p[0], p[n-1] = '<', '>'
		if err := l.Append(i, p); err != nil {
			t.Fatalf("Append(%d, %d bytes): %v", i, n, err)
		}
		want = append(want, fmt.Sprintf("%d:%s", i, p))
	}
	l.Close()
	got, last := replay(t, openT(t, dir, Options{}), 0)
	if last != 200 || !reflect.DeepEqual(got, want) {
		t.Fatalf("replayed %d records up to seq %d, want the 200 appended, byte for byte", len(got), last)
	}
}

// TestDirectWritesFallBack: where the file system takes direct I/O the
// segment is written with it; a direct write refused (EINVAL, here a
// buffer out of alignment) is done through the page cache instead, from
// then on, and every record replays.
func TestDirectWritesFallBack(t *testing.T) {
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	if err := os.WriteFile(probe, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, err := openDirect(probe); err != nil {
		t.Skipf("no direct I/O here: %v", err)
	} else {
		f.Close()
		os.Remove(f.Name())
	}
	l := openT(t, dir, Options{SegmentBytes: 16 << 10})
	if err := l.Start(1); err != nil {
		t.Fatal(err)
	}
	appendT(t, l, 1, "direct")
	if !l.direct {
		t.Fatal("the segment is not written with direct I/O")
	}
	// The same bytes, one byte off a block's alignment.
	head := int(l.off % block)
	raw := make([]byte, 64<<10+1)
	copy(raw[1:], l.blk[:head])
	l.blk = raw[1:]
	appendT(t, l, 2, "refused, then buffered")
	if l.direct || !l.noDirect {
		t.Fatalf("after a refused direct write: direct %v, noDirect %v", l.direct, l.noDirect)
	}
	for i := uint64(3); i <= 40; i++ { // over rotations: buffered from now on
		appendT(t, l, i, strings.Repeat("x", 1000))
		if l.direct {
			t.Fatalf("record %d was written with direct I/O after it was refused", i)
		}
	}
	l.Close()
	got, last := replay(t, openT(t, dir, Options{}), 0)
	if last != 40 || got[0] != "1:direct" || got[1] != "2:refused, then buffered" {
		t.Fatalf("replayed up to %d: %q…", last, got[:min(2, len(got))])
	}
}

// TestCloseWhileRotating: a Close while an Append waits for the next
// segment to be prepared makes that Append fail as closed, not panic.
func TestCloseWhileRotating(t *testing.T) {
	l := openT(t, t.TempDir(), Options{SegmentBytes: 8192})
	l.Start(1)
	appendT(t, l, 1, strings.Repeat("a", 5000)) // past half: the spare is prepared
	l.mu.Lock()
	ready := l.ready
	l.mu.Unlock()
	<-ready
	// As if the spare were still being prepared when the next record needs it.
	slow := make(chan struct{})
	l.mu.Lock()
	l.preparing, l.ready = true, slow
	l.mu.Unlock()
	waiting := make(chan struct{})
	testHookRotateWait = func() { close(waiting) }
	defer func() { testHookRotateWait = nil }()
	done := make(chan error, 1)
	go func() { done <- l.Append(2, []byte(strings.Repeat("b", 5000))) }()
	<-waiting
	l.mu.Lock()
	l.preparing = false // Close does not wait for it
	l.mu.Unlock()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	close(slow)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Append across a Close: %v, want closed", err)
	}
}

// TestFailedNameOfALargeRecord: a large record whose name could not be
// synced is an error; when its name is then removed for sure, it is not
// in the log, and when not even that, the error says it may be
// (ErrMaybeWritten), for the next start may replay it.
func TestFailedNameOfALargeRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int // directory syncs that fail
		maybe bool
	}{{"undone", 1, false}, {"unsure", 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openT(t, dir, Options{SegmentBytes: 4096})
			l.Start(1)
			appendT(t, l, 1, "one")
			fails := tc.fails
			testHookSyncDir = func() error {
				if fails > 0 {
					fails--
					return syscall.EIO
				}
				return nil
			}
			err := l.Append(2, bytes.Repeat([]byte("B"), 20000))
			testHookSyncDir = nil
			if err == nil || errors.Is(err, ErrMaybeWritten) != tc.maybe {
				t.Fatalf("Append: %v, want an error, ErrMaybeWritten %v", err, tc.maybe)
			}
			if err := l.Append(2, []byte("two")); err == nil {
				t.Fatal("the log took a record after a failed sync")
			}
			l.Close()
			if _, last := replay(t, openT(t, dir, Options{}), 0); !tc.maybe && last != 1 {
				t.Fatalf("replay after an undone large record: last %d, want 1", last)
			}
		})
	}
}

// record is the bytes of one record, as Append writes it.
func record(seq uint64, p []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(p)))
	b = binary.LittleEndian.AppendUint32(b, checksum(seq, p))
	b = binary.LittleEndian.AppendUint64(b, seq)
	return append(b, p...)
}

// TestTornRecordCarryingARecord: a torn last record whose payload (an
// uploaded artifact's bytes) holds what reads as a whole record is a torn
// end, not damage with records after it.
func TestTornRecordCarryingARecord(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	l.Start(1)
	appendT(t, l, 1, "one")
	upload := append(bytes.Repeat([]byte("x"), 100), record(3, []byte("crafted"))...)
	upload = append(upload, bytes.Repeat([]byte("y"), 4000)...)
	appendT(t, l, 2, string(upload))
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	data, _ := os.ReadFile(segs[0])
	rec2 := segHeader + recHeader + len("one")
	clear(data[rec2+recHeader+100+recHeader+len("crafted")+10:]) // a crash: record 2 written only so far
	os.WriteFile(segs[0], data, 0o600)
	l = openT(t, dir, Options{})
	if got, last := replay(t, l, 0); last != 1 || len(got) != 1 {
		t.Fatalf("replayed %v (last %d), want record 1", got, last)
	}
	if g := l.Gap(); g != "" {
		t.Fatalf("a torn last record reads as damage: Gap() = %q", g)
	}
}

// BenchmarkReplayGarbage: replaying a segment whose records end in 8 MiB
// of garbage, random or made of record headers claiming a megabyte each,
// stays about as cheap as reading it (the search after a bad record is
// bounded).
func BenchmarkReplayGarbage(b *testing.B) {
	for _, tc := range []struct {
		name string
		fill func(p []byte)
	}{
		{"random", func(p []byte) {
			r := rand.New(rand.NewPCG(1, 2))
			for i := range p {
				p[i] = byte(r.UintN(256))
			}
		}},
		{"headers", func(p []byte) {
			for off := 0; off+16 <= len(p); off += 16 {
				binary.LittleEndian.PutUint32(p[off:], 1<<20)
				binary.LittleEndian.PutUint64(p[off+8:], 2)
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			l, _ := Open(dir, Options{})
			l.Start(1)
			l.Append(1, []byte("one"))
			l.Close()
			segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
			data, _ := os.ReadFile(segs[0])
			tc.fill(data[segHeader+recHeader+3+1:])
			os.WriteFile(segs[0], data, 0o600)
			l, _ = Open(dir, Options{})
			defer l.Close()
			for b.Loop() {
				if _, err := l.Replay(0, func(uint64, []byte) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDamageThenWholeThenTorn: a damaged record, whole answered records
// after it, then a last record a crash tore: the whole ones are still
// reported (Gap), not taken for part of a torn end.
func TestDamageThenWholeThenTorn(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	l.Start(1)
	for seq, p := range []string{"one", "two", "three", strings.Repeat("f", 200)} {
		appendT(t, l, uint64(seq+1), p)
	}
	l.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	data, _ := os.ReadFile(segs[0])
	rec2 := segHeader + recHeader + len("one")
	data[rec2+recHeader] ^= 0xff // record 2 damaged
	rec4 := rec2 + recHeader + len("two") + recHeader + len("three")
	clear(data[rec4+recHeader+100 : rec4+recHeader+200]) // record 4 torn by the crash
	os.WriteFile(segs[0], data, 0o600)
	l = openT(t, dir, Options{})
	if got, last := replay(t, l, 0); last != 1 || len(got) != 1 {
		t.Fatalf("replayed %v (last %d), want record 1", got, last)
	}
	if g := l.Gap(); !strings.Contains(g, "seqs 3 to 3") {
		t.Fatalf("Gap() = %q, want record 3 named", g)
	}
}

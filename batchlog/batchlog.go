// Package batchlog is an append-only log of batches on disk: what makes a
// group-commit batch durable for the price of one small sequential write
// and one sync (docs/architecture.md §2.3, §5). A store writes each batch
// here before it answers, applies it to its tables afterwards, and replays
// the log at start for whatever the tables had not durably taken — the
// shape of slurmctld's state save, etcd's WAL and Nomad's Raft log.
//
// The log is a directory of segments, named by the seq of their first
// record, each written full of zeros before it is used, holding records
// one after the other:
//
//	segment: "ARBLOG01" (8 bytes) | first seq (8 bytes, little endian) | records… | zeros
//	record:  payload length (4) | CRC-32C of seq and payload (4) | seq (8) | payload
//
// A record is written whole with one write and synced before Append
// returns. Its segment was filled and synced before it was used, so that
// sync overwrites data only: no file size or block allocation moves, and
// the file system's journal — shared with everything else on the disk —
// is not waited for. On Linux the segment is written with direct I/O
// (O_DIRECT|O_DSYNC): the blocks the record touches, the start of the
// first one rewritten with the bytes it already holds, go to the disk in
// the one write, which returns once they are durable — the page cache's
// copy and writeback, and a second system call, are skipped (a lone
// commit took a quarter less here, docs/guides/performance.md). Where
// the file system refuses direct I/O the log writes through the page
// cache and calls fdatasync. The next segment is prepared in the
// background while the current one fills (as spare.tmp, named when it is
// put to use). A record larger than a segment gets a segment of its own,
// written as large.tmp and named once synced.
//
// Sequence numbers are consecutive. Replay reads the records in order and
// stops at the first that is missing, torn (wrong checksum) or out of
// sequence: only the last record written can be torn, since the next is
// written only after it was synced, and a torn record was never
// acknowledged. Whole records found past that end (a power cut without
// syncs, a damaged disk), in the same segment or later ones, are counted
// and described (Gap), not replayed; SetAside keeps them from Start.
//
// A directory is used by one Log at a time: Open takes an exclusive lock
// on a file in it (on systems with flock), so a second server on the same
// data fails at once instead of interleaving its records.
package batchlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/arbiter-hq/arbiter/filelock"
)

// Options tune a Log.
type Options struct {
	// SegmentBytes is the size of a segment (default 8 MiB, rounded up to
	// a multiple of 4 KiB); records go to the next segment past it. It
	// bounds how much a start replays beyond what the tables took durably.
	SegmentBytes int64
	// NoSync skips the syncs: a record survives the process being killed
	// (it is in the kernel's page cache) but not a power cut. SQLite's
	// synchronous = "normal".
	NoSync bool
}

// DefaultSegmentBytes is the default Options.SegmentBytes.
const DefaultSegmentBytes = 8 << 20

const (
	magic       = "ARBLOG01"
	segHeader   = 16 // magic and first seq
	recHeader   = 16 // length, checksum, seq
	segSuffix   = ".seg"
	spareName   = "spare.tmp"
	largeName   = "large.tmp" // a record larger than a segment, before it is named
	lockName    = "LOCK"
	nameDigits  = 16
	defaultMode = 0o640
	// block is the unit of a direct write: its offset, length and memory
	// are multiples of it (a disk's logical block is 512 bytes or 4 KiB).
	block = 4096
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrLocked is returned by Open when another Log holds the directory.
var ErrLocked = errors.New("the batch log is in use by another process")

// Log is an open batch log. Append is called by one goroutine at a time;
// Releasable, Release, Discard and Close may be called concurrently with
// it (an Append that Discard or Close overtakes fails as closed).
type Log struct {
	dir  string
	o    Options
	lock *os.File

	mu     sync.Mutex
	f      *os.File // the segment records are appended to; nil before Start
	path   string   // f's name
	off    int64    // where the next record goes in f
	next   uint64   // the seq the next record must carry
	closed []segment
	broken error  // nothing more may be appended
	gap    string // what the last Replay found beyond the end (Gap)
	buf    []byte

	// With direct I/O (direct: f is open with O_DIRECT|O_DSYNC), records
	// are written in whole blocks from blk, aligned, whose first
	// off%block bytes are what f's last block holds before off. noDirect
	// is set once the file system refused direct I/O.
	direct   bool
	noDirect bool
	blk      []byte

	// The next segment, prepared in the background as spare.tmp (spare),
	// or being prepared (preparing; ready is closed when it is done).
	spare     *os.File
	spareErr  error
	preparing bool
	ready     chan struct{}
}

// segment is a full segment still on disk, waiting for Release.
type segment struct {
	path string
	last uint64
}

// Open opens (creating it if missing) the log in dir and locks it. Call
// Replay, then Start, before Append. Errors: ErrLocked (wrapped) when
// another process holds it; the file system's errors.
func Open(dir string, o Options) (*Log, error) {
	if o.SegmentBytes < block {
		o.SegmentBytes = DefaultSegmentBytes
	}
	// Whole blocks, so that a direct write of a segment's last block
	// never grows the file.
	o.SegmentBytes = (o.SegmentBytes + block - 1) &^ (block - 1)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("batch log: %w", err)
	}
	lf, err := filelock.Exclusive(filepath.Join(dir, lockName), defaultMode)
	if errors.Is(err, filelock.ErrHeld) {
		err = ErrLocked
	}
	if err != nil {
		return nil, fmt.Errorf("batch log %s: %w", dir, err)
	}
	return &Log{dir: dir, o: o, lock: lf}, nil
}

// Dir is the log's directory.
func (l *Log) Dir() string { return l.dir }

// Replay calls fn with each record whose seq is greater than after, in
// order, and returns the seq of the last record of the log (after when it
// holds none beyond it). It stops at the end of the log: the first record
// that is missing, torn or out of sequence. Whole records with higher
// seqs after that point are not replayed; Gap describes them (a power cut
// with NoSync can leave them, or a damaged disk). An error of fn stops it
// and is returned.
func (l *Log) Replay(after uint64, fn func(seq uint64, payload []byte) error) (uint64, error) {
	last := after
	var beyond, first, high uint64 // records past the end, their lowest and highest seq
	err := l.each(func(seq uint64, payload []byte) (bool, error) {
		switch {
		case seq <= after:
			// Taken by the tables already (a segment whose removal
			// did not survive a crash).
		case beyond == 0 && seq == last+1:
			if err := fn(seq, payload); err != nil {
				return false, err
			}
			last = seq
		case seq > last:
			// Out of sequence: the log ended before. Counted, so
			// that what Start removes is said.
			if beyond == 0 || seq < first {
				first = seq
			}
			beyond++
			high = max(high, seq)
		}
		return true, nil
	})
	l.mu.Lock()
	l.gap = ""
	if beyond > 0 {
		l.gap = fmt.Sprintf("%d records with seqs %d to %d follow the end of the log at seq %d (record %d is missing or damaged) and were not replayed", beyond, first, high, last, last+1)
	}
	l.mu.Unlock()
	return last, err
}

// Gap says what the last Replay found beyond the end of the log, which
// Start then removes: "" when nothing.
func (l *Log) Gap() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gap
}

// Scan calls fn with every whole record the log holds, in the order of
// its segments, whatever their seqs: also those a caller took already
// but has not released. An error of fn stops it and is returned.
func (l *Log) Scan(fn func(seq uint64, payload []byte) error) error {
	return l.each(func(seq uint64, payload []byte) (bool, error) { return true, fn(seq, payload) })
}

// each calls fn with each whole record of each segment, in order, until
// fn says to stop or fails.
func (l *Log) each(fn func(seq uint64, payload []byte) (bool, error)) error {
	segs, err := l.segments()
	if err != nil {
		return err
	}
	for _, sg := range segs {
		data, err := os.ReadFile(sg.path)
		if err != nil {
			return fmt.Errorf("batch log: %w", err)
		}
		if len(data) < segHeader || string(data[:8]) != magic {
			continue // prepared, never used
		}
		prev := binary.LittleEndian.Uint64(data[8:]) - 1 // the seq before the segment's first
		for off := segHeader; off+recHeader <= len(data); {
			seq, end, ok := recordAt(data, off)
			if !ok {
				// The end of this segment's records — or a damaged
				// one with whole records after it, which only a
				// damaged disk or a power cut without syncs leaves:
				// those are given too, so that Replay counts them.
				if off, ok = nextRecord(data, off, prev); !ok {
					break
				}
				continue
			}
			if more, err := fn(seq, data[off+recHeader:end]); err != nil || !more {
				return err
			}
			prev, off = seq, end
		}
	}
	return nil
}

// recordAt reads the record at off in a segment's data: its seq and where
// it ends, or false when there is none whole there.
func recordAt(data []byte, off int) (seq uint64, end int, ok bool) {
	if off+recHeader > len(data) {
		return 0, 0, false
	}
	n := int(binary.LittleEndian.Uint32(data[off:]))
	sum := binary.LittleEndian.Uint32(data[off+4:])
	seq = binary.LittleEndian.Uint64(data[off+8:])
	end = off + recHeader + n
	if n == 0 || end > len(data) || end < off || checksum(seq, data[off+recHeader:end]) != sum {
		return 0, 0, false
	}
	return seq, end, true
}

// nextRecord finds the first whole record after off, where a record is
// missing, torn or damaged, or false when none follows. The record before
// had seq prev. A record found has a later seq, not more later than
// records could fit between, and begins a run of whole records that
// reaches the zeros past the log's end, the segment's end, or a torn last
// record before them (a crash after the damage): a record
// carried inside another one's payload — an uploaded artifact's bytes may
// hold anything — is followed by the rest of that payload, so it is not
// taken for one at a torn end. The checksums it computes are bounded by
// twice the segment's size, so that no content makes it slow.
func nextRecord(data []byte, off int, prev uint64) (int, bool) {
	last := len(data) - 1 // the last byte that is not zero
	for last >= 0 && data[last] == 0 {
		last--
	}
	budget := 2 * len(data)
	for at := off + 1; at+recHeader <= last+1 && budget > 0; at++ {
		n := int(binary.LittleEndian.Uint32(data[at:]))
		if n == 0 || at+recHeader+n > len(data) {
			continue // no record starts with a length of 0 or runs past the end
		}
		seq := binary.LittleEndian.Uint64(data[at+8:])
		if seq <= prev || seq-prev > uint64(at-off)/(recHeader+1)+1 {
			continue
		}
		end, p := at, prev
		for end+recHeader <= len(data) && budget > 0 {
			budget -= min(int(binary.LittleEndian.Uint32(data[end:])), len(data)-end)
			s, e, ok := recordAt(data, end)
			if !ok || s <= p {
				break
			}
			end, p = e, s
		}
		if end > at && (end > last || tornAt(data, end, p, last)) {
			return at, true
		}
	}
	return 0, false
}

// tornAt reports whether the bytes at off are the log's torn last record:
// the header of the record after prev, whose length holds every byte left
// that is not zero (last is the last of them).
func tornAt(data []byte, off int, prev uint64, last int) bool {
	if off+recHeader > len(data) {
		return false
	}
	n := int(binary.LittleEndian.Uint32(data[off:]))
	seq := binary.LittleEndian.Uint64(data[off+8:])
	return n > 0 && seq == prev+1 && off+recHeader+n <= len(data) && off+recHeader+n > last
}

type segFile struct {
	path  string
	first uint64
}

// segments returns the segment files in seq order.
func (l *Log) segments() ([]segFile, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, fmt.Errorf("batch log: %w", err)
	}
	var out []segFile
	for _, e := range ents {
		name := e.Name()
		if num, ok := strings.CutSuffix(name, segSuffix); ok && len(num) == nameDigits {
			if n, err := strconv.ParseUint(num, 16, 64); err == nil {
				out = append(out, segFile{filepath.Join(l.dir, name), n})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first < out[j].first })
	return out, nil
}

func (l *Log) segPath(first uint64) string {
	return filepath.Join(l.dir, fmt.Sprintf("%0*x%s", nameDigits, first, segSuffix))
}

// SetAside moves the log's segments into a new directory inside it,
// damaged-<UTC time>, where Start leaves them, and returns its path: for a
// log whose Replay found a Gap, so that the records past it are kept for
// whoever looks into it rather than removed. Errors: the file system's.
func (l *Log) SetAside() (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	segs, err := l.segments()
	if err != nil {
		return "", err
	}
	aside := filepath.Join(l.dir, "damaged-"+time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Mkdir(aside, 0o750); err != nil {
		return "", fmt.Errorf("batch log: %w", err)
	}
	for _, sg := range segs {
		if err := os.Rename(sg.path, filepath.Join(aside, filepath.Base(sg.path))); err != nil {
			return "", fmt.Errorf("batch log: %w", err)
		}
	}
	if err := syncDir(l.dir); err != nil {
		return "", fmt.Errorf("batch log: %w", err)
	}
	return aside, nil
}

// Start removes every segment, replayed or not, and begins a new one whose
// first record is next. Call it once what Replay returned is durable
// elsewhere.
func (l *Log) Start(next uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		return errors.New("batch log: started twice")
	}
	if err := l.removeSegments(); err != nil {
		return err
	}
	f, err := l.prepare()
	if err != nil {
		return err
	}
	return l.use(f, next)
}

// prepare creates the spare segment full of zeros and makes it and its
// size durable, so that writing a record in it later syncs data only.
func (l *Log) prepare() (*os.File, error) {
	path := filepath.Join(l.dir, spareName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, defaultMode)
	if err != nil {
		return nil, fmt.Errorf("batch log: %w", err)
	}
	err = func() error {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < l.o.SegmentBytes; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero[:min(int64(len(zero)), l.o.SegmentBytes-off)], off); err != nil {
				return err
			}
		}
		if l.o.NoSync {
			return nil
		}
		return f.Sync()
	}()
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("batch log: prepare a segment: %w", err)
	}
	return f, nil
}

// use names f, a prepared segment, after next, its first record, makes
// the name durable, and appends to it from now on. The segment's header
// is written with that record and synced with it.
func (l *Log) use(f *os.File, next uint64) error {
	path := l.segPath(next)
	if err := os.Rename(f.Name(), path); err != nil {
		f.Close()
		return fmt.Errorf("batch log: %w", err)
	}
	if !l.o.NoSync {
		if err := syncDir(l.dir); err != nil {
			f.Close()
			return fmt.Errorf("batch log: %w", err)
		}
	}
	// f.Name() is the spare's name; the segment is remembered by its own.
	direct := false
	if !l.o.NoSync && !l.noDirect {
		if df, err := openDirect(path); err == nil {
			f.Close()
			f, direct = df, true
		} else {
			// Refused (EINVAL where the file system has no direct
			// I/O) or failed: through the page cache from now on.
			l.noDirect = true
		}
	}
	l.switchTo(f, path, next)
	l.direct = direct
	return nil
}

// switchTo makes f, at path, the segment appended to. The segment it
// replaces waits for Release, unless it holds no record: then it goes at
// once (alone may have put f in its place under its name already).
func (l *Log) switchTo(f *os.File, path string, next uint64) {
	if l.f != nil {
		l.f.Close()
		switch {
		case l.off > 0:
			l.closed = append(l.closed, segment{path: l.path, last: next - 1})
		case l.path != path:
			os.Remove(l.path)
		}
	}
	l.f, l.path, l.off, l.next = f, path, 0, next
	l.direct = false
}

// prepareNext starts preparing the next segment in the background, once.
// Called with l.mu held.
func (l *Log) prepareNext() {
	if l.spare != nil || l.preparing {
		return
	}
	l.preparing = true
	l.ready = make(chan struct{})
	go func() {
		f, err := l.prepare()
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.lock == nil { // closed meanwhile
			if f != nil {
				f.Close()
			}
		} else {
			l.spare, l.spareErr = f, err
		}
		l.preparing = false
		close(l.ready)
	}()
}

// Append writes one record and, unless NoSync, syncs it: when it returns
// nil the record survives a crash. seq must be the one after the last
// record's. On an error nothing was appended, unless it is ErrMaybeWritten
// (errors.Is); after a failed sync the log refuses every later Append (the
// kernel may have dropped the pages, and a retried sync would not say so).
func (l *Log) Append(seq uint64, payload []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.broken != nil:
		return l.broken
	case l.f == nil:
		return errors.New("batch log: append before Start")
	case seq != l.next:
		return fmt.Errorf("batch log: append of seq %d, want %d", seq, l.next)
	case len(payload) == 0 || len(payload) > math.MaxUint32-segHeader-recHeader:
		return fmt.Errorf("batch log: a record of %d bytes: want 1 to %d", len(payload), math.MaxUint32-segHeader-recHeader)
	}
	size := int64(recHeader + len(payload))
	switch {
	case segHeader+size > l.o.SegmentBytes:
		// Larger than a segment (a big manifest's sync): a segment of
		// its own, written and synced whole, its size and name too.
		if err := l.alone(seq, payload); err != nil {
			return err
		}
		l.next++
		return nil
	case l.off > 0 && l.off+size > l.o.SegmentBytes:
		if err := l.rotate(seq); err != nil {
			return err
		}
	}
	at := l.off
	// In direct mode the record follows the start of its first block in
	// blk; buffered, it is written alone from buf.
	head := 0
	if l.direct {
		head = int(at % block)
		l.buf = l.blockBuf(head, segHeader+recHeader+len(payload))
	}
	l.buf = l.buf[:head]
	if at == 0 { // a segment's first record carries its header
		l.buf = append(l.buf, magic...)
		l.buf = binary.LittleEndian.AppendUint64(l.buf, seq)
	}
	l.buf = binary.LittleEndian.AppendUint32(l.buf, uint32(len(payload)))
	l.buf = binary.LittleEndian.AppendUint32(l.buf, checksum(seq, payload))
	l.buf = binary.LittleEndian.AppendUint64(l.buf, seq)
	l.buf = append(l.buf, payload...)
	if err := l.write(at, head); err != nil {
		return err
	}
	l.off = at + int64(len(l.buf)-head)
	l.next++
	if l.off > l.o.SegmentBytes/2 {
		l.prepareNext()
	}
	return nil
}

// write writes the record in l.buf[head:] at offset at of the segment
// and makes it durable; on an error nothing of it counts (undo).
func (l *Log) write(at int64, head int) error {
	if l.direct {
		err := l.writeDirect(at, head)
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		// Opened, but refused: this file system takes direct I/O on
		// some files or buffers only. Nothing was written.
		if err := l.buffered(); err != nil {
			return err
		}
	}
	if _, err := l.f.WriteAt(l.buf[head:], at); err != nil {
		return l.undo(fmt.Errorf("batch log: write: %w", err))
	}
	if !l.o.NoSync {
		if err := datasync(l.f); err != nil {
			return l.failedSync(err)
		}
	}
	return nil
}

// writeDirect writes the blocks l.buf covers from the start of at's
// block (l.buf[:head] is that block's content before at) through the end
// of the record, the rest of its last block zero as the segment was
// prepared, and keeps the last block's start for the next record. The
// write returns once the blocks are durable (O_DSYNC): an error other
// than EINVAL (refused before any I/O) may be a failed sync.
func (l *Log) writeDirect(at int64, head int) error {
	n := len(l.buf)
	b := l.buf[:(n+block-1)&^(block-1)]
	clear(b[n:])
	if _, err := l.f.WriteAt(b, at-int64(head)); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return err
		}
		return l.failedSync(err)
	}
	copy(l.blk, b[n&^(block-1):n])
	return nil
}

// failedSync breaks the log after a sync that failed, and undoes the
// record.
func (l *Log) failedSync(err error) error {
	l.breakAfterSync(err)
	return l.undo(fmt.Errorf("batch log: sync: %w", err))
}

// breakAfterSync makes every later Append fail after a sync that failed:
// the kernel may have dropped the pages, and a retried sync would not
// say so.
func (l *Log) breakAfterSync(err error) {
	l.broken = fmt.Errorf("batch log: an earlier sync failed (%v); restart the server once the disk is fixed", err)
}

// blockBuf returns l.blk, aligned to a block, with room for head bytes
// and a record of size bytes rounded up to whole blocks; its first head
// bytes are kept. One grown past a megabyte for a large record is not
// kept for much smaller ones.
func (l *Log) blockBuf(head, size int) []byte {
	need := (head + size + block - 1) &^ (block - 1)
	if cap(l.blk) >= need && (cap(l.blk) <= 1<<20 || need >= cap(l.blk)/4) {
		return l.blk[:need]
	}
	raw := make([]byte, need+block)
	b := raw[block-int(uintptr(unsafe.Pointer(&raw[0]))%block):][:need:need]
	copy(b, l.blk[:min(head, len(l.blk))])
	l.blk = b
	return b
}

// buffered reopens the segment without direct I/O, for good.
func (l *Log) buffered() error {
	f, err := os.OpenFile(l.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("batch log: %w", err)
	}
	l.f.Close()
	l.f, l.direct, l.noDirect = f, false, true
	return nil
}

// rotate moves to the next segment, whose first record is seq: the spare,
// waiting for it if it is still being prepared.
func (l *Log) rotate(seq uint64) error {
	l.prepareNext()
	for l.preparing {
		ready := l.ready
		l.mu.Unlock()
		if testHookRotateWait != nil {
			testHookRotateWait()
		}
		<-ready
		l.mu.Lock()
	}
	if l.f == nil { // closed or discarded while the lock was let go
		return l.broken
	}
	f, err := l.spare, l.spareErr
	l.spare, l.spareErr = nil, nil
	if err != nil {
		return err // the next Append tries again
	}
	return l.use(f, seq)
}

// testHookRotateWait, when set by a test, runs as rotate starts waiting
// for the spare segment, its lock let go.
var testHookRotateWait func()

// testHookSyncDir, when set by a test, runs before each directory sync,
// and an error it returns is the sync's.
var testHookSyncDir func() error

// alone writes the record seq in a segment of its own, sized to it, and
// makes it durable; the next record starts a new segment. The segment is
// written under a temporary name and renamed once synced: its name may be
// the current segment's (one with no record yet is named after seq too),
// which must stay whole should the write fail.
func (l *Log) alone(seq uint64, payload []byte) error {
	path := l.segPath(seq)
	tmp := filepath.Join(l.dir, largeName)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, defaultMode)
	if err != nil {
		return fmt.Errorf("batch log: %w", err)
	}
	buf := make([]byte, 0, segHeader+recHeader)
	buf = append(buf, magic...)
	buf = binary.LittleEndian.AppendUint64(buf, seq)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	buf = binary.LittleEndian.AppendUint32(buf, checksum(seq, payload))
	buf = binary.LittleEndian.AppendUint64(buf, seq)
	err = func() error {
		if _, err := f.Write(buf); err != nil {
			return err
		}
		if _, err := f.Write(payload); err != nil {
			return err
		}
		if !l.o.NoSync {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		if err := os.Rename(tmp, path); err != nil {
			return err
		}
		if l.o.NoSync {
			return nil
		}
		if err := syncDir(l.dir); err != nil {
			// The record has its name, perhaps in place of the current
			// segment's (which held no record yet), but not durably:
			// as after a failed sync, nothing more is appended, and
			// the name goes again, for sure only if that is synced.
			l.breakAfterSync(err)
			if os.Remove(path) != nil || syncDir(l.dir) != nil {
				return maybeWritten{err}
			}
			return err
		}
		return nil
	}()
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("batch log: write a large record: %w", err)
	}
	l.switchTo(f, path, seq)
	// Full: the next record goes to the spare.
	l.off = l.o.SegmentBytes
	return nil
}

// undo erases the header of a record that failed, so that a later record
// written in its place is not read after a stale tail, and returns err.
// When even that fails, the log is broken.
func (l *Log) undo(err error) error {
	var werr error
	if l.direct {
		// The block holding off, as it was before the record; the
		// write returns once it is durable (O_DSYNC).
		head := int(l.off % block)
		b := l.blockBuf(head, block-head)
		clear(b[head:])
		_, werr = l.f.WriteAt(b, l.off-int64(head))
	} else {
		at := l.off
		if at == 0 {
			at = segHeader // the segment's header may stand: a segment without records is skipped
		}
		_, werr = l.f.WriteAt(make([]byte, recHeader), at)
		if werr == nil && !l.o.NoSync {
			// The record may be on the disk whole (a sync that
			// failed may have written it): its erased header must be
			// too.
			werr = datasync(l.f)
		}
	}
	if werr != nil {
		if l.broken == nil {
			l.broken = fmt.Errorf("batch log: a failed record could not be erased (%v); restart the server", werr)
		}
		return maybeWritten{err}
	}
	return err
}

// ErrMaybeWritten marks an Append error after which the record may be in
// the log whole, and replayed at the next start: it failed midway and
// could not be undone for sure. On any other error the record is not in
// the log.
var ErrMaybeWritten = errors.New("batch log: the record may have been written")

type maybeWritten struct{ error }

func (e maybeWritten) Unwrap() error        { return e.error }
func (e maybeWritten) Is(target error) bool { return target == ErrMaybeWritten }

// Releasable reports whether a full segment waits to be released and the
// last seq it holds: the tables must have taken up to it durably first.
func (l *Log) Releasable() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.closed) == 0 {
		return 0, false
	}
	return l.closed[0].last, true
}

// Release removes the full segments whose records all have seq <= upTo:
// the caller has made them durable elsewhere.
func (l *Log) Release(upTo uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.closed) > 0 && l.closed[0].last <= upTo {
		if err := os.Remove(l.closed[0].path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("batch log: %w", err)
		}
		l.closed = l.closed[1:]
	}
	return nil
}

// Discard removes every segment: the caller has made all of them durable
// elsewhere (a clean shutdown). Append refuses from then on.
func (l *Log) Discard() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopLocked()
	l.closed = nil
	return l.removeSegments()
}

// removeSegments removes every segment and the spare one.
func (l *Log) removeSegments() error {
	segs, err := l.segments()
	if err != nil {
		return err
	}
	for _, sg := range append(segs, segFile{path: filepath.Join(l.dir, spareName)}, segFile{path: filepath.Join(l.dir, largeName)}) {
		if err := os.Remove(sg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("batch log: %w", err)
		}
	}
	return nil
}

// stopLocked waits for a segment being prepared and closes the files;
// Append refuses from then on. Called with l.mu held.
func (l *Log) stopLocked() {
	for l.preparing {
		ready := l.ready
		l.mu.Unlock()
		<-ready
		l.mu.Lock()
	}
	for _, f := range []*os.File{l.f, l.spare} {
		if f != nil {
			f.Close()
		}
	}
	l.f, l.spare = nil, nil
	if l.broken == nil {
		l.broken = errors.New("batch log: closed")
	}
}

// Close closes the log's files and unlocks the directory; the segments
// stay for the next Replay. It is safe to call twice.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopLocked()
	var err error
	if l.lock != nil {
		err = l.lock.Close() // closing releases the lock
		l.lock = nil
	}
	return err
}

func checksum(seq uint64, payload []byte) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seq)
	return crc32.Update(crc32.Checksum(b[:], castagnoli), castagnoli, payload)
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	if testHookSyncDir != nil {
		if err := testHookSyncDir(); err != nil {
			return err
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

package artifact

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/arbiter-hq/arbiter/filelock"
)

// Small blobs are not given a file each: creating one cost more than all
// the rest of an upload, and making it durable took two syncs (the file,
// then its directory). They are appended to a pack, DIR/packs/NNNNNNNN.pack,
// and made durable by one sync shared by every upload appended meanwhile
// (group commit, as the control loop does for commands):
//
//	entry: "ARBB" | size (4, little endian) | CRC-32C of id and data (4) | id (32 bytes) | data
//
// Open reads the packs into an index (id → pack, offset, size). A Store
// appends only to a pack it holds an exclusive lock on (filelock), so two
// Stores on one directory (replicas sharing it, an old leader not yet
// stopped) never write into one pack: Open takes the last pack when no
// other Store holds it, and a new one otherwise. The pack it takes has
// its torn last entry cut off, left by a crash in the middle of an
// append; such an upload was never answered, or its bytes were carried by
// the caller's commit (Options.CallerSyncsSmall), which gives them back
// (Restore). Only a pack's unsynced tail can be torn: a sync covers every
// append before it. A pack another Store appends to is indexed as it was
// at Open; what it gets later is read by the next Open.

const (
	packMagic   = "ARBB"
	packHeader  = 4 + 4 + 4 + 32
	packSuffix  = ".pack"
	packDirName = "packs"
	// packMax is the size past which appends go to a new pack.
	packMax = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// packRef is where a packed blob's bytes are.
type packRef struct {
	pack int   // index into packs.files
	off  int64 // of the data, after the header
	size int64
}

// packs holds the small blobs. Its methods are safe for concurrent use.
type packs struct {
	dir    string
	noSync bool

	mu    sync.Mutex
	cond  *sync.Cond // signalled when a sync ends
	index map[[32]byte]packRef
	files []*os.File // every pack, in number order; the last is appended to (and locked)
	end   int64      // where the next entry goes in the last pack
	next  int        // the number the next new pack tries
	// Durable so far: the packs before syncedPack whole, and syncedPack up
	// to syncedEnd.
	syncedPack int
	syncedEnd  int64
	syncing    bool
	broken     error // a sync failed: nothing more is appended
	buf        []byte
	// closedSynced: close found (or made) everything appended durable.
	closedSynced bool
}

// openPacks opens DIR/packs, indexes what is there and cuts a torn tail.
func openPacks(dir string, noSync bool) (*packs, error) {
	p := &packs{dir: filepath.Join(dir, packDirName), noSync: noSync, index: map[[32]byte]packRef{}, next: 1}
	p.cond = sync.NewCond(&p.mu)
	if err := os.MkdirAll(p.dir, 0o750); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, err
	}
	var nums []int // of the packs, by their names
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), packSuffix); ok && len(n) == 8 {
			if v, err := strconv.ParseUint(n, 10, 32); err == nil {
				nums = append(nums, int(v))
			}
		}
	}
	sort.Ints(nums)
	mine := false // the last pack is this Store's to append to
	for i, n := range nums {
		p.next = n + 1
		path := p.packPath(n)
		var f *os.File
		if i == len(nums)-1 {
			f, err = filelock.Exclusive(path, 0o640)
			mine = err == nil
		}
		if !mine {
			f, err = os.Open(path) // read only: another Store's, or an old one
		}
		if err != nil {
			p.close()
			return nil, err
		}
		p.files = append(p.files, f)
		end, err := p.scan(i, f)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("read %s: %w", filepath.Base(path), err)
		}
		if mine {
			// Whatever follows the last whole entry is a torn append.
			if err := f.Truncate(end); err != nil {
				p.close()
				return nil, err
			}
			p.end = end
		}
	}
	if !mine || p.end >= packMax {
		if err := p.newPack(); err != nil {
			p.close()
			return nil, err
		}
	}
	p.syncedPack, p.syncedEnd = len(p.files)-1, p.end
	return p, nil
}

// scan indexes the whole entries of pack i and returns where they end.
func (p *packs) scan(i int, f *os.File) (int64, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, 1<<62), 256<<10)
	var off int64
	hdr := make([]byte, packHeader)
	var data []byte
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return off, nil // the end, or a torn header
		}
		size := int64(binary.LittleEndian.Uint32(hdr[4:]))
		if string(hdr[:4]) != packMagic || size > packMax {
			return off, nil
		}
		if int64(cap(data)) < size {
			data = make([]byte, size)
		}
		data = data[:size]
		if _, err := io.ReadFull(r, data); err != nil {
			return off, nil
		}
		var id [32]byte
		copy(id[:], hdr[12:])
		if packSum(id, data) != binary.LittleEndian.Uint32(hdr[8:]) {
			return off, nil
		}
		p.index[id] = packRef{pack: i, off: off + packHeader, size: size}
		off += packHeader + size
	}
}

func packSum(id [32]byte, data []byte) uint32 {
	return crc32.Update(crc32.Checksum(id[:], castagnoli), castagnoli, data)
}

// packPath is where pack number n is.
func (p *packs) packPath(n int) string {
	return filepath.Join(p.dir, fmt.Sprintf("%08d%s", n, packSuffix))
}

// newPack starts the next pack, durable (its name too) before any entry
// in it is acknowledged: the first number no other Store holds or has
// written. Called with p.mu held, or before p is shared.
func (p *packs) newPack() error {
	if n := len(p.files); n > 0 && p.end > 0 && !p.noSync {
		// Whatever of the last pack (this Store's: it appended) is not
		// synced yet is, before it is left behind.
		if err := p.files[n-1].Sync(); err != nil {
			p.broken = fmt.Errorf("artifact store: a sync failed (%v); restart the server once the disk is fixed", err)
			return p.broken
		}
	}
	var f *os.File
	for ; ; p.next++ {
		if p.next > 99999999 {
			return errors.New("artifact store: no pack number left")
		}
		var err error
		f, err = filelock.Exclusive(p.packPath(p.next), 0o640)
		if errors.Is(err, filelock.ErrHeld) {
			continue // another Store's
		}
		if err != nil {
			return err
		}
		if st, err := f.Stat(); err != nil || st.Size() > 0 {
			f.Close() // another Store's, made since Open: the next Open reads it
			if err != nil {
				return err
			}
			continue
		}
		p.next++
		break
	}
	if !p.noSync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		if err := syncDir(p.dir); err != nil {
			f.Close()
			return err
		}
	}
	p.files = append(p.files, f)
	p.end = 0
	p.synced(len(p.files)-1, 0)
	return nil
}

// synced records that the packs before pack, and pack up to end, are
// durable. Called with p.mu held.
func (p *packs) synced(pack int, end int64) {
	if pack > p.syncedPack || pack == p.syncedPack && end > p.syncedEnd {
		p.syncedPack, p.syncedEnd = pack, end
	}
}

// lookup reports whether blob id is packed, and whether durably: a blob
// appended for a caller that carries its durability (add without wait)
// is served at once, but a second upload is told it exists only once a
// sync covers it.
func (p *packs) lookup(id [32]byte) (packed, durable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ref, ok := p.index[id]
	end := ref.off + ref.size
	return ok, ok && (p.noSync || ref.pack < p.syncedPack || ref.pack == p.syncedPack && end <= p.syncedEnd)
}

// add appends blob id. With wait it returns once the blob is durable (with
// NoSync, once it is written): appends that come while another waits for
// its sync share the next one. Without, it returns once the blob is
// written, and sync (or a later add that waits) makes it durable.
func (p *packs) add(id [32]byte, data []byte, wait bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return p.broken
	}
	size := int64(packHeader + len(data))
	if p.end > 0 && p.end+size > packMax {
		if err := p.newPack(); err != nil {
			return fmt.Errorf("artifact store: new pack: %w", err)
		}
	}
	pack, off := len(p.files)-1, p.end
	p.buf = append(p.buf[:0], packMagic...)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(data)))
	p.buf = binary.LittleEndian.AppendUint32(p.buf, packSum(id, data))
	p.buf = append(p.buf, id[:]...)
	p.buf = append(p.buf, data...)
	if _, err := p.files[pack].WriteAt(p.buf, off); err != nil {
		// Cut what was written, so the next entry follows the last whole one.
		if terr := p.files[pack].Truncate(off); terr != nil {
			p.broken = fmt.Errorf("artifact store: a failed append could not be undone (%v); restart the server", terr)
		}
		return fmt.Errorf("artifact store: append: %w", err)
	}
	p.end = off + size
	if wait {
		if err := p.syncTo(pack, off+size); err != nil {
			return err
		}
	}
	// Only now may an identical upload find it (lookup tells whether it
	// is durable yet).
	p.index[id] = packRef{pack: pack, off: off + packHeader, size: int64(len(data))}
	return nil
}

// sync makes everything appended so far durable. Once closed, it
// succeeds if close synced everything.
func (p *packs) sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.files == nil && p.closedSynced {
		return nil
	}
	if p.broken != nil {
		return p.broken
	}
	return p.syncTo(len(p.files)-1, p.end)
}

// syncTo returns once pack is durable up to end, syncing it or waiting
// for the sync in progress: one sync serves every append made before it
// began. Called with p.mu held.
func (p *packs) syncTo(pack int, end int64) error {
	for !p.noSync && (p.syncedPack < pack || p.syncedPack == pack && p.syncedEnd < end) {
		if p.broken != nil {
			return p.broken
		}
		if p.syncing {
			p.cond.Wait()
			continue
		}
		// Lead: sync everything appended so far, for every waiter.
		p.syncing = true
		f, sp, se := p.files[len(p.files)-1], len(p.files)-1, p.end
		p.mu.Unlock()
		err := f.Sync()
		p.mu.Lock()
		p.syncing = false
		p.cond.Broadcast()
		if err != nil {
			p.broken = fmt.Errorf("artifact store: a sync failed (%v); restart the server once the disk is fixed", err)
			return p.broken
		}
		p.synced(sp, se)
	}
	return nil
}

// open returns a reader of packed blob id and its size.
func (p *packs) open(id [32]byte) (io.ReadSeekCloser, int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ref, ok := p.index[id]
	if !ok {
		return nil, 0, false
	}
	return nopCloser{io.NewSectionReader(p.files[ref.pack], ref.off, ref.size)}, ref.size, true
}

// list returns the packed blobs.
func (p *packs) list() []Blob {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Blob, 0, len(p.index))
	for id, ref := range p.index {
		out = append(out, Blob{ID: hex.EncodeToString(id[:]), Size: ref.size})
	}
	return out
}

func (p *packs) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	if p.files != nil && p.broken == nil {
		// Blobs appended for callers that carry their durability are made
		// durable now, so that those callers may drop them after Close.
		if err := p.syncTo(len(p.files)-1, p.end); err != nil {
			errs = append(errs, err)
		} else {
			p.closedSynced = true
		}
	}
	for _, f := range p.files {
		errs = append(errs, f.Close())
	}
	p.files = nil
	if p.broken == nil {
		p.broken = errors.New("artifact store: closed")
	}
	return errors.Join(errs...)
}

// nopCloser is a packed blob's reader: the pack stays open.
type nopCloser struct{ *io.SectionReader }

func (nopCloser) Close() error { return nil }

// Package artifact stores immutable, content-addressed blobs (docs/reference/fleet.md
// §4): a blob's id is the sha256 of its bytes, so identical uploads are
// stored once.
//
// An upload is streamed into a temporary file while it is hashed and
// counted; it is published under its id only once it is complete, no
// larger than the limit and matching the expected sha256: the file is
// synced and renamed into place atomically, so a reader never
// sees part of a blob. A failed, oversize or cut-off upload leaves nothing
// behind. Blobs live at DIR/<first two hex digits>/<id>; an upload is
// written beside where it will live, as .upload-* (so that concurrent
// uploads spread over 256 directories and the rename stays in one); Open
// removes those a crash left.
//
// A small upload (at most Options.SmallBytes) is read into memory instead,
// hashed, and appended to a pack whose sync is shared by the uploads that
// come meanwhile (pack.go): it creates no file, and costs a fraction of
// one sync. With Options.CallerSyncsSmall one of at most MaxCarriedBytes
// costs none: the caller carries the bytes in its own durable commit (the
// SQLite store's batch log), gives them back with Restore after a crash,
// and calls Sync before it forgets them.
//
// The package knows nothing of tasks: the metadata of an artifact (which
// task, which worker) is recorded by the caller.
package artifact

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/arbiter-hq/arbiter"
)

// Store is a directory of blobs. It is safe for concurrent use, also by
// several processes sharing the directory.
type Store struct {
	dir         string
	noSync      bool
	small       int64
	callerSyncs bool // Options.CallerSyncsSmall
	packs       *packs
	// smallFiles is set when a blob of at most small bytes was a file of
	// its own at Open (stored by a version without packs): uploads made
	// since then put every such blob in a pack, so without one, a small
	// upload need not look for a file.
	smallFiles bool
	// smallBufs holds buffers of small+1 bytes: an upload that fills one
	// is not small.
	smallBufs sync.Pool
}

// Options tune a Store.
type Options struct {
	// NoSync skips fsync of blobs and directories: faster, but a power cut
	// may lose blobs whose upload was acknowledged. For tests and benchmarks.
	NoSync bool
	// SmallBytes is the size up to which an upload goes to a pack rather
	// than a file of its own (default DefaultSmallBytes; negative: none do).
	SmallBytes int64
	// CallerSyncsSmall leaves the durability of an upload of at most
	// MaxCarriedBytes to the caller: Ingest appends it to a pack without
	// waiting for a sync and returns its bytes in Blob.Data, which the
	// caller must make durable itself (in the commit that records the
	// blob), give back to Restore after a crash, and keep until Sync has
	// returned. Until then the blob is served but not reported as
	// existing to a second upload, which gets the bytes to carry too.
	CallerSyncsSmall bool
}

// MaxCarriedBytes bounds the uploads whose bytes a caller carries
// (Options.CallerSyncsSmall). Carried bytes are written twice (the
// caller's log, the pack), which for a tiny result costs far less than
// the sync it saves, but near DefaultSmallBytes would double what the
// disk writes.
const MaxCarriedBytes = 16 << 10

// DefaultSmallBytes is the default Options.SmallBytes.
const DefaultSmallBytes = 64 << 10

// Open opens (creating if needed) the store in dir and removes temporary
// files left by uploads a crash cut off.
func Open(dir string, o Options) (*Store, error) {
	s := &Store{dir: dir, noSync: o.NoSync, small: o.SmallBytes, callerSyncs: o.CallerSyncsSmall && !o.NoSync}
	if s.small == 0 {
		s.small = DefaultSmallBytes
	}
	s.smallBufs.New = func() any { b := make([]byte, max(s.small+1, 1)); return &b }
	// The 256 shard directories exist from the start: an upload then makes
	// no directory.
	for i := 0; i < 256; i++ {
		shard := filepath.Join(dir, fmt.Sprintf("%02x", i))
		if err := os.MkdirAll(shard, 0o750); err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		ents, err := os.ReadDir(shard)
		if err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), uploadPrefix) {
				if !s.smallFiles && s.small > 0 {
					info, err := e.Info()
					s.smallFiles = err != nil || info.Size() <= s.small
				}
				continue
			}
			if err := os.Remove(filepath.Join(shard, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("artifact store: remove a leftover upload: %w", err)
			}
		}
	}
	var err error
	if s.packs, err = openPacks(dir, o.NoSync); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	if !s.noSync {
		if err := syncDir(dir); err != nil {
			s.packs.close()
			return nil, fmt.Errorf("artifact store: %w", err)
		}
	}
	return s, nil
}

// Close closes the packs. It is safe to call twice.
func (s *Store) Close() error { return s.packs.close() }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Blob is a stored blob (the vocabulary's type, so that transports need
// not import this package).
type Blob = arbiter.Blob

// MismatchError is returned by Ingest when the bytes do not hash to the
// expected id. Its code (arbiter.ErrorCode) is invalid.
type MismatchError = arbiter.ChecksumError

var bufPool = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// Ingest reads r to its end into a new blob that must hash to want (64
// lowercase hex digits) and be at most limit bytes (limit <= 0: no limit).
// It returns the blob, with Existed set when those bytes were already
// stored (the upload is then discarded). On any error nothing is left
// behind. Errors: invalid for a bad want; too_large past the limit;
// *MismatchError; invalid when r fails (an upload cut off); anything else
// is a local failure (disk full).
func (s *Store) Ingest(r io.Reader, want string, limit int64) (Blob, error) {
	if err := arbiter.ValidateSHA256("sha256", want); err != nil {
		return Blob{}, err
	}
	src := r
	if limit > 0 {
		src = io.LimitReader(r, limit+1)
	}
	var head []byte // what was read trying it as a small upload
	if s.small > 0 {
		bp := s.smallBufs.Get().(*[]byte)
		defer s.smallBufs.Put(bp)
		n, end, err := readUpTo(src, *bp)
		switch {
		case err != nil:
			return Blob{}, arbiter.Errorf(arbiter.EInvalid, "the upload was cut off after %d bytes (%v); nothing was stored, send it again", n, err)
		case end:
			return s.ingestSmall((*bp)[:n], want, limit)
		}
		head = (*bp)[:n] // larger than small: a file of its own
	}
	final := s.path(want)
	f, err := os.CreateTemp(filepath.Dir(final), uploadPrefix+"*")
	if err != nil {
		return Blob{}, fmt.Errorf("artifact store: %w", err)
	}
	tmp := f.Name()
	published := false
	defer func() {
		if !published {
			f.Close()
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	bp := bufPool.Get().(*[]byte)
	n, err := copyHashing(f, h, io.MultiReader(bytes.NewReader(head), src), *bp)
	bufPool.Put(bp)
	switch {
	case err != nil && errors.Is(err, errWrite):
		return Blob{}, fmt.Errorf("artifact store: write %s: %w", tmp, errors.Unwrap(err))
	case err != nil:
		return Blob{}, arbiter.Errorf(arbiter.EInvalid, "the upload was cut off after %d bytes (%v); nothing was stored, send it again", n, err)
	case limit > 0 && n > limit:
		return Blob{}, arbiter.Errorf(arbiter.ETooLarge, "the upload is larger than the limit of %d bytes; nothing was stored", limit)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if got != want {
		return Blob{}, &MismatchError{Expected: want, Actual: got}
	}
	if s.has(want) {
		return Blob{ID: want, Size: n, Existed: true}, nil
	}
	// The bytes are durable before their name appears...
	if err := s.sync(f); err != nil {
		return Blob{}, fmt.Errorf("artifact store: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return Blob{}, fmt.Errorf("artifact store: close %s: %w", tmp, err)
	}
	// Two identical uploads at once may both get here: the second rename
	// replaces identical bytes with identical bytes.
	if err := os.Rename(tmp, final); err != nil {
		return Blob{}, fmt.Errorf("artifact store: publish %s: %w", want, err)
	}
	published = true
	// ...and the name is durable before the caller records it.
	if err := s.syncName(filepath.Dir(final)); err != nil {
		return Blob{}, fmt.Errorf("artifact store: sync directory: %w", err)
	}
	return Blob{ID: want, Size: n}, nil
}

// readUpTo reads r into buf until r ends (end set) or buf is full, and
// returns the bytes read. An error of r other than its end is returned.
func readUpTo(r io.Reader, buf []byte) (n int, end bool, err error) {
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// ingestSmall stores data, the whole upload, in a pack.
func (s *Store) ingestSmall(data []byte, want string, limit int64) (Blob, error) {
	n := int64(len(data))
	if limit > 0 && n > limit {
		return Blob{}, arbiter.Errorf(arbiter.ETooLarge, "the upload is larger than the limit of %d bytes; nothing was stored", limit)
	}
	id, err := idOf(data, want)
	if err != nil {
		return Blob{}, err
	}
	packed, durable := s.packs.lookup(id)
	if durable || s.hasFile(want, true) {
		return Blob{ID: want, Size: n, Existed: true}, nil
	}
	if !s.callerSyncs || n > MaxCarriedBytes {
		if err := s.packs.add(id, data, true); err != nil {
			return Blob{}, err
		}
		return Blob{ID: want, Size: n}, nil
	}
	// The caller's commit makes the bytes durable, so it gets its own
	// copy (data is a pooled buffer). A blob appended but not yet synced
	// is not appended again.
	carried := bytes.Clone(data)
	if !packed {
		if err := s.packs.add(id, carried, false); err != nil {
			return Blob{}, err
		}
	}
	return Blob{ID: want, Size: n, Data: carried}, nil
}

// idOf is data's id, or a *MismatchError when it is not want.
func idOf(data []byte, want string) ([32]byte, error) {
	id := sha256.Sum256(data)
	if got := hex.EncodeToString(id[:]); got != want {
		return id, &MismatchError{Expected: want, Actual: got}
	}
	return id, nil
}

// Restore puts back a blob whose bytes a caller carried (Blob.Data) and
// that a crash may have lost from its pack: it is appended unless
// stored, and durable once Sync returns. Errors: invalid when data does
// not hash to id; a local failure (disk full).
func (s *Store) Restore(id string, data []byte) error {
	key, err := idOf(data, id)
	if err != nil {
		return err
	}
	if packed, _ := s.packs.lookup(key); packed || s.hasFile(id, int64(len(data)) <= s.small) {
		return nil
	}
	return s.packs.add(key, data, false)
}

// Sync makes every blob appended so far durable: the bytes whose
// durability callers carried (Options.CallerSyncsSmall, Restore) may be
// dropped from their commits once it returns.
func (s *Store) Sync() error {
	if s.noSync {
		return nil
	}
	return s.packs.sync()
}

// has reports whether blob id (valid) is stored, durably packed or in a
// file.
func (s *Store) has(id string) bool {
	var key [32]byte
	if _, err := hex.Decode(key[:], []byte(id)); err == nil {
		if _, durable := s.packs.lookup(key); durable {
			return true
		}
	}
	return s.hasFile(id, false)
}

// hasFile reports whether blob id (valid) is a file of its own; small
// says it is at most Options.SmallBytes long.
func (s *Store) hasFile(id string, small bool) bool {
	if small && !s.smallFiles {
		return false
	}
	_, err := os.Lstat(s.path(id))
	return err == nil
}

// sync makes f's bytes durable.
func (s *Store) sync(f *os.File) error {
	if s.noSync {
		return nil
	}
	return f.Sync()
}

// syncName makes a new name in dir durable.
func (s *Store) syncName(dir string) error {
	if s.noSync {
		return nil
	}
	return syncDir(dir)
}

var errWrite = errors.New("write")

// uploadPrefix starts the names of uploads in progress.
const uploadPrefix = ".upload-"

// copyHashing copies src to f and h, returning the bytes read. A write
// failure is wrapped in errWrite; a read failure is returned as it is.
func copyHashing(f *os.File, h hash.Hash, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return n, fmt.Errorf("%w: %w", errWrite, err)
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

func (s *Store) path(id string) string { return filepath.Join(s.dir, id[:2], id) }

// Open returns the blob id for reading, and its size. Errors: invalid for a
// bad id, not_found when it is not stored.
func (s *Store) Open(id string) (io.ReadSeekCloser, int64, error) {
	if err := arbiter.ValidateSHA256("artifact id", id); err != nil {
		return nil, 0, err
	}
	var key [32]byte
	hex.Decode(key[:], []byte(id))
	if r, size, ok := s.packs.open(key); ok {
		return r, size, nil
	}
	f, err := os.Open(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, arbiter.Errorf(arbiter.ENotFound, "artifact %s is not stored", id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("artifact store: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("artifact store: %w", err)
	}
	return f, st.Size(), nil
}

// Has reports whether blob id is stored.
func (s *Store) Has(id string) bool {
	return arbiter.ValidateSHA256("artifact id", id) == nil && s.has(id)
}

// List returns every stored blob, in id order.
func (s *Store) List() ([]Blob, error) {
	out := s.packs.list()
	shards, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(s.dir, sh.Name()))
		if err != nil {
			return nil, fmt.Errorf("artifact store: %w", err)
		}
		for _, e := range ents {
			id := e.Name()
			if arbiter.ValidateSHA256("id", id) != nil || !strings.HasPrefix(id, sh.Name()) {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, Blob{ID: id, Size: info.Size()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

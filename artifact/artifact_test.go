package artifact

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// leftovers lists every file under dir but the packs, and names a pack
// that holds more than its blobs (List) take.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	var packed int64
	filepath.WalkDir(s.dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if filepath.Base(filepath.Dir(p)) == packDirName {
			info, _ := d.Info()
			packed += info.Size()
			return nil
		}
		out = append(out, strings.TrimPrefix(p, s.dir))
		return nil
	})
	var want int64
	for _, b := range s.packs.list() {
		want += packHeader + b.Size
	}
	if packed != want {
		out = append(out, fmt.Sprintf("packs of %d bytes for packed blobs of %d", packed, want))
	}
	return out
}

func TestIngestDedupAndRead(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("model weights "), 10000)
	id := sum(data)
	b, err := s.Ingest(bytes.NewReader(data), id, 1<<20)
	if err != nil || b.ID != id || b.Size != int64(len(data)) || b.Existed {
		t.Fatalf("got %+v %v", b, err)
	}
	b, err = s.Ingest(bytes.NewReader(data), id, 1<<20)
	if err != nil || !b.Existed {
		t.Fatalf("second upload: got %+v %v, want already present", b, err)
	}
	if files := leftovers(t, s); len(files) != 1 {
		t.Fatalf("got files %v, want just the one blob", files)
	}
	f, size, err := s.Open(id)
	if err != nil || size != int64(len(data)) {
		t.Fatalf("open: %d %v", size, err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("read back different bytes")
	}
	if !s.Has(id) || s.Has(sum([]byte("x"))) || s.Has("nope") {
		t.Error("Has is wrong")
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].Size != int64(len(data)) {
		t.Fatalf("list: %+v %v", list, err)
	}
}

type cutReader struct {
	r     io.Reader
	after int
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.after <= 0 {
		return 0, io.ErrUnexpectedEOF
	}
	if len(p) > c.after {
		p = p[:c.after]
	}
	n, err := c.r.Read(p)
	c.after -= n
	return n, err
}

func TestIngestFailuresLeaveNothing(t *testing.T) {
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, 100000)
	id := sum(data)
	small := data[:300] // packed, not a file
	smallID := sum(small)
	tests := []struct {
		name  string
		r     io.Reader
		want  string
		limit int64
		code  string
	}{
		{"bad sha", bytes.NewReader(data), "xyz", 0, arbiter.EInvalid},
		{"upper-case sha", bytes.NewReader(data), strings.ToUpper(id), 0, arbiter.EInvalid},
		{"mismatch", bytes.NewReader(data), sum([]byte("other")), 0, arbiter.EInvalid},
		{"too large", bytes.NewReader(data), id, 99999, arbiter.ETooLarge},
		{"cut off", &cutReader{r: bytes.NewReader(data), after: 70000}, id, 0, arbiter.EInvalid},
		{"cut off early", &cutReader{r: bytes.NewReader(data), after: 7000}, id, 0, arbiter.EInvalid},
		{"small mismatch", bytes.NewReader(small), id, 0, arbiter.EInvalid},
		{"small too large", bytes.NewReader(small), smallID, 299, arbiter.ETooLarge},
		{"small cut off", &cutReader{r: bytes.NewReader(small), after: 100}, smallID, 0, arbiter.EInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Ingest(tt.r, tt.want, tt.limit)
			if arbiter.ErrorCode(err) != tt.code {
				t.Fatalf("got %v (%s), want %s", err, arbiter.ErrorCode(err), tt.code)
			}
			if files := leftovers(t, s); len(files) != 0 {
				t.Fatalf("left behind %v", files)
			}
		})
	}
	var me *MismatchError
	_, err = s.Ingest(bytes.NewReader(data), sum([]byte("other")), 0)
	if !errors.As(err, &me) || me.Actual != id {
		t.Fatalf("got %v, want a mismatch naming the actual sha", err)
	}
	// Exactly at the limit is fine.
	if _, err := s.Ingest(bytes.NewReader(data), id, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(bytes.NewReader(small), smallID, int64(len(small))); err != nil {
		t.Fatal(err)
	}
}

// TestSmallBlobs: small uploads go to a pack — no file each — are read
// back, deduplicated, listed, and survive a reopen; a torn entry a crash
// left at the end of a pack is cut off and the next upload follows the
// last whole one.
func TestSmallBlobs(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	blobs := map[string][]byte{}
	for i := 0; i < 50; i++ {
		data := bytes.Repeat([]byte(fmt.Sprintf("blob %d;", i)), 10*i+1)
		id := sum(data)
		b, err := s.Ingest(bytes.NewReader(data), id, 1<<20)
		if err != nil || b.Existed || b.Size != int64(len(data)) {
			t.Fatalf("blob %d: %+v %v", i, b, err)
		}
		ids = append(ids, id)
		blobs[id] = data
	}
	if b, err := s.Ingest(bytes.NewReader(blobs[ids[3]]), ids[3], 0); err != nil || !b.Existed {
		t.Fatalf("again: %+v %v, want it to exist", b, err)
	}
	if files := leftovers(t, s); len(files) != 0 {
		t.Fatalf("small blobs left files %v", files)
	}
	check := func(s *Store) {
		t.Helper()
		for id, data := range blobs {
			r, size, err := s.Open(id)
			if err != nil || size != int64(len(data)) {
				t.Fatalf("open %s: %d %v", id[:8], size, err)
			}
			got, _ := io.ReadAll(r)
			r.Close()
			if !bytes.Equal(got, data) || !s.Has(id) {
				t.Fatalf("blob %s reads back wrong", id[:8])
			}
		}
		if list, _ := s.List(); len(list) != len(blobs) {
			t.Fatalf("list has %d blobs, want %d", len(list), len(blobs))
		}
	}
	check(s)
	s.Close()

	// A crash in the middle of an append: half an entry at the end.
	pack := filepath.Join(dir, packDirName, "00000001.pack")
	st, _ := os.Stat(pack)
	f, _ := os.OpenFile(pack, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte(packMagic + "\x10\x00\x00\x00half an entr"))
	f.Close()
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st2, _ := os.Stat(pack); st2.Size() != st.Size() {
		t.Errorf("the torn entry was not cut: %d bytes, want %d", st2.Size(), st.Size())
	}
	check(s)
	data := []byte("after the crash")
	blobs[sum(data)] = data
	if _, err := s.Ingest(bytes.NewReader(data), sum(data), 0); err != nil {
		t.Fatal(err)
	}
	check(s)
}

func TestConcurrentIdenticalUploads(t *testing.T) {
	s, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("abc"), 50000)
	id := sum(data)
	var wg sync.WaitGroup
	var mu sync.Mutex
	stored := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := s.Ingest(bytes.NewReader(data), id, 0)
			if err != nil {
				t.Error(err)
				return
			}
			if !b.Existed {
				mu.Lock()
				stored++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if stored < 1 {
		t.Errorf("no upload says it stored the blob")
	}
	if files := leftovers(t, s); len(files) != 1 {
		t.Fatalf("got %v, want one blob", files)
	}
}

func TestOpenRemovesLeftovers(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "ab"), 0o750)
	os.WriteFile(filepath.Join(dir, "ab", ".upload-123"), []byte("half"), 0o600)
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if files := leftovers(t, s); len(files) != 0 {
		t.Fatalf("got %v after Open, want the crash leftovers gone", files)
	}
	if _, _, err := s.Open(sum([]byte("nothing"))); arbiter.ErrorCode(err) != arbiter.ENotFound {
		t.Errorf("open of a missing blob: %v", err)
	}
	if _, _, err := s.Open("../../etc/passwd"); arbiter.ErrorCode(err) != arbiter.EInvalid {
		t.Errorf("open of a bad id: %v", err)
	}
}

func BenchmarkIngest4KiB(b *testing.B) {
	for _, small := range []int64{-1, DefaultSmallBytes} {
		name := "file"
		if small > 0 {
			name = "pack"
		}
		b.Run(name, func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{SmallBytes: small})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.ReportAllocs()
			b.SetParallelism(8) // uploads at once: a pack's sync is shared
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				data := make([]byte, 4096)
				for pb.Next() {
					i := n.Add(1)
					data[0], data[1], data[2] = byte(i), byte(i>>8), byte(i>>16)
					if _, err := s.Ingest(bytes.NewReader(data), sum(data), 1<<20); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// TestSmallBlobStoredAsAFile: a blob small enough for a pack that a store
// without packs kept as a file of its own is found there, not stored again.
func TestSmallBlobStoredAsAFile(t *testing.T) {
	dir := t.TempDir()
	old, err := Open(dir, Options{SmallBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("stored before packs")
	if b, err := old.Ingest(bytes.NewReader(data), sum(data), 0); err != nil || b.Existed {
		t.Fatalf("%+v %v", b, err)
	}
	old.Close()
	for _, tc := range []struct {
		name  string
		files bool // a small blob is a file
	}{{"with the file", true}, {"without it", false}} {
		if !tc.files {
			os.Remove(filepath.Join(dir, sum(data)[:2], sum(data)))
		}
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if s.smallFiles != tc.files {
			t.Errorf("%s: smallFiles %v", tc.name, s.smallFiles)
		}
		b, err := s.Ingest(bytes.NewReader(data), sum(data), 0)
		if err != nil || b.Existed != tc.files {
			t.Errorf("%s: %+v %v, want existed %v", tc.name, b, err, tc.files)
		}
		s.Close()
	}
}

// TestCallerSyncsSmall: with Options.CallerSyncsSmall a small upload is
// served at once and its bytes returned for the caller to carry; it is
// not told to a second upload as existing (that one carries the bytes
// too, without a second copy in the pack) until Sync; Restore puts back
// what a crash lost; Close leaves everything synced.
func TestCallerSyncsSmall(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{CallerSyncsSmall: true})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("a small result")
	id := sum(data)
	b, err := s.Ingest(bytes.NewReader(data), id, 0)
	if err != nil || b.Existed || !bytes.Equal(b.Data, data) {
		t.Fatalf("first upload: %+v %v; want its bytes to carry", b, err)
	}
	r, size, err := s.Open(id)
	if err != nil || size != int64(len(data)) {
		t.Fatalf("open before the sync: %d %v", size, err)
	}
	r.Close()
	pack := filepath.Join(dir, packDirName, "00000001.pack")
	st1, _ := os.Stat(pack)
	b, err = s.Ingest(bytes.NewReader(data), id, 0)
	if err != nil || b.Existed || !bytes.Equal(b.Data, data) {
		t.Fatalf("second upload before the sync: %+v %v; want its bytes to carry too", b, err)
	}
	if st2, _ := os.Stat(pack); st2.Size() != st1.Size() {
		t.Errorf("the second upload appended again: %d → %d bytes", st1.Size(), st2.Size())
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, err = s.Ingest(bytes.NewReader(data), id, 0); err != nil || !b.Existed || b.Data != nil {
		t.Fatalf("upload after the sync: %+v %v; want it to exist", b, err)
	}
	// Uploads past MaxCarriedBytes, packed or not, are synced as before
	// and carry nothing.
	for _, n := range []int{MaxCarriedBytes + 1, DefaultSmallBytes + 1} {
		big := bytes.Repeat([]byte("L"), n)
		if b, err = s.Ingest(bytes.NewReader(big), sum(big), 0); err != nil || b.Data != nil {
			t.Fatalf("upload of %d bytes: %v, carrying %d bytes", n, err, len(b.Data))
		}
		if b, err = s.Ingest(bytes.NewReader(big), sum(big), 0); err != nil || !b.Existed {
			t.Fatalf("upload of %d bytes again: %+v %v; want it to exist at once", n, b, err)
		}
	}
	s.Close()
	if err := s.Sync(); err != nil {
		t.Errorf("Sync after Close: %v; Close syncs", err)
	}

	// Bytes a crash lost from the packs come back through Restore (here
	// bytes never appended); a second Restore adds nothing.
	lost := []byte("lost in a crash")
	s, err = Open(dir, Options{CallerSyncsSmall: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Restore(sum(lost), []byte("not those bytes")); err == nil {
		t.Error("Restore took bytes that do not hash to the id")
	}
	for range 2 {
		if err := s.Restore(sum(lost), lost); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if files := leftovers(t, s); len(files) != 1 { // the large blob's file
		t.Errorf("files %v; want the large blob's alone (Restore appended twice?)", files)
	}
	r, _, err = s.Open(sum(lost))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, lost) || !s.Has(sum(lost)) {
		t.Errorf("restored blob reads %q", got)
	}
}

// TestTwoStoresOnOneDirectory: two Stores on one directory (replicas
// sharing it, an old leader not yet stopped) never write into one pack:
// each keeps the small blobs it acknowledged, and a later Open reads
// them all.
func TestTwoStoresOnOneDirectory(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" && runtime.GOOS != "windows" {
		t.Skip("no file locks here")
	}
	dir := t.TempDir()
	a, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	x := bytes.Repeat([]byte("x"), 1000)
	y := bytes.Repeat([]byte("y"), 900)
	if _, err := b.Ingest(bytes.NewReader(y), sum(y), 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ingest(bytes.NewReader(x), sum(x), 1<<20); err != nil {
		t.Fatal(err)
	}
	read := func(s *Store, want []byte) {
		t.Helper()
		r, _, err := s.Open(sum(want))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if got, _ := io.ReadAll(r); !bytes.Equal(got, want) {
			t.Fatalf("blob %s… reads back other bytes: another Store wrote over it", sum(want)[:12])
		}
	}
	read(b, y)
	read(a, x)
	a.Close()
	b.Close()
	c, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read(c, x)
	read(c, y)
}

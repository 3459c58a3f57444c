package artifact

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// leftovers lists every file under dir but the published blobs.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(s.dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, strings.TrimPrefix(p, s.dir))
		}
		return nil
	})
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
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 4096)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		data[0], data[1], data[2] = byte(i), byte(i>>8), byte(i>>16)
		if _, err := s.Ingest(bytes.NewReader(data), sum(data), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

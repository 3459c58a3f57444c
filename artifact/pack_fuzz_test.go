package artifact

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func fuzzIngest(t testing.TB, s *Store, data []byte) string {
	t.Helper()
	sum := sha256.Sum256(data)
	id := hex.EncodeToString(sum[:])
	if _, err := s.Ingest(bytes.NewReader(data), id, 0); err != nil {
		t.Fatalf("ingest: %v", err)
	}
	return id
}

// FuzzOpenPacks: any bytes as a pack found at start (a torn append, a
// damaged disk, a file copied in). Open still opens; every blob it lists
// reads back with the bytes its id is the hash of; what is uploaded next
// is kept, with everything listed before, across a restart (cutting the
// torn tail cut nothing whole, and appends follow the last whole entry).
func FuzzOpenPacks(f *testing.F) {
	src := f.TempDir()
	s, err := Open(src, Options{NoSync: true})
	if err != nil {
		f.Fatal(err)
	}
	for _, d := range []string{"a", "", "hello world"} {
		fuzzIngest(f, s, []byte(d))
	}
	s.Close()
	seed, err := os.ReadFile(filepath.Join(src, packDirName, "00000001"+packSuffix))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add(append(append([]byte{}, seed...), packMagic...))
	huge := append([]byte(packMagic), 0, 0, 0, 0x7f)
	f.Add(append(huge, make([]byte, 40)...))
	neg := binary.LittleEndian.AppendUint32([]byte(packMagic), packMax+1)
	f.Add(append(neg, make([]byte, 40)...))
	f.Fuzz(func(t *testing.T, pack []byte) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, packDirName), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, packDirName, "00000001"+packSuffix), pack, 0o640); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, Options{NoSync: true})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		check := func(s *Store, ids []string) {
			for _, id := range ids {
				r, size, err := s.Open(id)
				if err != nil {
					t.Fatalf("%s listed, then %v", id, err)
				}
				b, err := io.ReadAll(r)
				r.Close()
				sum := sha256.Sum256(b)
				if err != nil || int64(len(b)) != size || hex.EncodeToString(sum[:]) != id {
					t.Fatalf("%s reads back %d bytes (size %d) hashing to %x: %v", id, len(b), size, sum, err)
				}
			}
		}
		list, err := s.List()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, b := range list {
			ids = append(ids, b.ID)
		}
		check(s, ids)
		ids = append(ids, fuzzIngest(t, s, []byte("after the restart")))
		s.Close()
		s2, err := Open(dir, Options{NoSync: true})
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer s2.Close()
		check(s2, ids)
	})
}

package filelock

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"
)

// TestExclusive: while one open file holds the lock a second Exclusive is
// refused with ErrHeld; once it is closed the next one gets it.
func TestExclusive(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" && runtime.GOOS != "windows" {
		t.Skip("no locks here")
	}
	path := filepath.Join(t.TempDir(), "LOCK")
	a, err := Exclusive(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Exclusive(path, 0o600); !errors.Is(err, ErrHeld) {
		t.Fatalf("second lock while held: %v, want ErrHeld", err)
	}
	a.Close()
	b, err := Exclusive(path, 0o600)
	if err != nil {
		t.Fatalf("after the holder closed: %v", err)
	}
	b.Close()
}

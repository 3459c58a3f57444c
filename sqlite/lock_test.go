package sqlite

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestOneStorePerFile is issue 12's finding 1 on SQLite: while one Store
// has the file, a second Open of it — through the same path or through a
// symbolic link to it or its directory — is refused, naming the holder; after
// Close it is the next one's.
func TestOneStorePerFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "data", "arbiter.db")
	s := openT(t, path, Options{})
	_, err := Open(path, Options{})
	if arbiter.ErrorCode(err) != arbiter.EConflict {
		t.Fatalf("second Open: %v, want a conflict", err)
	}
	host, _ := os.Hostname()
	for _, want := range []string{"data directory " + filepath.Dir(s.Path()), fmt.Sprintf("pid %d", os.Getpid()), "on host " + host, "--data-dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "data"), link); err == nil {
		if _, err := Open(filepath.Join(link, "arbiter.db"), Options{}); arbiter.ErrorCode(err) != arbiter.EConflict {
			t.Errorf("Open through a symbolic link: %v, want a conflict", err)
		}
		// A link to the file itself, from elsewhere.
		fileLink := filepath.Join(dir, "elsewhere.db")
		if err := os.Symlink(path, fileLink); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(fileLink, Options{}); arbiter.ErrorCode(err) != arbiter.EConflict {
			t.Errorf("Open through a symbolic link to the file: %v, want a conflict", err)
		}
	}
	// Another database in the same directory is another store.
	openT(t, filepath.Join(dir, "data", "other.db"), Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s2.Close()
}

// TestLockDiesWithItsProcess: a server killed with SIGKILL leaves no lock
// behind, only the file, which the next server takes over.
func TestLockDiesWithItsProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arbiter.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ARBITER_TEST_LOCK_HOLDER="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "locked" {
		t.Fatalf("child: %q", line)
	}
	_, err = Open(path, Options{})
	if arbiter.ErrorCode(err) != arbiter.EConflict || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", cmd.Process.Pid)) {
		t.Fatalf("Open while the child holds it: %v, want a conflict naming pid %d", err, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the holder was killed: %v", err)
	}
	s.Close()
}

// lockHolderChild is the child process of TestLockDiesWithItsProcess: run
// first by TestMain, it holds the store until it is killed.
func lockHolderChild() {
	path := os.Getenv("ARBITER_TEST_LOCK_HOLDER")
	if path == "" {
		return
	}
	if _, err := Open(path, Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("locked")
	select {}
}

// TestDanglingLinkToTheFile: a database file given as a symbolic link to
// a file not created yet (on a faster disk, say) is the store at the
// link's target from the first start: after a crash its answered batches
// are replayed from the log beside the target.
func TestDanglingLinkToTheFile(t *testing.T) {
	real := filepath.Join(t.TempDir(), "fast", "a.db")
	link := filepath.Join(t.TempDir(), "a.db")
	if err := os.Symlink(real, link); err != nil {
		t.Skip(err)
	}
	s, err := Open(link, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != real {
		t.Errorf("store path %s, want the link's target %s", s.Path(), real)
	}
	s.behind.close()
	for k := 1; k <= 3; k++ {
		c := &arbiter.Changes{Events: []arbiter.Event{{Seq: int64(k), Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Kind: arbiter.EventAllocationReady, Subject: "allocation/1"}},
			NextEventSeq: int64(k + 1)}
		if err := s.Save(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.closeAll(); err != nil { // a crash
		t.Fatal(err)
	}
	s = openT(t, link, Options{})
	if st, err := s.Load(t.Context()); err != nil || st.NextEventSeq != 4 {
		t.Fatalf("after the crash: next event %d (%v), want 4: the three answered batches", st.NextEventSeq, err)
	}
}

// TestRelativeLinkInALinkedDirectory: a relative link whose ".." climbs out
// of a directory reached through another link is read as the kernel reads
// it: the store it names, not a new one beside the link's path.
func TestRelativeLinkInALinkedDirectory(t *testing.T) {
	root := t.TempDir()
	realDB := filepath.Join(root, "real", "arbiter.db")
	deep := filepath.Join(root, "a", "b")
	for _, d := range []string{filepath.Dir(realDB), deep} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := openT(t, realDB, Options{})
	c := &arbiter.Changes{Events: []arbiter.Event{{Seq: 1, Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Kind: arbiter.EventAllocationReady, Subject: "allocation/1"}},
		NextEventSeq: 2}
	if err := s.Save(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(deep, filepath.Join(root, "linkdir")); err != nil {
		t.Skip(err)
	}
	if err := os.Symlink("../../real/arbiter.db", filepath.Join(deep, "db")); err != nil {
		t.Fatal(err)
	}
	s2 := openT(t, filepath.Join(root, "linkdir", "db"), Options{})
	if st, err := s2.Load(t.Context()); err != nil || st.NextEventSeq != 2 || s2.Path() != realDB {
		t.Fatalf("opened %s (next event %d, %v); want %s with its saved batch", s2.Path(), st.NextEventSeq, err, realDB)
	}
}

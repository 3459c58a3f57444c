package sqlite

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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

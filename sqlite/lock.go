package sqlite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/filelock"
)

// One server per database file (docs/guides/operations.md, "One server per
// store"). Two servers on one file would each hold their own engine and hand
// out the same GPUs under the same ids; SQLite's own locks only keep their
// transactions apart. So Open takes an exclusive lock on a file beside the
// database, <name>.lock, held until Close, and writes into it who holds it,
// for the message of whoever is refused. The lock is the operating system's
// (flock on Unix, an exclusive share mode on Windows): it is released when
// the holder's process ends, kill -9 included, so a crash never leaves the
// store locked; the file itself stays, and the next holder overwrites it.

// lockHolder is what a lock file says about its holder.
type lockHolder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
}

// storeLock is a held lock file.
type storeLock struct {
	f *os.File
}

// lockStore takes the lock of the database at path (absolute), or fails
// naming its holder. Errors: conflict when held; others as they come.
func lockStore(path string) (*storeLock, error) {
	lockPath := path + ".lock"
	f, err := filelock.Exclusive(lockPath, 0o644)
	if errors.Is(err, filelock.ErrHeld) {
		return nil, heldError(path, lockPath)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	host, _ := os.Hostname()
	info, _ := json.Marshal(lockHolder{PID: os.Getpid(), Host: host, Started: time.Now().UTC().Truncate(time.Second)})
	// Who holds it, for the error another server gives (heldError).
	if err = f.Truncate(0); err == nil {
		_, err = f.WriteAt(append(info, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write lock file %s: %w", lockPath, err)
	}
	return &storeLock{f: f}, nil
}

// heldError names the holder of the lock of the database at path.
func heldError(path, lockPath string) error {
	who := "another arbiter server (it has not written who it is yet)"
	if b, err := readHolder(lockPath); err == nil {
		var h lockHolder
		if json.Unmarshal(b, &h) == nil && h.PID > 0 {
			who = fmt.Sprintf("arbiter server pid %d on host %s since %s", h.PID, arbiter.EscapeText(h.Host, false),
				h.Started.Local().Format(time.DateTime))
		}
	}
	return arbiter.Errorf(arbiter.EConflict, "data directory %s is used by %s (it holds %s); stop it or use another --data-dir",
		filepath.Dir(path), who, lockPath)
}

func readHolder(lockPath string) ([]byte, error) {
	f, err := os.Open(lockPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	return []byte(strings.TrimSpace(string(b))), err
}

// unlock releases the lock; the file stays for the next holder.
func (l *storeLock) unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing releases the lock
	l.f = nil
	return err
}

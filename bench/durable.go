package bench

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/arbiter-hq/arbiter/batchlog"
)

// The durable ceiling is the do-nothing server made to pay what any
// durable server must: before it answers a request that changes state in
// arbiter (an allocation made or released, a task claimed or completed,
// an artifact stored, a spalloc job created or destroyed), a record is
// appended to a batch log — arbiter's own, one synced write (batchlog)
// — shared by every request that arrived meanwhile (group commit, as
// arbiter does). What separates the server from this ceiling is its own
// work, not the disk's.

// durableRecord is the size of the record per batch: about what arbiter
// writes for a batch of one allocation (its events included).
const durableRecord = 1024

// durable is the durable ceiling's log, with leader-based group commit:
// a caller that finds no sync under way writes and syncs one record for
// every caller that asked before it, the others wait for that sync.
type durable struct {
	dir string
	log *batchlog.Log

	mu      sync.Mutex
	cond    *sync.Cond
	asked   uint64 // callers that asked for a sync
	synced  uint64 // callers whose ask a finished sync covered
	syncing bool
	seq     uint64
	err     error
	payload []byte

	closeOnce sync.Once
	closeErr  error
}

// newDurable opens a batch log in a new directory under parent ("": the
// system's temporary directory), which Close removes.
func newDurable(parent string) (*durable, error) {
	dir, err := os.MkdirTemp(parent, "arbiter-bench-ceiling-")
	if err != nil {
		return nil, err
	}
	log, err := batchlog.Open(dir, batchlog.Options{})
	if err == nil {
		_, err = log.Replay(0, func(uint64, []byte) error { return nil })
	}
	if err == nil {
		err = log.Start(1)
	}
	if err != nil {
		if log != nil {
			log.Close()
		}
		os.RemoveAll(dir)
		return nil, fmt.Errorf("the durable ceiling's log: %w", err)
	}
	d := &durable{dir: dir, log: log, payload: make([]byte, durableRecord)}
	d.cond = sync.NewCond(&d.mu)
	return d, nil
}

// commit returns once a record appended after the call began is synced.
// A nil *durable returns at once: the plain ceiling.
func (d *durable) commit() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked++
	mine := d.asked
	for d.synced < mine && d.err == nil {
		if d.syncing {
			d.cond.Wait()
			continue
		}
		d.syncing = true
		upTo := d.asked
		d.seq++
		seq := d.seq
		d.mu.Unlock()
		err := d.log.Append(seq, d.payload)
		if err == nil {
			err = d.log.Release(seq) // full segments: nothing here needs them
		}
		d.mu.Lock()
		d.syncing, d.synced = false, upTo
		if err != nil {
			d.err = err
		}
		d.cond.Broadcast()
	}
	return d.err
}

// Close closes the log and removes its directory. Nil-safe, and safe to
// call again (two ceilings can share a log): later calls return the
// first's error.
func (d *durable) Close() error {
	if d == nil {
		return nil
	}
	d.closeOnce.Do(func() {
		d.closeErr = errors.Join(d.log.Close(), os.RemoveAll(d.dir))
	})
	return d.closeErr
}

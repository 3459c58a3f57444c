package sqlite

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/arbiter-hq/arbiter/sqlstore"
)

// The tables are written behind the batch log. Save makes a batch durable
// in the log and hands it here; one goroutine applies whatever has
// gathered in one transaction, off the answer path: a record changed by
// many batches is written once, and the pages a transaction touches are
// written once for all of them. These transactions are not synced
// (synchronous = NORMAL): the log holds the batches until the tables
// have them durably. When the log has a full segment to release, the
// next transaction is synced (FULL), after which the segment goes.
//
// Readers of the store's own tables (Load, Events) wait for the batches
// saved before they asked, so they never miss an answered change; other
// processes reading the file see the tables a moment behind, never half a
// batch.

// maxBacklog bounds the bytes of batches saved but not yet in the tables:
// past it Save waits for the writer, so a slow disk slows commits rather
// than filling memory.
const maxBacklog = 64 << 20

// pace is how long the writer lets batches gather before it writes them,
// unless a reader waits for them: tens of milliseconds make a transaction
// of many batches, a row written by several of them (an allocation made
// and released) is written once, and the last pages of the tables (where
// new events and allocations go) are written once for all of them.
const pace = 40 * time.Millisecond

// behind is the writer of the tables.
type behind struct {
	s *Store

	mu      sync.Mutex
	cond    *sync.Cond // signalled when the queue, applied, err or closing change
	queue   []pending  // saved in the log, not yet in the tables, in seq order
	backlog int        // encoded bytes of queue
	saved   uint64     // seq of the last batch queued
	applied uint64     // seq of the last batch the tables hold
	err     error      // the last failure to write the tables; nil after a success
	closing bool
	waiters int           // flushes waiting: the writer does not pace
	kick    chan struct{} // a flush began: write now
	stop    chan struct{} // closed with closing: ends a pause or a backoff
	done    chan struct{}
}

// pending is a batch saved in the log, encoded: the writer decodes it, so
// that Save does not.
type pending struct {
	seq     uint64
	payload []byte
}

func newBehind(s *Store, applied uint64) *behind {
	b := &behind{s: s, saved: applied, applied: applied, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	b.cond = sync.NewCond(&b.mu)
	go b.run()
	return b
}

// add queues a batch that is durable in the log (payload is the writer's
// from now on), waiting while the backlog is full.
func (b *behind) add(seq uint64, payload []byte) {
	b.mu.Lock()
	for b.backlog > maxBacklog && b.err == nil && !b.closing {
		b.cond.Wait()
	}
	b.queue = append(b.queue, pending{seq, payload})
	b.backlog += len(payload)
	b.saved = seq
	b.cond.Broadcast()
	b.mu.Unlock()
}

// failure is the error that keeps the tables from being written, if any.
func (b *behind) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// flush waits until the tables hold every batch saved before it was
// called; it returns the writer's error if they cannot take them now.
func (b *behind) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	target := b.saved
	if b.applied < target {
		b.waiters++
		defer func() { b.waiters-- }()
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
	for b.applied < target {
		if b.err != nil {
			return b.err
		}
		if b.closing && len(b.queue) == 0 {
			break
		}
		b.cond.Wait()
	}
	if b.applied < target {
		return errors.New("the store is closed")
	}
	return nil
}

// close stops the writer once it has applied what is queued (or failed
// to) and reports whether the tables hold every batch saved.
func (b *behind) close() bool {
	b.mu.Lock()
	if !b.closing {
		b.closing = true
		close(b.stop)
	}
	b.cond.Broadcast()
	b.mu.Unlock()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.applied == b.saved
}

// run applies the queue until closed. A failure is kept (Save reports it
// until a later attempt succeeds) and retried with backoff; the batches
// stay queued, and in the log.
func (b *behind) run() {
	defer close(b.done)
	backoff := 20 * time.Millisecond
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		b.mu.Lock()
		for len(b.queue) == 0 && !b.closing {
			b.cond.Wait()
		}
		if len(b.queue) == 0 || (b.closing && b.err != nil) {
			b.mu.Unlock()
			return
		}
		urgent := b.closing || b.waiters > 0 || b.backlog > maxBacklog/4
		b.mu.Unlock()
		if !urgent {
			timer.Reset(pace)
			select {
			case <-timer.C:
			case <-b.kick:
				timer.Stop()
			case <-b.stop:
				timer.Stop()
			}
		}
		select { // a kick already answered by this write
		case <-b.kick:
		default:
		}
		b.mu.Lock()
		take := b.queue
		b.mu.Unlock()

		last := take[len(take)-1].seq
		_, release := b.s.log.Releasable()
		bs, err := decodeAll(take)
		if err == nil {
			err = b.s.applyBatches(bs, release)
		}
		if err != nil && b.s.tablesHold(last) {
			// The transaction committed and what followed it failed
			// (resetting the synchronous pragma): the batches are in,
			// and writing them again would fail on their events.
			b.s.logger.Warn("the database tables took a write that reported an error", "err", err)
			err = nil
		}
		if err == nil && release {
			// The log's batches go only once the blobs they carry are
			// durable where they belong. A failure here keeps the
			// segments for a later write's release; saves go on.
			if rerr := b.s.syncBlobs(); rerr != nil {
				b.s.logger.Error("the artifact bytes could not be synced; the batch log keeps them", "err", rerr)
			} else if rerr := b.s.log.Release(last); rerr != nil {
				b.s.logger.Error("a segment of the batch log could not be removed; it is removed at a later write", "err", rerr)
			}
		}

		b.mu.Lock()
		if err != nil {
			if b.err == nil {
				b.s.logger.Error("the database tables could not be written; saves fail until they can", "err", err)
			}
			b.err = fmt.Errorf("write the tables: %w", normalize(err))
			b.cond.Broadcast()
			closing := b.closing
			b.mu.Unlock()
			if closing {
				return // the log keeps the batches for the next start
			}
			select {
			case <-b.stop:
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		if b.err != nil {
			b.s.logger.Info("the database tables are written again")
		}
		backoff = 20 * time.Millisecond
		b.err = nil
		b.applied = last
		b.queue = b.queue[len(take):]
		for _, p := range take {
			b.backlog -= len(p.payload)
		}
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

func decodeAll(ps []pending) ([]*batch, error) {
	bs := make([]*batch, len(ps))
	for i, p := range ps {
		var err error
		if bs[i], err = decodeBatch(p.seq, p.payload); err != nil {
			return nil, err
		}
	}
	return bs, nil
}

// applyBatches writes bs, merged, in one transaction that also records
// the last one's seq as applied; synced when sync is set.
func (s *Store) applyBatches(bs []*batch, sync bool) error {
	m := mergeBatches(bs)
	return s.mirrorTx(sync, func(w *rawConn) error { return m.write(w) })
}

// merged is batches merged into what one transaction writes: each row's
// last state (nil data: removed), the events, the highest trim and
// counters, and the last batch's seq.
type merged struct {
	machines     map[string][]byte
	allocs       map[int64]*allocRow
	records      map[[2]string][]byte
	events       []eventRow
	trim         int64
	nextAllocID  int64
	nextEventSeq int64
	last         uint64
}

// mergeBatches merges bs, in seq order. Within one batch removals apply
// after upserts, as Save's contract says.
func mergeBatches(bs []*batch) *merged {
	m := &merged{machines: map[string][]byte{}, allocs: map[int64]*allocRow{}, records: map[[2]string][]byte{}}
	n := 0
	for _, b := range bs {
		n += len(b.events)
	}
	m.events = make([]eventRow, 0, n)
	for _, b := range bs {
		for i := range b.machines {
			m.machines[string(b.machines[i].name)] = b.machines[i].data
		}
		for _, name := range b.removedMachines {
			m.machines[string(name)] = nil
		}
		for i := range b.allocs {
			m.allocs[b.allocs[i].id] = &b.allocs[i]
		}
		for _, id := range b.removedAllocs {
			m.allocs[id] = nil
		}
		for i := range b.records {
			r := &b.records[i]
			m.records[[2]string{string(r.kind), string(r.key)}] = r.data
		}
		for _, r := range b.removedRecords {
			m.records[[2]string{string(r.kind), string(r.key)}] = nil
		}
		m.events = append(m.events, b.events...)
		m.trim = max(m.trim, b.trim)
		m.nextAllocID = max(m.nextAllocID, b.nextAllocID)
		m.nextEventSeq = max(m.nextEventSeq, b.nextEventSeq)
		m.last = b.seq
	}
	return m
}

// write writes m, inside a transaction.
func (m *merged) write(w *rawConn) error {
	y := yielder{last: time.Now()}
	for name, data := range m.machines {
		var err error
		if data == nil {
			err = w.exec(sqlDeleteMachine, name)
		} else {
			err = w.exec(sqlUpsertMachine, name, text(data))
		}
		if err != nil {
			return fmt.Errorf("machine %s: %w", name, err)
		}
		y.maybe()
	}
	for id, a := range m.allocs {
		var err error
		if a == nil {
			err = w.exec(sqlDeleteAllocation, id)
		} else {
			err = w.exec(sqlUpsertAllocation, id, text(a.state), text(a.owner), text(a.data))
		}
		if err != nil {
			return fmt.Errorf("allocation %d: %w", id, err)
		}
		y.maybe()
	}
	for k, data := range m.records {
		var err error
		if data == nil {
			err = w.exec(sqlDeleteRecord, k[0], k[1])
		} else {
			err = w.exec(sqlUpsertRecord, k[0], k[1], text(data))
		}
		if err != nil {
			return fmt.Errorf("record %s/%s: %w", k[0], k[1], err)
		}
		y.maybe()
	}
	for i := range m.events {
		e := &m.events[i]
		if e.seq < m.trim {
			continue // trimmed in the same transaction
		}
		var data any // NULL for no data
		if e.hasData {
			data = text(e.data)
		}
		if err := w.exec(sqlInsertEvent, e.seq, text(e.time), text(e.kind), text(e.subject), data); err != nil {
			return fmt.Errorf("insert event %d: %w", e.seq, err)
		}
		y.maybe()
	}
	if m.trim > 0 {
		if err := w.exec(`DELETE FROM events WHERE seq < ?`, m.trim); err != nil {
			return fmt.Errorf("trim events: %w", err)
		}
	}
	if m.nextAllocID > 0 || m.nextEventSeq > 0 {
		if err := w.exec(sqlNextIDs, sqlstore.KeyNextAllocationID, m.nextAllocID, sqlstore.KeyNextEventSeq, m.nextEventSeq); err != nil {
			return fmt.Errorf("write next ids: %w", err)
		}
	}
	if err := w.exec(sqlSetMeta, keyBatchApplied, int64(m.last)); err != nil {
		return fmt.Errorf("write the applied batch: %w", err)
	}
	return nil
}

// yieldEvery is how much of the writer's work may run between two offers
// of its CPU to a thread waiting for one (yieldCPU). On a machine of two
// CPUs a transaction of a few milliseconds otherwise holds a CPU that the
// loop's thread, woken by a request, waits behind: the answer is late by
// the whole transaction (docs/guides/performance.md, "the tail at one
// connection"). Rows are offered between; the COMMIT is one piece.
const yieldEvery = 100 * time.Microsecond

// yielder offers the CPU every yieldEvery of work.
type yielder struct{ last time.Time }

// maybe offers the CPU if yieldEvery has passed since the last offer.
func (y *yielder) maybe() {
	if time.Since(y.last) >= yieldEvery {
		yieldCPU()
		y.last = time.Now()
	}
}

// keyBatchApplied is the meta key of the seq of the last batch of the log
// the tables hold.
const keyBatchApplied = "batch_applied"

// appliedInTables reads keyBatchApplied: the seq of the last batch the
// tables hold (0: none).
func (s *Store) appliedInTables() (uint64, error) {
	v, err := s.raw.text(`SELECT value FROM meta WHERE key = '` + keyBatchApplied + `'`)
	if err != nil || v == "" {
		return 0, err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("meta %s is %q: %w", keyBatchApplied, v, err)
	}
	return n, nil
}

// tablesHold reports whether the tables hold the batches up to seq, as
// far as they can be read.
func (s *Store) tablesHold(seq uint64) bool {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.raw == nil {
		return false
	}
	n, err := s.appliedInTables()
	return err == nil && n >= seq
}

const sqlSetMeta = `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`

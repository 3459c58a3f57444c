package sqlite

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/sqlstore"
)

// A batch is one saved change set as the batch log holds it and the
// tables take it: each record's JSON (the tables' data column) encoded
// once, when the batch is saved, beside the few columns queries need.
// Save encodes it into the log's record; the writer behind (behind.go)
// and the replay at Open decode it and apply it, so the path a start
// takes is the one every commit takes.
type batch struct {
	seq             uint64
	machines        []machineRow
	removedMachines [][]byte
	allocs          []allocRow
	removedAllocs   []int64
	records         []recordRow
	removedRecords  []recordKey
	events          []eventRow
	trim            int64 // delete events with seq below it; 0: none
	nextAllocID     int64
	nextEventSeq    int64
	// blobs are artifact bytes the batch carries (Changes.Blobs): not
	// written to the tables, given back to Options.Blobs after a crash.
	blobs []blobRow
}

type blobRow struct{ id, data []byte }

type machineRow struct{ name, data []byte }

type allocRow struct {
	id                 int64
	state, owner, data []byte
}

type recordKey struct{ kind, key []byte }

type recordRow struct {
	recordKey
	data []byte
}

type eventRow struct {
	seq                       int64
	time, kind, subject, data []byte
	hasData                   bool // data is NULL without it
}

// The encoded form: a version byte, then sections, each a tag, a count
// and its rows. Strings and bytes are a uvarint length and the bytes;
// integers are varints.
const batchVersion = 1

const (
	tagMachines byte = iota + 1
	tagRemovedMachines
	tagAllocs
	tagRemovedAllocs
	tagRecords
	tagRemovedRecords
	tagEvents
	tagTrim
	tagNextIDs
	tagBlobs // after the fixed-size tags: a batch without blobs reads as before
)

// encoder turns change sets into the encoded form.
type encoder struct {
	// The bytes of recent machines', allocations' and records' JSON: the
	// next ones' guess (appendRowJSON).
	machineJSON, allocJSON, recordJSON int
	json                               bytes.Buffer
	enc                                *json.Encoder
}

// sizeHint is about how long c's encoding will be: the lengths it knows,
// and for each row its kind's guess. A batch is made in one slice of this
// size; grown from a guess, its copies were a fifth of the bytes the
// server allocated under load.
func (e *encoder) sizeHint(c *arbiter.Changes) int {
	n := 32 + len(c.Machines)*(e.machineJSON+64) + len(c.Allocations)*(e.allocJSON+64) + len(c.Records)*(e.recordJSON+64) +
		32*(len(c.RemovedMachines)+len(c.RemovedAllocations)+len(c.RemovedRecords))
	for i := range c.Events {
		ev := &c.Events[i]
		n += 48 + len(ev.Kind) + len(ev.Subject) + len(ev.Data)
	}
	for _, bl := range c.Blobs {
		n += 16 + len(bl.ID) + len(bl.Data)
	}
	return n
}

// encode returns c's encoded form, in a new slice.
func (e *encoder) encode(c *arbiter.Changes) ([]byte, error) {
	if e.enc == nil {
		e.enc = json.NewEncoder(&e.json)
		e.enc.SetEscapeHTML(false)
	}
	b := append(make([]byte, 0, e.sizeHint(c)), batchVersion)
	var err error
	if n := len(c.Machines); n > 0 {
		b = section(b, tagMachines, n)
		for i := range c.Machines {
			m := &c.Machines[i]
			b = appendString(b, m.Name)
			if b, err = e.appendJSON(b, sqlstore.DurableMachine(m), &e.machineJSON); err != nil {
				return nil, fmt.Errorf("encode machine %s: %w", m.Name, err)
			}
		}
	}
	if n := len(c.RemovedMachines); n > 0 {
		b = section(b, tagRemovedMachines, n)
		for _, name := range c.RemovedMachines {
			b = appendString(b, name)
		}
	}
	if n := len(c.Allocations); n > 0 {
		b = section(b, tagAllocs, n)
		for i := range c.Allocations {
			a := &c.Allocations[i]
			b = binary.AppendVarint(b, a.ID)
			b = appendString(b, string(a.State))
			b = appendString(b, a.Owner)
			d := sqlstore.DurableAllocation(a) // stays on the stack: written without reflection
			e.json.Reset()
			b = e.appendRowJSON(b, d.AppendJSON(e.json.AvailableBuffer()), &e.allocJSON)
		}
	}
	if n := len(c.RemovedAllocations); n > 0 {
		b = section(b, tagRemovedAllocs, n)
		for _, id := range c.RemovedAllocations {
			b = binary.AppendVarint(b, id)
		}
	}
	if n := len(c.Records); n > 0 {
		b = section(b, tagRecords, n)
		for i := range c.Records {
			r := &c.Records[i]
			b = appendString(b, r.Kind)
			b = appendString(b, r.Key)
			if b, err = e.appendJSON(b, r.Value, &e.recordJSON); err != nil {
				return nil, fmt.Errorf("encode %s record %s: %w", r.Kind, r.Key, err)
			}
		}
	}
	if n := len(c.RemovedRecords); n > 0 {
		b = section(b, tagRemovedRecords, n)
		for _, r := range c.RemovedRecords {
			b = appendString(b, r.Kind)
			b = appendString(b, r.Key)
		}
	}
	if n := len(c.Events); n > 0 {
		b = section(b, tagEvents, n)
		for i := range c.Events {
			ev := &c.Events[i]
			b = binary.AppendVarint(b, ev.Seq)
			b = appendTime(b, ev.Time)
			b = appendString(b, ev.Kind)
			b = appendString(b, ev.Subject)
			if len(ev.Data) == 0 {
				b = append(b, 0)
			} else {
				b = append(b, 1)
				b = appendBytes(b, ev.Data)
			}
		}
	}
	if c.TrimEventsBefore > 0 {
		b = append(b, tagTrim)
		b = binary.AppendVarint(b, c.TrimEventsBefore)
	}
	if c.NextAllocationID > 0 || c.NextEventSeq > 0 {
		b = append(b, tagNextIDs)
		b = binary.AppendVarint(b, max(c.NextAllocationID, 0))
		b = binary.AppendVarint(b, max(c.NextEventSeq, 0))
	}
	if n := len(c.Blobs); n > 0 {
		b = section(b, tagBlobs, n)
		for _, bl := range c.Blobs {
			b = appendString(b, bl.ID)
			b = appendBytes(b, bl.Data)
		}
	}
	return b, nil
}

func section(b []byte, tag byte, n int) []byte {
	return binary.AppendUvarint(append(b, tag), uint64(n))
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendTime appends t as appendString appends sqlstore.FormatTime(t),
// without making the string: its length, under 128, is one byte.
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, 0)
	at := len(b)
	b = sqlstore.AppendTime(b, t)
	b[at-1] = byte(len(b) - at)
	return b
}

func appendBytes(b, p []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(p))), p...)
}

// appendJSON appends v's JSON (without the encoder's newline) as bytes.
func (e *encoder) appendJSON(b []byte, v any, guess *int) ([]byte, error) {
	switch v := v.(type) {
	case json.RawMessage:
		if json.Valid(v) {
			return e.appendRowJSON(b, v, guess), nil // as loaded: already the stored form
		}
	case interface{ AppendJSON([]byte) []byte }: // the most frequent rows (allocations, tasks): written without reflection
		e.json.Reset()
		return e.appendRowJSON(b, v.AppendJSON(e.json.AvailableBuffer()), guess), nil
	}
	e.json.Reset()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	return e.appendRowJSON(b, bytes.TrimSuffix(e.json.Bytes(), []byte{'\n'}), guess), nil
}

// appendRowJSON appends a row's JSON j as bytes, and keeps in guess, for
// the next rows of its kind, the largest recent length: rows of a kind
// differ (a machine's grows with its GPUs' holders), and a guess short by a
// byte copies the whole batch.
func (e *encoder) appendRowJSON(b, j []byte, guess *int) []byte {
	*guess = max(len(j), *guess-*guess/16)
	return appendBytes(b, j)
}

var errBadBatch = errors.New("malformed batch")

// decodeBatch reads an encoded batch. Its rows point into p, which must
// not change while the batch is used.
func decodeBatch(seq uint64, p []byte) (*batch, error) {
	d := decoder{p: p}
	if v := d.byte(); v != batchVersion || d.err != nil {
		return nil, fmt.Errorf("batch %d: not a batch of version %d (%d bytes, version %d)", seq, batchVersion, len(p), v)
	}
	b := &batch{seq: seq}
	for d.err == nil && len(d.p) > 0 {
		tag := d.byte()
		var n int
		if tag < tagTrim || tag == tagBlobs {
			n = d.count()
		}
		switch tag {
		case tagMachines:
			b.machines = make([]machineRow, n)
			for i := range b.machines {
				b.machines[i] = machineRow{name: d.bytes(), data: d.bytes()}
			}
		case tagRemovedMachines:
			b.removedMachines = make([][]byte, n)
			for i := range b.removedMachines {
				b.removedMachines[i] = d.bytes()
			}
		case tagAllocs:
			b.allocs = make([]allocRow, n)
			for i := range b.allocs {
				b.allocs[i] = allocRow{id: d.varint(), state: d.bytes(), owner: d.bytes(), data: d.bytes()}
			}
		case tagRemovedAllocs:
			b.removedAllocs = make([]int64, n)
			for i := range b.removedAllocs {
				b.removedAllocs[i] = d.varint()
			}
		case tagRecords:
			b.records = make([]recordRow, n)
			for i := range b.records {
				b.records[i] = recordRow{recordKey: recordKey{kind: d.bytes(), key: d.bytes()}, data: d.bytes()}
			}
		case tagRemovedRecords:
			b.removedRecords = make([]recordKey, n)
			for i := range b.removedRecords {
				b.removedRecords[i] = recordKey{kind: d.bytes(), key: d.bytes()}
			}
		case tagEvents:
			b.events = make([]eventRow, n)
			for i := range b.events {
				ev := eventRow{seq: d.varint(), time: d.bytes(), kind: d.bytes(), subject: d.bytes()}
				if ev.hasData = d.byte() == 1; ev.hasData {
					ev.data = d.bytes()
				}
				b.events[i] = ev
			}
		case tagTrim:
			b.trim = d.varint()
		case tagNextIDs:
			b.nextAllocID, b.nextEventSeq = d.varint(), d.varint()
		case tagBlobs:
			b.blobs = make([]blobRow, n)
			for i := range b.blobs {
				b.blobs[i] = blobRow{id: d.bytes(), data: d.bytes()}
			}
		default:
			d.err = errBadBatch
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("batch %d: %w", seq, d.err)
	}
	return b, nil
}

// decoder reads the encoded form; the first problem sticks in err and
// every later read returns zero.
type decoder struct {
	p   []byte
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.p) == 0 {
		d.err = errBadBatch
		return 0
	}
	c := d.p[0]
	d.p = d.p[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.err = errBadBatch
		return 0
	}
	d.p = d.p[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.p)
	if n <= 0 {
		d.err = errBadBatch
		return 0
	}
	d.p = d.p[n:]
	return v
}

// count reads a section's row count, which cannot exceed the bytes left.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.p)) {
		d.err = errBadBatch
		return 0
	}
	return int(n)
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.p)) {
		d.err = errBadBatch
		return nil
	}
	b := d.p[:n:n]
	d.p = d.p[n:]
	return b
}

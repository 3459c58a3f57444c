package sqlite

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestBatchRoundTrip encodes a change set of every kind and decodes it.
func TestBatchRoundTrip(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	c := &arbiter.Changes{
		Machines:           []arbiter.Machine{{Name: "gpu1", Kind: arbiter.KindGPU}},
		RemovedMachines:    []string{"old"},
		Allocations:        []arbiter.Allocation{{ID: 7, Owner: "alice", State: arbiter.StateReady, CreatedAt: now}},
		RemovedAllocations: []int64{3, -1},
		Records:            []arbiter.Record{{Kind: "k", Key: "a", Value: map[string]int{"x": 1}}, {Kind: "k", Key: "b", Value: json.RawMessage(`{"y":2}`)}},
		RemovedRecords:     []arbiter.RecordRef{{Kind: "k", Key: "c"}},
		Events:             []arbiter.Event{{Seq: 9, Time: now, Kind: "e", Subject: "s", Data: json.RawMessage(`{}`)}, {Seq: 10, Time: now, Kind: "e", Subject: "t"}},
		TrimEventsBefore:   4,
		NextAllocationID:   8,
		NextEventSeq:       11,
		Blobs:              []arbiter.BlobBytes{{ID: "b1", Data: []byte("bytes\x00one")}, {ID: "b2", Data: []byte{}}},
	}
	var e encoder
	p, err := e.encode(c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeBatch(5, p)
	if err != nil {
		t.Fatal(err)
	}
	str := func(bs ...[]byte) []string {
		out := []string{}
		for _, x := range bs {
			out = append(out, string(x))
		}
		return out
	}
	got := []any{b.seq, str(b.machines[0].name), str(b.removedMachines...), b.allocs[0].id, str(b.allocs[0].state, b.allocs[0].owner),
		b.removedAllocs, str(b.records[0].key, b.records[0].data, b.records[1].data), str(b.removedRecords[0].kind, b.removedRecords[0].key),
		b.events[0].seq, str(b.events[0].time, b.events[0].data), b.events[1].hasData, b.trim, b.nextAllocID, b.nextEventSeq,
		str(b.blobs[0].id, b.blobs[0].data, b.blobs[1].id, b.blobs[1].data)}
	want := []any{uint64(5), []string{"gpu1"}, []string{"old"}, int64(7), []string{"ready", "alice"},
		[]int64{3, -1}, []string{"a", `{"x":1}`, `{"y":2}`}, []string{"k", "c"},
		int64(9), []string{"2026-01-02T03:04:05.000000006Z", "{}"}, false, int64(4), int64(8), int64(11),
		[]string{"b1", "bytes\x00one", "b2", ""}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded:\ngot  %v\nwant %v", got, want)
	}
	var a arbiter.Allocation
	if err := json.Unmarshal(b.allocs[0].data, &a); err != nil || a.ID != 7 || a.ExpiresAt != nil {
		t.Errorf("allocation row: %s (%v)", b.allocs[0].data, err)
	}
}

// TestEncodeInOneSlice: once the encoder has seen rows like a batch's, the
// batch is encoded into the one slice made for it, whatever the batch
// before was like (grown from a guess, the copies were a fifth of the
// bytes the server allocated under load).
func TestEncodeInOneSlice(t *testing.T) {
	events := func(n int) []arbiter.Event {
		data := json.RawMessage(`{"id":1,"owner":"` + strings.Repeat("x", 500) + `"}`)
		evs := make([]arbiter.Event, n)
		for i := range evs {
			evs[i] = arbiter.Event{Seq: int64(i + 1), Time: time.Now(), Kind: "allocation.ready", Subject: "allocation/1", Data: data}
		}
		return evs
	}
	gpus := make([]arbiter.GPU, 8)
	for i := range gpus {
		gpus[i] = arbiter.GPU{Index: i, UUID: "GPU-" + strings.Repeat("0", 36), Model: "NVIDIA H100 80GB HBM3", VRAMGiB: 80}
	}
	batches := []*arbiter.Changes{
		{Events: events(1)},
		{Events: events(64)},
		{Machines: []arbiter.Machine{{Name: "gpu1", Kind: arbiter.KindGPU, GPUs: gpus}},
			Allocations: []arbiter.Allocation{{ID: 7, Owner: "alice", State: arbiter.StateReady}}, Events: events(3)},
	}
	var e encoder
	for pass := range 2 { // the first teaches the encoder its rows' sizes
		for i, c := range batches {
			hint := e.sizeHint(c)
			p, err := e.encode(c)
			if err != nil {
				t.Fatal(err)
			}
			if pass == 1 && cap(p) != hint {
				t.Errorf("batch %d: %d bytes in a slice of %d, made for %d: it grew", i, len(p), cap(p), hint)
			}
		}
	}
}

// FuzzDecodeBatch: a batch read back from disk (a damaged log) is decoded
// or refused, never a panic.
func FuzzDecodeBatch(f *testing.F) {
	var e encoder
	p, _ := e.encode(&arbiter.Changes{Machines: []arbiter.Machine{{Name: "m"}}, Events: []arbiter.Event{{Seq: 1, Kind: "k"}}, NextEventSeq: 2})
	f.Add(p)
	f.Add([]byte{batchVersion, tagAllocs, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{batchVersion, tagTrim})
	p, _ = e.encode(&arbiter.Changes{Blobs: []arbiter.BlobBytes{{ID: "x", Data: []byte("y")}}})
	f.Add(p)
	f.Fuzz(func(t *testing.T, data []byte) {
		if b, err := decodeBatch(1, data); err == nil {
			mergeBatches([]*batch{b}) // what the writer does with it
		}
	})
}

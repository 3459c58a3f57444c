package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// BenchSave saves b.N change sets shaped like one group-commit batch, n
// allocation upserts and n events each, to s, an empty store, and reports
// the cost of one record (ns/record) beside the cost of one Save. Store
// packages run it from their BenchmarkSave, so that their numbers compare.
func BenchSave(b *testing.B, s arbiter.Store, n int) {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ka := 60.0
	seq := int64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := &arbiter.Changes{}
		for j := 0; j < n; j++ {
			seq++
			c.Allocations = append(c.Allocations, arbiter.Allocation{
				ID: seq, Owner: "alice", State: arbiter.StateReady, Machine: arbiter.Str("gpu1"),
				Devices:   []arbiter.DeviceRef{{Machine: "gpu1", Index: j % 8, UUID: "GPU-1234", Model: "H100", VRAMGiB: 80}},
				Request:   arbiter.Request{Owner: "alice", GPUs: 1, KeepaliveS: &ka},
				CreatedAt: now, ReadyAt: &now, KeepaliveS: &ka,
			})
			c.Events = append(c.Events, arbiter.Event{Seq: seq, Time: now, Kind: arbiter.EventAllocationReady,
				Subject: "allocation/1", Data: []byte(`{"id":1,"state":"ready","machine":"gpu1"}`)})
		}
		c.NextAllocationID, c.NextEventSeq = seq+1, seq+1
		if err := s.Save(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
}

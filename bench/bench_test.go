package bench

import (
	"testing"
	"time"
)

func TestBenchStats(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	got := benchStatsOf(ds)
	want := benchStats{Count: 100, P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got := benchStatsOf(nil); got != (benchStats{}) {
		t.Errorf("got %+v for no samples, want zeros", got)
	}
}

package clock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/clock"
)

func TestFakeMovesOnlyWhenTold(t *testing.T) {
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := clock.NewFake(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("got %v, want %v", got, start)
	}
	if got := c.Advance(90 * time.Second); !got.Equal(start.Add(90 * time.Second)) {
		t.Fatalf("Advance returned %v, want %v", got, start.Add(90*time.Second))
	}
	if got := c.Now(); !got.Equal(start.Add(90 * time.Second)) {
		t.Fatalf("after Advance: got %v, want %v", got, start.Add(90*time.Second))
	}
	c.Advance(-30 * time.Second)
	if got := c.Now(); !got.Equal(start.Add(time.Minute)) {
		t.Fatalf("after a negative Advance: got %v, want %v", got, start.Add(time.Minute))
	}
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("after Set: got %v, want %v", got, start)
	}
}

// TestFakeConcurrent is for -race: the code under test reads the clock from
// its goroutines while the test moves it.
func TestFakeConcurrent(t *testing.T) {
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := clock.NewFake(start)
	now := c.Now // what control.Options.Now takes
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Second)
			}
		}()
		go func() {
			defer wg.Done()
			for range 100 {
				if now().Before(start) {
					t.Error("the clock went back")
				}
			}
		}()
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(400*time.Second); !got.Equal(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

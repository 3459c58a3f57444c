package bmp

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// fakePlane hands Run events the test sends and records its commands.
type fakePlane struct {
	mu   sync.Mutex
	subs []chan arbiter.Event
	cmds chan arbiter.Command
	seq  int64
}

func newFakePlane() *fakePlane { return &fakePlane{cmds: make(chan arbiter.Command, 64)} }

func (p *fakePlane) Do(ctx context.Context, cmd arbiter.Command) (any, error) {
	p.cmds <- cmd
	return nil, nil
}

func (p *fakePlane) Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error) {
	ch := make(chan arbiter.Event, 16)
	p.mu.Lock()
	p.subs = append(p.subs, ch)
	p.mu.Unlock()
	return ch, nil
}

func (p *fakePlane) LastSeq() int64 { return 0 }

// publish sends an intent to the latest subscriber.
func (p *fakePlane) publish(t *testing.T, in grid.PowerIntent) {
	t.Helper()
	raw, _ := json.Marshal(in)
	p.mu.Lock()
	p.seq++
	ch := p.subs[len(p.subs)-1]
	p.mu.Unlock()
	ch <- arbiter.Event{Seq: p.seq, Kind: arbiter.EventGridPower, Data: raw}
}

func (p *fakePlane) lag() {
	p.mu.Lock()
	close(p.subs[len(p.subs)-1])
	p.mu.Unlock()
}

func (p *fakePlane) next(t *testing.T) arbiter.Command {
	t.Helper()
	select {
	case c := <-p.cmds:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no command")
		return nil
	}
}

func TestRunCarriesOutFramesConcurrently(t *testing.T) {
	p := newFakePlane()
	started := make(chan Request, 4)
	release := make(chan struct{})
	ctrl := Func(func(ctx context.Context, r Request) error {
		started <- r
		<-release
		switch r.Frame.Address {
		case "bad":
			return errors.New("no route to host")
		case "panic":
			panic("boom")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, p, ctrl, nil) }()
	if _, ok := p.next(t).(arbiter.GridPowerResend); !ok {
		t.Fatal("Run did not ask for the operations in progress")
	}
	p.publish(t, grid.PowerIntent{ID: 7, Machine: "m", Epoch: 3, On: true, Frames: []grid.PowerFrame{
		{Index: 0, Address: "a", Attempt: 1}, {Index: 1, Address: "bad", Attempt: 1}, {Index: 2, Address: "panic", Attempt: 1},
	}})
	// All three are in flight at once before any finishes.
	for range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("frames are not carried out concurrently")
		}
	}
	close(release)
	got := map[int]string{}
	for range 3 {
		d := p.next(t).(arbiter.GridPowerDone)
		if d.ID != 7 || d.Epoch != 3 {
			t.Fatalf("report %+v", d)
		}
		got[d.Frame] = d.Err
	}
	if got[0] != "" || got[1] != "no route to host" || got[2] == "" {
		t.Fatalf("reports %v", got)
	}
	// A final power-off is carried out but not reported.
	p.publish(t, grid.PowerIntent{ID: 7, Epoch: 4, Final: true, Frames: []grid.PowerFrame{{Index: 0, Address: "a"}}})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the final power-off was not carried out")
	}
	// A lagging subscription is replaced, and the operations asked for again.
	p.lag()
	if _, ok := p.next(t).(arbiter.GridPowerResend); !ok {
		t.Fatal("no resend after the subscription ended")
	}
	select {
	case c := <-p.cmds:
		t.Fatalf("unexpected command %T", c)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

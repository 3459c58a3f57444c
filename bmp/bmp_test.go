package bmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// TestSupersededPowerOnDoesNotOutlastFinalOff: a job is destroyed while
// its boards are still being switched on (a slow power-on). Its final
// power-off of the same frame stops the power-on and runs after it, so the
// boards of the ended job end switched off, as the last request says (the
// reference, too, handles one controller's requests in order).
func TestSupersededPowerOnDoesNotOutlastFinalOff(t *testing.T) {
	p := newFakePlane()
	var mu sync.Mutex
	board := map[string]bool{} // frame address → boards on
	onStarted := make(chan struct{})
	onDone := make(chan struct{})
	offDone := make(chan struct{})
	release := make(chan struct{})
	ctrl := Func(func(ctx context.Context, r Request) error {
		if r.On {
			close(onStarted)
			defer close(onDone)
			select { // a slow power-on: boards take seconds to come up
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			mu.Lock()
			board[r.Frame.Address] = true
			mu.Unlock()
			return nil
		}
		defer close(offDone)
		mu.Lock()
		board[r.Frame.Address] = false
		mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = Run(ctx, p, ctrl, nil) }()
	if _, ok := p.next(t).(arbiter.GridPowerResend); !ok {
		t.Fatal("Run did not ask for the operations in progress")
	}
	fr := grid.PowerFrame{Index: 0, Address: "10.0.0.0", Attempt: 1, Boards: []int{0}}
	p.publish(t, grid.PowerIntent{ID: 7, Machine: "m", Epoch: 1, On: true, Frames: []grid.PowerFrame{fr}})
	<-onStarted
	// The job is destroyed: the engine's final power-off of the same boards.
	p.publish(t, grid.PowerIntent{ID: 7, Machine: "m", Epoch: 2, On: false, Final: true, Frames: []grid.PowerFrame{fr}})
	select {
	case <-offDone:
	case <-time.After(2 * time.Second):
		// Serialised behind the power-on: fine, let the power-on finish.
	}
	close(release)
	<-onDone
	select {
	case <-offDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the final power-off was never carried out")
	}
	mu.Lock()
	defer mu.Unlock()
	if board["10.0.0.0"] {
		t.Fatal("the boards of an ended job are left switched on: the superseded power-on finished after the final power-off")
	}
}

// Another allocation's request for the same frame (the next job's
// power-on behind the last one's power-off) waits for the one in flight
// and is not cancelled by it, nor cancels it.
func TestOneFrameOneRequestAtATime(t *testing.T) {
	p := newFakePlane()
	offStarted := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string
	ctrl := Func(func(ctx context.Context, r Request) error {
		if !r.On {
			close(offStarted)
			<-release
		}
		mu.Lock()
		order = append(order, fmt.Sprintf("%d on=%v err=%v", r.ID, r.On, ctx.Err()))
		mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = Run(ctx, p, ctrl, nil) }()
	p.next(t) // GridPowerResend
	fr := grid.PowerFrame{Address: "10.0.0.0", Attempt: 1, Boards: []int{0}}
	p.publish(t, grid.PowerIntent{ID: 7, Machine: "m", Epoch: 1, Final: true, Frames: []grid.PowerFrame{fr}})
	<-offStarted
	p.publish(t, grid.PowerIntent{ID: 8, Machine: "m", Epoch: 2, On: true, Frames: []grid.PowerFrame{fr}})
	select {
	case c := <-p.cmds:
		t.Fatalf("job 8's power-on reported while job 7's power-off of the same frame runs: %+v", c)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if done, ok := p.next(t).(arbiter.GridPowerDone); !ok || done.ID != 8 || done.Err != "" {
		t.Fatalf("reported %+v", done)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"7 on=false err=<nil>", "8 on=true err=<nil>"}; !slices.Equal(order, want) {
		t.Fatalf("the controller saw %q, want %q", order, want)
	}
}

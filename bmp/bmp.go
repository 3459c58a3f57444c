// Package bmp carries out the power intents of grid machines (docs/reference/spalloc.md
// §6) through a Controller: the part of a grid machine's power handling that
// talks to the outside world. The engine decides — which boards, when, what
// a failure means — and emits each power operation as an intent
// (arbiter.EventGridPower carrying a grid.PowerIntent, one request per
// frame); Run carries out each frame's request through the Controller,
// concurrently with other frames' and in order for one frame, and reports
// every result back as a command
// (arbiter.GridPowerDone). Retries, timeouts and giving up are the engine's:
// Run holds no state beyond the requests in flight.
//
// Without an external controller the engine completes power operations
// itself after each machine's power delay (engine.Config.GridExternalPower
// false), and nothing of this package runs.
package bmp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// Request is one frame's part of a power intent: switch Frame.Boards of
// Machine on or off (and, switching on, disable Frame.LinksOff).
type Request struct {
	Machine string
	// ID and Epoch identify the allocation and the intent.
	ID    int64
	Epoch int64
	On    bool
	// Final is set for the power-off of an allocation that ended; its
	// result is not reported.
	Final bool
	Frame grid.PowerFrame
}

// Controller switches the boards of one frame through its
// board-management controller (Frame.Address). Power returns nil once the
// boards are in the requested state, or an error saying what failed; it
// must give up when ctx ends. It is called concurrently for different
// frames, and for one frame one request at a time, in the order the
// intents were issued, so the boards end as the last intent says.
type Controller interface {
	Power(ctx context.Context, r Request) error
}

// Func adapts a function to a Controller.
type Func func(ctx context.Context, r Request) error

// Power calls f.
func (f Func) Power(ctx context.Context, r Request) error { return f(ctx, r) }

// Plane is what Run needs of the control plane (control.Loop).
type Plane interface {
	Do(ctx context.Context, cmd arbiter.Command) (any, error)
	Subscribe(ctx context.Context, since int64) (<-chan arbiter.Event, error)
	LastSeq() int64
}

// MaxInFlight bounds the frame requests carried out at once; more wait.
const MaxInFlight = 256

// Run carries out power intents until ctx ends. It first asks the engine
// for the operations already in progress (arbiter.GridPowerResend), and
// again whenever it may have missed intents (its event subscription
// lagged). It returns ctx's error.
func Run(ctx context.Context, p Plane, c Controller, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, MaxInFlight)
	lanes := make(map[frameKey]*lane)
	since := p.LastSeq()
	for ctx.Err() == nil {
		ch, err := p.Subscribe(ctx, since)
		if err != nil {
			return err
		}
		if _, err := p.Do(ctx, arbiter.GridPowerResend{}); err != nil && ctx.Err() == nil {
			log.Error("bmp: ask for the power operations in progress", "err", err)
		}
		for {
			var ev arbiter.Event
			var ok bool
			select {
			case ev, ok = <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
			if !ok {
				break // lagged or closed: subscribe again
			}
			since = ev.Seq
			if ev.Kind != arbiter.EventGridPower {
				continue
			}
			var in grid.PowerIntent
			if err := json.Unmarshal(ev.Data, &in); err != nil {
				log.Error("bmp: unreadable power intent", "seq", ev.Seq, "err", err)
				continue
			}
			for _, f := range in.Frames {
				r := Request{Machine: in.Machine, ID: in.ID, Epoch: in.Epoch, On: in.On, Final: in.Final, Frame: f}
				k := frameKey{r.Machine, f.Address, f.Cabinet, f.Frame}
				prev := lanes[k]
				if prev != nil && prev.id == r.ID {
					prev.cancel() // superseded: the engine no longer waits for it
				}
				rctx, cancel := context.WithCancel(ctx)
				l := &lane{id: r.ID, cancel: cancel, done: make(chan struct{})}
				lanes[k] = l
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer close(l.done)
					defer cancel()
					if prev != nil {
						<-prev.done // one request at a time per frame, in order
					}
					if rctx.Err() != nil {
						return
					}
					// A slot once it is this frame's turn: requests waiting
					// behind a frame whose controller hangs take none.
					select {
					case slots <- struct{}{}:
					case <-rctx.Done():
						return
					}
					defer func() { <-slots }()
					carryOut(rctx, p, c, r, log)
				}()
				sweepLanes(lanes)
			}
		}
	}
	return ctx.Err()
}

// frameKey names the frame a board-management controller drives.
type frameKey struct {
	machine, address string
	cabinet, frame   int
}

// lane is the last request sent for a frame: the next for the frame waits
// for it, and cancels it when it is the same allocation's newer intent.
type lane struct {
	id     int64
	cancel context.CancelFunc
	done   chan struct{}
}

// sweepLanes forgets the frames whose last request has finished, once
// there are many: a long-running server sees every frame of its machines.
func sweepLanes(lanes map[frameKey]*lane) {
	if len(lanes) < MaxInFlight {
		return
	}
	for k, l := range lanes {
		select {
		case <-l.done:
			delete(lanes, k)
		default:
		}
	}
}

// carryOut runs one frame request and reports it.
func carryOut(ctx context.Context, p Plane, c Controller, r Request, log *slog.Logger) {
	err := power(ctx, c, r)
	if ctx.Err() != nil {
		// Shutting down (the engine resumes the operation after a restart),
		// or superseded by the same allocation's newer intent.
		return
	}
	if err != nil {
		log.Warn("bmp: power request failed", "machine", r.Machine, "controller", r.Frame.Address,
			"cabinet", r.Frame.Cabinet, "frame", r.Frame.Frame, "allocation", r.ID, "attempt", r.Frame.Attempt, "err", err)
	}
	if r.Final {
		return
	}
	done := arbiter.GridPowerDone{ID: r.ID, Epoch: r.Epoch, Frame: r.Frame.Index, Attempt: r.Frame.Attempt}
	if err != nil {
		done.Err = err.Error()
	}
	if _, err := p.Do(ctx, done); err != nil && ctx.Err() == nil {
		log.Error("bmp: report a power result", "allocation", r.ID, "err", err)
	}
}

// power calls the controller, turning a panic into an error.
func power(ctx context.Context, c Controller, r Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("power controller panicked: %v", v)
		}
	}()
	return c.Power(ctx, r)
}

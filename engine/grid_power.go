package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// Power operations of grid allocations (docs/reference/spalloc.md §6).
//
// Switching a job's boards is one operation made of one request per frame
// (the boards a board-management controller drives). Without an external
// controller (Config.GridExternalPower false) the engine is the controller:
// the whole operation completes power_delay_s after it started, as a
// deadline. With one, the engine emits the operation as an intent
// (arbiter.EventGridPower); the controller carries out the frames'
// requests concurrently and reports each (arbiter.GridPowerDone). A frame
// that fails, or is not reported within gridPowerTimeout, is retried once;
// a second failure ends the allocation with a reason naming the controller.

// gridPowerTimeout is how long, beyond the machine's power delay, an
// external controller may take to report a frame before it counts as
// failed.
const gridPowerTimeout = time.Minute

// gridOp is a power operation in progress.
type gridOp struct {
	epoch  int64
	on     bool
	frames []grid.PowerFrame
	done   []bool
	left   int
	// deadline: the completion (built-in controller) or the timeout
	// (external controller).
	deadline deadline
}

// powerFrames groups j's boards by frame, frames in (cabinet, frame)
// order, with the periphery links to disable when switching on.
func (g *grids) powerFrames(j *gridJob, on bool) []grid.PowerFrame {
	m := &j.mach.m
	var frames []grid.PowerFrame
	index := map[[2]int]int{}
	frameOf := func(b arbiter.Board) (int, arbiter.BoardLocation, bool) {
		info, ok := m.Info(b)
		if !ok {
			return 0, arbiter.BoardLocation{}, false
		}
		k := [2]int{info.Location.Cabinet, info.Location.Frame}
		i, ok := index[k]
		if !ok {
			addr, _ := m.FrameAddress(k[0], k[1])
			i = len(frames)
			index[k] = i
			frames = append(frames, grid.PowerFrame{Cabinet: k[0], Frame: k[1], Address: addr, Attempt: 1})
		}
		return i, info.Location, true
	}
	for _, b := range j.place.Boards {
		if i, loc, ok := frameOf(b); ok {
			frames[i].Boards = append(frames[i].Boards, loc.Board)
			frames[i].Logical = append(frames[i].Logical, b)
		}
	}
	if on {
		for _, l := range j.place.Periphery {
			if i, loc, ok := frameOf(l.Board); ok {
				frames[i].LinksOff = append(frames[i].LinksOff, grid.FrameLink{Board: loc.Board, Link: l.Link})
			}
		}
	}
	slices.SortStableFunc(frames, func(a, b grid.PowerFrame) int {
		if a.Cabinet != b.Cabinet {
			return a.Cabinet - b.Cabinet
		}
		return a.Frame - b.Frame
	})
	for i := range frames {
		frames[i].Index = i
	}
	return frames
}

// startPower starts switching j's boards on or off, superseding any
// operation in progress. With an external controller the intent is emitted
// unless emit is false (see resend).
func (g *grids) startPower(e *Engine, j *gridJob, on, emit bool, now time.Time) {
	g.stopPower(e, j)
	g.epoch++
	op := &gridOp{epoch: g.epoch, on: on, frames: g.powerFrames(j, on)}
	op.done = make([]bool, len(op.frames))
	op.left = len(op.frames)
	j.op = op
	delay := j.mach.m.PowerDelay
	if !e.cfg.GridExternalPower || op.left == 0 {
		// The built-in controller: done after the delay; with none, at
		// once (the state was power for no time at all).
		op.deadline = newDeadline(func(e *Engine, now time.Time) { g.powerComplete(e, j, op, now) })
		if delay <= 0 {
			g.powerComplete(e, j, op, now)
			return
		}
		e.dl.set(&op.deadline, now.Add(delay))
		return
	}
	if emit {
		g.emitIntent(e, j, op, op.frames, false, now)
	}
	op.deadline = newDeadline(func(e *Engine, now time.Time) { g.powerTimeout(e, j, op, now) })
	e.dl.set(&op.deadline, now.Add(delay+gridPowerTimeout))
}

func (g *grids) emitIntent(e *Engine, j *gridJob, op *gridOp, frames []grid.PowerFrame, final bool, now time.Time) {
	in := grid.PowerIntent{ID: j.id, Machine: j.mach.m.Name, Epoch: op.epoch, On: op.on, Final: final, Frames: frames}
	e.emit(now, arbiter.EventGridPower, fmt.Sprintf("allocation/%d", j.id), in)
}

// resend starts every power operation in progress again, emitting its
// intent (arbiter.GridPowerResend).
func (g *grids) resend(e *Engine, now time.Time) {
	if !e.cfg.GridExternalPower {
		return
	}
	for _, id := range sortedJobIDs(g.jobs) {
		switch j := g.jobs[id]; {
		case j.a != nil && j.op != nil:
			g.startPower(e, j, j.op.on, true, now)
		case j.a == nil && j.mach != nil:
			// Ended, its boards waiting to be freed: their power-off may
			// have been cut short by a restart. Switching off twice is
			// harmless.
			g.finalPowerOff(e, j, now)
		}
	}
}

// stopPower abandons j's power operation: later reports are ignored.
func (g *grids) stopPower(e *Engine, j *gridJob) {
	if j.op != nil {
		e.dl.clear(&j.op.deadline)
		j.op = nil
	}
}

// finalPowerOff switches an ended job's boards off. Nothing waits for it:
// the boards are freed after the settling time whatever happens.
func (g *grids) finalPowerOff(e *Engine, j *gridJob, now time.Time) {
	if !e.cfg.GridExternalPower {
		return
	}
	g.epoch++
	op := &gridOp{epoch: g.epoch, on: false}
	g.emitIntent(e, j, op, g.powerFrames(j, false), true, now)
}

// powerComplete ends j's power operation op: the allocation is ready.
func (g *grids) powerComplete(e *Engine, j *gridJob, op *gridOp, now time.Time) {
	if j.op != op || j.a == nil {
		return
	}
	e.dl.clear(&op.deadline)
	j.op = nil
	a := j.a
	a.a.State = arbiter.StateReady
	t := now
	a.a.ReadyAt = &t
	e.dirty(a)
	e.emitAlloc(now, arbiter.EventAllocationReady, subject(a), &a.a)
}

// powerDone takes an external controller's report of one frame.
func (g *grids) powerDone(e *Engine, c arbiter.GridPowerDone, now time.Time) {
	j := g.jobs[c.ID]
	if j == nil || j.a == nil || j.op == nil || j.op.epoch != c.Epoch || c.Frame < 0 || c.Frame >= len(j.op.frames) {
		return
	}
	op := j.op
	if op.done[c.Frame] {
		return
	}
	if c.Err != "" && c.Attempt != 0 && c.Attempt < op.frames[c.Frame].Attempt {
		return // the first attempt's late failure: the retry is under way
	}
	if c.Err == "" {
		op.done[c.Frame] = true
		op.left--
		if op.left == 0 {
			g.powerComplete(e, j, op, now)
		}
		return
	}
	g.powerFailed(e, j, op, []int{c.Frame}, c.Err, now)
}

// powerTimeout: the frames not reported in time have failed.
func (g *grids) powerTimeout(e *Engine, j *gridJob, op *gridOp, now time.Time) {
	if j.op != op || j.a == nil {
		return
	}
	var late []int
	for i, d := range op.done {
		if !d {
			late = append(late, i)
		}
	}
	g.powerFailed(e, j, op, late, fmt.Sprintf("no answer within %v", j.mach.m.PowerDelay+gridPowerTimeout), now)
}

// powerFailed retries the frames that failed for the first time and ends
// the allocation if one failed for the second.
func (g *grids) powerFailed(e *Engine, j *gridJob, op *gridOp, failed []int, why string, now time.Time) {
	var retry []grid.PowerFrame
	for _, i := range failed {
		f := &op.frames[i]
		if f.Attempt >= 2 {
			reason := fmt.Sprintf("Machine configuration failed. Error: board-management controller %s (cabinet %d, frame %d) failed twice: %s",
				f.Address, f.Cabinet, f.Frame, why)
			e.destroy(j.a, reason, now)
			return
		}
		f.Attempt = 2
		retry = append(retry, *f)
	}
	if len(retry) == 0 {
		return
	}
	g.emitIntent(e, j, op, retry, false, now)
	e.dl.set(&op.deadline, now.Add(j.mach.m.PowerDelay+gridPowerTimeout))
}

package spalloc

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// Notify turns the plane's committed events into srv's change
// notifications, until ctx ends, one call per processing step (a committed
// batch, or several when they come quickly): the grid allocations that
// changed and the grid machines that changed or had boards taken or given
// back. It follows the events only while some client watches something:
// otherwise a commit does not even wake it.
func Notify(ctx context.Context, loop Plane, srv *Server) {
	since := loop.LastSeq()
	for ctx.Err() == nil {
		// After a lag the subscription restarts from the last event seen;
		// batches skipped while nobody watched come from the store then,
		// and at worst notify a change twice.
		ch, err := loop.SubscribeWhile(ctx, since, srv.Watching)
		if err != nil {
			return
		}
		for ev := range ch {
			// The step is the rest of ev's batch, which is in the channel
			// once LastSeq returns (control.Loop.Subscribe; after a lag
			// a batch may come in two steps), and whatever else came
			// meanwhile.
			loop.LastSeq()
			step := []arbiter.Event{ev}
			for more := true; more; {
				select {
				case e, ok := <-ch:
					if ok {
						step = append(step, e)
					}
					more = ok
				default:
					more = false
				}
			}
			since = step[len(step)-1].Seq
			if srv.Watching() {
				jobs, machines := changes(step)
				srv.Notify(jobs, machines)
			}
		}
	}
}

// changes picks out of a step's events the grid allocations and
// grid machines that changed, sorted.
func changes(evs []arbiter.Event) ([]int64, []string) {
	var jobs []int64
	var machines []string
	for _, ev := range evs {
		switch ev.Kind {
		case arbiter.EventAllocationQueued, arbiter.EventAllocationPower, arbiter.EventAllocationReady, arbiter.EventAllocationDestroyed:
			var a struct {
				ID      int64      `json:"id"`
				Machine *string    `json:"machine"`
				Boards  []struct{} `json:"boards"`
				ReadyAt *string    `json:"ready_at"`
				Request struct {
					Grid json.RawMessage `json:"grid"`
				} `json:"request"`
			}
			if json.Unmarshal(ev.Data, &a) != nil || len(a.Request.Grid) == 0 || string(a.Request.Grid) == "null" {
				continue
			}
			jobs = append(jobs, a.ID)
			// A machine changes when a job is allocated on it (its first
			// power operation: never ready yet) or freed from it.
			placed := ev.Kind == arbiter.EventAllocationPower && a.ReadyAt == nil
			freed := ev.Kind == arbiter.EventAllocationDestroyed && len(a.Boards) > 0
			if (placed || freed) && a.Machine != nil {
				machines = append(machines, *a.Machine)
			}
		case arbiter.EventMachineRegistered, arbiter.EventMachineUpdated, arbiter.EventMachineRemoved:
			var m struct {
				Name  string `json:"name"`
				Width *int   `json:"width"`
			}
			if json.Unmarshal(ev.Data, &m) == nil && m.Width != nil { // grid machines only
				machines = append(machines, m.Name)
			}
		}
	}
	slices.Sort(jobs)
	slices.Sort(machines)
	return slices.Compact(jobs), slices.Compact(machines)
}

// Plane is what the spalloc server needs of the running control plane:
// commands answered once durable, and reads of the committed view.
// *control.Loop implements it.
type Plane interface {
	arbiter.Doer
	// Post sends a command without waiting for it or for a commit: for a
	// keepalive refresh, which changes nothing durable.
	Post(cmd arbiter.Command)
	Now() time.Time
	Allocation(id int64) (arbiter.Allocation, bool)
	Allocations(f arbiter.AllocationFilter) []arbiter.Allocation
	Record(kind, key string) (any, bool)
	// SubscribeWhile is control.Loop's: events from since, skipping the
	// batches committed while wanted reports false.
	SubscribeWhile(ctx context.Context, since int64, wanted func() bool) (<-chan arbiter.Event, error)
	LastSeq() int64
}

// NewBackend returns the protocol's Backend over p: a spalloc job is a
// grid allocation. Commands that change or touch a job go through p
// (answered once durable); reads come from its committed view. Its Close
// (the Server's, once every client is disconnected) makes the commands
// still waiting on p give up: a store that stays down must not keep the
// server from stopping, and their clients are gone anyway.
func NewBackend(p Plane) Backend {
	ctx, cancel := context.WithCancel(context.Background())
	return &planeBackend{loop: p, ctx: ctx, cancel: cancel}
}

type planeBackend struct {
	loop   Plane
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
}

// Close makes the commands waiting on the plane give up. Safe to call
// twice.
func (b *planeBackend) Close() error {
	b.cancel()
	return nil
}

var spallocCaller = arbiter.Caller{Name: "", Role: arbiter.RoleUser}

func (b *planeBackend) CreateJob(c *CreateJob) (int64, error) {
	gr := c.Request
	r := arbiter.Request{Owner: c.Owner, Tags: c.Tags, Machine: c.Machine, KeepaliveS: c.Keepalive, Grid: &gr}
	a, err := arbiter.Do(b.ctx, b.loop, arbiter.Allocate{Caller: spallocCaller, Request: r})
	return a.ID, err
}

func (b *planeBackend) Job(id int64, touch bool, peer string) (Job, error) {
	var a arbiter.Allocation
	var ok bool
	if touch {
		// The common case, a live job touched in time again from the same
		// address, changes nothing durable: answer from the committed view
		// and refresh the keepalive without waiting for a commit. A job
		// past its keepalive goes the slow way, which expires it first.
		if a, ok := b.loop.Allocation(id); ok && a.Live() && a.Request.Grid != nil && a.Request.Grid.KeepaliveHost == peer &&
			(a.ExpiresAt == nil || b.loop.Now().Before(*a.ExpiresAt)) {
			b.loop.Post(arbiter.GridTouch{ID: id, Peer: peer})
			return b.job(&a), nil
		}
		var err error
		if a, err = arbiter.Do(b.ctx, b.loop, arbiter.GridTouch{ID: id, Peer: peer}); err != nil {
			return Job{}, err
		}
		ok = a.ID != 0 // nil for an unknown id
	} else {
		a, ok = b.loop.Allocation(id)
		ok = ok && a.Request.Grid != nil
	}
	if !ok {
		return Job{ID: id, State: StateUnknown}, nil
	}
	return b.job(&a), nil
}

// job is what the protocol reports of a grid allocation.
func (b *planeBackend) job(a *arbiter.Allocation) Job {
	j := Job{ID: a.ID, Owner: a.Owner, Start: a.CreatedAt, Keepalive: a.KeepaliveS}
	if gr := a.Request.Grid; gr != nil {
		j.KeepaliveHost, j.Args, j.Kwargs = gr.KeepaliveHost, gr.EchoArgs(), gr.Kwargs
	}
	if j.Args == nil {
		j.Args = []int{}
	}
	if a.Power != nil {
		j.Power = *a.Power
	}
	switch a.State {
	case arbiter.StateQueued:
		j.State = StateQueued
	case arbiter.StatePower:
		j.State = StatePower
	case arbiter.StateReady:
		j.State = StateReady
	default:
		j.State = StateDestroyed
		j.Reason = a.Reason
		return j
	}
	if a.Machine != nil && len(a.Boards) > 0 {
		j.Machine = *a.Machine
		j.Placement = b.placement(a)
	}
	return j
}

// placement is where a live job's boards are: its record, or, should the
// record not be there, the boards alone.
func (b *planeBackend) placement(a *arbiter.Allocation) *grid.Placement {
	if v, ok := b.loop.Record(arbiter.RecordGridJob, strconv.FormatInt(a.ID, 10)); ok {
		if jr, ok := v.(grid.JobRecord); ok && jr.ID == a.ID {
			p := jr.Placement
			return &p
		}
	}
	// A one-board job keeps no record: its placement follows from its board.
	if len(a.Boards) == 1 {
		p := grid.SinglePlacement(a.Boards[0])
		return &p
	}
	return &grid.Placement{Boards: a.Boards, WidthChips: grid.BoardChips, HeightChips: grid.BoardChips}
}

func (b *planeBackend) PowerJob(id int64, on bool, peer string) error {
	_, err := b.loop.Do(b.ctx, arbiter.GridPower{ID: id, On: on, Peer: peer})
	return err
}

func (b *planeBackend) DestroyJob(id int64, reason *string) error {
	_, err := b.loop.Do(b.ctx, arbiter.GridDestroy{ID: id, Reason: reason})
	return err
}

func (b *planeBackend) ListJobs() ([]Job, error) {
	as := b.loop.Allocations(arbiter.AllocationFilter{State: "live"})
	out := make([]Job, 0, len(as))
	for i := range as {
		if as[i].Request.Grid != nil {
			out = append(out, b.job(&as[i]))
		}
	}
	return out, nil
}

func (b *planeBackend) Machines() ([]*arbiter.GridMachine, error) {
	if v, ok := b.loop.Record(arbiter.RecordGridMachines, ""); ok {
		if ms, ok := v.([]*arbiter.GridMachine); ok {
			return ms, nil
		}
	}
	return nil, nil
}

func (b *planeBackend) BoardJob(machine string, bd arbiter.Board) (int64, error) {
	for _, a := range b.loop.Allocations(arbiter.AllocationFilter{State: "live", Machine: machine}) {
		if a.Request.Grid != nil && slices.Contains(a.Boards, bd) {
			return a.ID, nil
		}
	}
	return 0, nil
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/bmp"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/grid"
	"github.com/arbiter-hq/arbiter/spalloc"
)

// gridServer is what the server runs for grid machines beside the control
// loop: the spalloc protocol server and its notifier, and the external
// power controller when there is one.
type gridServer struct {
	// power, when set before Open (tests), is the external power
	// controller: the engine then emits power intents and bmp.Run carries
	// them out. Nil: the engine's built-in controller completes each power
	// operation after the machine's power_delay_s.
	power bmp.Controller

	spalloc  *spalloc.Server
	listener net.Listener
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// syncGridCmd is the command that declares cfg's grid machines.
func syncGridCmd(cfg *config.Config) arbiter.SyncGridMachines {
	ms := cfg.GridMachines
	if ms == nil {
		ms = []grid.Machine{}
	}
	return arbiter.SyncGridMachines{Machines: ms, MaxRetiredJobs: cfg.Spalloc.MaxRetiredJobs,
		SecondsBeforeFree: durationS(cfg.Spalloc.SecondsBeforeFree)}
}

// openGrid declares the configured grid machines (always, even none:
// machines no longer configured are removed), starts the external power
// controller if there is one and the spalloc server if spalloc_listen is
// set.
func (m *serverMain) openGrid(ctx context.Context) error {
	if _, err := m.loop.Do(ctx, syncGridCmd(m.cfg)); err != nil {
		return fmt.Errorf("declare grid machines: %w", err)
	}
	g := &m.grid
	rctx, cancel := context.WithCancel(context.Background())
	g.stop = cancel
	if g.power != nil {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			_ = bmp.Run(rctx, m.loop, g.power, m.log)
		}()
	}
	addr := m.cfg.Server.SpallocListen
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("spalloc listen: %w", err)
	}
	g.listener = ln
	g.spalloc = spalloc.NewServer(spalloc.ServerOptions{
		Backend: &gridBackend{loop: m.loop},
		Allow:   m.cfg.Spalloc.AllowPrefixes,
		Logger:  m.log,
	})
	g.wg.Add(2)
	go func() {
		defer g.wg.Done()
		if err := g.spalloc.Serve(ln); err != nil && !errors.Is(err, spalloc.ErrServerClosed) {
			m.log.Error("spalloc server stopped", "err", err)
		}
	}()
	go func() {
		defer g.wg.Done()
		notifySpalloc(rctx, m.loop, g.spalloc)
	}()
	m.log.Info("spalloc protocol listening", "addr", ln.Addr().String(), "allow", m.cfg.Spalloc.Allow)
	return nil
}

// SpallocAddr is where the spalloc server listens ("" when off).
func (m *serverMain) SpallocAddr() string {
	if m.grid.listener == nil {
		return ""
	}
	return m.grid.listener.Addr().String()
}

// closeGrid stops the spalloc server, the notifier and the power
// controller. It is safe to call twice.
func (m *serverMain) closeGrid() {
	g := &m.grid
	if g.spalloc != nil {
		g.spalloc.Close()
	}
	if g.stop != nil {
		g.stop()
	}
	g.wg.Wait()
}

// reloadGrid applies a reloaded configuration's grid machines and
// [spalloc] settings.
func (m *serverMain) reloadGrid(ctx context.Context, cfg *config.Config) error {
	if _, err := m.loop.Do(ctx, syncGridCmd(cfg)); err != nil {
		return fmt.Errorf("apply grid machines: %w", err)
	}
	if cfg.Server.SpallocListen != m.cfg.Server.SpallocListen || !slices.Equal(cfg.Spalloc.Allow, m.cfg.Spalloc.Allow) {
		m.log.Warn("spalloc_listen and [spalloc] allow take effect at the next restart")
	}
	return nil
}

// notifySpalloc turns the loop's committed events into the spalloc
// server's change notifications, one call per processing step (a committed
// batch, or several when they come quickly): the grid allocations that
// changed and the grid machines that changed or had boards taken or given
// back. Events are only decoded while some client watches something.
func notifySpalloc(ctx context.Context, loop *control.Loop, srv *spalloc.Server) {
	since := loop.LastSeq()
	for ctx.Err() == nil {
		ch, err := loop.Subscribe(ctx, since)
		if err != nil {
			return
		}
		for ev := range ch {
			// The step is every event published up to now: publishing
			// sets the last sequence number before it hands the batch out.
			step := []arbiter.Event{ev}
			target := loop.LastSeq()
			open := true
			for open && ev.Seq < target {
				if ev, open = <-ch; open {
					step = append(step, ev)
				}
			}
			since = step[len(step)-1].Seq
			if srv.Watching() {
				jobs, machines := spallocChanges(step)
				srv.Notify(jobs, machines)
			}
			if !open {
				break
			}
		}
	}
}

// spallocChanges picks out of a step's events the grid allocations and
// grid machines that changed, sorted.
func spallocChanges(evs []arbiter.Event) ([]int64, []string) {
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

// gridBackend is the spalloc protocol's Backend over the control loop: a
// spalloc job is a grid allocation. Commands that change or touch a job go
// through the loop (answered once durable); reads come from its view.
type gridBackend struct {
	loop *control.Loop
}

var spallocCaller = arbiter.Caller{Name: "", Role: arbiter.RoleUser}

func (b *gridBackend) CreateJob(c *spalloc.CreateJob) (int64, error) {
	r := arbiter.Request{
		Owner:      c.Owner,
		Tags:       c.Tags,
		Machine:    c.Machine,
		KeepaliveS: c.Keepalive,
		Grid: &arbiter.GridRequest{
			Args:          c.Args,
			MinRatio:      c.Request.MinRatio,
			MaxDeadBoards: c.Request.MaxDeadBoards,
			MaxDeadLinks:  c.Request.MaxDeadLinks,
			RequireTorus:  c.Request.RequireTorus,
			Kwargs:        c.Kwargs,
			KeepaliveHost: c.Peer,
		},
	}
	res, err := b.loop.Do(context.Background(), arbiter.Allocate{Caller: spallocCaller, Request: r})
	if err != nil {
		return 0, err
	}
	return res.(arbiter.Allocation).ID, nil
}

func (b *gridBackend) Job(id int64, touch bool, peer string) (spalloc.Job, error) {
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
		res, err := b.loop.Do(context.Background(), arbiter.GridTouch{ID: id, Peer: peer})
		if err != nil {
			return spalloc.Job{}, err
		}
		a, ok = res.(arbiter.Allocation)
	} else {
		a, ok = b.loop.Allocation(id)
		ok = ok && a.Request.Grid != nil
	}
	if !ok {
		return spalloc.Job{ID: id, State: spalloc.StateUnknown}, nil
	}
	return b.job(&a), nil
}

// job is what the protocol reports of a grid allocation.
func (b *gridBackend) job(a *arbiter.Allocation) spalloc.Job {
	j := spalloc.Job{ID: a.ID, Owner: a.Owner, Start: a.CreatedAt, Keepalive: a.KeepaliveS}
	if gr := a.Request.Grid; gr != nil {
		j.KeepaliveHost, j.Args, j.Kwargs = gr.KeepaliveHost, gr.Args, gr.Kwargs
	}
	if j.Args == nil {
		j.Args = []int{}
	}
	if a.Power != nil {
		j.Power = *a.Power
	}
	switch a.State {
	case arbiter.StateQueued:
		j.State = spalloc.StateQueued
	case arbiter.StatePower:
		j.State = spalloc.StatePower
	case arbiter.StateReady:
		j.State = spalloc.StateReady
	default:
		j.State = spalloc.StateDestroyed
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
func (b *gridBackend) placement(a *arbiter.Allocation) *grid.Placement {
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

func (b *gridBackend) PowerJob(id int64, on bool, peer string) error {
	_, err := b.loop.Do(context.Background(), arbiter.GridPower{ID: id, On: on, Peer: peer})
	return err
}

func (b *gridBackend) DestroyJob(id int64, reason *string) error {
	_, err := b.loop.Do(context.Background(), arbiter.GridDestroy{ID: id, Reason: reason})
	return err
}

func (b *gridBackend) ListJobs() ([]spalloc.Job, error) {
	as := b.loop.Allocations(arbiter.AllocationFilter{State: "live"})
	out := make([]spalloc.Job, 0, len(as))
	for i := range as {
		if as[i].Request.Grid != nil {
			out = append(out, b.job(&as[i]))
		}
	}
	return out, nil
}

func (b *gridBackend) Machines() ([]*grid.Machine, error) {
	if v, ok := b.loop.Record(arbiter.RecordGridMachines, ""); ok {
		if ms, ok := v.([]*grid.Machine); ok {
			return ms, nil
		}
	}
	return nil, nil
}

func (b *gridBackend) BoardJob(machine string, bd arbiter.Board) (int64, error) {
	for _, a := range b.loop.Allocations(arbiter.AllocationFilter{State: "live", Machine: machine}) {
		if a.Request.Grid != nil && slices.Contains(a.Boards, bd) {
			return a.ID, nil
		}
	}
	return 0, nil
}

// Package agent is the host agent run by `arbiter agent` on every GPU host:
// it detects what the host offers (package gpu), registers it with the
// server as a machine, and keeps it alive with heartbeats.
//
// The agent is built to run unattended for months. A server that is down is
// retried with capped exponential backoff; a server that forgot the machine
// (heartbeat answers not_found, e.g. after a restart on a new database) gets
// it registered again; GPUs are re-detected periodically and the machine is
// re-registered when they change (a GPU fell off the bus). Stopping is
// always safe: Run returns when its context ends.
//
// Beside the heartbeat loop (see Run) the swap runner (swap.go) carries out
// the model swaps of services on this machine: it runs each swap's command
// as an argv, streams its output and checks the service's endpoint; and,
// when Config.Tasks is set, the task worker (worker.go) claims and runs the
// work queue's tasks this host may run (docs/reference/fleet.md §5); and, when
// Config.Observe is set, GPU observation (observe.go, enforce.go) samples
// the GPUs, reports what really runs on them and carries out the engine's
// orders (docs/reference/gpu-truth.md).
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
)

// Server is what the agent needs of the arbiter server. *client.Client
// implements it. Errors the server reports are *arbiter.Error with a code;
// any other error is a transport failure and is retried.
type Server interface {
	// RegisterMachine adds or updates the machine; calling it again with the
	// same description is harmless.
	RegisterMachine(ctx context.Context, m arbiter.Machine) (arbiter.MachineStatus, error)
	// Heartbeat marks the machine alive. It fails with code not_found when
	// the server does not know the machine.
	Heartbeat(ctx context.Context, name string) (arbiter.MachineStatus, error)
}

// Config is what Run needs. Server is required; every other field has a
// default.
type Config struct {
	Server Server
	// Name is the machine name; "" means the host name.
	Name string
	Tags []string

	// HeartbeatInterval is the time between heartbeats; default 15s.
	HeartbeatInterval time.Duration
	// RedetectInterval is the time between GPU re-detections; default 5m.
	RedetectInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before retrying a failed call;
	// the wait doubles from MinBackoff up to MaxBackoff. Defaults 1s and 30s.
	MinBackoff, MaxBackoff time.Duration
	// CallTimeout bounds one call to the server; default 30s.
	CallTimeout time.Duration

	// GPU tunes detection (nvidia-smi path, NVML off, timeout).
	GPU gpu.Options
	// Detect replaces gpu.Detect(ctx, GPU), for tests.
	Detect func(ctx context.Context) (gpu.Host, error)

	// Logger receives what the agent does; nil discards it.
	Logger *slog.Logger

	// Tasks, when set, runs the task worker beside the heartbeat loop
	// (worker.go); Server must then implement TaskServer.
	Tasks *WorkerConfig

	// Observe, when set, observes the GPUs once the machine is registered
	// (observe.go); Server must then implement GPUServer.
	Observe *ObserveConfig
}

// Defaults for the zero fields of Config.
const (
	DefaultHeartbeatInterval = 15 * time.Second
	DefaultRedetectInterval  = 5 * time.Minute
	DefaultMinBackoff        = time.Second
	DefaultMaxBackoff        = 30 * time.Second
	DefaultCallTimeout       = 30 * time.Second
)

func (c *Config) setDefaults() {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.RedetectInterval <= 0 {
		c.RedetectInterval = DefaultRedetectInterval
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = c.MinBackoff
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Detect == nil {
		opts := c.GPU
		c.Detect = func(ctx context.Context) (gpu.Host, error) { return gpu.Detect(ctx, opts) }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Run detects the host, registers it, and heartbeats until ctx ends, then
// returns nil. It returns an error only for what retrying cannot fix: the
// first detection failing, a machine description the server (or
// Machine.Validate) rejects as invalid, or a token the server refuses
// (unauthorized, forbidden). Everything else — the server down, timing out,
// unavailable, failing internally — is logged and retried with backoff.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Server == nil {
		return errors.New("agent: no server configured")
	}
	cfg.setDefaults()
	host, err := cfg.Detect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("detect host: %w", err)
	}
	a := &agent{cfg: cfg, log: cfg.Logger, backoff: cfg.MinBackoff}
	a.machine = a.describe(host)
	if err := a.machine.Validate(); err != nil {
		return fmt.Errorf("describe this host: %w; choose a valid --name or --tag", err)
	}
	a.log.Info("agent starting",
		"machine", a.machine.Name, "host", host.Hostname, "cores", host.Cores, "ram_gib", host.RAMGiB,
		"gpus", gpu.Summary(host.GPUs), "gpu_source", host.Source, "cuda", host.CUDA, "driver", host.Driver,
		"tags", a.machine.Tags)
	a.logNotes(host.Notes)

	// The seam for what comes next: the task worker and the swap runner will
	// start here, beside the heartbeat loop, and Run will wait for all of
	// them. They only act once the machine is registered.
	stopSwaps := a.startSwaps(ctx) // swap.go
	defer stopSwaps()
	stopTasks, err := a.startTasks(ctx, host) // worker.go
	if err != nil {
		return err
	}
	defer stopTasks()
	stopObserve, err := a.startObserve(ctx) // observe.go
	if err != nil {
		return err
	}
	defer stopObserve()
	return a.loop(ctx)
}

// agent is the state of one Run. Only the Run goroutine touches it.
type agent struct {
	cfg     Config
	log     *slog.Logger
	machine arbiter.Machine
	backoff time.Duration // the next wait after a failure
	// onRegistered are called once, after the first registration.
	onRegistered []func()
	// gpus are the machine's GPUs as last registered, for the observer.
	gpus atomic.Pointer[[]arbiter.GPU]
	// taskEnded tells the task worker of allocations that ended here.
	taskEnded func([]int64)
}

// describe turns a detection into the machine this agent registers.
func (a *agent) describe(h gpu.Host) arbiter.Machine {
	return h.Machine(a.cfg.Name, arbiter.SourceAgent, a.cfg.Tags)
}

// loop registers the machine, then heartbeats and re-detects until ctx ends.
// It is a single goroutine with one timer per duty, so there is no state to
// lock.
func (a *agent) loop(ctx context.Context) error {
	registered := false
	beat := time.NewTimer(0) // first fire registers
	defer beat.Stop()
	redetect := time.NewTicker(a.cfg.RedetectInterval)
	defer redetect.Stop()

	for {
		select {
		case <-ctx.Done():
			a.log.Info("agent stopping", "machine", a.machine.Name)
			if registered {
				a.leave(ctx)
			}
			return nil

		case <-beat.C:
			var err error
			if registered {
				err = a.heartbeat(ctx)
				if arbiter.ErrorCode(err) == arbiter.ENotFound {
					a.log.Warn("server does not know this machine; registering again", "machine", a.machine.Name)
					registered = false
					err = nil
				}
			}
			if !registered && err == nil {
				err = a.register(ctx)
				registered = err == nil
			}
			switch {
			case ctx.Err() != nil:
				continue // the Done case returns
			case err == nil:
				a.backoff = a.cfg.MinBackoff
				beat.Reset(a.cfg.HeartbeatInterval)
			case fatal(err):
				switch arbiter.ErrorCode(err) {
				case arbiter.EUnauthorized, arbiter.EForbidden:
					return fmt.Errorf("%w; give the agent a token with the agent role (--token or ARBITER_TOKEN)", err)
				}
				return err // the server's message says what to change
			default:
				wait := a.nextBackoff()
				a.log.Warn("server call failed; retrying", "machine", a.machine.Name, "err", err, "retry_in", wait.Round(time.Millisecond))
				beat.Reset(wait)
			}

		case <-redetect.C:
			if a.redetect(ctx) && registered {
				// Register at once rather than at the next heartbeat: the
				// scheduler must stop placing work on a lost GPU now.
				// (Since Go 1.23 Reset also drops a fire not yet received.)
				registered = false
				beat.Reset(0)
			}
		}
	}
}

// leaver is a Server that can be told the agent is leaving
// (*client.Client is one).
type leaver interface {
	LeaveMachine(ctx context.Context, name string) (arbiter.MachineStatus, error)
}

// leave tells the server the agent stops, so that the machine is down at
// once rather than at the heartbeat timeout and nothing new is placed on
// it (issue 12, finding 8). Best effort: the timeout catches it anyway.
func (a *agent) leave(ctx context.Context) {
	l, ok := a.cfg.Server.(leaver)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(a.cfg.CallTimeout, 5*time.Second))
	defer cancel()
	if _, err := l.LeaveMachine(ctx, a.machine.Name); err != nil {
		a.log.Warn("could not tell the server this machine is leaving; it is marked down at the heartbeat timeout", "machine", a.machine.Name, "err", err)
		return
	}
	a.log.Info("told the server this machine is leaving: it is down", "machine", a.machine.Name)
}

// register sends the machine description.
func (a *agent) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.CallTimeout)
	defer cancel()
	st, err := a.cfg.Server.RegisterMachine(ctx, a.machine)
	if err != nil {
		return fmt.Errorf("register machine %q: %w", a.machine.Name, err)
	}
	a.log.Info("machine registered", "machine", a.machine.Name, "state", st.State, "gpus", len(a.machine.GPUs))
	gs := slices.Clone(a.machine.GPUs)
	a.gpus.Store(&gs)
	fs := a.onRegistered
	a.onRegistered = nil
	for _, f := range fs {
		f()
	}
	return nil
}

// heartbeat tells the server the machine is alive.
func (a *agent) heartbeat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.CallTimeout)
	defer cancel()
	st, err := a.cfg.Server.Heartbeat(ctx, a.machine.Name)
	if err != nil {
		return fmt.Errorf("heartbeat machine %q: %w", a.machine.Name, err)
	}
	a.log.Debug("heartbeat", "machine", a.machine.Name, "state", st.State)
	return nil
}

// redetect looks at the host again and reports whether the machine changed.
// A failed detection keeps the previous description: dropping every GPU
// because nvidia-smi hiccuped would take them all from the scheduler.
func (a *agent) redetect(ctx context.Context) bool {
	host, err := a.cfg.Detect(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("GPU re-detection failed; keeping the previous description", "machine", a.machine.Name, "err", err)
		}
		return false
	}
	m := a.describe(host)
	if sameMachine(m, a.machine) {
		return false
	}
	if err := m.Validate(); err != nil {
		a.log.Error("re-detected host is not a valid machine; keeping the previous description", "machine", a.machine.Name, "err", err)
		return false
	}
	a.log.Warn("host changed; registering again", "machine", m.Name,
		"gpus_before", gpu.Summary(a.machine.GPUs), "gpus_now", gpu.Summary(m.GPUs),
		"cuda", m.CUDA, "driver", m.Driver)
	a.logNotes(host.Notes)
	a.machine = m
	return true
}

func (a *agent) logNotes(notes []string) {
	for _, n := range notes {
		a.log.Warn(n, "machine", a.machine.Name)
	}
}

// nextBackoff returns the wait before the next retry and doubles the one
// after, up to MaxBackoff. The wait is jittered by up to -20% so that a
// thousand agents do not return to a restarted server in step.
func (a *agent) nextBackoff() time.Duration {
	d := a.backoff
	a.backoff = min(2*a.backoff, a.cfg.MaxBackoff)
	if j := int64(d) / 5; j > 0 {
		d -= time.Duration(rand.Int64N(j))
	}
	return d
}

// fatal reports whether err cannot be fixed by retrying: the server refuses
// the credential, the machine description, or the machine's name (declared
// by the server's configuration). Transport errors have no code (ErrorCode
// says internal) and are never fatal.
func fatal(err error) bool {
	switch arbiter.ErrorCode(err) {
	case arbiter.EUnauthorized, arbiter.EForbidden, arbiter.EInvalid, arbiter.EConflict:
		return true
	}
	return false
}

// sameMachine compares what registration sends.
func sameMachine(x, y arbiter.Machine) bool {
	return x.Name == y.Name && x.Cores == y.Cores && x.RAMGiB == y.RAMGiB &&
		x.CUDA == y.CUDA && x.Driver == y.Driver &&
		slices.Equal(x.GPUs, y.GPUs) && slices.Equal(x.Tags, y.Tags)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/bmp"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/connlimit"
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
		ms = []arbiter.GridMachine{}
	}
	return arbiter.SyncGridMachines{Machines: ms, MaxRetiredJobs: cfg.Spalloc.MaxRetiredJobs,
		SecondsBeforeFree: durationS(cfg.Spalloc.SecondsBeforeFree)}
}

// openGrid starts the external power controller if there is one and the
// spalloc server if spalloc_listen is set; applyConfig has declared the
// grid machines.
func (m *serverMain) openGrid(ctx context.Context) error {
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
	ln := m.spallocLn // a replica's term: the replica's port hands it the connections (server_ha.go)
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("spalloc listen: %w", err)
		}
		ln = connlimit.Logged(ln, m.cfg.Spalloc.MaxConnsPerClient, m.log, "spalloc")
	}
	g.listener = ln
	g.spalloc = spalloc.NewServer(spalloc.ServerOptions{
		Backend: spalloc.NewBackend(m.loop),
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
		spalloc.Notify(rctx, m.loop, g.spalloc)
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

// warnSpallocRestart says when a reloaded configuration changes [spalloc]
// settings that only a restart applies.
func (m *serverMain) warnSpallocRestart(cfg *config.Config) {
	if cfg.Server.SpallocListen != m.cfg.Server.SpallocListen || !slices.Equal(cfg.Spalloc.Allow, m.cfg.Spalloc.Allow) {
		m.log.Warn("spalloc_listen and [spalloc] allow take effect at the next restart")
	}
}

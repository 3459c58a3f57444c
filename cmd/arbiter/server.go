package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/engine"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/httpio"
	"github.com/arbiter-hq/arbiter/postgres"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// serverMain is `arbiter server`: flags and configuration, then the store,
// the control loop and the HTTP server wired together. Tests run it on :0
// with a temporary data directory.
type serverMain struct {
	env      *cli.Env
	cfg      *config.Config
	noLocal  bool
	log      *slog.Logger
	store    arbiter.Store
	loop     *control.Loop
	listener net.Listener
	http     *http.Server
	api      *httpapi.Server
	baseCtx  context.CancelFunc
	// detect finds the local host; tests replace it.
	detect func(ctx context.Context) (gpu.Host, error)
	// now is the control loop's clock (nil: time.Now); tests drive a fake one.
	now func() time.Time
	// coord is the coordination capability's part: services, the webhook
	// dispatcher (server_coord.go).
	coord coordServer
	// tasks is the work queue's part: artifacts, manifest (server_tasks.go).
	tasks taskServer
	// grid is the grid machines' part: the spalloc server, the power
	// controller (server_spalloc.go).
	grid gridServer
	// cpuProfile is where `arbiter server` writes a CPU profile of its
	// start and run ("" for none).
	cpuProfile string
	// local is this host as a machine, once detected (declareMachines).
	local *arbiter.Machine
	// reloadMu serialises configuration reloads (SIGHUP, admin API).
	reloadMu sync.Mutex
	// storeLost is the store when it can lose its hold on the database
	// (PostgreSQL's lease): the server stops then.
	storeLost interface {
		Lost() <-chan struct{}
		LostError() error
	}
}

func cmdServer(ctx context.Context, env *cli.Env, args []string) error {
	m, err := newServerMain(env, args)
	if err != nil {
		return err
	}
	// The profile covers the start too: loading a large state is one of
	// the things to see in it.
	if m.cpuProfile != "" {
		f, err := os.Create(m.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := m.Open(ctx); err != nil {
		return err
	}
	return m.Run(ctx)
}

// newServerMain parses flags and loads the configuration.
func newServerMain(env *cli.Env, args []string) (*serverMain, error) {
	fs := flag.NewFlagSet("arbiter server", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	cfgPath := fs.String("config", "", "configuration file (TOML); without it the defaults apply")
	dataDir := fs.String("data-dir", "", "directory for the SQLite database (overrides [server] data_dir)")
	listen := fs.String("listen", "", "HTTP address host:port (overrides [server] listen)")
	database := fs.String("database", "", `"sqlite:PATH" or a postgres:// URL (overrides [server] database)`)
	noLocal := fs.Bool("no-local", false, "do not register this host as a machine when none are configured")
	insecure := fs.Bool("insecure-no-auth", false, "allow listening on a non-loopback address without any token configured")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile (go tool pprof) to this file until the server stops")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter server [flags]\n\nRuns the control plane. With no flags: SQLite under ./arbiter-data, listening on 127.0.0.1:7070.\n\n")
		fs.PrintDefaults()
	}
	pos, err := cli.ParseFlags(env, fs, args, false)
	if err != nil {
		if cli.HelpOK(err) == nil { // -h: the usage was printed
			return nil, cli.ExitError{Code: 0}
		}
		return nil, err
	}
	if len(pos) > 0 {
		return nil, cli.Usagef("unexpected argument %q; arbiter server takes only flags", pos[0])
	}
	cfg := config.Default()
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath, env.Getenv); err != nil {
			return nil, err
		}
	}
	if *dataDir != "" {
		cfg.Server.DataDir = *dataDir
	}
	if *listen != "" {
		cfg.Server.Listen = *listen
	}
	if *database != "" {
		cfg.Server.Database = *database
	}
	if *insecure {
		cfg.Server.InsecureNoAuth = true
	}
	// Flags may have changed what the file said: check the result again.
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &serverMain{env: env, cfg: cfg, noLocal: *noLocal || !cfg.Server.LocalEnabled(), cpuProfile: *cpuProfile}
	m.log = newLogger(env, cfg.Server.LogLevel, cfg.Server.LogFormat)
	m.detect = func(ctx context.Context) (gpu.Host, error) { return gpu.Detect(ctx, gpu.Options{}) }
	return m, nil
}

func newLogger(env *cli.Env, level, format string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(env.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(env.Stderr, opts))
}

// Open opens the store, starts the control loop, declares the configured
// (or local) machines and binds the listener.
func (m *serverMain) Open(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	// Listen first: the address is known before the store is taken, so a
	// PostgreSQL lease names where its holder is.
	if err := m.listen(); err != nil {
		return err
	}
	kind, target := m.cfg.Server.DatabaseTarget()
	switch kind {
	case config.DatabaseSQLite:
		var st *sqlite.Store // never a nil *Store in m.store: Close would call it
		if st, err = sqlite.Open(target, sqlite.Options{Synchronous: m.cfg.Server.Synchronous, Logger: m.log}); err == nil {
			m.store = st
		}
	default:
		var pg *postgres.Store
		pg, err = postgres.Open(ctx, target, postgres.Options{URL: m.URL(), LeaseTTL: durationS(m.cfg.Server.LeaseTTLS)})
		if err == nil {
			m.store, m.storeLost = pg, pg
		}
	}
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	var metrics atomic.Pointer[httpapi.Metrics]
	m.loop, err = control.Open(ctx, control.Options{
		Store:  m.store,
		Logger: m.log,
		Now:    m.now,
		Engine: engine.Config{
			History:          engineHistory(m.cfg.Allocations.History),
			Starvation:       durationS(m.cfg.Allocations.StarvationS),
			HeartbeatTimeout: durationS(m.cfg.Agents.HeartbeatTimeoutS),
			EventsKeep:       int64(m.cfg.Events.Keep),
			AuditKeep:        m.cfg.Audit.Keep,
			// Grid power: the engine's built-in controller unless one is wired (server_spalloc.go).
			GridExternalPower: m.grid.power != nil,
			// Recurring reservations' windows (UTC, as the schedule registry's).
			Cron: httpapi.ParseCron,
		},
		OnCommit: func(n int, d time.Duration) {
			if mt := metrics.Load(); mt != nil {
				mt.ObserveCommit(n, d)
			}
		},
	})
	if err != nil {
		return err
	}
	if err := m.declareMachines(ctx, m.cfg); err != nil {
		return err
	}
	if err := m.openCoord(ctx); err != nil {
		return err
	}
	if err := m.openTasks(ctx); err != nil {
		return err
	}
	if err := m.openGrid(ctx); err != nil {
		return err
	}
	// The stored form of a large state, read to build the engine's, and a
	// large manifest read to sync the queue, are garbage now: give their
	// memory back to the system rather than keep it as the process's size.
	debug.FreeOSMemory()
	mt := httpapi.NewMetrics(m.loop)
	metrics.Store(mt)
	tokens := apiTokens(m.cfg) // server_trust.go
	m.api = httpapi.NewServer(httpapi.Options{
		Plane:             m.loop,
		Tokens:            tokens,
		MaxBodyBytes:      m.cfg.Server.MaxBodyBytes,
		DefaultKeepaliveS: m.cfg.Allocations.DefaultKeepaliveS,
		Logger:            m.log,
		Metrics:           mt,
		Version:           version,
		Coordination:      m.coordOptions(),
		Tasks:             m.taskOptions(),
		Admin:             httpapi.AdminOptions{Reload: m.adminReload()},
	})
	base, cancel := context.WithCancel(context.Background())
	m.baseCtx = cancel
	tuneGC(base, m.env.Getenv) // gctune.go
	m.http = &http.Server{
		// Slow clients (issue 12, finding 5): headers within 10s, a body
		// within body_timeout_s (more for large ones, none for streams:
		// httpio.BodyDeadline), idle connections kept idle_timeout_s, and
		// at most max_conns_per_client connections per address (listen).
		Handler:           httpio.BodyDeadline(m.api.Handler(), durationS(m.cfg.Server.BodyTimeoutS), minBodyRate),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       durationS(m.cfg.Server.IdleTimeoutS),
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
	}
	machines := len(m.cfg.Machines)
	if m.local != nil {
		machines = 1
	}
	m.log.Info("arbiter server ready", "url", m.URL(), "database", kind, "target", redact(target),
		"machines", machines, "tokens", len(tokens), "version", version)
	return nil
}

// listen binds the HTTP listener, with TLS when configured.
func (m *serverMain) listen() error {
	ln, err := net.Listen("tcp", m.cfg.Server.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	m.listener = limitConns(ln, m.cfg.Server.MaxConnsPerClient, m.log, "http") // server_trust.go
	if m.cfg.Server.TLSCertFile != "" {
		c, err := tlsConfig(&m.cfg.Server) // server_trust.go
		if err != nil {
			return err
		}
		m.listener = tls.NewListener(m.listener, c)
	}
	return nil
}

// declareMachines declares cfg's GPU machines (or, with none, this host,
// detected once), its pools, its [gpus] policy and its fair-share policy
// ([[groups]], [[quotas]], [fairshare], [preemption]), at start and on
// every reload. Always, even
// with none: machines no longer configured are removed (their allocations
// end) and backings of pools no longer configured drain.
func (m *serverMain) declareMachines(ctx context.Context, cfg *config.Config) error {
	machines := append([]arbiter.Machine(nil), cfg.Machines...)
	if len(machines) == 0 && !m.noLocal {
		if m.local == nil {
			local, err := m.localMachine(ctx)
			if err != nil {
				return err
			}
			m.local = &local
		}
		machines = append(machines, *m.local)
	}
	if _, err := m.loop.Do(ctx, arbiter.SyncConfigMachines{Machines: machines}); err != nil {
		return fmt.Errorf("declare machines: %w", err)
	}
	if _, err := m.loop.Do(ctx, arbiter.SyncPools{Pools: cfg.Pools}); err != nil {
		return fmt.Errorf("declare pools: %w", err)
	}
	if _, err := m.loop.Do(ctx, arbiter.SetGPUPolicy{Policy: cfg.GPUs.Policy()}); err != nil {
		return fmt.Errorf("set the [gpus] policy: %w", err)
	}
	if _, err := m.loop.Do(ctx, arbiter.SetFairShare{Policy: cfg.FairSharePolicy}); err != nil {
		return fmt.Errorf("set the fair-share policy ([[groups]], [[quotas]], [fairshare], [preemption]): %w", err)
	}
	return nil
}

// localMachine describes the host the server runs on, as its agent would.
func (m *serverMain) localMachine(ctx context.Context) (arbiter.Machine, error) {
	h, err := m.detect(ctx)
	if err != nil {
		// A broken GPU tool should not keep the server from starting; the
		// machine is declared without GPUs and the log says why.
		m.log.Warn("could not detect this host's GPUs; it is declared without any", "err", err)
	}
	for _, n := range h.Notes {
		m.log.Warn("gpu detection", "note", n)
	}
	if h.Hostname == "" {
		h.Hostname, _ = os.Hostname()
	}
	if arbiter.ValidateName("machine name", h.Hostname) != nil {
		h.Hostname = "local"
	}
	return h.Machine("", arbiter.SourceLocal, nil), nil
}

// URL is where the server listens, e.g. http://127.0.0.1:7070.
func (m *serverMain) URL() string {
	scheme := "http"
	if m.cfg.Server.TLSCertFile != "" {
		scheme = "https"
	}
	return scheme + "://" + m.listener.Addr().String()
}

// Run serves until ctx ends, then shuts down gracefully: no new requests,
// streams ended, requests in flight given the shutdown timeout, the loop
// stopped after its batch, the store closed.
func (m *serverMain) Run(ctx context.Context) error {
	stopHUP := m.watchSIGHUP(ctx) // reloads (server_reload.go)
	errc := make(chan error, 1)
	srv, ln := m.http, m.listener // Close clears m.http, maybe before this goroutine runs
	go func() { errc <- srv.Serve(ln) }()
	var lost <-chan struct{}
	if m.storeLost != nil {
		lost = m.storeLost.Lost()
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		m.log.Info("shutting down")
	case <-lost:
		// Another server holds the database now, or this one could not
		// renew its lease in time: it writes nothing more, so it stops
		// rather than answer from a state it can no longer keep.
		err = m.storeLost.LostError()
		m.log.Error("stopping: this server no longer holds the database", "err", err)
	}
	stopHUP()
	m.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Close stops everything Open started. It is safe to call twice.
func (m *serverMain) Close() {
	if m.http != nil {
		m.baseCtx() // ends event streams and long-polls
		ctx, cancel := context.WithTimeout(context.Background(), durationS(m.cfg.Server.ShutdownTimeoutS))
		if err := m.http.Shutdown(ctx); err != nil {
			m.http.Close()
		}
		cancel()
		m.http = nil
	} else if m.listener != nil {
		m.listener.Close()
	}
	if m.api != nil {
		m.api.Close() // the audit trail's last counts
		m.api = nil
	}
	m.closeCoord() // the webhook dispatcher reads the loop: it stops first
	m.closeGrid()  // so do the spalloc server and the power controller
	if m.loop != nil {
		m.loop.Close()
		m.loop = nil
	}
	if m.tasks.artifacts != nil {
		m.tasks.artifacts.Close()
		m.tasks.artifacts = nil
	}
	if m.store != nil {
		if err := m.store.Close(); err != nil {
			m.log.Warn("close database", "err", err)
		}
		m.store = nil
	}
}

func durationS(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// redact hides a password in a database URL before it is logged.
func redact(target string) string {
	if u, err := url.Parse(target); err == nil && u.User != nil {
		return u.Redacted()
	}
	return target
}

// engineHistory is allocations.history for the engine, whose 0 means its
// default: the configuration's 0 keeps none.
func engineHistory(n int) int {
	if n == 0 {
		return engine.NoHistory
	}
	return n
}

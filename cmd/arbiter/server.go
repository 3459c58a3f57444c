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
	"regexp"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/connlimit"
	"github.com/arbiter-hq/arbiter/control"
	"github.com/arbiter-hq/arbiter/engine"
	"github.com/arbiter-hq/arbiter/gpu"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/httpio"
	"github.com/arbiter-hq/arbiter/leader"
	"github.com/arbiter-hq/arbiter/manifest"
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
	// local is this host as a machine, once detected (applyConfig).
	local *arbiter.Machine
	// reloadMu serialises configuration reloads (SIGHUP, admin API).
	reloadMu sync.Mutex
	// pg is the PostgreSQL database, whose lease the elector holds (or
	// campaigns for); m.store is then its Term, fenced by the lease's.
	pg      *postgres.Store
	elector *leader.Elector
	// leaderProblem, for a replica's term, says what its look at the
	// leader (itself) from outside found wrong (server_ha_probe.go).
	leaderProblem func() string
	// leaderErr gets the elector's end: a lost lease (one server per
	// database) or a replica that must stop; the server stops then.
	leaderErr   chan error
	stopElector context.CancelFunc
	electorDone chan struct{}
	// applyFlags puts the command line's overrides on a configuration
	// read again (a replica reads the file each time it starts leading).
	applyFlags func(*config.Config)
	// ha is a replica's process when [ha] is on (server_ha.go).
	ha *replica
	// advertise is the URL this server is known by when it does not
	// listen itself (a replica's term); spallocLn the listener a term's
	// spalloc server serves instead of its own.
	advertise string
	spallocLn net.Listener
	// tls is the listener's TLS configuration (nil without HTTPS).
	tls *tls.Config
}

func cmdServer(ctx context.Context, env *cli.Env, args []string) error {
	m, err := newServerMain(env, args)
	if err != nil {
		return err
	}
	tuneProcs(env.Getenv) // runtimetune.go
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
	check := fs.Bool("check", false, "check the configuration (with these flags) and the task manifest it names, then exit: 0 when they load")
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
	applyFlags := func(cfg *config.Config) {
		if *dataDir != "" {
			cfg.Server.DataDir = *dataDir
			cfg.SetByFlag("server.data_dir", "--data-dir")
		}
		if *listen != "" {
			cfg.Server.Listen = *listen
			cfg.SetByFlag("server.listen", "--listen")
		}
		if *database != "" {
			cfg.Server.Database = *database
			cfg.SetByFlag("server.database", "--database")
		}
		if *insecure {
			cfg.Server.InsecureNoAuth = true
		}
	}
	// The flags override the file before it is checked: --insecure-no-auth
	// or --listen may make right what the file alone is not.
	cfg := config.Default()
	applyFlags(cfg)
	if *cfgPath != "" {
		if cfg, err = config.Load(*cfgPath, env.Getenv, applyFlags); err != nil {
			return nil, err
		}
	} else if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if *check {
		return nil, checkOnly(env, cfg)
	}
	m := &serverMain{env: env, cfg: cfg, noLocal: *noLocal || !cfg.Server.LocalEnabled(), cpuProfile: *cpuProfile, applyFlags: applyFlags}
	m.log = newLogger(env, cfg.Server.LogLevel, cfg.Server.LogFormat)
	m.detect = func(ctx context.Context) (gpu.Host, error) { return gpu.Detect(ctx, gpu.Options{}) }
	return m, nil
}

// checkOnly is `arbiter server --check`: cfg loaded; the manifest it
// names is read too. It always ends the command: an ExitError of 0 when
// all loads, else the manifest's problems.
func checkOnly(env *cli.Env, cfg *config.Config) error {
	what := "the defaults"
	if cfg.Path != "" {
		what = cfg.Path
	}
	if p := cfg.Tasks.Manifest; p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read the task manifest: %w", err)
		}
		if _, err := manifest.Parse(p, data); err != nil {
			return err
		}
		what += " and " + p
	}
	fmt.Fprintf(env.Stdout, "%s: ok\n", what)
	return cli.ExitError{Code: 0}
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
// (or local) machines and binds the listener. With [ha] on it opens a
// replica instead, which leads only once Run has won the lease
// (server_ha.go).
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
	if m.cfg.HA.Enabled {
		return m.openReplica(ctx) // server_ha.go
	}
	if err := m.openStore(ctx); err != nil {
		return err
	}
	if err := m.openTerm(ctx); err != nil {
		return err
	}
	m.http = m.newHTTPServer(m.api.Handler())
	kind, target := m.cfg.Server.DatabaseTarget()
	machines := len(m.cfg.Machines)
	if m.local != nil {
		machines = 1
	}
	m.log.Info("arbiter server ready", "url", m.URL(), "database", kind, "target", redact(target),
		"machines", machines, "grid_machines", len(m.cfg.GridMachines), "tokens", len(m.cfg.Tokens), "version", version)
	return nil
}

// openStore opens the one server's store: SQLite (a file lock keeps it
// to one server), or PostgreSQL, whose lease it takes — refusing to start,
// naming the holder, while another server holds it — and keeps renewed
// until the server stops; a lost lease stops the server.
func (m *serverMain) openStore(ctx context.Context) error {
	kind, target := m.cfg.Server.DatabaseTarget()
	if kind == config.DatabaseSQLite {
		// A small upload's bytes travel in the batch that records it, synced
		// with it, rather than waiting for a sync of their own: the store
		// gives them back to the artifact store after a crash, and keeps
		// them until the artifact store has synced them (server_tasks.go).
		arts, err := m.openArtifacts()
		if err != nil {
			return err
		}
		st, err := sqlite.Open(target, sqlite.Options{Synchronous: m.cfg.Server.Synchronous, Logger: m.log, Blobs: arts})
		if err != nil {
			return fmt.Errorf("open database: %w", err)
		}
		m.store = st // never a nil *Store in m.store: Close would call it
		return nil
	}
	ttl := durationS(m.cfg.Server.LeaseTTLS)
	pg, err := postgres.Open(ctx, target, postgres.Options{ReclaimDead: true, IdleInTransaction: ttl})
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	m.pg = pg
	host, _ := os.Hostname()
	var e *leader.Elector
	e = leader.New(leader.Config{
		ID: fmt.Sprintf("pid %d on host %s", os.Getpid(), host), URL: m.URL(), Lease: pg, TTL: ttl, Single: true, Logger: m.log,
		Lead: func(_ context.Context, term int64) error {
			m.store = pg.Fenced(postgres.Fence{Term: term, Timeout: ttl,
				Trusted: func() error { return e.Trusted(term) }, Lost: func(err error) { e.Lost(term, err) }})
			return nil
		},
		// The loop stops writing by itself (the fence); Run stops the server.
		StepDown: func(int64, error) {},
	})
	if err := e.First(ctx); err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	m.elector = e
	m.startElector()
	return nil
}

// startElector runs the elector until endElector; its end (an error that
// stops the server, or nil) comes on m.leaderErr.
func (m *serverMain) startElector() {
	ctx, cancel := context.WithCancel(context.Background())
	m.stopElector, m.leaderErr, m.electorDone = cancel, make(chan error, 1), make(chan struct{})
	go func() {
		defer close(m.electorDone)
		m.leaderErr <- m.elector.Run(ctx)
	}()
}

// endElector stops the elector: it steps down (when leading), gives the
// lease back and leaves the roster. Safe to call twice.
func (m *serverMain) endElector() {
	if m.stopElector == nil {
		return
	}
	m.stopElector()
	<-m.electorDone
	m.stopElector = nil
}

// openTerm starts the control plane over m.store: the loop (which loads
// the state), the configured machines, coordination, the work queue, grid
// machines and the API server. A replica opens one per term it leads.
func (m *serverMain) openTerm(ctx context.Context) error {
	var metrics atomic.Pointer[httpapi.Metrics]
	var err error
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
	// Services at start only: a reload leaves them (and their swaps) be.
	if err := m.applyConfig(ctx, m.cfg, &arbiter.SyncServices{Services: m.cfg.Services, Catalog: m.cfg.Catalog}); err != nil {
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
	var cluster func() arbiter.Cluster
	if m.elector != nil && m.cfg.HA.Enabled {
		cluster = m.elector.Cluster
		mt.SetReplica(m.elector.Stats)
	}
	m.api = httpapi.NewServer(httpapi.Options{
		Plane:             m.loop,
		Tokens:            apiTokens(m.cfg),
		AnyHost:           m.cfg.Server.InsecureNoAuth, // else a server without tokens answers loopback names only
		MaxBodyBytes:      m.cfg.Server.MaxBodyBytes,
		DefaultKeepaliveS: m.cfg.Allocations.DefaultKeepaliveS,
		Logger:            m.log,
		Metrics:           mt,
		Version:           version,
		Coordination:      m.coordOptions(),
		Tasks:             m.taskOptions(),
		Admin:             httpapi.AdminOptions{Reload: m.adminReload()},
		Cluster:           cluster,
		Problem:           m.healthProblem,
	})
	return nil
}

// healthProblem is what health reports wrong: the store failing
// (control.Loop.Trouble), or a replica's leader not answering at its
// advertise_url (server_ha_probe.go).
func (m *serverMain) healthProblem() string {
	if t := m.loop.Trouble(); t != "" {
		return t
	}
	if m.leaderProblem != nil {
		return m.leaderProblem()
	}
	return ""
}

// newHTTPServer is the HTTP server of h.
func (m *serverMain) newHTTPServer(h http.Handler) *http.Server {
	base, cancel := context.WithCancel(context.Background())
	m.baseCtx = cancel
	tuneGC(base, m.env.Getenv) // runtimetune.go
	keepMonitorBackedOff(base) // monitorkeep.go
	return &http.Server{
		// Slow clients (issue 12, finding 5): headers within 10s, a body
		// within body_timeout_s (more for large ones, none for streams:
		// httpio.BodyDeadline), idle connections kept idle_timeout_s, and
		// at most max_conns_per_client connections per address (listen).
		Handler:           httpio.BodyDeadline(h, durationS(m.cfg.Server.BodyTimeoutS), minBodyRate),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       durationS(m.cfg.Server.IdleTimeoutS),
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
	}
}

// listen binds the HTTP listener, with TLS when configured.
func (m *serverMain) listen() error {
	ln, err := net.Listen("tcp", m.cfg.Server.Listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listen: %w: another program (another arbiter server?) listens there; stop it, or choose another address with --listen or [server] listen", err)
	}
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	m.listener = connlimit.Logged(ln, m.cfg.Server.MaxConnsPerClient, m.log, "http")
	if m.cfg.Server.TLSCertFile != "" {
		c, err := m.cfg.Server.ListenerTLS()
		if err != nil {
			return err
		}
		m.listener, m.tls = tls.NewListener(m.listener, c), c
	}
	return nil
}

// applyConfig puts cfg in force as one change (arbiter.Reconfigure), at
// start (with services, its services) and on every reload: its GPU
// machines (or, with none, this host, detected once), pools, [gpus]
// policy, fair-share policy ([[groups]], [[quotas]], [fairshare],
// [preemption]) and grid machines, and the end of the dashboard sessions
// of tokens it no longer has. Always, even with none: machines no longer
// configured are removed (their allocations end) and backings of pools no
// longer configured drain. A part refused, or a save that fails, changes
// nothing.
func (m *serverMain) applyConfig(ctx context.Context, cfg *config.Config, services *arbiter.SyncServices) error {
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
	n, err := arbiter.Do(ctx, m.loop, arbiter.Reconfigure{
		Services:  services,
		Machines:  arbiter.SyncConfigMachines{Machines: machines},
		Pools:     arbiter.SyncPools{Pools: cfg.Pools},
		GPUPolicy: arbiter.SetGPUPolicy{Policy: cfg.GPUs.Policy()},
		FairShare: arbiter.SetFairShare{Policy: cfg.FairSharePolicy},
		Grid:      syncGridCmd(cfg), // server_spalloc.go
		Sessions:  arbiter.EndSessions{Keep: httpapi.TokenFingerprints(apiTokens(cfg))},
	})
	if err != nil {
		return fmt.Errorf("apply the configuration: %w", err)
	}
	if n > 0 {
		m.log.Info("dashboard sessions of removed or changed tokens ended", "sessions", n)
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

// URL is where the server listens, e.g. http://127.0.0.1:7070 (a
// replica's term: where the replica is advertised).
func (m *serverMain) URL() string {
	if m.listener == nil {
		return m.advertise
	}
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
	if m.ha != nil {
		m.runReplica() // server_ha.go: campaign, lead, follow
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		m.log.Info("shutting down")
	case err = <-m.leaderErr:
		// One server per database: another server holds the database now,
		// or this one could not renew its lease in time: it writes nothing
		// more, so it stops rather than answer from a state it can no
		// longer keep. A replica: another process took its node id.
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
	m.closeReplica() // server_ha.go: the term led, the spalloc switch, the elector
	m.closeTerm()
	// One server per database: once the last batch is committed, the
	// lease is given back, so the next server starts at once.
	m.endElector()
	if m.store != nil {
		if err := m.store.Close(); err != nil {
			m.log.Warn("close database", "err", err)
		}
		m.store = nil
	}
	if m.pg != nil {
		m.pg.Close()
		m.pg = nil
	}
}

// closeTerm stops what openTerm started. It is safe to call twice.
func (m *serverMain) closeTerm() {
	m.shutTerm()
	m.api, m.loop = nil, nil
}

// shutTerm stops what openTerm started, keeping the fields (a replica's
// reload may still read them). Safe to call twice.
func (m *serverMain) shutTerm() {
	if m.loop != nil && m.elector != nil {
		if _, ok := m.elector.Leading(); !ok {
			// The lease is gone: nothing of the loop can commit any more, and
			// whoever waits on it (a spalloc command, the audit trail) must
			// be told so now, not when the database answers again.
			m.loop.Close()
		}
	}
	if m.api != nil {
		m.api.Close() // the audit trail's last counts
	}
	m.closeCoord() // the webhook dispatcher reads the loop: it stops first
	m.closeGrid()  // so do the spalloc server and the power controller
	if m.loop != nil {
		m.loop.Close()
	}
	if m.tasks.artifacts != nil {
		m.tasks.artifacts.Close()
	}
}

func durationS(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// redact hides the passwords in a database URL before it is logged: the
// user's, and PostgreSQL's password and sslpassword parameters (in the
// query, or in a key=value connection string).
func redact(target string) string {
	return redactParsed(target, redactForm(target))
}

// redactForm hides the passwords where the URL or connection string's
// form says they are.
func redactForm(target string) string {
	u, err := url.Parse(target)
	if err != nil || u.Scheme == "" {
		return dsnPassword.ReplaceAllString(target, "${1}xxxxx")
	}
	if q := u.Query(); q.Has("password") || q.Has("sslpassword") {
		for _, k := range []string{"password", "sslpassword"} {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// redactParsed hides, in out, the password the PostgreSQL driver reads in
// target, in every form it may be written: the driver takes targets that
// net/url does not (a URL with a ^ or # in its password), and those the
// form-based redaction would leave whole.
func redactParsed(target, out string) string {
	cfg, err := pgconn.ParseConfig(target)
	if err != nil || cfg.Password == "" {
		return out
	}
	for _, form := range []string{cfg.Password, url.QueryEscape(cfg.Password), url.PathEscape(cfg.Password),
		strings.TrimPrefix(url.UserPassword("", cfg.Password).String(), ":")} {
		if form != "" && form != "xxxxx" {
			out = strings.ReplaceAll(out, form, "xxxxx")
		}
	}
	return out
}

// dsnPassword is a password in a key=value connection string.
var dsnPassword = regexp.MustCompile(`((?:^|\s)(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|\S*)`)

// engineHistory is allocations.history for the engine, whose 0 means its
// default: the configuration's 0 keeps none.
func engineHistory(n int) int {
	if n == 0 {
		return engine.NoHistory
	}
	return n
}

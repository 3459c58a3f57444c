package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/config"
)

// serverReloader is one part of the server that SIGHUP reloads.
type serverReloader struct {
	what   string
	reload func(ctx context.Context) error
	// gate: when it fails, nothing after it is reloaded (a configuration
	// that does not load changes nothing, the manifest it names included).
	gate bool
}

// reloaders lists what SIGHUP reloads, in order. A capability with
// something to reload adds its line here.
func (m *serverMain) reloaders() []serverReloader {
	var rs []serverReloader
	if m.cfg.Path != "" {
		rs = append(rs, serverReloader{"configuration", m.reloadConfig, true})
	}
	// The manifest the configuration names now: the configuration's
	// reload, first, may have set or changed [tasks] manifest.
	rs = append(rs, serverReloader{"task manifest", func(ctx context.Context) error {
		if m.manifestPath() == "" {
			return errNothingToReload
		}
		_, err := m.reloadTaskManifest(ctx)
		return err
	}, false})
	return rs
}

// errNothingToReload: the part has nothing to reload (no manifest is
// configured); it is neither reloaded nor failed.
var errNothingToReload = errors.New("nothing to reload")

// reloadConfig reads the configuration file again and applies what can
// change while the server runs, as a restart would: tokens (a removed or
// changed one stops working at once, with its dashboard sessions), GPU
// machines, pools, grid machines and the task manifest's path (loaded by
// the next reloader). The rest (listen addresses, TLS, services, the
// store, the operator token) takes effect at the next restart. A file that
// does not load changes nothing; the error names file, line and key.
func (m *serverMain) reloadConfig(ctx context.Context) error {
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	cfg, err := m.rereadConfig()
	if err != nil {
		return err
	}
	// Everything is checked before anything changes: the tokens here, the
	// rest in applyConfig's one command.
	tokens := apiTokens(cfg) // server_trust.go
	if err := m.api.CheckTokens(tokens); err != nil {
		return err
	}
	if err := m.applyConfig(ctx, cfg, nil); err != nil { // server.go
		return err
	}
	if err := m.api.SetTokens(tokens); err != nil {
		return err // checked above: not expected
	}
	m.log.Info("tokens reloaded", "tokens", len(tokens))
	m.setManifestPath(cfg.Tasks.Manifest) // server_tasks.go
	m.warnSpallocRestart(cfg)             // server_spalloc.go
	m.log.Info("configuration reloaded", "machines", len(cfg.Machines), "pools", len(cfg.Pools), "grid_machines", len(cfg.GridMachines))
	return nil
}

// rereadConfig reads the configuration file again, with the command
// line's overrides, and checks it.
func (m *serverMain) rereadConfig() (*config.Config, error) {
	return config.Load(m.cfg.Path, m.env.Getenv, m.applyFlags)
}

// reloadAll is SIGHUP's reload: reloadReport, whose log says what failed.
func (m *serverMain) reloadAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, _ = m.reloadReport(ctx)
}

// watchSIGHUP reloads on SIGHUP until the returned stop is called.
func (m *serverMain) watchSIGHUP(ctx context.Context) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-ch:
				t := m.reloadTarget() // server_ha.go: a replica reloads the term it leads
				if t == nil {
					if err := m.checkConfig(); err != nil {
						m.log.Error("SIGHUP: the configuration does not load; this follower would lead with the one read last", "err", err)
					} else {
						m.log.Info("SIGHUP: the configuration loads; this follower applies it when it leads")
					}
					continue
				}
				t.log.Info("SIGHUP: reloading")
				t.auditLocal(ctx, "SIGHUP reload", "") // server_trust.go
				t.reloadAll(ctx)
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
		<-finished
	}
}

// adminReload is the admin API's reload: nil when the server runs on the
// defaults, without a file to read.
func (m *serverMain) adminReload() func(ctx context.Context) ([]string, error) {
	if m.cfg.Path == "" {
		return nil
	}
	return m.reloadReport
}

// reloadReport runs the reloaders and reports what was reloaded; a
// failure is logged and the others still run, unless it was a gate's. The
// error lists what failed (each kept its previous state).
func (m *serverMain) reloadReport(ctx context.Context) ([]string, error) {
	var done, failed []string
	for _, r := range m.reloaders() {
		err := r.reload(ctx)
		if errors.Is(err, errNothingToReload) {
			continue
		}
		if err != nil {
			m.log.Error("reload failed; the previous one stays in force", "what", r.what, "err", err)
			// Not an *arbiter.Error: a problem of the file, said as it is
			// (file, line and key) to the admin who asked.
			msg := err.Error()
			var ae *arbiter.Error
			if errors.As(err, &ae) {
				msg = ae.Message
			}
			failed = append(failed, r.what+": "+msg)
			if r.gate {
				break
			}
			continue
		}
		done = append(done, r.what)
	}
	switch {
	case len(failed) > 0 && len(done) > 0:
		// Some parts were applied: saying "nothing changed" would hide it.
		return done, arbiter.Errorf(arbiter.EInvalid, "reloaded %s; the rest failed, and its previous version stays in force: %s",
			strings.Join(done, ", "), strings.Join(failed, "; "))
	case len(failed) > 0:
		return done, arbiter.Errorf(arbiter.EInvalid, "reload failed, the previous configuration stays in force: %s", strings.Join(failed, "; "))
	}
	return done, nil
}

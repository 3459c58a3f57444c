package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// serverReloader is one part of the server that SIGHUP reloads.
type serverReloader struct {
	what   string
	reload func(ctx context.Context) error
}

// reloaders lists what SIGHUP reloads, in order. A capability with
// something to reload adds its line here.
func (m *serverMain) reloaders() []serverReloader {
	var rs []serverReloader
	if m.cfg.Path != "" {
		rs = append(rs, serverReloader{"grid machines", m.reloadGrid}) // server_spalloc.go
	}
	if m.cfg.Tasks.Manifest != "" {
		rs = append(rs, serverReloader{"task manifest", func(ctx context.Context) error {
			_, err := m.reloadTaskManifest(ctx)
			return err
		}})
	}
	return rs
}

// reloadAll runs every reloader; a failure is logged and the others still
// run (what failed keeps its previous state).
func (m *serverMain) reloadAll(ctx context.Context) {
	for _, r := range m.reloaders() {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		if err := r.reload(rctx); err != nil {
			m.log.Error("reload failed; the previous one stays in force", "what", r.what, "err", err)
		}
		cancel()
	}
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
				m.log.Info("SIGHUP: reloading")
				m.reloadAll(ctx)
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
		<-finished
	}
}

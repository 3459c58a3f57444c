package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/artifact"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/manifest"
)

// taskServer is the work queue's part of the server: the artifact store,
// the manifest path and the operator token.
type taskServer struct {
	artifacts *artifact.Store
	opToken   string
	mu        sync.Mutex // one manifest reload at a time; guards path
	// path is the manifest in force: [tasks] manifest as the configuration
	// said at start or at its last reload ("" for none).
	path string
}

// openTasks opens the artifact store (openArtifacts; on SQLite openStore
// has) and loads the configured manifest. A manifest that does not load
// stops the start: the operator must see the problem now, not when
// workers find nothing to do.
func (m *serverMain) openTasks(ctx context.Context) error {
	// On SQLite openStore opened the artifact store, which the store
	// needs at once; on PostgreSQL each term (a replica leads several)
	// opens its own.
	if kind, _ := m.cfg.Server.DatabaseTarget(); kind != config.DatabaseSQLite {
		if _, err := m.openArtifacts(); err != nil {
			return err
		}
	}
	m.tasks.path = m.cfg.Tasks.Manifest
	m.tasks.opToken = m.env.Getenv(m.cfg.Tasks.OperatorTokenEnv)
	if n := utf8.RuneCountInString(m.tasks.opToken); n > 0 && n < config.MinSecretLen {
		// It acts as an admin on the operator endpoints: held to the rule of
		// tokens' secrets.
		return fmt.Errorf("$%s is %d characters; use at least %d (e.g. openssl rand -hex 32)", m.cfg.Tasks.OperatorTokenEnv, n, config.MinSecretLen)
	}
	switch {
	case m.tasks.opToken != "":
	case len(m.cfg.Tokens) == 0:
		m.log.Info("no operator token configured: the fleet API's operator endpoints answer loopback callers only",
			"env", m.cfg.Tasks.OperatorTokenEnv)
	default:
		m.log.Info("no operator token configured: the fleet API's operator endpoints answer admin tokens only",
			"env", m.cfg.Tasks.OperatorTokenEnv)
	}
	if m.cfg.Tasks.OpenWorkerAPI && len(m.cfg.Tokens) > 0 {
		m.log.Warn("[tasks] open_worker_api is on: anyone who can reach the server may claim, fail and complete tasks as any X-Lab-Host; " +
			"authenticate the workers in front of it")
	}
	if m.cfg.Tasks.Manifest == "" {
		return nil
	}
	if _, err := m.reloadTaskManifest(ctx); err != nil {
		return fmt.Errorf("load the task manifest: %w", err)
	}
	return nil
}

// openArtifacts opens the artifact store under data_dir/artifacts.
// Artifacts are as durable as commits: synchronous = "normal" trades the
// last ones on a power cut for speed, for both. On SQLite a small
// upload's durability is left to the commit that records it, whose batch
// carries its bytes (the SQLite store is given the artifact store to
// hand them back to); PostgreSQL keeps no batches, so there each upload
// is synced before it is recorded.
func (m *serverMain) openArtifacts() (*artifact.Store, error) {
	dir := filepath.Join(m.cfg.Server.DataDir, "artifacts")
	kind, _ := m.cfg.Server.DatabaseTarget()
	st, err := artifact.Open(dir, artifact.Options{
		NoSync:           m.cfg.Server.Synchronous == "normal",
		CallerSyncsSmall: kind == config.DatabaseSQLite,
	})
	if err != nil {
		return nil, err
	}
	m.tasks.artifacts = st
	return st, nil
}

// taskOptions are the HTTP server's work-queue options.
func (m *serverMain) taskOptions() *httpapi.TaskOptions {
	return &httpapi.TaskOptions{
		Artifacts:        m.tasks.artifacts,
		MaxArtifactBytes: m.cfg.Tasks.MaxArtifactBytes,
		OperatorToken:    m.tasks.opToken,
		OpenWorkerAPI:    m.cfg.Tasks.OpenWorkerAPI,
		Reload:           m.reloadTasksFromConfig,
	}
}

// manifestPath is the manifest in force ("" for none).
func (m *serverMain) manifestPath() string {
	m.tasks.mu.Lock()
	defer m.tasks.mu.Unlock()
	return m.tasks.path
}

func (m *serverMain) setManifestPath(p string) {
	m.tasks.mu.Lock()
	defer m.tasks.mu.Unlock()
	m.tasks.path = p
}

// reloadTasksFromConfig is `arbiter tasks reload`: the manifest the
// configuration file names now — [tasks] manifest set, changed or removed
// since the start counts (issue 12, finding 9) — is loaded. Errors:
// invalid when the file does not load or names no manifest.
func (m *serverMain) reloadTasksFromConfig(ctx context.Context) (arbiter.TaskSyncReport, error) {
	where := "the server's configuration (it runs without --config: restart it with one)"
	if m.cfg.Path != "" {
		where = m.cfg.Path
		cfg, err := m.rereadConfig() // server_reload.go
		if err != nil {
			return arbiter.TaskSyncReport{}, fmt.Errorf("the configuration does not load, so the manifest it names cannot be: %w", err)
		}
		m.setManifestPath(cfg.Tasks.Manifest)
	}
	if m.manifestPath() == "" {
		return arbiter.TaskSyncReport{}, arbiter.Errorf(arbiter.EInvalid, "no manifest is configured: set [tasks] manifest in %s, then run arbiter tasks reload", where)
	}
	return m.reloadTaskManifest(ctx)
}

// reloadTaskManifest reads the manifest and syncs the queue with it. On any
// problem nothing changes and the manifest in force stays.
func (m *serverMain) reloadTaskManifest(ctx context.Context) (arbiter.TaskSyncReport, error) {
	m.tasks.mu.Lock()
	defer m.tasks.mu.Unlock()
	path := m.tasks.path
	f, err := os.Open(path)
	if err != nil {
		return arbiter.TaskSyncReport{}, fmt.Errorf("read the task manifest: %w", err)
	}
	defer f.Close()
	man, err := manifest.Read(path, f)
	if err != nil {
		return arbiter.TaskSyncReport{}, err
	}
	rep, err := arbiter.Do(ctx, m.loop, arbiter.SyncTasks{Manifest: man.TaskManifest()})
	if err != nil {
		return arbiter.TaskSyncReport{}, err
	}
	m.log.Info("task manifest loaded", "manifest", path, "name", rep.Manifest, "tasks", rep.Tasks,
		"added", rep.Added, "updated", rep.Updated, "unchanged", rep.Unchanged, "removed", rep.Removed)
	return rep, nil
}

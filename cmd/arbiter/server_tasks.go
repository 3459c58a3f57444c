package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/artifact"
	"github.com/arbiter-hq/arbiter/httpapi"
	"github.com/arbiter-hq/arbiter/manifest"
)

// taskServer is the work queue's part of the server: the artifact store,
// the manifest path and the operator token.
type taskServer struct {
	artifacts *artifact.Store
	opToken   string
	mu        sync.Mutex // one manifest reload at a time
}

// openTasks opens the artifact store under data_dir/artifacts and loads the
// configured manifest. A manifest that does not load stops the start: the
// operator must see the problem now, not when workers find nothing to do.
func (m *serverMain) openTasks(ctx context.Context) error {
	dir := filepath.Join(m.cfg.Server.DataDir, "artifacts")
	// Artifacts are as durable as commits: synchronous = "normal" trades
	// the last ones on a power cut for speed, for both.
	st, err := artifact.Open(dir, artifact.Options{NoSync: m.cfg.Server.Synchronous == "normal"})
	if err != nil {
		return err
	}
	m.tasks.artifacts = st
	m.tasks.opToken = m.env.Getenv(m.cfg.Tasks.OperatorTokenEnv)
	if m.tasks.opToken == "" {
		m.log.Info("no operator token configured: the fleet API's operator endpoints answer loopback callers only",
			"env", m.cfg.Tasks.OperatorTokenEnv)
	}
	if m.cfg.Tasks.Manifest == "" {
		return nil
	}
	if _, err := m.reloadTaskManifest(ctx); err != nil {
		return fmt.Errorf("load the task manifest: %w", err)
	}
	return nil
}

// taskOptions are the HTTP server's work-queue options.
func (m *serverMain) taskOptions() *httpapi.TaskOptions {
	o := &httpapi.TaskOptions{
		Artifacts:        m.tasks.artifacts,
		MaxArtifactBytes: m.cfg.Tasks.MaxArtifactBytes,
		OperatorToken:    m.tasks.opToken,
	}
	if m.cfg.Tasks.Manifest != "" {
		o.Reload = m.reloadTaskManifest
	}
	return o
}

// reloadTaskManifest reads the manifest and syncs the queue with it. On any
// problem nothing changes and the manifest in force stays.
func (m *serverMain) reloadTaskManifest(ctx context.Context) (arbiter.TaskSyncReport, error) {
	m.tasks.mu.Lock()
	defer m.tasks.mu.Unlock()
	path := m.cfg.Tasks.Manifest
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

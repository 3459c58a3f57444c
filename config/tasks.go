package config

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Tasks is the [tasks] section: the work queue (docs/reference/fleet.md).
type Tasks struct {
	// Manifest is the path of the task manifest; "" means no work queue
	// manifest (the queue is empty until one is configured). A relative path
	// is relative to the configuration file's directory.
	Manifest string `toml:"manifest"`
	// OperatorTokenEnv names the environment variable holding the fleet
	// API's X-Operator-Token. Default "ARBITER_OPERATOR_TOKEN". The server
	// reads it at start; unset or empty means the /v1 operator endpoints
	// take loopback callers only.
	OperatorTokenEnv string `toml:"operator_token_env" want:"a string naming an environment variable"`
	// MaxArtifactBytes bounds an uploaded artifact. Default 1 GiB.
	MaxArtifactBytes int64 `toml:"max_artifact_bytes" want:"a whole number of bytes"`
	// OpenWorkerAPI lets anyone use the fleet's /v1 worker endpoints on a
	// server with tokens, naming themselves by X-Lab-Host alone: for
	// workers authenticated in front of the server (a proxy checking client
	// certificates). Default false: a worker needs a client certificate
	// (server.tls_client_ca) or an agent token. The server logs a warning
	// at start when it is on.
	OpenWorkerAPI bool `toml:"open_worker_api"`
}

// Defaults of [tasks].
const (
	DefaultOperatorTokenEnv = "ARBITER_OPERATOR_TOKEN"
	DefaultMaxArtifactBytes = 1 << 30
)

func defaultTasks() Tasks {
	return Tasks{OperatorTokenEnv: DefaultOperatorTokenEnv, MaxArtifactBytes: DefaultMaxArtifactBytes}
}

// resolveTasks makes a relative manifest path relative to the directory of
// the configuration file.
func (t *Tasks) resolve(dir string) {
	if t.Manifest != "" && !filepath.IsAbs(t.Manifest) && dir != "" {
		t.Manifest = filepath.Join(dir, t.Manifest)
	}
}

func (c *Config) validateTasks(ps *problems) {
	t := &c.Tasks
	if strings.ContainsRune(t.Manifest, 0) {
		ps.add("tasks.manifest", "must be a file path")
	}
	if t.OperatorTokenEnv == "" || strings.ContainsAny(t.OperatorTokenEnv, "= \t\r\n\x00") {
		ps.add("tasks.operator_token_env", fmt.Sprintf("%q is not an environment variable name such as ARBITER_OPERATOR_TOKEN", t.OperatorTokenEnv))
	}
	if t.MaxArtifactBytes < 1024 {
		ps.add("tasks.max_artifact_bytes", fmt.Sprintf("must be at least 1024 bytes, got %d", t.MaxArtifactBytes))
	}
}

package config

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestTasksSection(t *testing.T) {
	c, err := Parse(filepath.Join("/etc", "arbiter", "arbiter.toml"), []byte("[tasks]\nmanifest = \"training.toml\"\nmax_artifact_bytes = 2048\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tasks.Manifest != "/etc/arbiter/training.toml" || c.Tasks.MaxArtifactBytes != 2048 || c.Tasks.OperatorTokenEnv != DefaultOperatorTokenEnv {
		t.Errorf("got %+v", c.Tasks)
	}
	c, err = Parse("a.toml", []byte("[tasks]\nmanifest = \"/abs/m.toml\"\noperator_token_env = \"OPS\"\n"), nil)
	if err != nil || c.Tasks.Manifest != "/abs/m.toml" || c.Tasks.OperatorTokenEnv != "OPS" || c.Tasks.MaxArtifactBytes != 1<<30 {
		t.Fatalf("got %+v %v", c, err)
	}
	if d := Default(); d.Tasks.Manifest != "" || d.Tasks.MaxArtifactBytes != DefaultMaxArtifactBytes {
		t.Errorf("default: %+v", d.Tasks)
	}
	for _, tt := range []struct{ doc, want string }{
		{"[tasks]\noperator_token_env = \"\"\n", "a.toml:2: tasks.operator_token_env"},
		{"[tasks]\nmax_artifact_bytes = \"big\"\n", "a.toml:2: tasks.max_artifact_bytes: must be a whole number of bytes"},
		{"[tasks]\nmanifests = \"x\"\n", "a.toml:2: tasks.manifests: unknown key"},
	} {
		if _, err := Parse("a.toml", []byte(tt.doc), nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
}

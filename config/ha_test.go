package config

import (
	"strings"
	"testing"
)

const pgDB = "[server]\ndatabase = \"postgres://db/arbiter\"\n"

// TestHA reads a good [ha] section, with renew_s defaulting to a third of
// the lease and the spalloc address derived from advertise_url.
func TestHA(t *testing.T) {
	doc := pgDB + "spalloc_listen = \"0.0.0.0:22244\"\n[ha]\nenabled = true\nnode_id = \"arbiter-1\"\n" +
		"advertise_url = \"http://arbiter-1.lab:7070\"\nlease_ttl_s = 6\nsecret_env = \"ADMIN\"\n"
	c, err := Parse("a.toml", []byte(doc), env)
	if err != nil {
		t.Fatal(err)
	}
	h := c.HA
	if !h.Enabled || h.NodeID != "arbiter-1" || h.Secret != secret1 || h.Renew() != 2 {
		t.Fatalf("got %+v (renew %v)", h, h.Renew())
	}
	if got := c.SpallocAdvertised(); got != "arbiter-1.lab:22244" {
		t.Fatalf("spalloc advertised as %q", got)
	}
	// Off, the section's keys are not checked: one file serves both.
	if _, err := Parse("a.toml", []byte("[ha]\nnode_id = \"\"\nlease_ttl_s = 10\n"), env); err != nil {
		t.Fatalf("a disabled [ha]: %v", err)
	}
}

func TestHABad(t *testing.T) {
	on := "[ha]\nenabled = true\nnode_id = \"a\"\nadvertise_url = \"http://a:7070\"\nsecret_env = \"ADMIN\"\n"
	tests := []struct{ name, doc, key, msg string }{
		{"sqlite", on, "ha.enabled", "needs PostgreSQL: SQLite is one file with one writer"},
		{"node id", pgDB + strings.Replace(on, `node_id = "a"`, `node_id = "a b"`, 1), "ha.node_id", "every replica needs its own"},
		{"no url", pgDB + strings.Replace(on, `advertise_url = "http://a:7070"`, "", 1), "ha.advertise_url", "want an http:// or https:// URL"},
		{"url with path", pgDB + strings.Replace(on, `http://a:7070`, `http://a:7070/x`, 1), "ha.advertise_url", "is not where"},
		{"https without tls", pgDB + strings.Replace(on, `http://a:7070`, `https://a:7070`, 1), "ha.advertise_url", "disagree"},
		{"ttl", pgDB + on + "lease_ttl_s = 0.5\n", "ha.lease_ttl_s", "1 to 600 seconds"},
		{"renew", pgDB + on + "renew_s = 6\n", "ha.renew_s", "half of lease_ttl_s"},
		{"no secret", pgDB + strings.Replace(on, `secret_env = "ADMIN"`, "", 1), "ha.secret_file", "need a shared secret"},
		{"short secret", pgDB + strings.Replace(on, `"ADMIN"`, `"SHORT"`, 1), "ha.secret_env", "at least 16"},
		{"unset secret", pgDB + strings.Replace(on, `"ADMIN"`, `"NONE"`, 1), "ha.secret_env", "not set or empty"},
		{"spalloc", pgDB + on + "advertise_spalloc = \"a\"\n", "ha.advertise_spalloc", "not host:port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("a.toml", []byte(tt.doc), env)
			if err == nil || !strings.Contains(err.Error(), tt.key+": ") || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %s: …%s…", err, tt.key, tt.msg)
			}
		})
	}
}

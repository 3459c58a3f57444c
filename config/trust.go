package config

import (
	"fmt"
	"os"
)

// Audit is the [audit] section: the audit trail (docs/guides/security.md).
type Audit struct {
	// Keep is how many audit entries the store keeps, the newest. Default
	// 10000; 100 to 1000000.
	Keep int `toml:"keep" want:"a whole number"`
}

// Defaults of the connection limits (Server) and of [spalloc]'s.
const (
	DefaultBodyTimeoutS          = 30
	DefaultIdleTimeoutS          = 120
	DefaultMaxConnsPerClient     = 256
	DefaultSpallocConnsPerClient = 64
)

// validateTrust checks what keeps the server to its own callers: the client
// certificate authorities, the connection limits, the audit trail.
func (c *Config) validateTrust(ps *problems) {
	s := &c.Server
	if s.TLSClientCA != "" {
		if s.TLSCertFile == "" {
			ps.add("server.tls_client_ca", "client certificates need HTTPS: set tls_cert_file and tls_key_file too")
		} else if st, err := os.Stat(s.TLSClientCA); err != nil || !st.Mode().IsRegular() {
			ps.add("server.tls_client_ca", fmt.Sprintf("cannot read %s: give a PEM file of the certificate authorities of the workers' certificates", s.TLSClientCA))
		}
	}
	checkSeconds(ps, "server.body_timeout_s", s.BodyTimeoutS, 1, 3600)
	checkSeconds(ps, "server.idle_timeout_s", s.IdleTimeoutS, 1, 86400)
	if s.MaxConnsPerClient < 0 || s.MaxConnsPerClient > 1000000 {
		ps.add("server.max_conns_per_client", fmt.Sprintf("must be 0 (no limit) to 1000000, got %d", s.MaxConnsPerClient))
	}
	if n := c.Spalloc.MaxConnsPerClient; n < 0 || n > 1000000 {
		ps.add("spalloc.max_conns_per_client", fmt.Sprintf("must be 0 (no limit) to 1000000, got %d", n))
	}
	if k := c.Audit.Keep; k < 100 || k > 1000000 {
		ps.add("audit.keep", fmt.Sprintf("must be 100 to 1000000, got %d", k))
	}
}

package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

// HA is the [ha] section: several server replicas on one PostgreSQL
// database, one of them leading (docs/guides/high-availability.md).
type HA struct {
	Enabled bool `toml:"enabled"`
	// NodeID names this replica: in the lease, the roster, health and the
	// logs. Every replica needs its own; a second process with one in use
	// refuses to start.
	NodeID string `toml:"node_id"`
	// AdvertiseURL is where the other replicas (and clients told who
	// leads) reach this one, e.g. "https://arbiter-1.lab:7070".
	AdvertiseURL string `toml:"advertise_url"`
	// AdvertiseSpalloc is where the other replicas reach this one's
	// spalloc port when it leads; default the host of advertise_url with
	// the port of [server] spalloc_listen.
	AdvertiseSpalloc string `toml:"advertise_spalloc" want:"a string host:port"`
	// LeaseTTLS is how long the leader's lease lasts unrenewed: a follower
	// takes over within it when the leader dies. Default 10; 1 to 600.
	LeaseTTLS float64 `toml:"lease_ttl_s" want:"a number of seconds"`
	// RenewS is the time between renewals (default lease_ttl_s/3, at most
	// half of it).
	RenewS float64 `toml:"renew_s" want:"a number of seconds"`
	// SecretEnv or SecretFile hold the secret the replicas share: a leader
	// believes the caller's address and client certificate that a follower
	// forwards only with it.
	SecretEnv  string `toml:"secret_env" want:"a string naming an environment variable"`
	SecretFile string `toml:"secret_file" want:"a string naming a file"`
	// Secret is the resolved secret ("" when none could be read).
	Secret string `toml:"-"`
}

// DefaultHALeaseTTLS is [ha] lease_ttl_s's default.
const DefaultHALeaseTTLS = 10

func defaultHA() HA { return HA{LeaseTTLS: DefaultHALeaseTTLS} }

// Renew is the time between renewals in seconds, the default filled in.
func (h *HA) Renew() float64 {
	if h.RenewS > 0 {
		return h.RenewS
	}
	return h.LeaseTTLS / 3
}

// resolve reads the shared secret, when the section is on.
func (h *HA) resolve(ps *problems, dir string, getenv func(string) string) {
	if !h.Enabled {
		return
	}
	switch {
	case h.SecretEnv != "" && h.SecretFile != "":
		ps.add("ha.secret_file", "set only one of secret_env and secret_file")
	case h.SecretEnv != "":
		if h.Secret = getenv(h.SecretEnv); h.Secret == "" {
			ps.add("ha.secret_env", fmt.Sprintf("environment variable %s is not set or empty; export the replicas' shared secret in it", h.SecretEnv))
		}
	case h.SecretFile != "":
		s, err := readTokenFile(dir, h.SecretFile)
		if err != nil {
			ps.add("ha.secret_file", err.Error())
		}
		h.Secret = s
	}
}

// validateHA checks [ha] when it is on.
func (c *Config) validateHA(ps *problems) {
	h := &c.HA
	if !h.Enabled {
		return
	}
	if kind, _ := c.Server.DatabaseTarget(); kind != DatabasePostgres {
		ps.add("ha.enabled", "high availability needs PostgreSQL: SQLite is one file with one writer on one host, which no second replica can share; "+
			"set [server] database to a postgres:// URL (docs/guides/high-availability.md)")
	}
	if err := arbiter.ValidateName("node_id", h.NodeID); err != nil {
		ps.add("ha.node_id", err.Error()+"; every replica needs its own, e.g. \"arbiter-1\"")
	}
	if u, err := url.Parse(h.AdvertiseURL); h.AdvertiseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" && u.Path != "/" {
		ps.add("ha.advertise_url", fmt.Sprintf("%q is not where the other replicas reach this one: want an http:// or https:// URL such as \"http://arbiter-1.lab:7070\"", h.AdvertiseURL))
	} else if (u.Scheme == "https") != (c.Server.TLSCertFile != "") {
		ps.add("ha.advertise_url", fmt.Sprintf("%q and the server's TLS disagree: use https:// when tls_cert_file is set and http:// when it is not", h.AdvertiseURL))
	}
	if h.AdvertiseSpalloc != "" {
		if _, _, err := net.SplitHostPort(h.AdvertiseSpalloc); err != nil {
			ps.add("ha.advertise_spalloc", fmt.Sprintf("%q is not host:port", h.AdvertiseSpalloc))
		}
	}
	checkSeconds(ps, "ha.lease_ttl_s", h.LeaseTTLS, 1, 600)
	if h.RenewS != 0 && (!finite(h.RenewS) || h.RenewS < 0.1 || h.RenewS > h.LeaseTTLS/2) {
		ps.add("ha.renew_s", fmt.Sprintf("must be 0.1 seconds to half of lease_ttl_s (%v), got %v", h.LeaseTTLS/2, h.RenewS))
	}
	switch {
	case h.SecretEnv == "" && h.SecretFile == "":
		ps.add("ha.secret_file", "the replicas need a shared secret: set secret_file (a file only arbiter may read) or secret_env")
	case h.Secret != "" && utf8.RuneCountInString(h.Secret) < MinSecretLen:
		key := "ha.secret_file"
		if h.SecretEnv != "" {
			key = "ha.secret_env"
		}
		ps.add(key, fmt.Sprintf("the secret is %d characters; use at least %d (e.g. openssl rand -hex 32)", utf8.RuneCountInString(h.Secret), MinSecretLen))
	}
}

// SpallocAdvertised is where the other replicas reach this one's spalloc
// port: advertise_spalloc, else advertise_url's host with spalloc_listen's
// port ("" when spalloc is off).
func (c *Config) SpallocAdvertised() string {
	if c.Server.SpallocListen == "" {
		return ""
	}
	if c.HA.AdvertiseSpalloc != "" {
		return c.HA.AdvertiseSpalloc
	}
	_, port, _ := net.SplitHostPort(c.Server.SpallocListen)
	u, err := url.Parse(c.HA.AdvertiseURL)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(strings.Trim(u.Hostname(), "[]"), port)
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/config"
	"github.com/arbiter-hq/arbiter/connlimit"
	"github.com/arbiter-hq/arbiter/httpapi"
)

// The server's trust and safety wiring (docs/guides/security.md): tokens
// (and their reload), client certificates, the audit trail's entries that
// do not come through HTTP.

// apiTokens are the configuration's tokens for the HTTP server.
func apiTokens(cfg *config.Config) []httpapi.Token {
	out := make([]httpapi.Token, len(cfg.Tokens))
	for i, t := range cfg.Tokens {
		out[i] = httpapi.Token{Name: t.Name, Role: t.Role, Secret: t.Secret, SHA256: t.Sum()}
	}
	return out
}

// clientCAs reads [server] tls_client_ca: the pool client certificates are
// checked against, nil when none is configured.
func clientCAs(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tls_client_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls_client_ca %s holds no PEM certificate", path)
	}
	return pool, nil
}

// tlsConfig is the listener's TLS: the server's certificate and, with
// tls_client_ca, client certificates verified when a client offers one
// (fleet workers); clients without one still connect and use tokens.
func tlsConfig(s *config.Server) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	pool, err := clientCAs(s.TLSClientCA)
	if err != nil {
		return nil, err
	}
	if pool != nil {
		c.ClientCAs, c.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return c, nil
}

// reloadTokens puts cfg's tokens in force and ends the dashboard sessions
// of tokens removed or changed. Errors: as httpapi.Server.SetTokens (the
// tokens in force stay).
func (m *serverMain) reloadTokens(ctx context.Context, cfg *config.Config) error {
	if err := m.api.SetTokens(apiTokens(cfg)); err != nil {
		return err
	}
	n, err := arbiter.Do(ctx, m.loop, arbiter.EndSessions{Keep: m.api.TokenFingerprints()})
	if err != nil {
		return fmt.Errorf("end the sessions of removed tokens: %w", err)
	}
	m.log.Info("tokens reloaded", "tokens", len(cfg.Tokens), "sessions_ended", n)
	return nil
}

// auditLocal records an admin action of this host (a signal), not of an
// HTTP caller.
func (m *serverMain) auditLocal(ctx context.Context, action, detail string) {
	if m.api != nil {
		m.api.Audit(ctx, arbiter.AuditEntry{Via: "signal", Address: "local", Action: action, Detail: detail})
	}
}

// minBodyRate is the slowest a large request body may arrive on average
// (httpio.BodyDeadline): body_timeout_s, plus a second for every 64 KiB.
const minBodyRate = 64 << 10

// limitConns bounds ln's connections per client address (0: no limit),
// logging the refused at most once every 10 seconds.
func limitConns(ln net.Listener, perClient int, log *slog.Logger, what string) net.Listener {
	if perClient <= 0 {
		return ln
	}
	var last atomic.Int64
	var refused atomic.Int64
	return connlimit.New(ln, perClient, func(remote net.Addr) {
		n := refused.Add(1)
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev > int64(10*time.Second) && last.CompareAndSwap(prev, now) {
			log.Warn("connections refused: a client holds too many", "listener", what, "client", remote.String(),
				"max_conns_per_client", perClient, "refused_so_far", n)
		}
	})
}

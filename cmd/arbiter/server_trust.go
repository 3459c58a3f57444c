package main

import (
	"context"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/config"
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

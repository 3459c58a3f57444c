package arbiter

import "time"

// Dashboard sessions (docs/guides/security.md, "The dashboard"). Signing in
// with a token gives the browser an opaque, random session id in its
// cookie; the server keeps the session, under the SHA-256 of that id, as a
// record. The cookie is therefore neither the token nor anything a reader
// of the store could present. A session ends when it expires, when its
// holder logs out, and when its token is removed or changed: it remembers
// the token's fingerprint, and a session whose token no longer matches is
// not honoured (and is removed at the next reload).

// RecordSession is the record kind of sessions (key: Session.ID).
const RecordSession = "session"

// Session lifetime and bounds.
const (
	SessionTTL = 7 * 24 * time.Hour
	// MaxSessionsPerPrincipal bounds the sessions of one token: signing
	// in again past it ends that token's oldest session.
	MaxSessionsPerPrincipal = 64
)

// Session is a signed-in dashboard. ID is the hex SHA-256 of the id in the
// cookie; TokenFP fingerprints the token it was signed in with (hex, the
// SHA-256 of the token's SHA-256), so that a changed token ends it.
type Session struct {
	ID        string    `json:"id"`
	Principal string    `json:"principal"`
	Role      string    `json:"role"`
	TokenFP   string    `json:"token_fp"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// StartSession keeps a new session for TTL (at most SessionTTL; its
// CreatedAt and ExpiresAt are the engine's now and now + TTL). Result:
// Session. Errors: invalid for a malformed id, principal or TTL.
type StartSession struct {
	Session Session
	TTL     time.Duration
}

// EndSession ends the session with this ID (log out). Ending one that does
// not exist is no error. Result: None.
type EndSession struct {
	ID string
}

// EndSessions ends every session whose token is not in Keep (principal →
// token fingerprint) as it is now: tokens removed or changed by a reload.
// Result: int, how many ended.
type EndSessions struct {
	Keep map[string]string
}

func (StartSession) isCommand()      {}
func (StartSession) result() Session { return Session{} }
func (EndSession) isCommand()        {}
func (EndSession) result() None      { return None{} }
func (EndSessions) isCommand()       {}
func (EndSessions) result() int      { return 0 }

package httpapi

// Dashboard sessions (arbiter.Session): signing in with a token gives the
// browser a random session id (256 bits) in its cookie, never the token.
// The server keeps the session as a record through the control plane,
// under the SHA-256 of the id, so it survives a restart and a copy of the
// store holds nothing a browser could present. A session is honoured while
// it has not expired and its token is still configured with the same
// secret; log out ends it, and so does a reload that removes or changes
// its token.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/ui"
)

// sessionIDBytes is the entropy of a session id.
const sessionIDBytes = 32

// sessionKey is the record key of a cookie's session: the hex SHA-256 of
// its value; "" for a value that cannot be a session id.
func sessionKey(cookie string) string {
	if len(cookie) != base64.RawURLEncoding.EncodedLen(sessionIDBytes) {
		return ""
	}
	sum := sha256.Sum256([]byte(cookie))
	return hex.EncodeToString(sum[:])
}

// signIn checks a token typed into the dashboard's sign-in form and starts
// a session for its holder; the cookie carries the session's id.
func (s *Server) signIn(ctx context.Context, secret string) (string, arbiter.Caller, bool) {
	t := s.tokens.get().lookup(secret)
	if t == nil {
		return "", arbiter.Caller{}, false
	}
	var raw [sessionIDBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", arbiter.Caller{}, false
	}
	cookie := base64.RawURLEncoding.EncodeToString(raw[:])
	_, err := arbiter.Do(ctx, s.plane, arbiter.StartSession{Session: arbiter.Session{
		ID: sessionKey(cookie), Principal: t.caller.Name, Role: t.caller.Role, TokenFP: t.fp,
	}, TTL: arbiter.SessionTTL})
	if err != nil {
		s.log.Warn("dashboard sign-in: the session could not be kept", "err", err)
		return "", arbiter.Caller{}, false
	}
	return cookie, t.caller, true
}

// signOut ends the cookie's session.
func (s *Server) signOut(ctx context.Context, cookie string) {
	if key := sessionKey(cookie); key != "" {
		if _, err := s.plane.Do(ctx, arbiter.EndSession{ID: key}); err != nil {
			s.log.Warn("dashboard log out: the session could not be ended", "err", err)
			return
		}
		s.tokens.recheck() // its streams under way end too
	}
}

// sessionCaller returns who r's session cookie signed in, if the session
// is live and its token unchanged; the token's role is the one in force.
func (s *Server) sessionCaller(r *http.Request) (arbiter.Caller, bool) {
	sess, ok := s.session(r)
	if !ok {
		return arbiter.Caller{}, false
	}
	t := s.tokens.get().byName[sess.Principal]
	if t == nil || t.fp != sess.TokenFP {
		return arbiter.Caller{}, false // the token was removed or changed
	}
	return t.caller, true
}

// session returns r's session cookie's session, if it is live.
func (s *Server) session(r *http.Request) (arbiter.Session, bool) {
	c, err := r.Cookie(ui.CookieName)
	if err != nil {
		return arbiter.Session{}, false
	}
	key := sessionKey(c.Value)
	if key == "" {
		return arbiter.Session{}, false
	}
	v, ok := s.plane.Record(arbiter.RecordSession, key)
	if !ok {
		return arbiter.Session{}, false
	}
	var sess arbiter.Session
	switch x := v.(type) {
	case arbiter.Session:
		sess = x
	case *arbiter.Session:
		sess = *x
	case json.RawMessage:
		if json.Unmarshal(x, &sess) != nil {
			return arbiter.Session{}, false
		}
	default:
		return arbiter.Session{}, false
	}
	if sess.ID != key || !time.Now().Before(sess.ExpiresAt) {
		return arbiter.Session{}, false
	}
	return sess, true
}

package arbiter

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"time"
)

// Lock bounds (docs/reference/coordination.md §1): a TTL is clamped to [LockTTLMin,
// LockTTLMax]; a request that gives none gets LockTTLDefault.
const (
	LockTTLMin     = time.Second
	LockTTLMax     = 24 * time.Hour
	LockTTLDefault = 15 * time.Minute

	// MaxLockHolderBytes and MaxLockNoteBytes bound the descriptive fields.
	MaxLockHolderBytes = 128
	MaxLockNoteBytes   = 1024
	// MaxLockTokenBytes bounds a presented token; real ones are 32 hex digits.
	MaxLockTokenBytes = 256
)

// Event kinds of locks. The subject is "lock/NAME"; the data is a LockEvent.
const (
	EventLockAcquired = "lock.acquired"
	EventLockExtended = "lock.extended"
	EventLockReleased = "lock.released"
	EventLockExpired  = "lock.expired"
)

// RecordLock is the record kind of held locks (key: the lock name).
const RecordLock = "lock"

// Lock is a held lock as the engine keeps and stores it: a named, TTL-bounded
// exclusive reservation. The token itself is never kept: only its SHA-256,
// so neither a read nor a stolen database gives it away. Fence is the
// lock's fencing number: every new acquisition of any lock gets a larger one,
// never reused, so a guarded resource can refuse a caller whose number is
// older than one it has already seen.
type Lock struct {
	Name       string    `json:"name"`
	Holder     string    `json:"holder"`
	TokenHash  string    `json:"token_sha256"`
	Fence      int64     `json:"fence"`
	AcquiredAt time.Time `json:"acquired_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Note       string    `json:"note"`
}

// LockState is the public view of a lock: never the token. A free lock is
// {"held": false} (with its name in native answers).
type LockState struct {
	Name             string     `json:"name,omitempty"`
	Held             bool       `json:"held"`
	Holder           string     `json:"holder,omitempty"`
	AcquiredAt       *time.Time `json:"acquired_at,omitempty"`
	ExpiresAt        *time.Time `json:"expires_at,omitempty"`
	SecondsRemaining *int64     `json:"seconds_remaining,omitempty"`
	Note             *string    `json:"note,omitempty"`
	Fence            int64      `json:"fence,omitempty"`
}

// Public returns the token-free view of l at time now.
func (l *Lock) Public(now time.Time) LockState {
	acq, exp, note := l.AcquiredAt, l.ExpiresAt, l.Note
	left := max(int64(exp.Sub(now)/time.Second), 0)
	return LockState{
		Name: l.Name, Held: true, Holder: l.Holder,
		AcquiredAt: &acq, ExpiresAt: &exp, SecondsRemaining: &left, Note: &note, Fence: l.Fence,
	}
}

// Matches reports, in constant time, whether token is this lock's token.
func (l *Lock) Matches(token string) bool {
	if token == "" || l.TokenHash == "" {
		return false
	}
	h := HashLockToken(token)
	return subtle.ConstantTimeCompare([]byte(h), []byte(l.TokenHash)) == 1
}

// FreeLock is the public view of a lock nobody holds.
func FreeLock(name string) LockState { return LockState{Name: name} }

// HashLockToken returns the hex SHA-256 of a lock token, the form in which
// tokens are kept. Tokens are 128-bit random values, so no salt is needed.
func HashLockToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ClampLockTTL clamps d to [LockTTLMin, LockTTLMax]; 0 gives LockTTLDefault.
func ClampLockTTL(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return LockTTLDefault
	case d < LockTTLMin:
		return LockTTLMin
	case d > LockTTLMax:
		return LockTTLMax
	}
	return d
}

// ValidateLockName checks a lock name: 1 to 128 letters, digits, '.', '_',
// '-' or ':' (as in "swap:vllm"), starting with a letter or digit. Names
// reach URLs and logs.
func ValidateLockName(s string) error {
	if s == "" {
		return Errorf(EInvalid, "lock name must not be empty")
	}
	if len(s) > 128 {
		return Errorf(EInvalid, "lock name %.40q… is longer than 128 characters", s)
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			(i > 0 && (r == '.' || r == '_' || r == '-' || r == ':'))
		if !ok {
			return Errorf(EInvalid, "lock name %q may only hold letters, digits, '.', '_', '-' and ':' (not first)", s)
		}
	}
	return nil
}

// LockEvent is the data of a lock event: the public state after the change
// (for a release or expiry, the state it had), whether an admin forced the
// release, and who did it.
type LockEvent struct {
	LockState
	Forced bool   `json:"forced,omitempty"`
	By     string `json:"by,omitempty"`
}

// LockHeldError refuses an operation because someone else holds a lock. It
// carries the lock's public state so that answers can show who holds it and
// until when. Its code (through Unwrap) is conflict for an acquisition and
// locked for a guarded operation such as a swap.
type LockHeldError struct {
	Lock LockState
	err  *Error
}

// NewLockHeldError returns a LockHeldError with the given code (EConflict or
// ELocked) for the lock whose public state is st.
func NewLockHeldError(code string, st LockState, what string) *LockHeldError {
	until := ""
	if st.ExpiresAt != nil {
		until = " until " + st.ExpiresAt.UTC().Format(time.RFC3339)
	}
	msg := fmt.Sprintf("lock %q is held by %q%s; %s", st.Name, st.Holder, until, what)
	return &LockHeldError{Lock: st, err: Errorf(code, "%s", msg)}
}

// LockHeldErrorFrom rebuilds a LockHeldError from an answer that carried
// its code, message and the lock's public state (the Go client does).
func LockHeldErrorFrom(code, message string, st LockState) *LockHeldError {
	return &LockHeldError{Lock: st, err: &Error{Code: code, Message: message}}
}

func (e *LockHeldError) Error() string { return e.err.Message }

// Unwrap gives the *Error with the code and message.
func (e *LockHeldError) Unwrap() error { return e.err }

// AcquireLock takes a lock, or extends it for whoever presents its token.
// Result: LockGrant.
//
// A free (or expired) lock is taken with a new token, NewToken, and the next
// fencing number. A held lock whose token is Token is extended: it now
// expires TTL from now, Holder and Note replace the old ones when not empty,
// token and fence stay. A held lock without the right Token — whatever the
// Holder says — is refused with a *LockHeldError (conflict).
//
// The engine never draws random numbers: the transport draws NewToken (128
// random bits) and passes it in, so applying the same commands always gives
// the same state. Errors: invalid for a bad name, an empty holder, a note or
// holder that is too long, or no NewToken.
type AcquireLock struct {
	Caller   Caller
	Name     string
	Holder   string
	TTL      time.Duration // clamped with ClampLockTTL
	Note     string
	Token    string // the token presented, to extend a lock already held
	NewToken string // the token a new acquisition gets
}

// ExtendLock moves a held lock's expiry to TTL from now for whoever presents
// its token; Note, when not nil, replaces the note. Result: LockGrant
// (without the token). Errors: conflict when the lock is not held (it may
// have expired: acquire it again), forbidden when Token is not its token.
type ExtendLock struct {
	Caller Caller
	Name   string
	Token  string
	TTL    time.Duration // clamped with ClampLockTTL
	Note   *string
}

// ReleaseLock frees a lock for whoever presents its token, or for an admin
// with Force (no token needed: the human override). Result: LockRelease;
// releasing a lock nobody holds returns Released false and changes nothing.
// Errors: forbidden when Token is not the lock's token, or Force comes from a
// caller who is not an admin.
type ReleaseLock struct {
	Caller Caller
	Name   string
	Token  string
	Force  bool
}

// LockGrant is the result of AcquireLock and ExtendLock: the public state
// and, for AcquireLock only, the token (the one secret the caller must keep).
type LockGrant struct {
	LockState
	Token string `json:"token,omitempty"`
}

// LockRelease is the result of ReleaseLock: whether a lock was freed, and
// its public state just before.
type LockRelease struct {
	Released bool      `json:"released"`
	Lock     LockState `json:"lock"`
}

func (AcquireLock) isCommand()          {}
func (AcquireLock) result() LockGrant   { return LockGrant{} }
func (ExtendLock) isCommand()           {}
func (ExtendLock) result() LockGrant    { return LockGrant{} }
func (ReleaseLock) isCommand()          {}
func (ReleaseLock) result() LockRelease { return LockRelease{} }

package arbiter

import (
	"errors"
	"fmt"
)

// Error codes. Each maps to one HTTP status in httpapi and back in its client.
const (
	EInvalid      = "invalid"      // the request is malformed or breaks a rule
	ENotFound     = "not_found"    // the named thing does not exist
	EConflict     = "conflict"     // the request clashes with the current state
	EUnauthorized = "unauthorized" // no valid credential
	EForbidden    = "forbidden"    // the credential lacks the role
	ELocked       = "locked"       // a lock guards the operation
	ETooLarge     = "too_large"    // the body or upload is over its limit
	EUnavailable  = "unavailable"  // the server cannot take the request now (shutting down, not leader)
	EInternal     = "internal"     // anything else; details are logged, not shown
)

// Error is an application error: a code from the list above and a message a
// person can act on. Errors that are not *Error reach users as "internal error".
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err if it is (or wraps) an *Error, and
// EInternal otherwise. A nil error has no code.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// ErrorMessage returns the message of an *Error, or "internal error" for any
// other error so that internals never leak to users.
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

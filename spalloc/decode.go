package spalloc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

// DispatchError is a request that cannot be dispatched: not UTF-8, not a
// JSON object, no string "command", an unknown command, "args" not a list,
// "kwargs" not an object. The protocol closes the connection without a
// reply; the error says why, for the server's log.
type DispatchError struct{ Reason string }

func (e *DispatchError) Error() string { return "spalloc: undispatchable request: " + e.Reason }

func undispatchable(format string, args ...any) error {
	return &DispatchError{Reason: fmt.Sprintf(format, args...)}
}

// call is a decoded request: a known command with its arguments. Values are
// raw JSON, converted when the command binds them.
type call struct {
	cmd    *command
	args   []json.RawMessage
	kwargs map[string]json.RawMessage // without "client"
}

// decode parses one request line. blank reports an empty line (to be
// ignored); err is a *DispatchError.
func decode(line []byte) (c call, blank bool, err error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return c, true, nil
	}
	if !utf8.Valid(line) {
		return c, false, undispatchable("not UTF-8")
	}
	if line[0] != '{' {
		return c, false, undispatchable("not a JSON object")
	}
	var command, args, kwargs []byte
	sc := scanner{b: line}
	err = sc.object(func(key string, raw []byte) {
		switch key {
		case "command":
			command = raw
		case "args":
			args = raw
		case "kwargs":
			kwargs = raw
		}
	})
	if err == nil {
		if sc.ws(); sc.i != len(line) {
			err = sc.fail("data after the object")
		}
	}
	if err != nil {
		return c, false, undispatchable("%v", err)
	}
	if command == nil {
		return c, false, undispatchable("no \"command\"")
	}
	if command[0] != '"' {
		return c, false, undispatchable("\"command\" is not a string")
	}
	name := unquote(command)
	if c.cmd = commands[name]; c.cmd == nil {
		return c, false, undispatchable("unknown command %q", arbiter.Clip(name, 40))
	}
	if args != nil {
		if args[0] != '[' {
			return c, false, undispatchable("\"args\" is not a list")
		}
		as := scanner{b: args}
		_ = as.array(func(raw []byte) { c.args = append(c.args, raw) }) // valid: scanned above
	}
	if kwargs != nil {
		if kwargs[0] != '{' {
			return c, false, undispatchable("\"kwargs\" is not an object")
		}
		c.kwargs = map[string]json.RawMessage{}
		ks := scanner{b: kwargs}
		_ = ks.object(func(key string, raw []byte) {
			if key != "client" {
				c.kwargs[key] = raw
			}
		})
	}
	return c, false, nil
}

// ArgError is a command whose arguments are wrong: its message is the
// exception the client gets.
type ArgError struct{ Message string }

func (e *ArgError) Error() string { return e.Message }

func argErrorf(format string, args ...any) error {
	return &ArgError{Message: fmt.Sprintf(format, args...)}
}

// isNull reports whether a raw value is absent or JSON null: not given.
func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// asInt reads an integer: 1 and 1.0 are the same integer.
func asInt(name string, raw json.RawMessage) (int64, error) {
	s := string(raw)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	if len(s) > 0 && (s[0] == '-' || s[0] >= '0' && s[0] <= '9') {
		if f, err := strconv.ParseFloat(s, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return int64(f), nil
		}
	}
	return 0, argErrorf("%s must be an integer, not %s", name, arbiter.Clip(s, 40))
}

// asSmallInt reads an integer that fits comfortably in an int (coordinates,
// board counts): beyond ±2^31 nothing can match anyway.
func asSmallInt(name string, raw json.RawMessage) (int, error) {
	n, err := asInt(name, raw)
	if err != nil {
		return 0, err
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, argErrorf("%s must be an integer between %d and %d, not %d", name, math.MinInt32, math.MaxInt32, n)
	}
	return int(n), nil
}

func asString(name string, raw json.RawMessage) (string, error) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", argErrorf("%s must be a string, not %s", name, arbiter.Clip(string(raw), 40))
	}
	return unquote(raw), nil
}

func asFloat(name string, raw json.RawMessage) (float64, error) {
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') || math.IsInf(f, 0) {
		return 0, argErrorf("%s must be a number, not %s", name, arbiter.Clip(string(raw), 40))
	}
	return f, nil
}

func asBool(name string, raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, argErrorf("%s must be true or false, not %s", name, arbiter.Clip(string(raw), 40))
}

func asStrings(name string, raw json.RawMessage) ([]string, error) {
	var out []string
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &out) != nil {
		return nil, argErrorf("%s must be a list of strings, not %s", name, arbiter.Clip(string(raw), 40))
	}
	return out, nil
}

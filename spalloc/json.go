package spalloc

import (
	"encoding/json"
	"errors"
	"fmt"
)

// A small strict JSON scanner for request lines: it validates a whole line
// (RFC 8259: no NaN, no trailing data) and hands out the raw bytes of the
// values the protocol needs, which encoding/json's reflection would spend
// most of a request's time on. Values are converted when a command binds
// them.

// maxDepth bounds nesting: deeper requests are refused (undispatchable)
// rather than recursed into.
const maxDepth = 128

var errSyntax = errors.New("invalid JSON")

type scanner struct {
	b     []byte
	i     int
	depth int
}

func (s *scanner) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", errSyntax, what, s.i)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value skips one value, checking its syntax, and returns its raw bytes.
func (s *scanner) value() ([]byte, error) {
	s.ws()
	start := s.i
	if s.i >= len(s.b) {
		return nil, s.fail("value expected")
	}
	var err error
	switch c := s.b[s.i]; {
	case c == '"':
		err = s.str()
	case c == '{':
		err = s.object(nil)
	case c == '[':
		err = s.array(nil)
	case c == '-' || c >= '0' && c <= '9':
		err = s.number()
	default:
		err = s.literal()
	}
	if err != nil {
		return nil, err
	}
	return s.b[start:s.i], nil
}

func (s *scanner) literal() error {
	for _, lit := range []string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return nil
		}
	}
	return s.fail("unexpected character")
}

func (s *scanner) str() error {
	s.i++ // opening quote
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return nil
		case c < 0x20:
			return s.fail("control character in string")
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return s.fail("unfinished escape")
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 {
					return s.fail("unfinished \\u escape")
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return s.fail("bad \\u escape")
					}
				}
				s.i += 5
			default:
				return s.fail("bad escape")
			}
		default:
			s.i++
		}
	}
	return s.fail("unterminated string")
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

func (s *scanner) number() error {
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if s.digits() == 0 {
		return s.fail("bad number")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return s.fail("bad number")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			return s.fail("bad number")
		}
	}
	return nil
}

func (s *scanner) enter() error {
	s.depth++
	if s.depth > maxDepth {
		return s.fail("nested too deeply")
	}
	return nil
}

// object scans an object; member, if not nil, gets each key (unescaped)
// and value's raw bytes.
func (s *scanner) object(member func(key string, raw []byte)) error {
	if err := s.enter(); err != nil {
		return err
	}
	s.i++ // '{'
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return s.fail("object key expected")
		}
		start := s.i
		if err := s.str(); err != nil {
			return err
		}
		rawKey := s.b[start:s.i]
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return s.fail("':' expected")
		}
		s.i++
		v, err := s.value()
		if err != nil {
			return err
		}
		if member != nil {
			member(unquote(rawKey), v)
		}
		s.ws()
		if s.i >= len(s.b) {
			return s.fail("unterminated object")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("',' or '}' expected")
		}
	}
}

// array scans an array; elem, if not nil, gets each element's raw bytes.
func (s *scanner) array(elem func(raw []byte)) error {
	if err := s.enter(); err != nil {
		return err
	}
	s.i++ // '['
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return nil
	}
	for {
		v, err := s.value()
		if err != nil {
			return err
		}
		if elem != nil {
			elem(v)
		}
		s.ws()
		if s.i >= len(s.b) {
			return s.fail("unterminated array")
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return nil
		default:
			return s.fail("',' or ']' expected")
		}
	}
}

// unquote returns the string a valid raw JSON string spells.
func unquote(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c == '\\' {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return string(inner)
			}
			return s
		}
	}
	return string(inner)
}

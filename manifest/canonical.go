package manifest

import (
	"bytes"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

// The canonical JSON of a task's identity is, byte for byte, what Python's
// json.dumps(v, sort_keys=True, separators=(",", ":")) writes for the same
// TOML values (tomllib), so that an operator's Python tooling computes the
// same task ids as the server:
//
//   - keys sorted by code point, no white space;
//   - strings ASCII only (ensure_ascii): '"' and '\\' escaped, \n \r \t \b
//     \f, every other character outside ' '..'~' as \uXXXX in lowercase hex,
//     characters beyond U+FFFF as a surrogate pair;
//   - integers in decimal; floats as Python's repr: the shortest digits that
//     read back the same, "1.0" for an integral float (TOML keeps 1 and 1.0
//     apart, and so does the id), and exponent notation ("1e-05", "1e+16")
//     when the decimal exponent is below -4 or above 15.
//
// Decision: before this, floats were written as Go's encoding/json writes
// them (1.0 as 1, 1e-05 as 0.00001) and non-ASCII characters as UTF-8, which
// contradicted the documented Python equivalence. Ids of manifests without
// such values are unchanged (TestIDStable pins one).

// writeCanonical appends the canonical JSON of a plain value (what plain
// returns: map[string]any, []any, string, int64, float64, bool).
func writeCanonical(b *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // byte order of UTF-8 is code point order
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case string:
		writeString(b, x)
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("nan and inf have no JSON form; use a number")
		}
		b.WriteString(pythonFloat(x))
	default:
		return fmt.Errorf("unsupported value of type %T", v)
	}
	return nil
}

// pythonFloat formats f as Python's repr(float) does.
func pythonFloat(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // shortest digits: "-1.5e-05", "1e+16"
	exp, _ := strconv.Atoi(e[strings.LastIndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e // Go, like Python, writes the exponent's sign and at least two digits
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// writeString appends s as a JSON string the way Python's json.dumps does
// with ensure_ascii (the default).
func writeString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	u := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r >= ' ' && r <= '~':
			b.WriteByte(byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			u(r1)
			u(r2)
		default:
			u(r)
		}
	}
	b.WriteByte('"')
}

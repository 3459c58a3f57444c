package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/arbiter-hq/arbiter/tomlpos"
)

// Error is one problem with a configuration. Its message reads
// "FILE:LINE: KEY: MESSAGE", leaving out what is unknown: File is as given
// to Load or Parse ("" from Config.Validate), Line is 0 when the problem has
// no place in the file, and Key is a dotted path with array indices, e.g.
// "machines[1].gpus[0].vram_gib". Entry is never set.
type Error = tomlpos.Error

// problems collects what validation finds, keyed by path.
type problems struct {
	list    []problem
	covered map[string]bool // the keys of list and all their ancestors
}

type problem struct{ key, msg string }

// add records a problem unless one was already recorded at key or below it:
// the first, most precise report of a problem is enough.
func (ps *problems) add(key, msg string) {
	if ps.has(key) {
		return
	}
	if ps.covered == nil {
		ps.covered = map[string]bool{}
	}
	ps.list = append(ps.list, problem{key, msg})
	for k := key; k != "" && !ps.covered[k]; k = tomlpos.Parent(k) {
		ps.covered[k] = true
	}
}

// has reports whether a problem was recorded at key or below it.
func (ps *problems) has(key string) bool { return ps.covered[key] }

// errors places each problem at its line (when ix is not nil) and returns
// them in file order: one *Error, or several joined.
// A problem at a key a command-line flag set (flags) names the flag and
// has no line.
func (ps *problems) errors(file string, ix *tomlpos.Index, flags map[string]string) error {
	l := tomlpos.List{File: file}
	for _, p := range ps.list {
		e := &Error{File: file, Key: p.key, Message: p.msg}
		if f, ok := flags[p.key]; ok {
			e.Key = f + " (" + p.key + ")"
		} else if ix != nil {
			e.Line, _ = ix.Line(p.key)
		}
		l.Add(e)
	}
	return l.Err()
}

// decodeError turns go-toml's errors into *Error: the key is found by
// position in the document, since go-toml's own key has no array indices.
func decodeError(file string, data []byte, err error) error {
	ix := tomlpos.NewIndex(data)
	var se *toml.StrictMissingError
	if errors.As(err, &se) {
		l := tomlpos.List{File: file}
		for i := range se.Errors {
			if i == tomlpos.MaxErrors {
				// Placing a key costs a walk of the index; the rest are
				// only counted.
				l.Skip(len(se.Errors) - i)
				break
			}
			line, col := se.Errors[i].Position()
			key := ix.At(ix.Offset(line, col))
			if key == "" {
				key = joinKey(se.Errors[i].Key())
			}
			l.Add(&Error{File: file, Line: line, Key: key, Message: unknownKey(key)})
		}
		return l.Err()
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col := de.Position()
		key := ix.At(ix.Offset(line, col))
		if key == "" {
			key = joinKey(de.Key())
		}
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		switch {
		case ix.Err() != nil:
			msg = "invalid TOML: " + msg
		case strings.HasPrefix(msg, "cannot decode TOML "):
			if want := describe(key); want != "" {
				msg = "must be " + want
			}
		case strings.Contains(msg, "too large to fit"), strings.Contains(msg, "overflow"):
			msg = "number is too large"
		}
		return &Error{File: file, Line: line, Key: key, Message: msg}
	}
	return fmt.Errorf("%s: %w", file, err)
}

// fieldNamed returns ".FIELD" for the first of fields that msg (a
// vocabulary's Validate message) is about — it starts with it, or names it
// after the entry ("service \"s\": gpus must …") — or "" for none: the
// problem is then placed at the entry.
func fieldNamed(msg string, fields ...string) string {
	if _, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "service ") {
		msg = rest
	}
	for _, f := range fields {
		if strings.HasPrefix(msg, f+" ") || strings.HasPrefix(msg, f+":") {
			return "." + f
		}
	}
	return ""
}

// joinKey spells go-toml's key (no array indices) as a path.
func joinKey(parts []string) string {
	key := ""
	for _, part := range parts {
		key = tomlpos.Join(key, tomlpos.Part(part))
	}
	return key
}

// unknownKey says that key is not known and lists the keys allowed there.
func unknownKey(key string) string {
	t := schemaType(tomlpos.Parent(key))
	if t == nil || t.Kind() != reflect.Struct {
		return "unknown key"
	}
	names := tomlpos.FieldNames(t)
	if tomlpos.Parent(key) == "" {
		return "unknown section; the sections are " + strings.Join(names, ", ")
	}
	return "unknown key; the keys allowed here are " + strings.Join(names, ", ")
}

// describe says what a value at key must be, from the field's want tag or
// its Go type; "" when key is not in the schema.
func describe(key string) string {
	t, want := schemaField(key)
	if want != "" || t == nil {
		return want
	}
	return tomlpos.Describe(t)
}

// schemaType is the Go type of the value at key in the decoded file.
func schemaType(key string) reflect.Type {
	t, _ := schemaField(key)
	return t
}

// schemaField walks the file's type along key ("machines[0].gpus[1].count":
// field machines, element, field gpus, element, field count) and returns
// the type there and the want tag of the last field, if the key ends in one.
func schemaField(key string) (reflect.Type, string) {
	t := reflect.TypeOf(file{})
	want := ""
	if key == "" {
		return t, ""
	}
	for _, part := range splitKey(key) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if part == "[]" {
			if t.Kind() != reflect.Slice {
				return nil, ""
			}
			t, want = t.Elem(), ""
			continue
		}
		if t.Kind() != reflect.Struct {
			return nil, ""
		}
		f, ok := tomlpos.Field(t, part)
		if !ok {
			return nil, ""
		}
		t, want = f.Type, f.Tag.Get("want")
	}
	return t, want
}

// splitKey splits a path into field names and "[]" for each index. Quoted
// parts are not in the schema, so the split need not understand quotes.
func splitKey(key string) []string {
	var parts []string
	for _, dotted := range strings.Split(key, ".") {
		name, rest, _ := strings.Cut(dotted, "[")
		parts = append(parts, name)
		for n := strings.Count(rest, "["); n >= 0 && rest != ""; n-- {
			parts = append(parts, "[]")
		}
	}
	return parts
}

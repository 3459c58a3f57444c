package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Error is one problem with a configuration. Its message reads
// "FILE:LINE: KEY: MESSAGE", leaving out what is unknown.
type Error struct {
	File    string // as given to Load or Parse; "" from Config.Validate
	Line    int    // 1-based; 0 when the problem has no place in the file
	Key     string // dotted path with array indices, e.g. "machines[1].gpus[0].vram_gib"
	Message string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteString(":" + strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

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
	for k := key; k != "" && !ps.covered[k]; k = parent(k) {
		ps.covered[k] = true
	}
}

// has reports whether a problem was recorded at key or below it.
func (ps *problems) has(key string) bool { return ps.covered[key] }

// errors places each problem at its line (when ix is not nil) and returns
// them in file order: one *Error, or several joined.
func (ps *problems) errors(file string, ix *index) error {
	errs := make([]*Error, 0, len(ps.list))
	for _, p := range ps.list {
		e := &Error{File: file, Key: p.key, Message: p.msg}
		if ix != nil {
			e.Line, _ = ix.lineOf(p.key)
		}
		errs = append(errs, e)
	}
	return joinErrors(file, errs, 0)
}

// maxErrors bounds the problems reported at once: past a screenful, more
// do not help, and a broken file must not cost time quadratic in its size.
const maxErrors = 20

// joinErrors sorts errs by line and joins the first maxErrors, counting the
// rest and more (problems found but not placed).
func joinErrors(file string, errs []*Error, more int) error {
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
	if len(errs) == 1 && more == 0 {
		return errs[0]
	}
	if len(errs) > maxErrors {
		more += len(errs) - maxErrors
		errs = errs[:maxErrors]
	}
	out := make([]error, 0, len(errs)+1)
	for _, e := range errs {
		out = append(out, e)
	}
	if more > 0 {
		prefix := ""
		if file != "" {
			prefix = file + ": "
		}
		out = append(out, fmt.Errorf("%s%d more problems not shown", prefix, more))
	}
	return errors.Join(out...)
}

// decodeError turns go-toml's errors into *Error: the key is found by
// position in the document, since go-toml's own key has no array indices.
func decodeError(file string, data []byte, err error) error {
	ix := buildIndex(data)
	var se *toml.StrictMissingError
	if errors.As(err, &se) {
		errs := make([]*Error, 0, len(se.Errors))
		for i := range se.Errors {
			if i == maxErrors {
				// Placing a key costs a walk of the index; the rest are
				// only counted.
				break
			}
			line, col := se.Errors[i].Position()
			key := ix.at(ix.offset(line, col))
			if key == "" {
				key = joinKey(se.Errors[i].Key())
			}
			errs = append(errs, &Error{File: file, Line: line, Key: key, Message: unknownKey(key)})
		}
		return joinErrors(file, errs, len(se.Errors)-len(errs))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, col := de.Position()
		key := ix.at(ix.offset(line, col))
		if key == "" {
			key = joinKey(de.Key())
		}
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		switch {
		case ix.err != nil:
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

// joinKey spells go-toml's key (no array indices) as a path.
func joinKey(parts []string) string {
	key := ""
	for _, part := range parts {
		key = join(key, keyPart(part))
	}
	return key
}

// unknownKey says that key is not known and lists the keys allowed there.
func unknownKey(key string) string {
	t := schemaType(parent(key))
	if t == nil || t.Kind() != reflect.Struct {
		return "unknown key"
	}
	names := tomlNames(t)
	if parent(key) == "" {
		return "unknown section; the sections are " + strings.Join(names, ", ")
	}
	return "unknown key; the keys allowed here are " + strings.Join(names, ", ")
}

// describe says what a value at key must be, from the field's want tag or
// its Go type; "" when key is not in the schema.
func describe(key string) string {
	t, want := schemaField(key)
	if want != "" {
		return want
	}
	if t == nil {
		return ""
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "a table"
	case reflect.Slice:
		switch t.Elem().Kind() {
		case reflect.String:
			return "an array of strings"
		case reflect.Struct, reflect.Map:
			return "an array of tables"
		}
		return "an array"
	}
	return ""
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
		f, ok := fieldByTOMLName(t, part)
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

func fieldByTOMLName(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tomlNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ","); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}

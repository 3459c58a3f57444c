package manifest

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// index maps the keys of a manifest to the lines they are written on, so
// that problems found after decoding are reported where they are. Paths are
// dotted with array indices: "jobs[2].gpus", "hosts[0].allow_jobs".
type index struct {
	lineStarts []int
	lines      map[string]int // path → line of its first mention
	headers    []header       // table headers in document order
	arrays     map[string]int // array-of-tables path → elements so far
}

type header struct {
	path string
	line int
}

// buildIndex walks data with go-toml's parser; a syntax error stops the
// walk, keeping what came before (enough to place the error).
func buildIndex(data []byte) *index {
	ix := &index{lines: map[string]int{}, arrays: map[string]int{}, lineStarts: []int{0}}
	for i, c := range data {
		if c == '\n' {
			ix.lineStarts = append(ix.lineStarts, i+1)
		}
	}
	var p unstable.Parser
	p.Reset(data)
	cur := ""
	for p.NextExpression() {
		expr := p.Expression()
		switch expr.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts, off := keyParts(expr.Key())
			path := ""
			for i, part := range parts {
				path = join(path, part)
				if i == len(parts)-1 && expr.Kind == unstable.ArrayTable {
					n := ix.arrays[path]
					ix.arrays[path] = n + 1
					ix.mark(path, off)
					path += "[" + strconv.Itoa(n) + "]"
				} else if n, ok := ix.arrays[path]; ok && n > 0 {
					path += "[" + strconv.Itoa(n-1) + "]"
				}
			}
			cur = path
			ix.mark(cur, off)
			ix.headers = append(ix.headers, header{cur, ix.line(off)})
		case unstable.KeyValue:
			parts, off := keyParts(expr.Key())
			path := cur
			for _, part := range parts {
				path = join(path, part)
				ix.mark(path, off)
			}
			ix.value(path, expr.Value())
		}
	}
	return ix
}

// value marks the elements of arrays and the keys of inline tables.
func (ix *index) value(path string, v *unstable.Node) {
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			n := it.Node()
			if n.Kind != unstable.KeyValue {
				continue
			}
			parts, off := keyParts(n.Key())
			p := path
			for _, part := range parts {
				p = join(p, part)
				ix.mark(p, off)
			}
			ix.value(p, n.Value())
		}
	case unstable.Array:
		i := 0
		it := v.Children()
		for it.Next() {
			n := it.Node()
			if n.Kind == unstable.Comment {
				continue
			}
			p := path + "[" + strconv.Itoa(i) + "]"
			i++
			if n.Kind != unstable.Array && n.Kind != unstable.InlineTable {
				ix.mark(p, int(n.Raw.Offset))
			}
			ix.value(p, n)
		}
	}
}

func keyParts(it unstable.Iterator) ([]string, int) {
	var parts []string
	off := -1
	for it.Next() {
		k := it.Node()
		if off < 0 {
			off = int(k.Raw.Offset)
		}
		parts = append(parts, string(k.Data))
	}
	return parts, off
}

func (ix *index) mark(path string, off int) {
	if _, ok := ix.lines[path]; !ok && off >= 0 {
		ix.lines[path] = ix.line(off)
	}
}

func (ix *index) line(off int) int {
	return sort.Search(len(ix.lineStarts), func(i int) bool { return ix.lineStarts[i] > off })
}

// lineOf returns the line of path or of its nearest written ancestor; 0 when
// none is written.
func (ix *index) lineOf(path string) int {
	for p := path; p != ""; p = parentPath(p) {
		if l, ok := ix.lines[p]; ok {
			return l
		}
	}
	return 0
}

// tableAt returns the path of the table whose header is the last one at or
// before line; "" for the top level.
func (ix *index) tableAt(line int) string {
	t := ""
	for _, h := range ix.headers {
		if h.line > line {
			break
		}
		t = h.path
	}
	return t
}

func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// decodeError turns go-toml's errors into *Error, placed with the index.
// doc holds what was decoded (for naming the entry).
func decodeError(file string, ix *index, doc *fileDoc, err error) error {
	var se *toml.StrictMissingError
	if errors.As(err, &se) {
		p := &parser{file: file, ix: ix}
		for i := range se.Errors {
			line, _ := se.Errors[i].Position()
			key := se.Errors[i].Key()
			table := ix.tableAt(line)
			entry, within := entryOf(table, doc)
			name := ""
			if len(key) > 0 {
				name = key[len(key)-1]
			}
			if within != "" {
				name = within + "." + name
			}
			p.errs = append(p.errs, &Error{File: file, Line: line, Entry: entry, Key: name, Message: unknownMessage(table, name)})
		}
		return p.joined()
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		line, _ := de.Position()
		key := de.Key()
		table := ix.tableAt(line)
		entry, within := entryOf(table, doc)
		name := ""
		if len(key) > 0 {
			name = key[len(key)-1]
		}
		if within != "" && name != "" {
			name = within + "." + name
		}
		msg := strings.TrimPrefix(de.Error(), "toml: ")
		if strings.HasPrefix(msg, "cannot decode TOML ") {
			msg = "wrong type: " + strings.TrimPrefix(msg, "cannot decode TOML ")
			if want := wantOf(table, name); want != "" {
				msg = "must be " + want
			}
		}
		return &Error{File: file, Line: line, Entry: entry, Key: name, Message: msg}
	}
	return &Error{File: file, Message: err.Error()}
}

// entryOf names the entry a table path belongs to ("jobs[2] (gbt/realistic)")
// and the sub-table within it ("hyper"), if any.
func entryOf(table string, doc *fileDoc) (entry, within string) {
	if table == "" {
		return "", ""
	}
	head, rest, _ := strings.Cut(table, ".")
	switch {
	case strings.HasPrefix(head, "jobs["):
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(head, "jobs["), "]"))
		if err == nil && i >= 0 && i < len(doc.Jobs) {
			return jobEntryName(i, &doc.Jobs[i]), rest
		}
	case strings.HasPrefix(head, "hosts["):
		i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(head, "hosts["), "]"))
		if err == nil && i >= 0 && i < len(doc.Hosts) && doc.Hosts[i].Name != "" {
			return head + " (" + clip(doc.Hosts[i].Name, 40) + ")", rest
		}
	}
	return head, rest
}

// schemaOf returns the struct type of the table at path.
func schemaOf(table string) reflect.Type {
	head, rest, _ := strings.Cut(table, ".")
	if rest != "" {
		return nil // inside hyper: anything goes
	}
	switch {
	case head == "":
		return reflect.TypeOf(fileDoc{})
	case head == "defaults":
		return reflect.TypeOf(defaults{})
	case strings.HasPrefix(head, "jobs"):
		return reflect.TypeOf(jobEntry{})
	case strings.HasPrefix(head, "hosts"):
		return reflect.TypeOf(hostEntry{})
	}
	return nil
}

func unknownMessage(table, key string) string {
	t := schemaOf(table)
	if t == nil {
		return "unknown key"
	}
	names := tomlNames(t)
	if strings.HasPrefix(table, "defaults") && (key == "model" || key == "name") {
		return "a job's " + key + " has no default; set it in each [[jobs]] entry"
	}
	if table == "" {
		return "unknown key; the top level takes " + strings.Join(names, ", ")
	}
	return "unknown key; the keys allowed here are " + strings.Join(names, ", ")
}

func tomlNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			names = append(names, tomlNames(f.Type)...)
			continue
		}
		if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}

// wantOf says what the value of key in table must be, from its Go type.
func wantOf(table, key string) string {
	t := schemaOf(table)
	if t == nil {
		return ""
	}
	f, ok := fieldOf(t, key)
	if !ok {
		return ""
	}
	ft := f.Type
	for ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	switch ft.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Float64:
		return "a number"
	case reflect.Map:
		return "a table, such as { lr = 0.1, depth = 6 }"
	case reflect.Slice:
		if ft.Elem().Kind() == reflect.String {
			return "an array of strings"
		}
		return "an array of tables"
	}
	return fmt.Sprint(ft)
}

func fieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			if sf, ok := fieldOf(f.Type, name); ok {
				return sf, true
			}
			continue
		}
		if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// Package tomlpos reports problems of a TOML document at the lines they are
// written on. go-toml decodes a document but forgets where its keys were;
// the configuration (config) and the task manifest (manifest) both validate
// after decoding, and both must say "FILE:LINE: KEY: MESSAGE".
//
// It holds the three pieces both need: an Index from key paths to where
// they are written, the Error type and the List that reports several at
// once, and the words for what a key takes (Describe, FieldNames), read from
// the Go type it decodes into.
//
// A path is dotted with array indices: "server.listen",
// "machines[1].gpus[0].vram_gib", "jobs[2].gpus". A key part that TOML
// would have to quote is quoted (see Part), so that a path stays
// unambiguous. The package is pure: it reads the bytes it is given.
package tomlpos

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// Index maps the keys of a TOML document to where they are written: each
// key-value, array element and table header, with its byte range. An
// [[array of tables]] counts its elements, so the second [[jobs]] header
// is "jobs[1]", and the table names after it refer to that element.
type Index struct {
	lineStarts []int          // byte offset of the start of each line
	entries    []entry        // in document order
	byPath     map[string]int // path -> first entry written for it
	arrays     map[string]int // array-of-tables path -> elements so far
	tables     []entry        // table headers, in document order
	err        error          // the syntax error that stopped the walk, if any
}

// entry is one key (or array element, or table header) of the document.
type entry struct {
	path       string
	start, end int // byte range: key through value, or the header's key
}

// NewIndex walks data with go-toml's parser. A syntax error stops the walk
// and leaves the entries before it, which is enough to place the error;
// Err returns it.
func NewIndex(data []byte) *Index {
	ix := &Index{
		byPath: map[string]int{},
		arrays: map[string]int{},
	}
	ix.lineStarts = append(ix.lineStarts, 0)
	for i, c := range data {
		if c == '\n' {
			ix.lineStarts = append(ix.lineStarts, i+1)
		}
	}
	// About one entry a line. Past that, entries double: append grows a
	// large slice by a quarter, which would copy it about five times over.
	ix.entries = make([]entry, 0, len(ix.lineStarts))

	var p unstable.Parser
	p.Reset(data)
	cur := "" // the table the following key-values belong to
	for p.NextExpression() {
		expr := p.Expression()
		switch expr.Kind {
		case unstable.Table, unstable.ArrayTable:
			parts, start, end := keyParts(expr.Key())
			base, path := ix.resolve(parts, expr.Kind == unstable.ArrayTable)
			if base != path {
				// The array itself is placed at its first element.
				ix.add(base, start, end)
			}
			cur = path
			ix.add(cur, start, end)
			ix.tables = append(ix.tables, entry{path: cur, start: start, end: end})
		case unstable.KeyValue:
			ix.keyValue(cur, expr)
		}
	}
	ix.err = p.Error()
	return ix
}

// Err returns the syntax error that stopped the walk, or nil when the
// whole document was read.
func (ix *Index) Err() error { return ix.err }

// resolve turns a header's key into a path: a part naming an array of tables
// refers to its last element; the last part of an [[array table]] header
// starts a new element. It returns the path without and with that new
// element's index (the same path for a [table]).
func (ix *Index) resolve(parts []string, arrayTable bool) (base, path string) {
	for i, part := range parts {
		path = Join(path, part)
		last := i == len(parts)-1
		if last && arrayTable {
			base = path
			n := ix.arrays[path]
			ix.arrays[path] = n + 1
			path += "[" + strconv.Itoa(n) + "]"
		} else if n, ok := ix.arrays[path]; ok && n > 0 {
			path += "[" + strconv.Itoa(n-1) + "]"
		}
	}
	if base == "" {
		base = path
	}
	return base, path
}

// keyValue records a key-value under the table prefix, and its value's
// elements and inline-table keys below it.
func (ix *Index) keyValue(prefix string, kv *unstable.Node) {
	parts, start, _ := keyParts(kv.Key())
	end := int(kv.Raw.Offset + kv.Raw.Length)
	if kv.Raw.Length == 0 {
		end = start
	}
	path := prefix
	for i, part := range parts {
		path = Join(path, part)
		if i < len(parts)-1 {
			// A dotted key defines the tables it passes through.
			ix.add(path, start, end)
		}
	}
	ix.add(path, start, end)
	ix.value(path, kv.Value(), start)
}

// value records the elements of an array and the keys of an inline table.
func (ix *Index) value(path string, v *unstable.Node, fallback int) {
	switch v.Kind {
	case unstable.InlineTable:
		it := v.Children()
		for it.Next() {
			if n := it.Node(); n.Kind == unstable.KeyValue {
				ix.keyValue(path, n)
			}
		}
	case unstable.Array:
		i := 0
		it := v.Children()
		for it.Next() {
			n := it.Node()
			if n.Kind == unstable.Comment {
				continue
			}
			el := path + "[" + strconv.Itoa(i) + "]"
			i++
			start, end := valueRange(n, fallback)
			ix.add(el, start, end)
			ix.value(el, n, start)
		}
	}
}

// valueRange is the byte range of a value. Arrays carry no range of their
// own; theirs is taken from their first element that has one.
func valueRange(n *unstable.Node, fallback int) (start, end int) {
	if n.Kind != unstable.Array {
		s := int(n.Raw.Offset)
		return s, s + int(n.Raw.Length)
	}
	it := n.Children()
	for it.Next() {
		if c := it.Node(); c.Kind != unstable.Comment {
			s, _ := valueRange(c, fallback)
			return s, s
		}
	}
	return fallback, fallback
}

// keyParts returns the parts of a (dotted) key, spelled as in a path, and
// its byte range.
func keyParts(it unstable.Iterator) (parts []string, start, end int) {
	first := true
	for it.Next() {
		k := it.Node()
		parts = append(parts, Part(string(k.Data)))
		if first {
			start = int(k.Raw.Offset)
			first = false
		}
		end = int(k.Raw.Offset + k.Raw.Length)
	}
	return parts, start, end
}

func (ix *Index) add(path string, start, end int) {
	if _, ok := ix.byPath[path]; !ok {
		ix.byPath[path] = len(ix.entries)
	}
	if len(ix.entries) == cap(ix.entries) {
		ix.entries = slices.Grow(ix.entries, len(ix.entries))
	}
	ix.entries = append(ix.entries, entry{path: path, start: start, end: end})
}

// line returns the 1-based line of a byte offset.
func (ix *Index) line(offset int) int {
	return sort.Search(len(ix.lineStarts), func(i int) bool { return ix.lineStarts[i] > offset })
}

// Offset returns the byte offset of a 1-based line and column (as go-toml's
// errors give them); -1 for a line the document does not have.
func (ix *Index) Offset(line, column int) int {
	if line < 1 || line > len(ix.lineStarts) {
		return -1
	}
	return ix.lineStarts[line-1] + column - 1
}

// Line returns the line where path, or failing that its nearest written
// ancestor, is written, so that a key the document does not mention (a
// missing required key, a default) is placed at its table. ok is false, and
// line 0, when neither path nor any ancestor is written.
func (ix *Index) Line(path string) (line int, ok bool) {
	for p := path; p != ""; p = Parent(p) {
		if i, ok := ix.byPath[p]; ok {
			return ix.line(ix.entries[i].start), true
		}
	}
	return 0, false
}

// Has reports whether the document writes path itself (not only a table
// above it).
func (ix *Index) Has(path string) bool {
	_, ok := ix.byPath[path]
	return ok
}

// At returns the path of the innermost entry containing the byte offset, or
// failing that the table whose body holds it; "" for the top level.
func (ix *Index) At(offset int) string {
	best, bestLen := "", -1
	for _, e := range ix.entries {
		if offset >= e.start && (offset < e.end || offset == e.start) {
			if l := e.end - e.start; bestLen < 0 || l < bestLen || l == bestLen && len(e.path) > len(best) {
				best, bestLen = e.path, l
			}
		}
	}
	if bestLen >= 0 {
		return best
	}
	for i := len(ix.tables) - 1; i >= 0; i-- {
		if ix.tables[i].start <= offset {
			return ix.tables[i].path
		}
	}
	return ""
}

// TableAt returns the path of the table whose header is the last one on or
// before the 1-based line; "" for the top level.
func (ix *Index) TableAt(line int) string {
	n := sort.Search(len(ix.tables), func(i int) bool { return ix.line(ix.tables[i].start) > line })
	if n == 0 {
		return ""
	}
	return ix.tables[n-1].path
}

// Part spells one key part as in a path: bare when TOML allows it, quoted
// otherwise, so that a dotted path stays unambiguous in messages.
func Part(s string) string {
	if s == "" {
		return strconv.Quote(s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return strconv.Quote(s)
		}
	}
	return s
}

// Parent strips the last part of a path: "a.b[2]" -> "a.b", "a.b" -> "a",
// "a" -> "".
func Parent(path string) string {
	if strings.HasSuffix(path, "]") {
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return ""
}

// Join appends a part to a path: Join("a", "b") is "a.b", Join("", "b") is
// "b". part is taken as it is (see Part).
func Join(path, part string) string {
	if path == "" {
		return part
	}
	return path + "." + part
}

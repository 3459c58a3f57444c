package config

import (
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2/unstable"
)

// index maps the keys of a TOML document to where they are written, so that
// a problem found after decoding can be reported at its line. Keys are dotted
// paths with array indices: "server.listen", "machines[1].gpus[0].vram_gib".
type index struct {
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

// buildIndex walks data with go-toml's parser. A syntax error stops the walk
// and leaves the entries before it, which is enough to place the error.
func buildIndex(data []byte) *index {
	ix := &index{
		byPath: map[string]int{},
		arrays: map[string]int{},
	}
	ix.lineStarts = append(ix.lineStarts, 0)
	for i, c := range data {
		if c == '\n' {
			ix.lineStarts = append(ix.lineStarts, i+1)
		}
	}

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

// resolve turns a header's key into a path: a part naming an array of tables
// refers to its last element; the last part of an [[array table]] header
// starts a new element. It returns the path without and with that new
// element's index (the same path for a [table]).
func (ix *index) resolve(parts []string, arrayTable bool) (base, path string) {
	for i, part := range parts {
		path = join(path, part)
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
func (ix *index) keyValue(prefix string, kv *unstable.Node) {
	parts, start, _ := keyParts(kv.Key())
	end := int(kv.Raw.Offset + kv.Raw.Length)
	if kv.Raw.Length == 0 {
		end = start
	}
	path := prefix
	for i, part := range parts {
		path = join(path, part)
		if i < len(parts)-1 {
			// A dotted key defines the tables it passes through.
			ix.add(path, start, end)
		}
	}
	ix.add(path, start, end)
	ix.value(path, kv.Value(), start)
}

// value records the elements of an array and the keys of an inline table.
func (ix *index) value(path string, v *unstable.Node, fallback int) {
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

// keyParts returns the decoded parts of a (dotted) key and its byte range.
func keyParts(it unstable.Iterator) (parts []string, start, end int) {
	first := true
	for it.Next() {
		k := it.Node()
		parts = append(parts, keyPart(string(k.Data)))
		if first {
			start = int(k.Raw.Offset)
			first = false
		}
		end = int(k.Raw.Offset + k.Raw.Length)
	}
	return parts, start, end
}

// keyPart spells one key part as in a path: bare when TOML allows it, quoted
// otherwise, so that a dotted path stays unambiguous in messages.
func keyPart(s string) string {
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

func (ix *index) add(path string, start, end int) {
	if _, ok := ix.byPath[path]; !ok {
		ix.byPath[path] = len(ix.entries)
	}
	ix.entries = append(ix.entries, entry{path: path, start: start, end: end})
}

// line returns the 1-based line of a byte offset.
func (ix *index) line(offset int) int {
	return sort.Search(len(ix.lineStarts), func(i int) bool { return ix.lineStarts[i] > offset })
}

// offset returns the byte offset of a 1-based line and column.
func (ix *index) offset(line, column int) int {
	if line < 1 || line > len(ix.lineStarts) {
		return -1
	}
	return ix.lineStarts[line-1] + column - 1
}

// lineOf returns the line where path, or failing that its nearest written
// ancestor, is written; and the path found. A key the file does not mention
// (a missing required key, a default) is placed at its table.
func (ix *index) lineOf(path string) (int, bool) {
	for p := path; p != ""; p = parent(p) {
		if i, ok := ix.byPath[p]; ok {
			return ix.line(ix.entries[i].start), true
		}
	}
	return 0, false
}

// at returns the path of the innermost entry containing the byte offset, or
// failing that the table whose body holds it; "" for the root.
func (ix *index) at(offset int) string {
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

// parent strips the last part of a path: "a.b[2]" -> "a.b", "a.b" -> "a".
func parent(path string) string {
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

func join(prefix, part string) string {
	if prefix == "" {
		return part
	}
	return prefix + "." + part
}

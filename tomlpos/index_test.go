package tomlpos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

const doc = `# comment
server.listen = "x"
[a.b]
c = { d = 1, e = [1, { f = 2 }] }
[[m]]
name = "x"
[[m.g]]
v = 1
[[m]]
g = [
  { v = 1 },

  { v = [[1], [2]] },
]
[m.t]
k = 1
"odd key" = 2
`

func TestIndexLine(t *testing.T) {
	ix := NewIndex([]byte(doc))
	if ix.Err() != nil {
		t.Fatal(ix.Err())
	}
	want := map[string]int{
		"server":           2,
		"server.listen":    2,
		"a.b":              3,
		"a.b.c":            4,
		"a.b.c.d":          4,
		"a.b.c.e[1].f":     4,
		"m":                5,
		"m[0]":             5,
		"m[0].name":        6,
		"m[0].g[0]":        7,
		"m[0].g[0].v":      8,
		"m[1]":             9,
		"m[1].g":           10,
		"m[1].g[0].v":      11,
		"m[1].g[1]":        13,
		"m[1].g[1].v[1]":   13,
		"m[1].t.k":         16,
		`m[1].t."odd key"`: 17,
		"m[1].t.nope":      15, // not written: placed at its table
	}
	for path, line := range want {
		if got, ok := ix.Line(path); got != line || !ok {
			t.Errorf("%s: got line %d %v, want %d true", path, got, ok, line)
		}
	}
	if got, ok := ix.Line("zzz"); ok || got != 0 {
		t.Errorf("zzz: got %d %v, want 0 false", got, ok)
	}
}

func TestIndexAt(t *testing.T) {
	ix := NewIndex([]byte(doc))
	for _, tt := range []struct {
		line, col int
		want      string
	}{
		{2, 1, "server.listen"},
		{2, 17, "server.listen"},
		{4, 7, "a.b.c.d"},
		{4, 24, "a.b.c.e[1].f"},
		{6, 1, "m[0].name"},
		{11, 5, "m[1].g[0].v"},
		{12, 1, "m[1].g"}, // the blank line inside the array
		{16, 1, "m[1].t.k"},
		{1, 1, ""}, // the comment before any table
	} {
		if got := ix.At(ix.Offset(tt.line, tt.col)); got != tt.want {
			t.Errorf("%d:%d: got %q, want %q", tt.line, tt.col, got, tt.want)
		}
	}
	if got := ix.Offset(99, 1); got != -1 {
		t.Errorf("Offset of line 99: got %d, want -1", got)
	}
}

func TestIndexTableAt(t *testing.T) {
	ix := NewIndex([]byte(doc))
	for line, want := range map[int]string{1: "", 2: "", 3: "a.b", 4: "a.b", 6: "m[0]", 7: "m[0].g[0]", 9: "m[1]", 14: "m[1]", 15: "m[1].t", 99: "m[1].t"} {
		if got := ix.TableAt(line); got != want {
			t.Errorf("line %d: got %q, want %q", line, got, want)
		}
	}
}

// TestIndexSyntaxError: the entries before a syntax error are kept, so the
// error can be placed.
func TestIndexSyntaxError(t *testing.T) {
	ix := NewIndex([]byte("[[jobs]]\nmodel = \"a\"\n[[jobs]]\ngpus = \n"))
	if ix.Err() == nil {
		t.Fatal("got no syntax error")
	}
	if got, _ := ix.Line("jobs[1]"); got != 3 {
		t.Errorf("jobs[1]: got line %d, want 3", got)
	}
	if got, _ := ix.Line("jobs[0].model"); got != 2 {
		t.Errorf("jobs[0].model: got line %d, want 2", got)
	}
}

func TestPaths(t *testing.T) {
	for in, want := range map[string]string{"a.b[2]": "a.b", "a.b": "a", "a": "", "a[0][1]": "a[0]"} {
		if got := Parent(in); got != want {
			t.Errorf("Parent(%q): got %q, want %q", in, got, want)
		}
	}
	if got := Join("", "a") + " " + Join("a[0]", "b"); got != "a a[0].b" {
		t.Errorf("Join: got %q", got)
	}
	for in, want := range map[string]string{"bare_key-1": "bare_key-1", "": `""`, "x y": `"x y"`, "a.b": `"a.b"`, "é": `"é"`} {
		if got := Part(in); got != want {
			t.Errorf("Part(%q): got %q, want %q", in, got, want)
		}
	}
}

// FuzzIndex checks that any document can be indexed and asked about
// without a panic, and that in a document go-toml decodes, every value that
// is not a table has an entry of its own on an existing line.
func FuzzIndex(f *testing.F) {
	for _, s := range []string{
		doc,
		"",
		"a = [\n1,\n# c\n[2, 3],\n]\n",
		"[[a.b]]\n[[a.b.c]]\nx = 1\n[[a.b]]\n[a.b.d]\ny = { z = [ { w = 1 } ] }\n",
		"\"quoted.key\" = 1\n['x'.\"y\"]\nz.'w' = 2\n",
		"[x]\ny = \n",
		"a = { b = 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ix := NewIndex(data)
		lines := strings.Count(string(data), "\n") + 1
		for off := 0; off <= len(data) && off < 4096; off++ {
			if p := ix.At(off); p != "" {
				if _, ok := ix.byPath[p]; !ok {
					t.Fatalf("At(%d) = %q, which is not in the index", off, p)
				}
			}
		}
		for _, e := range ix.entries {
			if l, ok := ix.Line(e.path); !ok || l < 1 || l > lines {
				t.Fatalf("%s: line %d %v of %d", e.path, l, ok, lines)
			}
		}
		for l := 0; l <= lines+1; l++ {
			_ = ix.TableAt(l)
			if o := ix.Offset(l, 1); o < -1 || o > len(data) {
				t.Fatalf("Offset(%d, 1) = %d, outside the document", l, o)
			}
		}
		var v map[string]any
		if toml.Unmarshal(data, &v) != nil {
			return
		}
		if ix.Err() != nil {
			t.Fatalf("go-toml decodes the document, the index stopped at %v", ix.Err())
		}
		walk(v, "", func(path string) {
			if _, ok := ix.byPath[path]; !ok {
				t.Fatalf("%s is not in the index of\n%s", path, data)
			}
		})
	})
}

// walk calls leaf with the path of every value below v that is not a table.
func walk(v any, path string, leaf func(string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			walk(e, Join(path, Part(k)), leaf)
		}
	case []any:
		leaf(path)
		for i, e := range v {
			walk(e, fmt.Sprintf("%s[%d]", path, i), leaf)
		}
	default:
		leaf(path)
	}
}

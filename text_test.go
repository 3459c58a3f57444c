package arbiter_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/arbiter-hq/arbiter"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdef", 3, "abc…"},
		{"héllo", 2, "h…"}, // é is two bytes: never cut inside it
		{"日本語", 4, "日…"},
		{"日本語", 0, "…"},
		{"x", -1, "…"},
	} {
		if got := arbiter.Clip(tc.s, tc.n); got != tc.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func FuzzClip(f *testing.F) {
	f.Add("héllo wörld", 4)
	f.Fuzz(func(t *testing.T, s string, n int) {
		got := arbiter.Clip(s, n)
		if len(s) <= n {
			if got != s {
				t.Fatalf("Clip(%q, %d) = %q, want s unchanged", s, n, got)
			}
			return
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("Clip(%q, %d) = %q: cut inside a character", s, n, got)
		}
		if len(got) > max(n, 0)+len("…") {
			t.Fatalf("Clip(%q, %d) = %q: longer than n + the mark", s, n, got)
		}
	})
}

func TestClipStart(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "…def"},
		{"日本語", 4, "…語"}, // never cut inside a character
		{"abc", 0, "…"},
		{"abc", -1, "…"},
	} {
		if got := arbiter.ClipStart(tc.s, tc.n); got != tc.want {
			t.Errorf("ClipStart(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func FuzzClipStart(f *testing.F) {
	f.Add("héllo wörld", 4)
	f.Fuzz(func(t *testing.T, s string, n int) {
		got := arbiter.ClipStart(s, n)
		switch {
		case len(s) <= n && got != s:
			t.Fatalf("ClipStart(%q, %d) = %q, want s unchanged", s, n, got)
		case utf8.ValidString(s) && !utf8.ValidString(got):
			t.Fatalf("ClipStart(%q, %d) = %q: cut inside a character", s, n, got)
		case len(got) > max(n, 0)+len("…"):
			t.Fatalf("ClipStart(%q, %d) = %q: longer than n + the mark", s, n, got)
		case len(s) > n && !strings.HasSuffix(s, strings.TrimPrefix(got, "…")):
			t.Fatalf("ClipStart(%q, %d) = %q: not the end of s", s, n, got)
		}
	})
}

// TestTextRule is finding 4 of issue 12: text that could drive a terminal
// or reorder what a reader sees is refused, naming the field.
func TestTextRule(t *testing.T) {
	for _, tc := range []struct {
		s     string
		one   bool // ValidateText accepts it
		lines bool // ValidateLines accepts it
	}{
		{"alice", true, true},
		{"Jürgen Müller 日本語 🙂", true, true},
		{"emoji 👩\u200d🔬 joined", true, true},
		{"", true, true},
		{"bob\x1b[2J\x1b[31mFAKE", false, false},
		{"bob\nroot gpu0 ready", false, true},
		{"col\tumn", false, true},
		{"over\rwrite", false, false},
		{"nul\x00", false, false},
		{"del\x7f", false, false},
		{"c1\u0085next", false, false},
		{"csi\u009b2J", false, false},
		{"evil\u202egnp.exe", false, false},
		{"isolate\u2066x\u2069", false, false},
		{"mark\u200f", false, false},
		{"arabic\u061cmark", false, false},
		{"line\u2028sep", false, false},
		{"zero\u200bwidth", false, false},
		{"bom\ufeff", false, false},
		{"bad \xff utf8", false, false},
	} {
		if err := arbiter.ValidateText("owner", tc.s, 200); (err == nil) != tc.one {
			t.Errorf("ValidateText(%q) = %v, want ok %v", tc.s, err, tc.one)
		} else if err != nil && !strings.HasPrefix(arbiter.ErrorMessage(err), "owner ") {
			t.Errorf("ValidateText(%q): message %q does not name the field first", tc.s, arbiter.ErrorMessage(err))
		}
		if err := arbiter.ValidateLines("error", tc.s, 200); (err == nil) != tc.lines {
			t.Errorf("ValidateLines(%q) = %v, want ok %v", tc.s, err, tc.lines)
		}
		if e := arbiter.EscapeText(tc.s, false); arbiter.ValidateText("x", e, 1<<20) != nil {
			t.Errorf("EscapeText(%q) = %q, which the rule still refuses", tc.s, e)
		}
	}
	if err := arbiter.ValidateText("label", strings.Repeat("x", 129), 128); err == nil ||
		arbiter.ErrorCode(err) != arbiter.EInvalid || !strings.Contains(arbiter.ErrorMessage(err), "129 bytes") {
		t.Errorf("over-long: %v", err)
	}
	if got, want := arbiter.EscapeText("a\x1b[2J\nb\u202e\xff", false), `a\x1b[2J\nb\u202e\xff`; got != want {
		t.Errorf("EscapeText = %q, want %q", got, want)
	}
	if got, want := arbiter.EscapeText("a\nb\tc\rd", true), "a\nb\tc\\rd"; got != want {
		t.Errorf("EscapeText(lines) = %q, want %q", got, want)
	}
}

// FuzzTextRule checks the rule and its escaping against each other: text
// the rule accepts is left as it is; escaped text is always accepted and
// never holds an escape character, a bidi control or a line break.
func FuzzTextRule(f *testing.F) {
	for _, s := range []string{"alice", "bob\x1b[2J\nroot", "\u202e\u2066x", "\xff\xfe", "日本\u200b", "a\tb\r\n"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, lines bool) {
		check := arbiter.ValidateText
		if lines {
			check = arbiter.ValidateLines
		}
		ok := check("f", s, len(s)) == nil
		esc := arbiter.EscapeText(s, lines)
		if ok && esc != s {
			t.Fatalf("EscapeText changed accepted text %q into %q", s, esc)
		}
		if err := check("f", esc, len(esc)); err != nil {
			t.Fatalf("EscapeText(%q) = %q, refused: %v", s, esc, err)
		}
		if strings.ContainsAny(esc, "\x1b\r\u202e\u2066\u2028\u0085") || (!lines && strings.ContainsAny(esc, "\n\t")) {
			t.Fatalf("EscapeText(%q) = %q still holds a forbidden character", s, esc)
		}
	})
}

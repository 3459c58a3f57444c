package arbiter_test

import (
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

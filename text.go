package arbiter

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Clip shortens s to at most n bytes for a message or a table cell, cutting
// at a character boundary (never inside a UTF-8 sequence) and marking the
// cut with "…". Invalid UTF-8 in s is kept as it is; callers that print to
// a terminal escape it themselves.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 0 {
		n = 0
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// ClipLine is the first line of s, clipped as Clip does; when s has more
// lines the cut is marked with " …".
func ClipLine(s string, n int) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return Clip(s[:i], n) + " …"
	}
	return Clip(s, n)
}

// Plural counts n of word for a message: "1 GPU", "3 GPUs", "0 machines".
// Words whose plural is not word+"s" are not used in messages.
func Plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

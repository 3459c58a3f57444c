package arbiter

import (
	"fmt"
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

// ClipStart keeps the end of s in at most n bytes, as Clip keeps the
// start: for a log's tail, whose last lines matter. The cut falls at a
// character boundary and is marked with "…" (three bytes more).
func ClipStart(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := len(s) - max(n, 0)
	for cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut++
	}
	return "…" + s[cut:]
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

// The text rule. Every name and free text the server stores and people
// later read — an owner, a label, a lock's holder, a reason, a GPU model, a
// task's error, a swap's log line — passes ValidateText (one line) or
// ValidateLines (several), so nothing the server hands back can move a
// terminal's cursor, clear its screen, fake a table row or reorder what a
// reader sees. Identifiers that reach paths and URLs are held to the
// stricter ValidateName on top.
//
// Text must be valid UTF-8, at most limit bytes, and hold none of:
//   - control characters (C0, DEL, C1): ESC starts terminal escape
//     sequences, CR overwrites a line, a newline or a tab fakes a row or a
//     column (ValidateLines allows newline and tab, for log lines and
//     errors);
//   - the bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E,
//     U+2066–U+2069), which make text display in another order than it
//     is stored (CVE-2021-42574, "Trojan Source");
//   - the line and paragraph separators U+2028 and U+2029, which some
//     readers take for line breaks;
//   - invisible characters that make two different names look the same:
//     U+200B (zero width space), U+2060 (word joiner), U+FEFF (byte order
//     mark) and the interlinear annotation marks U+FFF9–U+FFFB.
//
// Zero width joiners (U+200C, U+200D), which scripts and emoji need, are
// allowed.

// Length limits of the free texts the server stores, in bytes.
const (
	MaxOwnerBytes   = 128  // an allocation's owner
	MaxLabelBytes   = 128  // an allocation's label
	MaxReasonBytes  = 1024 // why something ended or was cancelled
	MaxTagBytes     = 64   // a machine's or a request's tag
	MaxModelBytes   = 128  // a GPU model, or a pattern over models
	MaxUUIDBytes    = 128  // a GPU's UUID
	MaxVersionBytes = 64   // a CUDA or driver version, a library version, a commit
)

// ValidateText checks one line of free text against the text rule: valid
// UTF-8, at most limit bytes, none of the forbidden characters (not even a
// newline or a tab). Errors: invalid, naming field and what is wrong.
func ValidateText(field, s string, limit int) error { return checkText(field, s, limit, false) }

// ValidateLines is ValidateText for text of several lines (a task's error,
// the tail of a log): newline and tab are allowed, every other forbidden
// character is not. Errors: invalid, naming field and what is wrong.
func ValidateLines(field, s string, limit int) error { return checkText(field, s, limit, true) }

func checkText(field, s string, limit int, lines bool) error {
	if len(s) > limit {
		return Errorf(EInvalid, "%s is %d bytes long; at most %d are allowed", field, len(s), limit)
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			return Errorf(EInvalid, "%s is not valid UTF-8 (byte %d is 0x%02x): send text", field, i, s[i])
		}
		if !textRuneOK(r, lines) {
			return Errorf(EInvalid, "%s holds %s at byte %d: %s", field, describeRune(r), i, forbiddenHint(lines))
		}
		i += n
	}
	return nil
}

func forbiddenHint(lines bool) string {
	if lines {
		return "only printable text, newlines and tabs are allowed"
	}
	return "only printable text on one line is allowed (no control characters, newlines, tabs or direction overrides)"
}

// describeRune names a forbidden character for a message.
func describeRune(r rune) string {
	switch {
	case r == '\n':
		return "a newline"
	case r == '\t':
		return "a tab"
	case r == '\r':
		return "a carriage return"
	case r == 0x1b:
		return "an escape character (U+001B, which starts terminal control sequences)"
	case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
		return fmt.Sprintf("a control character (U+%04X)", r)
	case isBidiControl(r):
		return fmt.Sprintf("a text direction control (U+%04X)", r)
	}
	return fmt.Sprintf("an invisible character (U+%04X)", r)
}

// textRuneOK reports whether the text rule allows r; lines allows newline
// and tab.
func textRuneOK(r rune, lines bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return lines
	case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
		return false
	case r < 0x200b:
		return r != 0x061c
	case isBidiControl(r):
		return false
	}
	switch r {
	case 0x200b, 0x2028, 0x2029, 0x2060, 0xfeff, 0xfff9, 0xfffa, 0xfffb:
		return false
	}
	return true
}

func isBidiControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069
}

// EscapeText returns s with every character the text rule forbids written
// as an escape — \x1b, \n, \u202e, and \xff for a byte that is not UTF-8 —
// so that the result always passes the rule (length aside) and shows what
// was there. lines keeps newlines and tabs as they are. It is the one way
// to make outside text safe: the CLI escapes what it prints with it, and
// the agent escapes program output before sending it.
func EscapeText(s string, lines bool) string {
	if textClean(s, lines) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case textRuneOK(r, lines):
			b.WriteString(s[i : i+n])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += n
	}
	return b.String()
}

// textClean reports whether s needs no escaping; the common case of plain
// ASCII is checked without decoding.
func textClean(s string, lines bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return checkText("", s[i:], len(s), lines) == nil
		}
		if c < 0x20 || c == 0x7f {
			if !lines || (c != '\n' && c != '\t') {
				return false
			}
		}
	}
	return true
}

// EditDistance is the Levenshtein distance between a and b, in bytes:
// what "did you mean" suggestions measure.
func EditDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

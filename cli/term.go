package cli

import (
	"bytes"
	"io"

	"github.com/arbiter-hq/arbiter"
)

// What the CLI prints from the server is escaped, so that text someone
// stored — an owner, a label, a task's error — cannot clear the screen,
// recolour it, move the cursor or reorder what is shown, even if a server
// (an older one, or not arbiter at all) let it through. The rule of what
// must be escaped is the server's own text rule (arbiter.EscapeText), in
// two strengths:
//
//   - safe escapes one table cell or value: newlines and tabs too, so a
//     value can fake neither a row nor a column;
//   - every command's Stdout and Stderr go through a termWriter (Run
//     installs it), which escapes the rest everywhere — JSON output
//     included, where an escaped character stays the same JSON string —
//     and keeps the newlines and tabs the CLI itself writes.
//
// Output that is not text for a terminal — an artifact downloaded to
// stdout, the output of a command run by `arbiter alloc -- CMD` — takes
// rawOut instead.

// safe returns s fit to print as one value on a terminal.
func safe(s string) string { return arbiter.EscapeText(s, false) }

// termWriter escapes what could drive a terminal in everything written
// through it, keeping newlines and tabs. Each Write is escaped on its own:
// the CLI writes whole values, never half a character.
type termWriter struct{ w io.Writer }

// newTermWriter wraps w, unless it is wrapped already.
func newTermWriter(w io.Writer) io.Writer {
	if _, ok := w.(*termWriter); ok || w == nil {
		return w
	}
	return &termWriter{w: w}
}

func (t *termWriter) Write(p []byte) (int, error) {
	s := string(p)
	if e := arbiter.EscapeText(s, true); e != s {
		if _, err := io.WriteString(t.w, e); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return t.w.Write(p)
}

// jsonOut returns a writer for JSON to w. encoding/json leaves DEL (0x7f)
// raw inside strings, which a termWriter would escape as \x7f, not JSON;
// this writes it as \u007f, the same JSON string. Every other character
// a termWriter escapes, encoding/json has escaped already or it becomes
// \uXXXX, valid JSON.
func jsonOut(w io.Writer) io.Writer { return delEscaper{w} }

type delEscaper struct{ w io.Writer }

func (d delEscaper) Write(p []byte) (int, error) {
	if bytes.IndexByte(p, 0x7f) < 0 {
		return d.w.Write(p)
	}
	if _, err := d.w.Write(bytes.ReplaceAll(p, []byte{0x7f}, []byte(`\u007f`))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// rawOut returns the writer under w's escaping, for bytes that are not
// text for a terminal.
func rawOut(w io.Writer) io.Writer {
	if t, ok := w.(*termWriter); ok {
		return t.w
	}
	return w
}

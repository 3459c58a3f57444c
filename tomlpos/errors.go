package tomlpos

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Error is one problem of a document. It reads
// "FILE:LINE: ENTRY: KEY: MESSAGE", leaving out what is unknown or unset.
type Error struct {
	File    string // the document's name as the caller gave it; "" for none
	Line    int    // 1-based; 0 when the problem has no place in the file
	Entry   string // what the key belongs to, e.g. "jobs[2] (gbt/realistic)"; "" when Key says it all
	Key     string // a path (e.g. "machines[1].gpus[0].vram_gib"), or within Entry (e.g. "gpus")
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
	if e.Entry != "" {
		b.WriteString(e.Entry + ": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// MaxErrors bounds the problems a List reports: past a screenful, more do
// not help, and a broken file must not cost time quadratic in its size.
const MaxErrors = 20

// List collects the problems of one document, to report them at once. The
// zero value is an empty list of a document with no name.
type List struct {
	File    string // the document's name, for the "more problems" line
	errs    []*Error
	skipped int
}

// Add records a problem.
func (l *List) Add(e *Error) { l.errs = append(l.errs, e) }

// Skip counts n problems found but not recorded (placing them would cost
// more than they help); Err reports their number.
func (l *List) Skip(n int) { l.skipped += n }

// Len returns the number of problems recorded or skipped.
func (l *List) Len() int { return len(l.errs) + l.skipped }

// Err returns the problems in line order: nil for none, the *Error itself
// for one, else the first MaxErrors joined with errors.Join and a last
// line counting the rest, "FILE: N more problems not shown".
func (l *List) Err() error {
	errs := l.errs
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Line < errs[j].Line })
	more := l.skipped
	if len(errs) == 1 && more == 0 {
		return errs[0]
	}
	if len(errs) > MaxErrors {
		more += len(errs) - MaxErrors
		errs = errs[:MaxErrors]
	}
	out := make([]error, 0, len(errs)+1)
	for _, e := range errs {
		out = append(out, e)
	}
	if more > 0 {
		prefix := ""
		if l.File != "" {
			prefix = l.File + ": "
		}
		out = append(out, fmt.Errorf("%s%d more problems not shown", prefix, more))
	}
	return errors.Join(out...)
}

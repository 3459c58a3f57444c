package tomlpos

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestError(t *testing.T) {
	for _, tt := range []struct {
		e    Error
		want string
	}{
		{Error{File: "training.toml", Line: 31, Entry: "jobs[2] (gbt/realistic)", Key: "gpus", Message: "must be 0 to 64, got 99"},
			"training.toml:31: jobs[2] (gbt/realistic): gpus: must be 0 to 64, got 99"},
		{Error{File: "a.toml", Line: 14, Key: "machines[1].gpus[0].vram_gib", Message: "m"}, "a.toml:14: machines[1].gpus[0].vram_gib: m"},
		{Error{File: "a.toml", Key: "k", Message: "m"}, "a.toml: k: m"},
		{Error{Key: "server.listen", Message: "m"}, "server.listen: m"},
		{Error{Line: 3, Message: "m"}, "m"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestList(t *testing.T) {
	var empty List
	if err := empty.Err(); err != nil {
		t.Errorf("empty list: got %v, want nil", err)
	}

	one := List{File: "a.toml"}
	e := &Error{File: "a.toml", Line: 2, Message: "m"}
	one.Add(e)
	if err := one.Err(); err != e {
		t.Errorf("one problem: got %v (%T), want the *Error itself", err, err)
	}

	// In line order, and several at once.
	var l List
	l.File = "a.toml"
	l.Add(&Error{File: "a.toml", Line: 7, Key: "b", Message: "second"})
	l.Add(&Error{File: "a.toml", Line: 3, Key: "a", Message: "first"})
	if got, want := l.Err().Error(), "a.toml:3: a: first\na.toml:7: b: second"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	var pe *Error
	if !errors.As(l.Err(), &pe) || pe.Line != 3 {
		t.Errorf("errors.As: got %v, want the first *Error", pe)
	}

	// At most MaxErrors, then a count of the rest and of the skipped.
	many := List{File: "a.toml"}
	for i := MaxErrors + 5; i > 0; i-- {
		many.Add(&Error{File: "a.toml", Line: i, Message: "m"})
	}
	many.Skip(2)
	if many.Len() != MaxErrors+7 {
		t.Errorf("Len: got %d, want %d", many.Len(), MaxErrors+7)
	}
	lines := strings.Split(many.Err().Error(), "\n")
	if len(lines) != MaxErrors+1 || lines[0] != "a.toml:1: m" || lines[MaxErrors] != "a.toml: 7 more problems not shown" {
		t.Errorf("got %d lines, first %q, last %q", len(lines), lines[0], lines[len(lines)-1])
	}

	// Only skipped problems still make an error; a list with no file name
	// says no name.
	var skipped List
	skipped.Skip(3)
	if err := skipped.Err(); err == nil || err.Error() != "3 more problems not shown" {
		t.Errorf("got %v, want the count", err)
	}
}

func TestDescribe(t *testing.T) {
	type inner struct {
		A int `toml:"a"`
	}
	type doc struct {
		inner
		S    string            `toml:"s"`
		P    *[]string         `toml:"p"`
		M    map[string]any    `toml:"m" want:"a table, such as { x = 1 }"`
		T    []inner           `toml:"t"`
		F    *float64          `toml:"f,omitempty"`
		B    bool              `toml:"b"`
		Nums []int             `toml:"nums"`
		Sub  inner             `toml:"sub"`
		Skip string            `toml:"-"`
		Raw  map[string]string `toml:"raw"`
		C    complex128        `toml:"c"`
	}
	rt := reflect.TypeOf(doc{})
	if got := fmt.Sprint(FieldNames(rt)); got != "[a s p m t f b nums sub raw c]" {
		t.Errorf("FieldNames: got %s", got)
	}
	for key, want := range map[string]string{
		"a": "a whole number", "s": "a string", "p": "an array of strings", "m": "a table, such as { x = 1 }",
		"t": "an array of tables", "f": "a number", "b": "true or false", "nums": "an array", "sub": "a table",
		"raw": "a table", "c": "",
	} {
		f, ok := Field(rt, key)
		if !ok {
			t.Errorf("Field(%q): not found", key)
			continue
		}
		if got := Want(f); got != want {
			t.Errorf("Want(%s): got %q, want %q", key, got, want)
		}
	}
	if _, ok := Field(rt, "nope"); ok {
		t.Error(`Field("nope") found a field`)
	}
}

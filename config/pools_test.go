package config

import (
	"strings"
	"testing"
)

// A pool that fails its checks must not shift the index other messages
// give: pools[1] is named as pools[1] even after a broken pools[0].
func TestPoolsSameBackingNamesTheRightEntry(t *testing.T) {
	doc := "[[pools]]\nname = \"x\"\nbacking = { gpus = 0 }\nslots = 2\n" +
		"[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\n" +
		"[[pools]]\nname = \"q\"\nbacking = { gpus = 1 }\nslots = 4\n"
	_, err := Parse("bad.toml", []byte(doc), env)
	want := `bad.toml:9: pools[2]: pool "q" has the same backing request as pool "p" (pools[1])`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}

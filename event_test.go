package arbiter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Every Event constant of the package is in EventKinds, and nothing else:
// a kind left out could not be subscribed to by a webhook.
func TestEventKindsAreWhole(t *testing.T) {
	pkgs, err := parser.ParseDir(token.NewFileSet(), ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	for _, f := range pkgs["arbiter"].Files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Event") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					consts = append(consts, v)
				}
			}
			return true
		})
	}
	slices.Sort(consts)
	kinds := EventKinds()
	slices.Sort(kinds)
	if !slices.Equal(consts, kinds) {
		t.Fatalf("the Event constants %v\nand EventKinds %v differ", consts, kinds)
	}
}

// A webhook's kinds are event kinds the server emits, prefixes of some, or
// *; a misspelt one is refused with the kind meant.
func TestWebhookKindsMustExist(t *testing.T) {
	for _, k := range []string{"*", "swap.complete", "swap.*", "allocation.time_limit", "notification"} {
		if err := checkWebhookKind(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
	for k, want := range map[string]string{
		"swap.completed":    "did you mean swap.complete?",
		"allocation.redy":   "did you mean allocation.ready?",
		"bogus.kind":        "is not an event kind",
		"bogus.*":           "matches no event kind; the kinds start with allocation.*, machine.*",
		"Swap.Complete":     "is not an event kind (like swap.complete)",
		"allocation.ready.": "is not an event kind (like swap.complete)",
	} {
		err := checkWebhookKind(k)
		if err == nil || ErrorCode(err) != EInvalid || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", k, err, want)
		}
	}
}

package arbiter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Every Event constant of the package is in EventKinds, and nothing else:
// a kind left out could not be subscribed to by a webhook.
func TestEventKindsAreWhole(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var consts []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
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
	// The engine emits kinds by their constants only: a literal would be
	// missing from the list.
	engineFiles, _ := filepath.Glob("engine/*.go")
	literal := regexp.MustCompile(`\bemit(Alloc)?\(now, "`)
	for _, name := range engineFiles {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if loc := literal.FindIndex(b); loc != nil && !strings.HasSuffix(name, "_test.go") {
			t.Errorf("%s emits a kind by a literal: make it an Event constant", name)
		}
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

// The families a refusal suggests are themselves accepted, and the
// engine's load errors (engine.*) may be subscribed to.
func TestSuggestedKindPrefixesAreAccepted(t *testing.T) {
	for _, p := range append(kindPrefixes(), "engine.*", "engine.load_error") {
		if err := checkWebhookKind(p); err != nil {
			t.Errorf("%q is refused: %v", p, err)
		}
	}
}

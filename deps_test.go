package arbiter_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/arbiter-hq/arbiter"

// allowed lists, for each package of the module, the module packages and
// third-party modules it may import (docs/architecture.md §3: dependencies point inward;
// the engine decides, stores and transports are adapters, only cmd/arbiter
// wires concrete pieces). The standard library is always allowed, except
// where pureForbidden says otherwise. A package missing here fails the test,
// so a new package must state its place.
var allowed = map[string][]string{
	"":            {},
	"place":       {""},
	"grid":        {""},
	"engine":      {"", "place", "grid"},
	"control":     {"", "engine", "place", "grid"},
	"sqlite":      {"", "sqlstore", "batchlog", "filelock", "modernc.org/sqlite", "modernc.org/libc"}, // libc: the C API for the writer (rawconn.go)
	"batchlog":    {"filelock"},                                                                       // the append-only log of batches
	"leader":      {""},                                                                               // which replica leads (high availability)
	"forward":     {"", "httpapi"},                                                                    // a follower's traffic to the leader
	"postgres":    {"", "sqlstore", "github.com/jackc/pgx/v5"},
	"sqlstore":    {""}, // what sqlite and postgres share; no driver
	"storetest":   {""},
	"httpapi":     {"", "ui", "httpio", "github.com/robfig/cron/v3"},
	"httpio":      {""},
	"connlimit":   {},
	"ui":          {"", "httpio"},
	"config":      {"", "grid", "tomlpos", "github.com/pelletier/go-toml/v2"},
	"spalloc":     {"", "grid"},
	"bmp":         {"", "grid"},
	"gpu":         {"", "github.com/NVIDIA/go-nvml"},
	"agent":       {"", "gpu", "client", "procgroup", "github.com/klauspost/compress"},
	"client":      {""},
	"cli":         {"", "client", "agent", "gpu", "procgroup"}, // agent: `arbiter agent`
	"procgroup":   {},                                          // a command and its process group; standard library only
	"bench":       {"", "batchlog", "cli", "client", "engine", "manifest"},
	"manifest":    {"", "tomlpos", "github.com/pelletier/go-toml/v2"},
	"tomlpos":     {"github.com/pelletier/go-toml/v2"},
	"artifact":    {"", "filelock"},
	"filelock":    {}, // exclusive locks on files; standard library only
	"webhook":     {""},
	"clock":       {}, // the fake clock of the tests; standard library only
	"poll":        {}, // the tests' wait-for helper; standard library only
	"tcpproxy":    {}, // the tests' TCP proxy that cuts or loses traffic; standard library only
	"cmd/arbiter": {"*"},
}

// pure packages decide; they may not touch the outside world or the clock.
var pure = map[string]bool{"": true, "place": true, "engine": true, "grid": true, "manifest": true, "tomlpos": true}

var pureForbiddenImports = []string{"os", "net", "net/http", "database/sql", "os/exec", "syscall", "io/fs", "log", "log/slog"}

func TestDependencyRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imports, _ := strings.Cut(line, ":")
		rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		rules, ok := allowed[rel]
		if !ok {
			t.Errorf("package %q has no entry in the dependency rules: add it to allowed in deps_test.go", path)
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if !permitted(rel, rules, imp) {
				t.Errorf("package %q imports %q, which docs/architecture.md §3 does not allow", path, imp)
			}
		}
	}
}

func permitted(pkg string, rules []string, imp string) bool {
	if len(rules) == 1 && rules[0] == "*" {
		return true
	}
	first, _, _ := strings.Cut(imp, "/")
	if !strings.Contains(first, ".") { // standard library
		if pure[pkg] {
			for _, f := range pureForbiddenImports {
				if imp == f {
					return false
				}
			}
		}
		return true
	}
	if imp == module || strings.HasPrefix(imp, module+"/") {
		rel := strings.TrimPrefix(strings.TrimPrefix(imp, module), "/")
		for _, r := range rules {
			if r == rel {
				return true
			}
		}
		return false
	}
	for _, r := range rules {
		if strings.Contains(r, ".") && (imp == r || strings.HasPrefix(imp, r+"/")) {
			return true
		}
	}
	return false
}

// TestPurePackagesTakeNow checks that the engine and placement never read
// the wall clock, sleep or start goroutines: time is an argument (docs/architecture.md §2.1).
func TestPurePackagesTakeNow(t *testing.T) {
	banned := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true}
	for _, dir := range []string{".", "engine", "place", "grid"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GoStmt:
					t.Errorf("%s: a goroutine in a pure package", fset.Position(n.Pos()))
				case *ast.SelectorExpr:
					if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && banned[n.Sel.Name] {
						t.Errorf("%s: time.%s in a pure package: take now as an argument", fset.Position(n.Pos()), n.Sel.Name)
					}
				}
				return true
			})
		}
	}
}

// TestAgentCarriesNoServer: the agent (and so a host that only runs it)
// links the Go client, not the server, the dashboard or Prometheus.
func TestAgentCarriesNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./agent", "./cli").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{module + "/httpapi", module + "/ui", module + "/control", module + "/engine", module + "/sqlite", module + "/postgres", "github.com/prometheus/"} {
			if dep == banned || strings.HasPrefix(dep, banned) && strings.HasSuffix(banned, "/") {
				t.Errorf("the agent or the CLI depends on %s", dep)
			}
		}
	}
}

package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/tomlpos"
)

const secret1 = "0123456789abcdef0123"
const secret2 = "fedcba9876543210fedc"

// env is a getenv with two good secrets and one short one.
func env(name string) string {
	return map[string]string{
		"ADMIN": secret1,
		"AGENT": secret2,
		"SHORT": "short",
		"SAME":  secret1,
	}[name]
}

func TestDefault(t *testing.T) {
	d := Default()
	if err := d.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v, want nil", err)
	}
	if got, want := d.Server.Listen, "127.0.0.1:7070"; got != want {
		t.Errorf("listen: got %q, want %q", got, want)
	}
	if !d.Server.LocalEnabled() {
		t.Errorf("local: got false, want true")
	}
	kind, target := d.Server.DatabaseTarget()
	if kind != DatabaseSQLite || target != filepath.Join("arbiter-data", "arbiter.db") {
		t.Errorf("database target: got %s %q, want sqlite arbiter-data/arbiter.db", kind, target)
	}
	if Default().Server.Local == d.Server.Local {
		t.Errorf("Default shares its Local pointer between calls")
	}

	c, err := Parse("empty.toml", nil, env)
	if err != nil {
		t.Fatalf("Parse(empty) = %v", err)
	}
	d.Path = "empty.toml"
	if !reflect.DeepEqual(c, d) {
		t.Errorf("empty file:\ngot  %+v\nwant %+v", c, d)
	}
}

func TestParseGood(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		check func(t *testing.T, c *Config)
	}{
		{"server", `
[server]
listen = "0.0.0.0:8080"
insecure_no_auth = true
data_dir = "/var/lib/arbiter"
local = false
max_body_bytes = 4096
tls_cert_file = "c.pem"
tls_key_file = "k.pem"
synchronous = "normal"
log_level = "debug"
log_format = "json"
shutdown_timeout_s = 2.5
`, func(t *testing.T, c *Config) {
			s := c.Server
			if s.Listen != "0.0.0.0:8080" || !s.InsecureNoAuth || s.DataDir != "/var/lib/arbiter" || s.LocalEnabled() ||
				s.MaxBodyBytes != 4096 || s.TLSCertFile != "c.pem" || s.TLSKeyFile != "k.pem" || s.Synchronous != "normal" ||
				s.LogLevel != "debug" || s.LogFormat != "json" || s.ShutdownTimeoutS != 2.5 {
				t.Errorf("got %+v", s)
			}
		}},
		{"integers as seconds", `
[allocations]
default_keepalive_s = 30
history = 0
starvation_s = 0
[agents]
heartbeat_timeout_s = 5
[events]
keep = 10
`, func(t *testing.T, c *Config) {
			want := Allocations{DefaultKeepaliveS: 30, History: 0, StarvationS: 0}
			if c.Allocations != want || c.Agents.HeartbeatTimeoutS != 5 || c.Events.Keep != 10 {
				t.Errorf("got %+v %+v %+v", c.Allocations, c.Agents, c.Events)
			}
		}},
		{"dotted keys", `server.listen = "localhost:1"`, func(t *testing.T, c *Config) {
			if got, want := c.Server.Listen, "localhost:1"; got != want {
				t.Errorf("listen: got %q, want %q", got, want)
			}
		}},
		{"ipv6 loopback", `server.listen = "[::1]:7070"`, nil},
		{"sqlite path", `server.database = "sqlite:/tmp/a.db"`, func(t *testing.T, c *Config) {
			if k, p := c.Server.DatabaseTarget(); k != DatabaseSQLite || p != "/tmp/a.db" {
				t.Errorf("got %s %q, want sqlite /tmp/a.db", k, p)
			}
		}},
		{"postgres url", `server.database = "postgresql://u:pw@db:5432/arbiter?sslmode=disable"`, func(t *testing.T, c *Config) {
			if k, _ := c.Server.DatabaseTarget(); k != DatabasePostgres {
				t.Errorf("kind: got %s, want postgres", k)
			}
		}},
		{"tokens open a non-loopback listen", `
server.listen = ":7070"
[[tokens]]
name = "ops"
role = "admin"
token_env = "ADMIN"
[[tokens]]
name = "agents"
role = "agent"
token_env = "AGENT"
`, func(t *testing.T, c *Config) {
			want := []Token{{Name: "ops", Role: "admin", Secret: secret1}, {Name: "agents", Role: "agent", Secret: secret2}}
			if !reflect.DeepEqual(c.Tokens, want) {
				t.Errorf("tokens: got %v, want %v", c.Tokens, want)
			}
		}},
		{"empty pending sections", "[spalloc]\n[tasks]\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("good.toml", []byte(tt.doc), env)
			if err != nil {
				t.Fatalf("Parse = %v", err)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate after Parse = %v", err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		line int
		key  string
		msg  string // a part of the message
	}{
		{"unknown key", "[server]\nlisten = \"127.0.0.1:1\"\nlisen = 1\n", 3, "server.lisen", "unknown key; the keys allowed here are listen,"},
		{"unknown section", "\n[sever]\nlisten = 1\n", 2, "sever", "unknown section"},
		{"unknown top-level key", "x = 1\n", 1, "x", "unknown section"},
		{"unknown gpu key", "[[machines]]\nname = \"a\"\n[[machines]]\nname = \"b\"\ngpus = [{ vram_gib = 80, modle = \"x\" }]\n", 5, "machines[1].gpus[0].modle", "keys allowed here are model, vram_gib"},
		{"type string for number", "[[machines]]\nname = \"a\"\ngpus = [{ vram_gib = 1 }]\n\n[[machines]]\nname = \"b\"\ngpus = [\n  { vram_gib = 80 },\n  { vram_gib = \"80\" },\n]\n", 9, "machines[1].gpus[1].vram_gib", "must be a number of GiB"},
		{"type float for int", "[allocations]\nhistory = 1.5\n", 2, "allocations.history", "must be a whole number"},
		{"type int for string", "[server]\nlisten = 7070\n", 2, "server.listen", "must be a string host:port"},
		{"type bool", "[server]\nlocal = \"yes\"\n", 2, "server.local", "must be true or false"},
		{"type array element", "[[machines]]\nname = \"a\"\ntags = [\"x\", 2]\n", 3, "machines[0].tags[1]", "must be a string"},
		{"type table", "server = 1\n", 1, "server", "must be a table"},
		{"too large", "[events]\nkeep = 99999999999999999999\n", 2, "events.keep", "too large"},
		{"syntax", "[server]\nlisten = \n", 2, "server", "invalid TOML"},
		{"duplicate key", "[server]\nlisten = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n", 3, "server.listen", "already defined"},
		{"listen", "[server]\n\nlisten = \"7070\"\n", 3, "server.listen", "not host:port"},
		{"listen port", "server.listen = \"127.0.0.1:70000\"\n", 1, "server.listen", "0 to 65535"},
		{"open listen", "[server]\nlisten = \"0.0.0.0:7070\"\n", 2, "server.listen", "insecure_no_auth"},
		{"open listen any host", "[server]\nlisten = \":7070\"\n", 2, "server.listen", "configure tokens"},
		{"data dir", "[server]\ndata_dir = \"\"\n", 2, "server.data_dir", "must not be empty"},
		{"database scheme", "[server]\ndatabase = \"mysql://u:hunter2@h/db\"\n", 2, "server.database", `unknown database "mysql:…"`},
		{"database path", "[server]\ndatabase = \"/var/a.db\"\n", 2, "server.database", `write "sqlite:/var/a.db"`},
		{"database sqlite", "[server]\ndatabase = \"sqlite:\"\n", 2, "server.database", "needs a file path"},
		{"database url", "[server]\ndatabase = \"postgres://\"\n", 2, "server.database", "not a valid"},
		{"spalloc listen", "[server]\nspalloc_listen = \"127.0.0.1\"\n", 2, "server.spalloc_listen", "is not host:port"},
		{"spalloc allow", "[spalloc]\nallow = [\"127.0.0.1\", \"10.0.0.0/33\"]\n", 2, "spalloc.allow[1]", "not an IP address or CIDR prefix"},
		{"tls half", "[server]\ntls_cert_file = \"c.pem\"\n", 1, "server.tls_key_file", "or neither"},
		{"tls other half", "[server]\n\ntls_key_file = \"k.pem\"\n", 1, "server.tls_cert_file", "or neither"},
		{"body", "[server]\nmax_body_bytes = 0\n", 2, "server.max_body_bytes", "at least 1024"},
		{"synchronous", "[server]\nsynchronous = \"off\"\n", 2, "server.synchronous", `unknown value "off"; want full, normal`},
		{"log level", "[server]\nlog_level = \"trace\"\n", 2, "server.log_level", "want debug, info, warn, error"},
		{"log format", "[server]\nlog_format = \"xml\"\n", 2, "server.log_format", "want text, json"},
		{"shutdown", "[server]\nshutdown_timeout_s = -1\n", 2, "server.shutdown_timeout_s", "0 to 3600 seconds"},
		{"keepalive low", "[allocations]\ndefault_keepalive_s = 0\n", 2, "allocations.default_keepalive_s", "1 to 604800 seconds, got 0"},
		{"keepalive high", "[allocations]\ndefault_keepalive_s = 604801\n", 2, "allocations.default_keepalive_s", "1 to 604800"},
		{"keepalive nan", "[allocations]\ndefault_keepalive_s = nan\n", 2, "allocations.default_keepalive_s", "got NaN"},
		{"history", "[allocations]\nhistory = -1\n", 2, "allocations.history", "must not be negative"},
		{"starvation", "[allocations]\nstarvation_s = -inf\n", 2, "allocations.starvation_s", "0 to 604800"},
		{"heartbeat", "[agents]\nheartbeat_timeout_s = 0\n", 2, "agents.heartbeat_timeout_s", "more than 0"},
		{"events", "[events]\nkeep = 0\n", 2, "events.keep", "at least 1"},
		{"grid machines", "[server]\n[[grid_machines]]\nname = \"m\"\n", 2, "grid_machines[0].width", "missing"},
		{"spalloc section", "[spalloc]\nmax_retired_jobs = -10\n", 2, "spalloc.max_retired_jobs", "must be 0 to"},
		{"tasks artifact limit", "\ntasks.max_artifact_bytes = 10\n", 2, "tasks.max_artifact_bytes", "at least 1024"},
		{"pool no backing", "[[pools]]\nname = \"p\"\nslots = 2\n", 1, "pools[0].backing", "missing"},
		{"pool no slots", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\n", 1, "pools[0].slots", "missing"},
		{"pool bad slots", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 0\n", 1, "pools[0]", "slots must be between 1"},
		{"pool bad backing", "[[pools]]\nname = \"p\"\nbacking = { gpus = -1 }\nslots = 2\n", 1, "pools[0]", "backing: gpus must not be negative"},
		{"pool backing type", "[[pools]]\nname = \"p\"\nbacking = { gpus = \"one\" }\nslots = 2\n", 3, "pools[0].backing.gpus", "whole number"},
		{"pool grace", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\ngrace_time_s = -1\n", 5, "pools[0].grace_time_s", "must be a number of seconds from 0 to 315360000, got -1"},
		{"pool grace inf", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\ngrace_time_s = inf\n", 5, "pools[0].grace_time_s", "got +Inf"},
		{"pool retention nan", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\nmin_retention_s = nan\n", 5, "pools[0].min_retention_s", "got NaN"},
		{"pool max age", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\nmax_age_s = 1e12\n", 5, "pools[0].max_age_s", "from 0 to 315360000"},
		{"pool duplicate", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\n[[pools]]\nname = \"p\"\nbacking = { gpus = 2 }\nslots = 2\n", 6, "pools[1].name", "already declared by pools[0]"},
		{"pool same backing", "[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\n[[pools]]\nname = \"q\"\nbacking = { gpus = 1 }\nslots = 4\n", 5, "pools[1]", `same backing request as pool "p"`},
		{"services", "\n\n[[services]]\nname = \"vllm\"\nmachine = \"gpu1\"\nkind = \"tgi\"\nswap_command = [\"/bin/true\"]\n", 6, "services[0].kind", `unknown kind "tgi"`},
		{"token role", "[[tokens]]\nname = \"a\"\nrole = \"root\"\ntoken_env = \"ADMIN\"\n", 3, "tokens[0].role", `unknown role "root"`},
		{"token name", "[[tokens]]\nname = \"a b\"\nrole = \"user\"\ntoken_env = \"ADMIN\"\n", 2, "tokens[0].name", "may only hold"},
		{"token no name", "[[tokens]]\nrole = \"user\"\ntoken_env = \"ADMIN\"\n", 1, "tokens[0].name", "must not be empty"},
		{"token duplicate name", "[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"ADMIN\"\n[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"AGENT\"\n", 6, "tokens[1].name", "already used by tokens[0]"},
		{"token env unset", "[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"NOPE\"\n", 4, "tokens[0].token_env", "NOPE is not set"},
		{"token short", "[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"SHORT\"\n", 4, "tokens[0].token_env", "the secret is 5 characters; use at least 16"},
		{"token same secret", "[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"ADMIN\"\n[[tokens]]\nname = \"b\"\nrole = \"user\"\ntoken_env = \"SAME\"\n", 8, "tokens[1].token_env", "same as that of tokens[0]"},
		{"token both", "[[tokens]]\nname = \"a\"\nrole = \"user\"\ntoken_env = \"ADMIN\"\ntoken_file = \"t\"\n", 5, "tokens[0].token_file", "not both"},
		{"token neither", "\n[[tokens]]\nname = \"a\"\nrole = \"user\"\n", 2, "tokens[0]", "needs token_env"},
		{"machine name", "[[machines]]\nname = \"-x\"\n", 2, "machines[0].name", "may only hold"},
		{"machine no name", "[[machines]]\ncores = 1\n", 1, "machines[0].name", "must not be empty"},
		{"machine duplicate", "[[machines]]\nname = \"a\"\n[[machines]]\nname = \"a\"\n", 4, "machines[1].name", "already used by machines[0]"},
		{"machine tag", "[[machines]]\nname = \"a\"\ntags = [\"ok\", \"not ok\"]\n", 3, "machines[0].tags[1]", "without spaces"},
		{"machine cores", "[[machines]]\nname = \"a\"\ncores = -1\n", 3, "machines[0].cores", "must not be negative"},
		{"machine ram", "[[machines]]\nname = \"a\"\nram_gib = -1.5\n", 3, "machines[0].ram_gib", "not negative"},
		{"machine cuda", "[[machines]]\nname = \"a\"\ncuda = \"twelve\"\n", 3, "machines[0].cuda", "not of the form"},
		{"machine driver", "[[machines]]\nname = \"a\"\ndriver = \"a\\u0001\"\n", 3, "machines[0].driver", "printable"},
		{"gpu count zero", "[[machines]]\nname = \"a\"\ngpus = [{ vram_gib = 8, count = 0 }]\n", 3, "machines[0].gpus[0].count", "must be 1 to 64, got 0"},
		{"gpu count big", "[[machines]]\nname = \"a\"\ngpus = [{ vram_gib = 8, count = 65 }]\n", 3, "machines[0].gpus[0].count", "must be 1 to 64"},
		{"gpu total", "[[machines]]\nname = \"a\"\ngpus = [\n { vram_gib = 8, count = 60 },\n { vram_gib = 8, count = 5 },\n]\n", 5, "machines[0].gpus[1].count", "at most 64"},
		{"gpu no vram", "[[machines]]\nname = \"a\"\n[[machines.gpus]]\nmodel = \"x\"\n", 3, "machines[0].gpus[0].vram_gib", "missing"},
		{"gpu vram", "[[machines]]\nname = \"a\"\n[[machines.gpus]]\nmodel = \"x\"\nvram_gib = 0\n", 5, "machines[0].gpus[0].vram_gib", "positive number of GiB, got 0"},
		{"gpu compute", "[[machines]]\nname = \"a\"\ngpus = [{ vram_gib = 8 }, { vram_gib = 8, compute = \"sm_90\" }]\n", 3, "machines[0].gpus[1].compute", `"sm_90" is not of the form`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("bad.toml", []byte(tt.doc), env)
			if err == nil {
				t.Fatalf("Parse = nil error, want one at %d %s", tt.line, tt.key)
			}
			if c != nil {
				t.Errorf("Parse returned a Config with an error")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			if e.File != "bad.toml" || e.Line != tt.line || e.Key != tt.key {
				t.Errorf("got %s:%d %s, want bad.toml:%d %s (error %q)", e.File, e.Line, e.Key, tt.line, tt.key, err)
			}
			prefix := fmt.Sprintf("bad.toml:%d: %s: ", tt.line, tt.key)
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("got %q, want %q…%q", err, prefix, tt.msg)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), secret1) {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}
}

func TestParseManyErrors(t *testing.T) {
	doc := "[server]\nlog_level = \"x\"\n[allocations]\nhistory = -1\n[events]\nkeep = 0\n"
	_, err := Parse("bad.toml", []byte(doc), env)
	want := "bad.toml:2: server.log_level: unknown value \"x\"; want debug, info, warn, error\n" +
		"bad.toml:4: allocations.history: must not be negative, got -1\n" +
		"bad.toml:6: events.keep: must be at least 1, got 0"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want\n%s", err, want)
	}

	doc = "a = 1\n[server]\nb = 2\n"
	_, err = Parse("bad.toml", []byte(doc), env)
	if err == nil || !strings.Contains(err.Error(), "bad.toml:1: a: ") || !strings.Contains(err.Error(), "bad.toml:3: server.b: ") {
		t.Errorf("got %v, want both unknown keys", err)
	}
}

func TestValidateAfterOverride(t *testing.T) {
	c := Default()
	c.Server.Listen = "0.0.0.0:7070"
	err := c.Validate()
	if err == nil || !strings.HasPrefix(err.Error(), "server.listen: ") {
		t.Errorf("got %v, want a server.listen error", err)
	}
	c.Server.InsecureNoAuth = true
	if err := c.Validate(); err != nil {
		t.Errorf("with insecure_no_auth: got %v, want nil", err)
	}
	c.Tokens = []Token{{Name: "a", Role: "user", Secret: "short"}}
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "tokens[0]: ") {
		t.Errorf("short secret: got %v, want a tokens[0] error", err)
	}
}

func TestTokenFile(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no permission bits on Windows")
	}
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // WriteFile's mode is masked by umask
			t.Fatal(err)
		}
	}
	write("good", "\n  "+secret1+"\n", 0o600)
	write("open", secret1, 0o644)
	write("empty", " \n", 0o400)
	cfg := filepath.Join(dir, "arbiter.toml")

	doc := func(file string) []byte {
		return []byte("[[tokens]]\nname = \"a\"\nrole = \"agent\"\ntoken_file = " + fmt.Sprintf("%q", file) + "\n")
	}
	c, err := Parse(cfg, doc("good"), env)
	if err != nil {
		t.Fatalf("relative good file: %v", err)
	}
	if got := c.Tokens[0].Secret; got != secret1 {
		t.Errorf("secret: got %q, want %q (trimmed)", got, secret1)
	}
	if _, err := Parse("elsewhere/arbiter.toml", doc(filepath.Join(dir, "good")), env); err != nil {
		t.Errorf("absolute good file: %v", err)
	}

	tests := []struct{ name, file, msg string }{
		{"open", "open", "can be read by group or others (mode 0644); run: chmod 600 " + filepath.Join(dir, "open")},
		{"empty", "empty", "is empty"},
		{"missing", "missing", "no such file"},
		{"directory", ".", "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(cfg, doc(tt.file), env)
			want := cfg + ":4: tokens[0].token_file: "
			if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v, want %q…%q", err, want, tt.msg)
			}
		})
	}
}

func TestMachines(t *testing.T) {
	doc := `
[[machines]]
name = "gpu1"
tags = ["default", "h100"]
cores = 64
ram_gib = 512
cuda = "12.4"
driver = "550.54.15"
gpus = [
  { model = "H100", vram_gib = 80, compute = "9.0", count = 2 },
  { model = "A10", vram_gib = 24.5 },
]

[[machines]]
name = "cpu1"
`
	c, err := Parse("m.toml", []byte(doc), env)
	if err != nil {
		t.Fatal(err)
	}
	want := []arbiter.Machine{{
		Name: "gpu1", Kind: "gpu", Source: "config", Tags: []string{"default", "h100"},
		Cores: 64, RAMGiB: 512, CUDA: "12.4", Driver: "550.54.15",
		GPUs: []arbiter.GPU{
			{Index: 0, Model: "H100", VRAMGiB: 80, Compute: "9.0", Healthy: true},
			{Index: 1, Model: "H100", VRAMGiB: 80, Compute: "9.0", Healthy: true},
			{Index: 2, Model: "A10", VRAMGiB: 24.5, Healthy: true},
		},
	}, {
		Name: "cpu1", Kind: "gpu", Source: "config", Tags: []string{}, GPUs: []arbiter.GPU{},
	}}
	if !reflect.DeepEqual(c.Machines, want) {
		t.Errorf("got  %+v\nwant %+v", c.Machines, want)
	}
	for i := range c.Machines {
		if err := c.Machines[i].Validate(); err != nil {
			t.Errorf("machine %d: %v", i, err)
		}
	}

	// 64 GPUs is the limit, not over it.
	doc = "[[machines]]\nname = \"big\"\ngpus = [{ vram_gib = 8, count = 32 }, { vram_gib = 8, count = 32 }]\n"
	c, err = Parse("m.toml", []byte(doc), env)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.Machines[0].GPUs); got != 64 {
		t.Errorf("gpus: got %d, want 64", got)
	}
}

func TestLoad(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "none.toml"), env); err == nil || !strings.Contains(err.Error(), "none.toml") {
		t.Errorf("missing file: got %v, want an error naming it", err)
	}
	c, err := Load("example.toml", env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path != "example.toml" {
		t.Errorf("path: got %q, want example.toml", c.Path)
	}
}

// TestExample checks that example.toml holds the defaults, and that its
// commented-out examples parse once uncommented.
func TestExample(t *testing.T) {
	data, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("example.toml", data, env)
	if err != nil {
		t.Fatalf("example.toml: %v", err)
	}
	d := Default()
	d.Path = "example.toml"
	if !reflect.DeepEqual(c, d) {
		t.Errorf("example.toml is not the defaults:\ngot  %+v\nwant %+v", c, d)
	}

	// Every key of every section is in the example.
	for _, section := range []string{"server", "allocations", "agents", "events"} {
		f, _ := tomlpos.Field(reflect.TypeOf(file{}), section)
		for _, key := range tomlpos.FieldNames(f.Type) {
			if !regexp.MustCompile(`(?m)^` + key + ` = `).Match(data) {
				t.Errorf("example.toml lacks %s.%s", section, key)
			}
		}
	}

	setting := regexp.MustCompile(`(?m)^# (\[\[[a-z_]+\]\]|[a-z_]+ = .*)$`)
	uncommented := setting.ReplaceAll(data, []byte("$1"))
	getenv := func(name string) string {
		return map[string]string{"ARBITER_ADMIN_TOKEN": secret1, "ARBITER_AGENT_TOKEN": secret2}[name]
	}
	c, err = Parse("example.toml", uncommented, getenv)
	if err != nil {
		t.Fatalf("example.toml uncommented: %v", err)
	}
	if len(c.Tokens) != 2 || len(c.Machines) != 1 || len(c.Machines[0].GPUs) != 8 {
		t.Errorf("uncommented: got %d tokens, %d machines, want 2 and 1 with 8 GPUs", len(c.Tokens), len(c.Machines))
	}
}

func TestTokenHidesSecret(t *testing.T) {
	tok := Token{Name: "a", Role: "user", Secret: secret1}
	for _, s := range []string{fmt.Sprint(tok), fmt.Sprintf("%v %+v %#v %s", tok, tok, tok, tok)} {
		if strings.Contains(s, secret1) {
			t.Errorf("formatted token %q shows its secret", s)
		}
	}
}

// TestExampleListsEveryKey checks that example.toml shows every key the
// decoder takes, in every section and entry, each written `key = …` (set,
// commented out or in a comment's example).
func TestExampleListsEveryKey(t *testing.T) {
	data, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct {
			return
		}
		for _, name := range tomlpos.FieldNames(typ) {
			f, _ := tomlpos.Field(typ, name)
			key := name
			if path != "" {
				key = path + "." + name
			}
			leaf := f.Type
			for leaf.Kind() == reflect.Pointer || leaf.Kind() == reflect.Slice {
				leaf = leaf.Elem()
			}
			// Sections are headers; tables within entries are written
			// "key = " or as a header; every other key is written "key = ".
			switch {
			case path == "" && leaf.Kind() == reflect.Struct:
			case !regexp.MustCompile(`(?m)(^|[\s{,#])`+name+` = `).Match(data) &&
				(leaf.Kind() != reflect.Struct || !strings.Contains(string(data), "[["+key+"]]")):
				t.Errorf("example.toml lacks %s", key)
			}
			walk(key, f.Type)
		}
	}
	walk("", reflect.TypeOf(file{}))
}

// TestSecretLengthInCharacters: the least length of a secret counts
// characters, not bytes.
func TestSecretLengthInCharacters(t *testing.T) {
	env := func(string) string { return "éééééééé" } // 8 characters, 16 bytes
	if _, err := Parse("a.toml", []byte("[[tokens]]\nname = \"a\"\nrole = \"admin\"\ntoken_env = \"T\"\n"), env); err == nil {
		t.Error("an 8-character secret was accepted")
	}
}

// TestPoolsWithOneBackingMustAgree: tags left out and tags = [] are the
// same backing request, so pools with different slots are refused.
func TestPoolsWithOneBackingMustAgree(t *testing.T) {
	_, err := Parse("a.toml", []byte("[[pools]]\nname = \"p\"\nbacking = { gpus = 1 }\nslots = 2\n[[pools]]\nname = \"q\"\nbacking = { gpus = 1, tags = [] }\nslots = 3\n"), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "same backing request") {
		t.Errorf("pools p and q with one backing and different slots: %v", err)
	}
}

// TestVocabularyProblemsAtTheirKey: a problem the vocabulary's checks find
// in an entry is placed at the key it is about, not at the entry's header.
func TestVocabularyProblemsAtTheirKey(t *testing.T) {
	for _, c := range []struct{ doc, key, line string }{
		{"[[services]]\nname = \"s\"\nmachine = \"g\"\nkind = \"command\"\nswap_command = [\"x\", \"{model}\"]\ngpus = -1\n", "services[0].gpus", "a.toml:6:"},
		{"[[quotas]]\ngroup = \"default\"\nmax_gpus = -1\n", "quotas[0].max_gpus", "a.toml:3:"},
	} {
		_, err := Parse("a.toml", []byte(c.doc), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.key) || !strings.HasPrefix(err.Error(), c.line) {
			t.Errorf("want %s %s, got %v", c.line, c.key, err)
		}
	}
}

// TestUnknownKeysAndOtherProblemsAtOnce: a file with an unknown key and a
// bad value has both reported at once.
func TestUnknownKeysAndOtherProblemsAtOnce(t *testing.T) {
	_, err := Parse("a.toml", []byte("[server]\nlog_level = \"x\"\nlsten = \"1\"\n"), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "server.lsten: unknown key") || !strings.Contains(err.Error(), "server.log_level: unknown value") {
		t.Errorf("got %v, want both server.lsten and server.log_level", err)
	}
}

// A problem with a value a command-line flag set names the flag, not the
// file's line.
func TestProblemOfAFlagNamesTheFlag(t *testing.T) {
	doc := "[server]\nlisten = \"127.0.0.1:7070\"\n"
	_, err := Parse("a.toml", []byte(doc), func(string) string { return "" }, func(c *Config) {
		c.Server.Listen = "0.0.0.0:1"
		c.SetByFlag("server.listen", "--listen")
	})
	if err == nil || !strings.Contains(err.Error(), "a.toml: --listen (server.listen): listening on 0.0.0.0:1") ||
		!strings.Contains(err.Error(), "(--insecure-no-auth)") {
		t.Fatalf("got %v", err)
	}
}

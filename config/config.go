// Package config loads and validates arbiter's TOML configuration file
// (docs/reference/native.md, "Configuration file"; config/example.toml documents every
// key with its default).
//
// Decoding is strict: an unknown key is an error. Every error names the key as
// a dotted path with array indices and the line it is written on, e.g.
//
//	arbiter.toml:14: machines[1].gpus[0].vram_gib: must be a number of GiB
//
// A file that fails to load yields an error and no Config. Token secrets are
// resolved at load time from the environment or from files, so a Config holds
// secrets: never log or print one whole.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/tomlpos"
)

// Config is a loaded, validated configuration.
type Config struct {
	Server      Server      `toml:"server"`
	Allocations Allocations `toml:"allocations"`
	Agents      Agents      `toml:"agents"`
	Events      Events      `toml:"events"`
	// Spalloc is the [spalloc] section (docs/reference/spalloc.md).
	Spalloc Spalloc `toml:"spalloc"`
	// Tokens are the configured credentials with their secrets resolved.
	// None configured means the API is open, which Validate allows only on
	// loopback (or with Server.InsecureNoAuth).
	Tokens []Token `toml:"-"`
	// Machines are the [[machines]] entries, expanded: GPUs numbered 0..n-1
	// in the order of the gpus entries and their counts, Kind "gpu", Source
	// "config", all healthy. Tags default to none.
	Machines []arbiter.Machine `toml:"-"`
	// Pools are the [[pools]] entries (docs/reference/pools.md), validated.
	Pools []arbiter.Pool `toml:"-"`
	// GridMachines are the [[grid_machines]] entries (docs/reference/spalloc.md §7),
	// expanded and validated, in file order, which is their priority.
	GridMachines []arbiter.GridMachine `toml:"-"`
	// Services are the [[services]] entries (docs/reference/coordination.md), validated;
	// Catalog holds their [[services.catalog]] entries.
	Services []arbiter.Service      `toml:"-"`
	Catalog  []arbiter.CatalogEntry `toml:"-"`
	// Webhooks is the [webhooks] section (services.go).
	Webhooks Webhooks `toml:"webhooks"`
	// Tasks is the [tasks] section (tasks.go).
	Tasks Tasks `toml:"tasks"`
	// Audit is the [audit] section (trust.go).
	Audit Audit `toml:"audit"`
	// GPUs is the [gpus] section: GPU ground truth (gpus.go).
	GPUs GPUs `toml:"gpus"`
	// FairShare and Preemption are the [fairshare] and [preemption]
	// sections; FairSharePolicy is them with [[groups]] and [[quotas]], as
	// the engine takes it (fairshare.go).
	FairShare       FairShare               `toml:"fairshare"`
	Preemption      Preemption              `toml:"preemption"`
	FairSharePolicy arbiter.FairSharePolicy `toml:"-"`
	// HA is the [ha] section: replicas on one PostgreSQL (ha.go).
	HA HA `toml:"ha"`
	// Path is the file the configuration came from, "" for Default.
	Path string `toml:"-"`
	// flags names the command-line flag that set a key (SetByFlag): a
	// problem with its value is the flag's, not the file's line.
	flags map[string]string
}

// SetByFlag records that the command-line flag flag (such as "--listen")
// set key (such as "server.listen"), for overrides to call.
func (c *Config) SetByFlag(key, flag string) {
	if c.flags == nil {
		c.flags = map[string]string{}
	}
	c.flags[key] = flag
}

// Server is the [server] section.
type Server struct {
	// Listen is the HTTP address, host:port. Default "127.0.0.1:7070".
	Listen string `toml:"listen" want:"a string host:port"`
	// DataDir holds the SQLite database and artifacts. Default
	// "./arbiter-data", relative to the working directory.
	DataDir string `toml:"data_dir"`
	// Database is "" (the SQLite file <data_dir>/arbiter.db), "sqlite:PATH",
	// or a "postgres://" / "postgresql://" URL. See DatabaseTarget.
	Database string `toml:"database"`
	// SpallocListen is the spalloc protocol's TCP address (e.g.
	// "127.0.0.1:22244"), "" for off (the default). Clients are served only
	// from the addresses in [spalloc] allow.
	SpallocListen string `toml:"spalloc_listen" want:"a string host:port"`
	// InsecureNoAuth allows a non-loopback Listen with no tokens configured.
	InsecureNoAuth bool `toml:"insecure_no_auth"`
	// Local registers the server's own host as a machine when no machines
	// are configured. Default true; never nil in a Config from this package.
	Local *bool `toml:"local"`
	// MaxBodyBytes bounds request bodies. Default 1 MiB.
	MaxBodyBytes int64 `toml:"max_body_bytes" want:"a whole number of bytes"`
	// TLSCertFile and TLSKeyFile turn on HTTPS; both or neither. Relative
	// paths are relative to the working directory.
	TLSCertFile string `toml:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file"`
	// TLSClientCA is a PEM file of the certificate authorities whose client
	// certificates the server accepts (needs HTTPS). A /v1 worker with such
	// a certificate is the host its name (common name or a DNS name) says:
	// it must match the worker's X-Lab-Host.
	TLSClientCA string `toml:"tls_client_ca"`
	// Connection limits (trust.go): how long a request's body may take to
	// arrive, how long an idle connection is kept, how many connections
	// one client address may hold open at once (0: no limit).
	BodyTimeoutS      float64 `toml:"body_timeout_s" want:"a number of seconds"`
	IdleTimeoutS      float64 `toml:"idle_timeout_s" want:"a number of seconds"`
	MaxConnsPerClient int     `toml:"max_conns_per_client" want:"a whole number"`
	// Synchronous is SQLite's synchronous pragma: "full" (default) or
	// "normal" (faster; a power cut may lose the last commits, never
	// corrupt). Ignored by PostgreSQL.
	Synchronous string `toml:"synchronous"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `toml:"log_level"`
	// LogFormat is text (default) or json.
	LogFormat string `toml:"log_format"`
	// ShutdownTimeoutS is how long a stopping server waits for requests in
	// flight before it closes them. Default 10.
	ShutdownTimeoutS float64 `toml:"shutdown_timeout_s" want:"a number of seconds"`
	// LeaseTTLS is how long the server's lease on a PostgreSQL database
	// lasts unrenewed (it renews every third of it): the longest a crashed
	// server on another host keeps the next one from starting, and the
	// longest a server cut off from the database goes on before it stops.
	// Default 15; 1 to 600. SQLite needs none (a file lock).
	LeaseTTLS float64 `toml:"lease_ttl_s" want:"a number of seconds"`
}

// Allocations is the [allocations] section.
type Allocations struct {
	// DefaultKeepaliveS is the keepalive of a request that omits
	// keepalive_s. Default 60; 1 to 604800 (a week).
	DefaultKeepaliveS float64 `toml:"default_keepalive_s" want:"a number of seconds"`
	// History is how many destroyed allocations stay queryable, spalloc's
	// jobs aside (they have [spalloc] max_retired_jobs). Default 1200; 0
	// keeps none.
	History int `toml:"history" want:"a whole number"`
	// StarvationS is how long the head of the queue may wait before GPUs
	// freed on machines that could serve it are held for it instead of being
	// backfilled to smaller requests behind it. Default 600. 0 means never
	// hold: requests behind the head are always backfilled, so a large
	// request may wait for as long as small ones keep arriving.
	StarvationS float64 `toml:"starvation_s" want:"a number of seconds"`
}

// Agents is the [agents] section.
type Agents struct {
	// HeartbeatTimeoutS: a machine whose agent is silent this long is marked
	// down. Default 60.
	HeartbeatTimeoutS float64 `toml:"heartbeat_timeout_s" want:"a number of seconds"`
}

// Events is the [events] section.
type Events struct {
	// Keep is how many of the newest events the store keeps. Default 100000.
	Keep int `toml:"keep" want:"a whole number"`
}

// Token is a configured credential with its secret resolved — or, for a
// token given by token_sha256, only the secret's SHA-256 (Secret "").
type Token struct {
	Name   string
	Role   string // arbiter.RoleAdmin, RoleAgent or RoleUser
	Secret string
	SHA256 [sha256.Size]byte // set when Secret is ""
}

// Sum is the SHA-256 of the token's secret, however it was given.
func (t Token) Sum() [sha256.Size]byte {
	if t.Secret != "" {
		return sha256.Sum256([]byte(t.Secret))
	}
	return t.SHA256
}

// String hides the secret so that a Token can be logged.
func (t Token) String() string { return fmt.Sprintf("token %s (%s)", t.Name, t.Role) }

// GoString hides the secret from %#v too.
func (t Token) GoString() string { return t.String() }

// Bounds of the checked values.
const (
	MinSecretLen  = 16     // characters of a token secret
	MaxKeepaliveS = 604800 // a week
	maxTokenFile  = 64 << 10
)

// Database kinds returned by DatabaseTarget.
const (
	DatabaseSQLite   = "sqlite"
	DatabasePostgres = "postgres"
)

// Default returns the configuration the server runs with when there is no
// file. Each call returns a new value.
func Default() *Config {
	local := true
	return &Config{
		Server: Server{
			Listen:           "127.0.0.1:7070",
			DataDir:          "./arbiter-data",
			Local:            &local,
			MaxBodyBytes:     1 << 20,
			Synchronous:      "full",
			LogLevel:         "info",
			LogFormat:        "text",
			ShutdownTimeoutS: 10,
			LeaseTTLS:        15,

			BodyTimeoutS:      DefaultBodyTimeoutS,
			IdleTimeoutS:      DefaultIdleTimeoutS,
			MaxConnsPerClient: DefaultMaxConnsPerClient,
		},
		Allocations: Allocations{DefaultKeepaliveS: 60, History: 1200, StarvationS: 600},
		Agents:      Agents{HeartbeatTimeoutS: 60},
		Events:      Events{Keep: 100000},
		Spalloc:     defaultSpalloc(),
		Webhooks:    defaultWebhooks(),
		Tasks:       defaultTasks(),
		Audit:       Audit{Keep: arbiter.DefaultAuditKeep},
		GPUs:        defaultGPUs(),
		FairShare:   defaultFairShare(),
		Preemption:  defaultPreemption(),
		FairSharePolicy: func() arbiter.FairSharePolicy {
			p := arbiter.DefaultFairSharePolicy()
			p.Groups, p.Quotas = []arbiter.Group{}, []arbiter.Quota{}
			return p
		}(),
		HA: defaultHA(),
	}
}

// DatabaseTarget says which store the configuration names: DatabaseSQLite
// with a file path (<data_dir>/arbiter.db when Database is "") or
// DatabasePostgres with the URL. Database must have been validated.
func (s *Server) DatabaseTarget() (kind, target string) {
	switch {
	case s.Database == "":
		return DatabaseSQLite, filepath.Join(s.DataDir, "arbiter.db")
	case strings.HasPrefix(s.Database, "sqlite:"):
		return DatabaseSQLite, strings.TrimPrefix(s.Database, "sqlite:")
	}
	return DatabasePostgres, s.Database
}

// LocalEnabled reports whether the server registers its own host when no
// machines are configured (Local, defaulting to true).
func (s *Server) LocalEnabled() bool { return s.Local == nil || *s.Local }

// Load reads and parses the configuration file at path. getenv resolves
// token_env (os.Getenv when nil); overrides as Parse. Errors: the file
// cannot be read, or any problem Parse reports.
func Load(path string, getenv func(string) string, overrides ...func(*Config)) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data, getenv, overrides...)
}

// Parse parses and validates a configuration document. name is the file's
// name, used in messages and to resolve relative token_file paths (against
// its directory). getenv resolves token_env (os.Getenv when nil).
//
// overrides (command-line flags) change the configuration before it is
// checked. On failure it returns no Config and an error made of one *Error
// per problem (errors.Join when more than one), in file order.
func Parse(name string, data []byte, getenv func(string) string, overrides ...func(*Config)) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	f := newFile()
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	unknown := dec.Decode(f)
	if unknown != nil {
		var se *toml.StrictMissingError
		if !errors.As(unknown, &se) {
			return nil, decodeError(name, data, unknown) // a syntax or type error stops here
		}
		// Only unknown keys: decoded again without them, the rest is
		// checked too, so that every problem is reported at once.
		f = newFile()
		if err := toml.NewDecoder(bytes.NewReader(data)).Decode(f); err != nil {
			return nil, decodeError(name, data, unknown)
		}
	}

	var ps problems
	f.checkPending(&ps)
	c := &Config{
		Server:      f.Server,
		Allocations: f.Allocations,
		Agents:      f.Agents,
		Events:      f.Events,
		Spalloc:     f.Spalloc,
		Webhooks:    f.Webhooks,
		Tasks:       f.Tasks,
		Audit:       f.Audit,
		GPUs:        f.GPUs,
		FairShare:   f.FairShare,
		Preemption:  f.Preemption,
		HA:          f.HA,
		Path:        name,
	}
	c.Tasks.resolve(filepath.Dir(name))
	c.HA.resolve(&ps, filepath.Dir(name), getenv)
	if c.Server.Local == nil {
		local := true
		c.Server.Local = &local
	}
	c.Tokens = f.resolveTokens(&ps, filepath.Dir(name), getenv)
	c.Machines = f.expandMachines(&ps)
	c.Pools = f.expandPools(&ps)
	c.GridMachines = f.expandGrid(&ps)
	c.Services, c.Catalog = f.expandServices(&ps)
	c.FairSharePolicy = f.expandFairShare(&ps) // fairshare.go
	for _, o := range overrides {
		o(c) // before the checks: a flag may make right what the file alone is not
	}
	c.validate(&ps, func(i int) string {
		switch {
		case f.Tokens[i].TokenFile != "":
			return fmt.Sprintf("tokens[%d].token_file", i)
		case f.Tokens[i].TokenSHA256 != "":
			return fmt.Sprintf("tokens[%d].token_sha256", i)
		}
		return fmt.Sprintf("tokens[%d].token_env", i)
	})
	switch {
	case unknown != nil && len(ps.list) > 0:
		return nil, errors.Join(decodeError(name, data, unknown), ps.errors(name, tomlpos.NewIndex(data), c.flags))
	case unknown != nil:
		return nil, decodeError(name, data, unknown)
	case len(ps.list) > 0:
		return nil, ps.errors(name, tomlpos.NewIndex(data), c.flags)
	}
	return c, nil
}

// Validate checks a configuration, for instance after command-line flags
// overrode some of it. Errors name the key (without a line).
func (c *Config) Validate() error {
	var ps problems
	c.validate(&ps, func(i int) string { return fmt.Sprintf("tokens[%d]", i) })
	if len(ps.list) > 0 {
		return ps.errors("", nil, c.flags)
	}
	return nil
}

// file is the document as decoded: the sections of Config as they are
// written, plus entries that are expanded or resolved into Config.
type file struct {
	Server      Server         `toml:"server"`
	Allocations Allocations    `toml:"allocations"`
	Agents      Agents         `toml:"agents"`
	Events      Events         `toml:"events"`
	Tokens      []tokenEntry   `toml:"tokens"`
	Machines    []machineEntry `toml:"machines"`

	// Sections of later features (docs/reference/native.md). They are recognised so
	// that they are not "unknown", and refused while they have content. To
	// turn one on: give it its own entry type here, validate it, and drop it
	// from checkPending.
	GridMachines []gridEntry    `toml:"grid_machines" want:"an array of tables ([[grid_machines]])"`
	Spalloc      Spalloc        `toml:"spalloc" want:"a table ([spalloc])"`
	Tasks        Tasks          `toml:"tasks" want:"a table ([tasks])"`
	Pools        []poolEntry    `toml:"pools" want:"an array of tables ([[pools]])"`
	Services     []serviceEntry `toml:"services" want:"an array of tables ([[services]])"`
	Webhooks     Webhooks       `toml:"webhooks" want:"a table ([webhooks])"`
	Audit        Audit          `toml:"audit" want:"a table ([audit])"`
	GPUs         GPUs           `toml:"gpus" want:"a table ([gpus])"`
	// Fair share (fairshare.go).
	Groups     []groupEntry `toml:"groups" want:"an array of tables ([[groups]])"`
	Quotas     []quotaEntry `toml:"quotas" want:"an array of tables ([[quotas]])"`
	FairShare  FairShare    `toml:"fairshare" want:"a table ([fairshare])"`
	Preemption Preemption   `toml:"preemption" want:"a table ([preemption])"`
	HA         HA           `toml:"ha" want:"a table ([ha])"`
}

// tokenEntry is one [[tokens]] entry.
type tokenEntry struct {
	Name      string `toml:"name"`
	Role      string `toml:"role" want:"a string: admin, agent or user"`
	TokenEnv  string `toml:"token_env" want:"a string naming an environment variable"`
	TokenFile string `toml:"token_file" want:"a string naming a file"`
	// TokenSHA256 is the secret's SHA-256 in hex, instead of the secret:
	// the file then holds nothing a client could present.
	TokenSHA256 string `toml:"token_sha256" want:"a string of 64 hex digits"`
}

// machineEntry is one [[machines]] entry.
type machineEntry struct {
	Name   string     `toml:"name"`
	Tags   []string   `toml:"tags"`
	Cores  int        `toml:"cores" want:"a whole number"`
	RAMGiB float64    `toml:"ram_gib" want:"a number of GiB"`
	CUDA   string     `toml:"cuda" want:"a string such as \"12.4\""`
	Driver string     `toml:"driver" want:"a string such as \"550.54.15\""`
	GPUs   []gpuEntry `toml:"gpus" want:"an array of tables such as [{ model = \"…\", vram_gib = 80, count = 8 }]"`
}

// gpuEntry is one element of a machine's gpus: count identical GPUs.
type gpuEntry struct {
	Model   string   `toml:"model"`
	VRAMGiB *float64 `toml:"vram_gib" want:"a number of GiB"`
	Compute string   `toml:"compute" want:"a string such as \"9.0\""`
	Count   *int     `toml:"count" want:"a whole number"`
}

// newFile returns a file holding the defaults, which decoding overwrites
// key by key.
func newFile() *file {
	d := Default()
	return &file{Server: d.Server, Allocations: d.Allocations, Agents: d.Agents, Events: d.Events, Spalloc: d.Spalloc, Webhooks: d.Webhooks, Tasks: d.Tasks, Audit: d.Audit, GPUs: d.GPUs,
		FairShare: d.FairShare, Preemption: d.Preemption, HA: d.HA}
}

// checkPending refuses the sections of features this build does not have.
// Every section of docs/reference/native.md is supported now; a new pending one
// adds its check here.
func (f *file) checkPending(ps *problems) {}

// resolveTokens reads each token's secret. The result has one Token per
// entry, in order (Secret "" where it could not be read), so that problems
// found later name the right entry.
func (f *file) resolveTokens(ps *problems, dir string, getenv func(string) string) []Token {
	var out []Token
	for i, e := range f.Tokens {
		t := Token{Name: e.Name, Role: e.Role}
		key := fmt.Sprintf("tokens[%d]", i)
		var given []string
		for _, f := range []struct{ name, v string }{{"token_env", e.TokenEnv}, {"token_file", e.TokenFile}, {"token_sha256", e.TokenSHA256}} {
			if f.v != "" {
				given = append(given, f.name)
			}
		}
		switch {
		case len(given) > 1:
			ps.add(key+"."+given[1], "set only one of token_env, token_file and token_sha256, not both "+given[0]+" and "+given[1])
		case e.TokenEnv != "":
			t.Secret = getenv(e.TokenEnv)
			if t.Secret == "" {
				ps.add(key+".token_env", fmt.Sprintf("environment variable %s is not set or empty; export the token's secret in it", e.TokenEnv))
			}
		case e.TokenFile != "":
			s, err := readTokenFile(dir, e.TokenFile)
			if err != nil {
				ps.add(key+".token_file", err.Error())
			}
			t.Secret = s
		case e.TokenSHA256 != "":
			b, err := hex.DecodeString(strings.ToLower(e.TokenSHA256))
			if err != nil || len(b) != sha256.Size {
				ps.add(key+".token_sha256", "must be the secret's SHA-256 as 64 hex digits: printf %s \"$SECRET\" | sha256sum")
			}
			copy(t.SHA256[:], b)
		default:
			ps.add(key, "a token needs token_env (an environment variable), token_file (a file) or token_sha256 (the secret's SHA-256)")
		}
		out = append(out, t)
	}
	return out
}

// readTokenFile reads a secret (a token's, the replicas') from a file that
// only its owner may read,
// trimmed of surrounding white space.
func readTokenFile(dir, name string) (string, error) {
	path := name
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs // messages say where it was looked for
	}
	fh, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("cannot read the secret file %s: %w", path, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return "", fmt.Errorf("cannot read the secret file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("secret file %s is not a regular file", path)
	}
	// Windows has no such permission bits to check.
	if perm := st.Mode().Perm(); perm&0o077 != 0 && runtime.GOOS != "windows" {
		return "", fmt.Errorf("secret file %s can be read by group or others (mode %04o); run: chmod 600 %s", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(fh, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("cannot read the secret file %s: %w", path, err)
	}
	if len(data) > maxTokenFile {
		return "", fmt.Errorf("secret file %s is larger than %d bytes; it should hold only the secret", path, maxTokenFile)
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return "", fmt.Errorf("secret file %s is empty; write the token's secret in it", path)
	}
	return s, nil
}

// expandMachines turns [[machines]] entries into machines, checking what
// only the entries show (the gpus entries). The result has one Machine per
// entry, in order.
func (f *file) expandMachines(ps *problems) []arbiter.Machine {
	var out []arbiter.Machine
	for i, e := range f.Machines {
		key := fmt.Sprintf("machines[%d]", i)
		m := arbiter.Machine{
			Name:   e.Name,
			Kind:   arbiter.KindGPU,
			Source: arbiter.SourceConfig,
			Tags:   append([]string{}, e.Tags...),
			Cores:  e.Cores,
			RAMGiB: e.RAMGiB,
			CUDA:   e.CUDA,
			Driver: e.Driver,
			GPUs:   []arbiter.GPU{},
		}
		total := 0
		for j, g := range e.GPUs {
			gkey := fmt.Sprintf("%s.gpus[%d]", key, j)
			n := 1
			if g.Count != nil {
				n = *g.Count
			}
			if n < 1 || n > arbiter.MaxGPUsPerMachine {
				ps.add(gkey+".count", fmt.Sprintf("must be 1 to %d, got %d", arbiter.MaxGPUsPerMachine, n))
				continue
			}
			var vram float64
			switch {
			case g.VRAMGiB == nil:
				ps.add(gkey+".vram_gib", "missing: give the memory of each GPU in GiB, e.g. vram_gib = 80")
			case !finite(*g.VRAMGiB) || *g.VRAMGiB <= 0:
				ps.add(gkey+".vram_gib", fmt.Sprintf("must be a positive number of GiB, got %v", *g.VRAMGiB))
			default:
				vram = *g.VRAMGiB
			}
			if g.Compute != "" {
				if _, _, ok := arbiter.ParseCompute(g.Compute); !ok {
					ps.add(gkey+".compute", fmt.Sprintf("compute capability %q is not of the form \"9.0\"", g.Compute))
				}
			}
			if total+n > arbiter.MaxGPUsPerMachine {
				ps.add(gkey+".count", fmt.Sprintf("the machine would have more than %d GPUs; a machine may have at most %d", arbiter.MaxGPUsPerMachine, arbiter.MaxGPUsPerMachine))
				break
			}
			for k := 0; k < n; k++ {
				m.GPUs = append(m.GPUs, arbiter.GPU{
					Index:   total,
					Model:   g.Model,
					VRAMGiB: vram,
					Compute: g.Compute,
					Healthy: true,
				})
				total++
			}
		}
		out = append(out, m)
	}
	return out
}

// validate checks the assembled configuration. secretKey names where token
// i's secret came from.
func (c *Config) validate(ps *problems, secretKey func(i int) string) {
	s := &c.Server
	if err := checkListen(s.Listen); err != nil {
		ps.add("server.listen", err.Error())
	} else if host, _, _ := net.SplitHostPort(s.Listen); len(c.Tokens) == 0 && !s.InsecureNoAuth && !isLoopback(host) {
		ps.add("server.listen", fmt.Sprintf("listening on %s with no [[tokens]] would let anyone on the network use the API; configure tokens, listen on 127.0.0.1, or set insecure_no_auth = true (--insecure-no-auth)", s.Listen))
	}
	if s.DataDir == "" {
		ps.add("server.data_dir", "must not be empty; it holds the database and artifacts")
	}
	if err := checkDatabase(s.Database); err != nil {
		ps.add("server.database", err.Error())
	}
	if s.SpallocListen != "" {
		if err := checkListen(s.SpallocListen); err != nil {
			ps.add("server.spalloc_listen", err.Error())
		}
	}
	if s.MaxBodyBytes < 1024 {
		ps.add("server.max_body_bytes", fmt.Sprintf("must be at least 1024, got %d", s.MaxBodyBytes))
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") {
		key := "server.tls_key_file"
		if s.TLSCertFile == "" {
			key = "server.tls_cert_file"
		}
		ps.add(key, "set both tls_cert_file and tls_key_file to serve HTTPS, or neither")
	}
	checkEnum(ps, "server.synchronous", s.Synchronous, "full", "normal")
	checkEnum(ps, "server.log_level", s.LogLevel, "debug", "info", "warn", "error")
	checkEnum(ps, "server.log_format", s.LogFormat, "text", "json")
	checkSeconds(ps, "server.shutdown_timeout_s", s.ShutdownTimeoutS, 0, 3600)
	checkSeconds(ps, "server.lease_ttl_s", s.LeaseTTLS, 1, 600)

	checkSeconds(ps, "allocations.default_keepalive_s", c.Allocations.DefaultKeepaliveS, 1, MaxKeepaliveS)
	if c.Allocations.History < 0 {
		ps.add("allocations.history", fmt.Sprintf("must not be negative, got %d", c.Allocations.History))
	}
	checkSeconds(ps, "allocations.starvation_s", c.Allocations.StarvationS, 0, MaxKeepaliveS)
	if h := c.Agents.HeartbeatTimeoutS; !finite(h) || h <= 0 || h > MaxKeepaliveS {
		ps.add("agents.heartbeat_timeout_s", fmt.Sprintf("must be more than 0 and at most %d seconds, got %v", MaxKeepaliveS, h))
	}
	if c.Events.Keep < 1 {
		ps.add("events.keep", fmt.Sprintf("must be at least 1, got %d", c.Events.Keep))
	}

	c.validateTokens(ps, secretKey)
	c.validateMachines(ps)
	c.validateSpalloc(ps)
	c.validateWebhooks(ps)
	c.validateTasks(ps)
	c.validateTrust(ps) // trust.go
	c.validateGPUs(ps)
	c.validateHA(ps) // ha.go
}

func (c *Config) validateTokens(ps *problems, secretKey func(i int) string) {
	names := map[string]int{}
	secrets := map[[sha256.Size]byte]int{}
	for i, t := range c.Tokens {
		key := fmt.Sprintf("tokens[%d]", i)
		if err := arbiter.ValidateName("token name", t.Name); err != nil {
			ps.add(key+".name", err.Error())
		} else if j, dup := names[t.Name]; dup {
			ps.add(key+".name", fmt.Sprintf("token name %q is already used by tokens[%d]", t.Name, j))
		} else {
			names[t.Name] = i
		}
		switch t.Role {
		case arbiter.RoleAdmin, arbiter.RoleAgent, arbiter.RoleUser:
		default:
			ps.add(key+".role", fmt.Sprintf("unknown role %q; want admin, agent or user", t.Role))
		}
		// Never quote a secret: messages end up in logs. A digest's secret
		// cannot be measured; the digest must not be of nothing.
		sum := t.Sum()
		switch j, dup := secrets[sum]; {
		case t.Secret == "" && sum != ([sha256.Size]byte{}) && sum == sha256.Sum256(nil):
			ps.add(secretKey(i), "token_sha256 is the SHA-256 of an empty secret")
		case t.Secret != "" && utf8.RuneCountInString(t.Secret) < MinSecretLen:
			ps.add(secretKey(i), fmt.Sprintf("the secret is %d characters; use at least %d (e.g. openssl rand -hex 32)", utf8.RuneCountInString(t.Secret), MinSecretLen))
		case t.Secret == "" && sum == ([sha256.Size]byte{}):
			ps.add(secretKey(i), fmt.Sprintf("the secret is 0 characters; use at least %d (e.g. openssl rand -hex 32)", MinSecretLen))
		case dup:
			ps.add(secretKey(i), fmt.Sprintf("the secret is the same as that of tokens[%d]; give every token its own secret", j))
		default:
			secrets[sum] = i
		}
	}
}

func (c *Config) validateMachines(ps *problems) {
	names := map[string]int{}
	for i := range c.Machines {
		m := &c.Machines[i]
		key := fmt.Sprintf("machines[%d]", i)
		if err := arbiter.ValidateName("machine name", m.Name); err != nil {
			ps.add(key+".name", err.Error())
		} else if j, dup := names[m.Name]; dup {
			ps.add(key+".name", fmt.Sprintf("machine name %q is already used by machines[%d]", m.Name, j))
		} else {
			names[m.Name] = i
		}
		for j, t := range m.Tags {
			if t == "" || strings.ContainsAny(t, " \t\r\n,") {
				ps.add(fmt.Sprintf("%s.tags[%d]", key, j), fmt.Sprintf("tag %q must be non-empty without spaces or commas", t))
			}
		}
		if m.Cores < 0 {
			ps.add(key+".cores", fmt.Sprintf("must not be negative, got %d", m.Cores))
		}
		if !finite(m.RAMGiB) || m.RAMGiB < 0 {
			ps.add(key+".ram_gib", fmt.Sprintf("must be a number of GiB, not negative, got %v", m.RAMGiB))
		}
		if m.CUDA != "" && !isVersion(m.CUDA) {
			ps.add(key+".cuda", fmt.Sprintf("CUDA version %q is not of the form \"12.4\"", m.CUDA))
		}
		if len(m.Driver) > 64 || strings.ContainsFunc(m.Driver, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			ps.add(key+".driver", "must be a version string of at most 64 printable characters")
		}
		for _, g := range m.GPUs {
			if !finite(g.VRAMGiB) || g.VRAMGiB <= 0 {
				ps.add(key+".gpus", fmt.Sprintf("gpu %d: vram_gib must be a positive number of GiB", g.Index))
				break
			}
		}
		if ps.has(key) {
			continue
		}
		// The vocabulary's own rules are the last word; the checks above
		// only say more precisely where a problem is.
		if err := m.Validate(); err != nil {
			ps.add(key, err.Error())
		}
	}
}

func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. \"127.0.0.1:7070\" or \":7070\")", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if strings.ContainsAny(host, " \t\r\n/") {
		return fmt.Errorf("host %q is not a host name or IP address", host)
	}
	return nil
}

// isLoopback reports whether host only accepts connections from this host.
// An empty host listens on every interface.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func checkDatabase(db string) error {
	switch {
	case db == "":
		return nil
	case strings.HasPrefix(db, "sqlite:"):
		if strings.TrimPrefix(db, "sqlite:") == "" {
			return fmt.Errorf("\"sqlite:\" needs a file path, e.g. \"sqlite:/var/lib/arbiter/arbiter.db\"")
		}
		return nil
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		// The URL may hold a password: say what is wrong, never echo it.
		u, err := url.Parse(db)
		if err != nil || u.Host == "" {
			return fmt.Errorf("the PostgreSQL URL is not a valid postgres://user@host:port/database URL")
		}
		return nil
	}
	scheme, _, found := strings.Cut(db, ":")
	if !found {
		return fmt.Errorf("%q has no scheme; for a SQLite file write \"sqlite:%s\"", db, db)
	}
	if len(scheme) > 20 {
		scheme = scheme[:20] + "…"
	}
	return fmt.Errorf("unknown database %q; want \"\" (SQLite in data_dir), \"sqlite:PATH\" or a \"postgres://\" URL", scheme+":…")
}

func checkEnum(ps *problems, key, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	ps.add(key, fmt.Sprintf("unknown value %q; want %s", v, strings.Join(allowed, ", ")))
}

func checkSeconds(ps *problems, key string, v, lo, hi float64) {
	if !finite(v) || v < lo || v > hi {
		ps.add(key, fmt.Sprintf("must be %v to %v seconds, got %v", lo, hi, v))
	}
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// isVersion reports whether s is a dotted version of one to three numbers,
// such as "12" or "12.4".
func isVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 3 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 4 || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

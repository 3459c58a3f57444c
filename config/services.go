package config

import (
	"fmt"
	"path"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// serviceEntry is one [[services]] entry (docs/reference/coordination.md §2).
type serviceEntry struct {
	Name           string         `toml:"name"`
	Machine        string         `toml:"machine"`
	Kind           string         `toml:"kind" want:"a string: vllm or command"`
	Endpoint       string         `toml:"endpoint" want:"a string URL such as \"http://127.0.0.1:8000\""`
	SwapCommand    []string       `toml:"swap_command" want:"an array of strings such as [\"/opt/vllm/launch.sh\", \"{model}\"]"`
	LocalPathRoots []string       `toml:"local_path_roots" want:"an array of absolute paths such as [\"/models\"]"`
	Default        bool           `toml:"default" want:"true or false"`
	ReadyTimeoutS  *float64       `toml:"ready_timeout_s" want:"a number of seconds"`
	SwapTimeoutS   *float64       `toml:"swap_timeout_s" want:"a number of seconds"`
	GPUs           int            `toml:"gpus" want:"a whole number of GPUs"`
	Catalog        []catalogEntry `toml:"catalog" want:"an array of tables ([[services.catalog]])"`
}

// catalogEntry is one [[services.catalog]] entry: a model the service may
// serve.
type catalogEntry struct {
	Key        string   `toml:"key"`
	Repo       string   `toml:"repo"`
	LocalPath  string   `toml:"local_path"`
	Args       []string `toml:"args" want:"an array of strings"`
	ServedName string   `toml:"served_name"`
}

// Webhooks is the [webhooks] section: how the dispatcher delivers events to
// the subscriptions admins create through the API.
type Webhooks struct {
	// AllowLinkLocal lets subscriptions target link-local, unspecified,
	// multicast and cloud metadata addresses (169.254.169.254 …). Default
	// false: such URLs are refused, and so are connections to them.
	AllowLinkLocal bool `toml:"allow_link_local" want:"true or false"`
	// TimeoutS bounds one POST. Default 10.
	TimeoutS float64 `toml:"timeout_s" want:"a number of seconds"`
	// RetryMinS is the wait before the first retry; it doubles per attempt
	// up to RetryMaxS, with jitter. Defaults 1 and 300.
	RetryMinS float64 `toml:"retry_min_s" want:"a number of seconds"`
	RetryMaxS float64 `toml:"retry_max_s" want:"a number of seconds"`
	// RetryForS: a delivery not delivered this long after its event is
	// given up as failed. Default 3600.
	RetryForS float64 `toml:"retry_for_s" want:"a number of seconds"`
	// Workers is how many deliveries may be in flight at once. Default 8.
	Workers int `toml:"workers" want:"a whole number"`
	// Keep is how many finished deliveries the log keeps. Default 10000.
	Keep int `toml:"keep" want:"a whole number"`
}

// defaultWebhooks are the [webhooks] defaults.
func defaultWebhooks() Webhooks {
	return Webhooks{TimeoutS: 10, RetryMinS: 1, RetryMaxS: 300, RetryForS: 3600, Workers: 8, Keep: 10000}
}

// expandServices turns [[services]] into services and their configured
// catalog entries, checking each with the key and line at fault.
func (f *file) expandServices(ps *problems) ([]arbiter.Service, []arbiter.CatalogEntry) {
	var svcs []arbiter.Service
	var cat []arbiter.CatalogEntry
	names := map[string]int{}
	defaults := []int{}
	for i, e := range f.Services {
		key := fmt.Sprintf("services[%d]", i)
		s := arbiter.Service{
			Name: e.Name, Machine: e.Machine, Kind: e.Kind, Endpoint: e.Endpoint,
			SwapCommand: append([]string{}, e.SwapCommand...), LocalPathRoots: append([]string{}, e.LocalPathRoots...),
			Default: e.Default, ReadyTimeoutS: arbiter.DefaultReadyTimeoutS, SwapTimeoutS: arbiter.DefaultSwapTimeoutS,
			GPUs: e.GPUs,
		}
		if e.ReadyTimeoutS != nil {
			s.ReadyTimeoutS = *e.ReadyTimeoutS
		}
		if e.SwapTimeoutS != nil {
			s.SwapTimeoutS = *e.SwapTimeoutS
		}
		if err := arbiter.ValidateName("service name", s.Name); err != nil {
			ps.add(key+".name", err.Error())
		} else if j, dup := names[s.Name]; dup {
			ps.add(key+".name", fmt.Sprintf("service name %q is already used by services[%d]", s.Name, j))
		} else {
			names[s.Name] = i
		}
		if err := arbiter.ValidateName("machine", s.Machine); err != nil {
			ps.add(key+".machine", err.Error()+"; name the machine whose agent runs the swaps")
		}
		switch s.Kind {
		case arbiter.ServiceVLLM, arbiter.ServiceCommand:
		case "":
			ps.add(key+".kind", "missing: vllm (checked through GET /v1/models) or command")
		default:
			ps.add(key+".kind", fmt.Sprintf("unknown kind %q; want vllm or command", s.Kind))
		}
		if len(s.SwapCommand) == 0 {
			ps.add(key+".swap_command", "missing: the program and arguments a swap runs, e.g. [\"/opt/vllm/launch.sh\", \"{model}\"]")
		} else if err := arbiter.ValidateSwapTemplate(s.SwapCommand); err != nil {
			ps.add(key+".swap_command", arbiter.ErrorMessage(err))
		}
		for j, r := range s.LocalPathRoots {
			if !path.IsAbs(r) || strings.Contains("/"+r+"/", "/../") {
				ps.add(fmt.Sprintf("%s.local_path_roots[%d]", key, j), fmt.Sprintf("%q must be an absolute path without '..'", r))
			}
		}
		if !finite(s.ReadyTimeoutS) || s.ReadyTimeoutS <= 0 || s.ReadyTimeoutS > 86400 {
			ps.add(key+".ready_timeout_s", fmt.Sprintf("must be more than 0 and at most 86400 seconds, got %v", s.ReadyTimeoutS))
		}
		if !finite(s.SwapTimeoutS) || s.SwapTimeoutS <= 0 || s.SwapTimeoutS > 7*86400 {
			ps.add(key+".swap_timeout_s", fmt.Sprintf("must be more than 0 and at most 604800 seconds, got %v", s.SwapTimeoutS))
		}
		if s.Default {
			defaults = append(defaults, i)
		}
		if !ps.has(key) {
			// The vocabulary's rules are the last word (the endpoint URL).
			if err := s.Validate(); err != nil {
				msg := arbiter.ErrorMessage(err)
				field := fieldNamed(msg, "gpus", "machine", "kind", "endpoint", "name")
				if field == "" && strings.Contains(msg, "endpoint") {
					field = ".endpoint"
				}
				ps.add(key+field, msg)
			}
		}
		keys := map[string]int{}
		for j, ce := range e.Catalog {
			ckey := fmt.Sprintf("%s.catalog[%d]", key, j)
			c := arbiter.CatalogEntry{Service: s.Name, Key: ce.Key, Repo: ce.Repo, LocalPath: ce.LocalPath,
				Args: append([]string{}, ce.Args...), ServedName: ce.ServedName, Source: arbiter.CatalogFromConfig}
			switch {
			case arbiter.ValidateName("model key", c.Key) != nil:
				ps.add(ckey+".key", arbiter.ErrorMessage(arbiter.ValidateName("model key", c.Key)))
				continue
			case c.Repo != "" && c.LocalPath != "":
				ps.add(ckey+".local_path", "give repo or local_path, not both")
				continue
			case c.LocalPath != "":
				if err := arbiter.CheckLocalPath(c.LocalPath, s.LocalPathRoots); err != nil {
					ps.add(ckey+".local_path", arbiter.ErrorMessage(err))
					continue
				}
			}
			if j0, dup := keys[c.Key]; dup {
				ps.add(ckey+".key", fmt.Sprintf("model key %q is already used by %s.catalog[%d]", c.Key, key, j0))
				continue
			}
			keys[c.Key] = j
			if err := c.Validate(&s); err != nil {
				ps.add(ckey, arbiter.ErrorMessage(err))
				continue
			}
			cat = append(cat, c)
		}
		svcs = append(svcs, s)
	}
	if len(defaults) > 1 {
		ps.add(fmt.Sprintf("services[%d].default", defaults[1]), fmt.Sprintf("services[%d] is already the default; only one service may be (the compatible /api/swap endpoints act on it)", defaults[0]))
	}
	return svcs, cat
}

// validateWebhooks checks the [webhooks] section.
func (c *Config) validateWebhooks(ps *problems) {
	w := &c.Webhooks
	checkSeconds(ps, "webhooks.timeout_s", w.TimeoutS, 0.001, 300)
	checkSeconds(ps, "webhooks.retry_min_s", w.RetryMinS, 0.001, 86400)
	checkSeconds(ps, "webhooks.retry_max_s", w.RetryMaxS, 0.001, 86400)
	checkSeconds(ps, "webhooks.retry_for_s", w.RetryForS, 0, 7*86400)
	if finite(w.RetryMinS) && finite(w.RetryMaxS) && w.RetryMaxS < w.RetryMinS {
		ps.add("webhooks.retry_max_s", fmt.Sprintf("must be at least retry_min_s (%v), got %v", w.RetryMinS, w.RetryMaxS))
	}
	if w.Workers < 1 || w.Workers > 256 {
		ps.add("webhooks.workers", fmt.Sprintf("must be 1 to 256, got %d", w.Workers))
	}
	if w.Keep < 1 {
		ps.add("webhooks.keep", fmt.Sprintf("must be at least 1, got %d", w.Keep))
	}
}

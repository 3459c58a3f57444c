package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

const servicesDoc = `
[[services]]
name = "vllm"
machine = "gpu1"
kind = "vllm"
endpoint = "http://127.0.0.1:8000"
swap_command = ["/opt/vllm/launch.sh", "{model}", "{args}"]
local_path_roots = ["/models"]
default = true
ready_timeout_s = 120

[[services.catalog]]
key = "gemma"
repo = "google/gemma-3-27b-it"
args = ["--max-model-len", "8192"]

[[services.catalog]]
key = "ten31"
local_path = "/models/ten31-v2"
served_name = "ten31"

[[services]]
name = "tts"
machine = "gpu2"
kind = "command"
swap_command = ["swap-tts", "{key}"]

[webhooks]
allow_link_local = true
retry_for_s = 60
`

func TestServicesConfig(t *testing.T) {
	c, err := Parse("a.toml", []byte(servicesDoc), env)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Services) != 2 || len(c.Catalog) != 2 {
		t.Fatalf("got %d services, %d entries", len(c.Services), len(c.Catalog))
	}
	s := c.Services[0]
	if s.Name != "vllm" || !s.Default || s.ReadyTimeoutS != 120 || s.SwapTimeoutS != arbiter.DefaultSwapTimeoutS || !reflect.DeepEqual(s.LocalPathRoots, []string{"/models"}) {
		t.Errorf("service: %+v", s)
	}
	if e := c.Catalog[1]; e.Service != "vllm" || e.Key != "ten31" || e.LocalPath != "/models/ten31-v2" || e.Source != arbiter.CatalogFromConfig {
		t.Errorf("entry: %+v", e)
	}
	if !c.Webhooks.AllowLinkLocal || c.Webhooks.RetryForS != 60 || c.Webhooks.Workers != 8 {
		t.Errorf("webhooks: %+v", c.Webhooks)
	}
	cmd, err := arbiter.SwapCommandFor(&c.Services[0], &c.Catalog[0])
	if err != nil || strings.Join(cmd, " ") != "/opt/vllm/launch.sh google/gemma-3-27b-it --max-model-len 8192" {
		t.Errorf("command: %v %v", cmd, err)
	}
}

func TestServicesConfigBad(t *testing.T) {
	svc := "[[services]]\nname = \"vllm\"\nmachine = \"gpu1\"\nkind = \"vllm\"\nendpoint = \"http://127.0.0.1:8000\"\nswap_command = [\"/x\", \"{model}\"]\nlocal_path_roots = [\"/models\"]\n"
	cases := []struct {
		name, doc string
		line      int
		key, msg  string
	}{
		{"no kind", "[[services]]\nname = \"a\"\nmachine = \"m\"\nswap_command = [\"/x\"]\n", 1, "services[0].kind", "missing"},
		{"no command", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"command\"\n", 1, "services[0].swap_command", "missing"},
		{"placeholder", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"command\"\nswap_command = [\"/x\", \"{modle}\"]\n", 5, "services[0].swap_command", "unknown placeholder {modle}"},
		{"args inside", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"command\"\nswap_command = [\"/x\", \"--a={args}\"]\n", 5, "services[0].swap_command", "whole element"},
		{"relative program", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"command\"\nswap_command = [\"bin/x\"]\n", 5, "services[0].swap_command", "absolute path"},
		{"vllm no endpoint", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"vllm\"\nswap_command = [\"/x\"]\n", 1, "services[0].endpoint", "needs an endpoint"},
		{"bad endpoint", svc + "endpoint = \"ftp://x\"\n", 0, "", ""},
		{"relative root", "[[services]]\nname = \"a\"\nmachine = \"m\"\nkind = \"command\"\nswap_command = [\"/x\"]\nlocal_path_roots = [\"models\"]\n", 6, "services[0].local_path_roots[0]", "absolute"},
		{"both", svc + "[[services.catalog]]\nkey = \"k\"\nrepo = \"a/b\"\nlocal_path = \"/models/k\"\n", 11, "services[0].catalog[0].local_path", "not both"},
		{"outside roots", svc + "[[services.catalog]]\nkey = \"k\"\nlocal_path = \"/srv/k\"\n", 10, "services[0].catalog[0].local_path", "outside the allowed roots"},
		{"dotdot", svc + "[[services.catalog]]\nkey = \"k\"\nlocal_path = \"/models/../etc\"\n", 10, "services[0].catalog[0].local_path", "'..'"},
		{"relative path", svc + "[[services.catalog]]\nkey = \"k\"\nlocal_path = \"models/k\"\n", 10, "services[0].catalog[0].local_path", "relative"},
		{"neither", svc + "[[services.catalog]]\nkey = \"k\"\n", 8, "services[0].catalog[0]", "give repo"},
		{"bad key", svc + "[[services.catalog]]\nkey = \"a/b\"\nrepo = \"x\"\n", 9, "services[0].catalog[0].key", "may only hold"},
		{"dup key", svc + "[[services.catalog]]\nkey = \"k\"\nrepo = \"x\"\n[[services.catalog]]\nkey = \"k\"\nrepo = \"y\"\n", 12, "services[0].catalog[1].key", "already used"},
		{"two defaults", strings.Replace(svc, "[[services]]\n", "[[services]]\ndefault = true\n", 1) + strings.Replace(strings.Replace(svc, "\"vllm\"\nmachine", "\"b\"\nmachine", 1), "[[services]]\n", "[[services]]\ndefault = true\n", 1), 10, "services[1].default", "already the default"},
		{"dup name", svc + svc, 9, "services[1].name", "already used"},
		{"timeout", svc + "ready_timeout_s = 0\n", 8, "services[0].ready_timeout_s", "more than 0"},
		{"webhook workers", "[webhooks]\nworkers = 0\n", 2, "webhooks.workers", "1 to 256"},
		{"webhook retry", "[webhooks]\nretry_min_s = 10\nretry_max_s = 5\n", 3, "webhooks.retry_max_s", "at least retry_min_s"},
		{"webhook unknown", "[webhooks]\nallow_private = true\n", 2, "webhooks.allow_private", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.toml", []byte(c.doc), env)
			if err == nil {
				t.Fatal("got no error")
			}
			if c.key == "" {
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("got %v, want a *config.Error", err)
			}
			if e.Key != c.key || e.Line != c.line || !strings.Contains(e.Message, c.msg) {
				t.Fatalf("got %v (key %s line %d), want %s at line %d with %q", err, e.Key, e.Line, c.key, c.line, c.msg)
			}
		})
	}
}

package config

import (
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestFairShareSections(t *testing.T) {
	doc := `
[[groups]]
name = "ml"
members = ["alice", "ml-*"]
time_limit_s = 7200

[[groups]]
name = "cv"
members = ["carol"]
preemptible = true

[[quotas]]
group = "ml"
max_gpus = 8

[[quotas]]
principal = "carol"
max_gpu_hours = 100
window_s = 86400

[[quotas]]
group = "cv"
max_gpus = 2
model = "*H100*"

[fairshare]
half_life_s = 3600
shares = { ml = 2, cv = 1 }

[preemption]
grace_s = 30
min_runtime_s = 60
`
	c, err := Parse("a.toml", []byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := c.FairSharePolicy
	if len(p.Groups) != 2 || p.Groups[0].TimeLimitS != 7200 || !p.Groups[1].Preemptible || len(p.Quotas) != 3 ||
		p.HalfLifeS != 3600 || p.Shares["ml"] != 2 || p.GraceS != 30 || p.MinRuntimeS != 60 || p.NoticeS != 300 {
		t.Fatalf("policy %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if g := p.GroupOf("", "ml-bot"); g == nil || g.Name != "ml" {
		t.Fatalf("ml-bot is in %v", g)
	}
	for _, tt := range []struct{ doc, want string }{
		{"[[groups]]\nname = \"ml\"\n", "a.toml:1: groups[0].members: empty"},
		{"[[groups]]\nname = \"ml\"\nmembers = [\"a\"]\n[[groups]]\nname = \"ml\"\nmembers = [\"b\"]\n", "a.toml:5: groups[1].name: group \"ml\" is already defined"},
		{"[[groups]]\nname = \"ml\"\nmembers = [\"[\"]\n", "groups[0].members: pattern"},
		{"[[quotas]]\ngroup = \"nope\"\nmax_gpus = 1\n", "a.toml:2: quotas[0].group: group \"nope\" is not one of [[groups]]"},
		{"[[quotas]]\nprincipal = \"a\"\n", "a.toml:1: quotas[0]: a quota sets max_gpus, max_gpu_hours or both"},
		{"[[quotas]]\nprincipal = \"a\"\ngroup = \"default\"\nmax_gpus = 1\n", "quotas[0]: a quota names exactly one of group or principal"},
		{"[[quotas]]\nprincipal = \"a\"\nmax_gpus = 1\n[[quotas]]\nprincipal = \"a\"\nmax_gpu_hours = 1\n", "a.toml:4: quotas[1]: quotas[0] already limits principal:a"},
		{"[[quotas]]\nprincipal = \"a\"\nmax_gpus = \"1\"\n", "a.toml:3: quotas[0].max_gpus: must be a whole number"},
		{"[fairshare]\nhalf_life_s = 0\n", "a.toml:2: fairshare.half_life_s: must be 1 to"},
		{"[fairshare]\nshares = { x = 1 }\n", "fairshare.shares.x: group \"x\" is not one of [[groups]]"},
		{"[fairshare]\nshares = { default = -1 }\n", "fairshare.shares.default: must be more than 0"},
		{"[preemption]\ngrace_s = -1\n", "a.toml:2: preemption.grace_s: must be 0 to"},
		{"[preemption]\ngrace = 1\n", "a.toml:2: preemption.grace: unknown key"},
	} {
		_, err := Parse("a.toml", []byte(tt.doc), nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
	if d := Default().FairSharePolicy; d.HalfLifeS != arbiter.DefaultHalfLifeS || len(d.Groups) != 0 {
		t.Fatalf("default policy %+v", d)
	}
}

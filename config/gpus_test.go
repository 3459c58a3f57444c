package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestGPUsSection(t *testing.T) {
	if p := Default().GPUs.Policy(); !reflect.DeepEqual(p, arbiter.DefaultGPUPolicy()) {
		t.Fatalf("default [gpus]: %+v", p)
	}
	doc := "[gpus]\nsample_s = 1\nenforce = \"wait\"\nunmanaged = \"kill\"\nunmanaged_grace_s = 5\nidle_action = \"release\"\nidle_after_s = 60\ncritical_xids = [79]\n"
	c, err := Parse("a.toml", []byte(doc), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := c.GPUs.Policy()
	if p.SampleS != 1 || p.Enforce != "wait" || p.Unmanaged != "kill" || p.UnmanagedGraceS != 5 || p.IdleAction != "release" ||
		p.IdleAfterS != 60 || !reflect.DeepEqual(p.CriticalXIDs, []int{79}) || p.KillGraceS != 10 || p.HealthyAfterS != 600 {
		t.Fatalf("got %+v", p)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ doc, want string }{
		{"[gpus]\nsample_s = 0\n", "a.toml:2: gpus.sample_s: must be 0.1 to 3600 seconds"},
		{"[gpus]\nenforce = \"maybe\"\n", "a.toml:2: gpus.enforce: unknown value \"maybe\"; want kill, wait"},
		{"[gpus]\nunmanaged = \"ignore\"\n", "a.toml:2: gpus.unmanaged: unknown value"},
		{"[gpus]\nidle_action = \"sleep\"\n", "a.toml:2: gpus.idle_action: unknown value"},
		{"[gpus]\nidle_util_pct = 120\n", "a.toml:2: gpus.idle_util_pct: must be a percentage from 0 to 100"},
		{"[gpus]\nidle_after_s = 0\n", "a.toml:2: gpus.idle_after_s"},
		{"[gpus]\nkill_grace_s = -1\n", "a.toml:2: gpus.kill_grace_s"},
		{"[gpus]\ncritical_xids = [79, 0]\n", "a.toml:2: gpus.critical_xids[1]: 0 is not an XID"},
		{"[gpus]\ncritical_xids = \"79\"\n", "a.toml:2: gpus.critical_xids: must be an array of XID numbers"},
		{"[gpus]\nsample_s = \"5s\"\n", "a.toml:2: gpus.sample_s: must be a number of seconds"},
		{"[gpus]\nsamples = 5\n", "a.toml:2: gpus.samples: unknown key"},
	} {
		if _, err := Parse("a.toml", []byte(tt.doc), nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.doc, err, tt.want)
		}
	}
}

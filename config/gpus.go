package config

import (
	"fmt"
	"slices"

	"github.com/arbiter-hq/arbiter"
)

// GPUs is the [gpus] section: GPU ground truth (docs/reference/gpu-truth.md), how
// the server treats what agents see on their GPUs. Its names are fixed by
// the contract; arbiter.GPUPolicy documents each.
type GPUs struct {
	SampleS           float64 `toml:"sample_s" want:"a number of seconds"`
	Enforce           string  `toml:"enforce" want:"a string: kill or wait"`
	KillGraceS        float64 `toml:"kill_grace_s" want:"a number of seconds"`
	ReleasingTimeoutS float64 `toml:"releasing_timeout_s" want:"a number of seconds"`
	Unmanaged         string  `toml:"unmanaged" want:"a string: report or kill"`
	UnmanagedGraceS   float64 `toml:"unmanaged_grace_s" want:"a number of seconds"`
	IdleUtilPct       float64 `toml:"idle_util_pct" want:"a percentage from 0 to 100"`
	IdleAfterS        float64 `toml:"idle_after_s" want:"a number of seconds"`
	IdleGraceS        float64 `toml:"idle_grace_s" want:"a number of seconds"`
	IdleAction        string  `toml:"idle_action" want:"a string: warn or release"`
	HealthyAfterS     float64 `toml:"healthy_after_s" want:"a number of seconds"`
	CriticalXIDs      []int   `toml:"critical_xids" want:"an array of XID numbers such as [48, 79]"`
}

func defaultGPUs() GPUs {
	p := arbiter.DefaultGPUPolicy()
	return GPUs{SampleS: p.SampleS, Enforce: p.Enforce, KillGraceS: p.KillGraceS, ReleasingTimeoutS: p.ReleasingTimeoutS,
		Unmanaged: p.Unmanaged, UnmanagedGraceS: p.UnmanagedGraceS, IdleUtilPct: p.IdleUtilPct, IdleAfterS: p.IdleAfterS,
		IdleGraceS: p.IdleGraceS, IdleAction: p.IdleAction, HealthyAfterS: p.HealthyAfterS, CriticalXIDs: p.CriticalXIDs}
}

// Policy is the section as the engine takes it.
func (g *GPUs) Policy() arbiter.GPUPolicy {
	return arbiter.GPUPolicy{SampleS: g.SampleS, Enforce: g.Enforce, KillGraceS: g.KillGraceS, ReleasingTimeoutS: g.ReleasingTimeoutS,
		Unmanaged: g.Unmanaged, UnmanagedGraceS: g.UnmanagedGraceS, IdleUtilPct: g.IdleUtilPct, IdleAfterS: g.IdleAfterS,
		IdleGraceS: g.IdleGraceS, IdleAction: g.IdleAction, HealthyAfterS: g.HealthyAfterS, CriticalXIDs: slices.Clone(g.CriticalXIDs)}
}

func (c *Config) validateGPUs(ps *problems) {
	g := &c.GPUs
	checkSeconds(ps, "gpus.sample_s", g.SampleS, arbiter.MinGPUSampleS, arbiter.MaxGPUSampleS)
	for _, s := range []struct {
		key string
		v   float64
	}{
		{"kill_grace_s", g.KillGraceS}, {"releasing_timeout_s", g.ReleasingTimeoutS}, {"unmanaged_grace_s", g.UnmanagedGraceS},
		{"idle_grace_s", g.IdleGraceS}, {"healthy_after_s", g.HealthyAfterS},
	} {
		checkSeconds(ps, "gpus."+s.key, s.v, 0, arbiter.MaxGPUPolicyS)
	}
	checkSeconds(ps, "gpus.idle_after_s", g.IdleAfterS, 1, arbiter.MaxGPUPolicyS)
	if !finite(g.IdleUtilPct) || g.IdleUtilPct < 0 || g.IdleUtilPct > 100 {
		ps.add("gpus.idle_util_pct", fmt.Sprintf("must be a percentage from 0 to 100, got %v", g.IdleUtilPct))
	}
	checkEnum(ps, "gpus.enforce", g.Enforce, arbiter.EnforceKill, arbiter.EnforceWait)
	checkEnum(ps, "gpus.unmanaged", g.Unmanaged, arbiter.UnmanagedReport, arbiter.UnmanagedKill)
	checkEnum(ps, "gpus.idle_action", g.IdleAction, arbiter.IdleWarn, arbiter.IdleRelease)
	if len(g.CriticalXIDs) > arbiter.MaxGPUXIDs {
		ps.add("gpus.critical_xids", fmt.Sprintf("lists %d XIDs; at most %d", len(g.CriticalXIDs), arbiter.MaxGPUXIDs))
	}
	for i, x := range g.CriticalXIDs {
		if x <= 0 || x > arbiter.MaxXID {
			ps.add(fmt.Sprintf("gpus.critical_xids[%d]", i), fmt.Sprintf("%d is not an XID (1 to %d)", x, arbiter.MaxXID))
		}
	}
	if ps.has("gpus") {
		return
	}
	// The vocabulary's own rules are the last word.
	p := g.Policy()
	if err := p.Validate(); err != nil {
		ps.add("gpus", arbiter.ErrorMessage(err))
	}
}

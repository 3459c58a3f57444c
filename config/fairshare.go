package config

import (
	"fmt"

	"github.com/arbiter-hq/arbiter"
)

// Fair share (docs/guides/fair-share.md): [[groups]], [[quotas]],
// [fairshare] and [preemption]. Together they make one
// arbiter.FairSharePolicy (Config.FairSharePolicy), which the server hands
// the engine at start and on every reload.

// FairShare is the [fairshare] section.
type FairShare struct {
	// HalfLifeS is the half-life of the usage decay (default a day).
	HalfLifeS float64 `toml:"half_life_s" want:"a number of seconds"`
	// Shares is each group's share (default 1).
	Shares map[string]float64 `toml:"shares" want:"a table of group = number, such as { ml = 2, cv = 1 }"`
	// NoticeS is how long before its time limit an allocation's holder is
	// told (default 300).
	NoticeS float64 `toml:"notice_s" want:"a number of seconds"`
}

// Preemption is the [preemption] section.
type Preemption struct {
	// GraceS is the time between allocation.preempting and the end
	// (default 300).
	GraceS float64 `toml:"grace_s" want:"a number of seconds"`
	// MinRuntimeS protects new work from preemption (default 600).
	MinRuntimeS float64 `toml:"min_runtime_s" want:"a number of seconds"`
}

// groupEntry is one [[groups]] entry.
type groupEntry struct {
	Name        string   `toml:"name"`
	Members     []string `toml:"members" want:"an array of principal names or owner patterns"`
	TimeLimitS  float64  `toml:"time_limit_s" want:"a number of seconds"`
	Preemptible bool     `toml:"preemptible" want:"true or false"`
}

// quotaEntry is one [[quotas]] entry.
type quotaEntry struct {
	Group       string   `toml:"group"`
	Principal   string   `toml:"principal"`
	MaxGPUs     *int     `toml:"max_gpus" want:"a whole number"`
	Model       string   `toml:"model" want:"a string pattern such as \"*H100*\""`
	MaxGPUHours *float64 `toml:"max_gpu_hours" want:"a number of GPU-hours"`
	WindowS     float64  `toml:"window_s" want:"a number of seconds"`
}

func defaultFairShare() FairShare {
	p := arbiter.DefaultFairSharePolicy()
	return FairShare{HalfLifeS: p.HalfLifeS, Shares: map[string]float64{}, NoticeS: p.NoticeS}
}

func defaultPreemption() Preemption {
	p := arbiter.DefaultFairSharePolicy()
	return Preemption{GraceS: p.GraceS, MinRuntimeS: p.MinRuntimeS}
}

// expandFairShare assembles the policy from the sections and entries,
// naming the key of each problem.
func (f *file) expandFairShare(ps *problems) arbiter.FairSharePolicy {
	p := arbiter.FairSharePolicy{HalfLifeS: f.FairShare.HalfLifeS, Shares: map[string]float64{}, NoticeS: f.FairShare.NoticeS,
		GraceS: f.Preemption.GraceS, MinRuntimeS: f.Preemption.MinRuntimeS, Groups: []arbiter.Group{}, Quotas: []arbiter.Quota{}}
	checkSeconds(ps, "fairshare.half_life_s", p.HalfLifeS, 1, arbiter.MaxFairShareS)
	checkSeconds(ps, "fairshare.notice_s", p.NoticeS, 0, arbiter.MaxFairShareS)
	checkSeconds(ps, "preemption.grace_s", p.GraceS, 0, arbiter.MaxFairShareS)
	checkSeconds(ps, "preemption.min_runtime_s", p.MinRuntimeS, 0, arbiter.MaxFairShareS)
	names := map[string]int{}
	for i, e := range f.Groups {
		key := fmt.Sprintf("groups[%d]", i)
		g := arbiter.Group{Name: e.Name, Members: append([]string{}, e.Members...), TimeLimitS: e.TimeLimitS, Preemptible: e.Preemptible}
		switch err := arbiter.ValidateName("group name", e.Name); {
		case err != nil:
			ps.add(key+".name", err.Error())
		case e.Name == arbiter.DefaultGroup && len(e.Members) > 0:
			ps.add(key+".name", fmt.Sprintf("%q is the group of everyone no other group takes: it has no members", arbiter.DefaultGroup))
		default:
			if j, dup := names[e.Name]; dup {
				ps.add(key+".name", fmt.Sprintf("group %q is already defined by groups[%d]", e.Name, j))
			}
			names[e.Name] = i
		}
		if len(e.Members) == 0 && e.Name != arbiter.DefaultGroup {
			ps.add(key+".members", "empty: list principal (token) names or owner patterns, e.g. members = [\"alice\", \"bob@*\"]")
		}
		checkSeconds(ps, key+".time_limit_s", e.TimeLimitS, 0, arbiter.MaxTimeLimitS)
		if ps.has(key) {
			continue
		}
		one := arbiter.FairSharePolicy{Groups: []arbiter.Group{g}, HalfLifeS: 1}
		if err := one.Validate(); err != nil {
			ps.add(key+".members", trimEntry(err))
			continue
		}
		p.Groups = append(p.Groups, g)
	}
	for name, s := range f.FairShare.Shares {
		if _, ok := names[name]; !ok && name != arbiter.DefaultGroup {
			ps.add("fairshare.shares."+name, fmt.Sprintf("group %q is not one of [[groups]]", name))
			continue
		}
		if !finite(s) || s <= 0 || s > arbiter.MaxShare {
			ps.add("fairshare.shares."+name, fmt.Sprintf("must be more than 0 and at most %g, got %v", arbiter.MaxShare, s))
			continue
		}
		p.Shares[name] = s
	}
	keys := map[string]int{}
	for i, e := range f.Quotas {
		key := fmt.Sprintf("quotas[%d]", i)
		q := arbiter.Quota{Group: e.Group, Principal: e.Principal, MaxGPUs: e.MaxGPUs, Model: e.Model, MaxGPUHours: e.MaxGPUHours, WindowS: e.WindowS}
		if e.Group != "" {
			if _, ok := names[e.Group]; !ok && e.Group != arbiter.DefaultGroup {
				ps.add(key+".group", fmt.Sprintf("group %q is not one of [[groups]]", e.Group))
				continue
			}
		}
		if err := q.Validate(); err != nil {
			msg := arbiter.ErrorMessage(err)
			ps.add(key+fieldNamed(msg, "max_gpus", "max_gpu_hours", "window_s", "model", "principal", "group"), msg)
			continue
		}
		if j, dup := keys[q.Key()]; dup {
			ps.add(key, fmt.Sprintf("quotas[%d] already limits %s", j, q.Key()))
			continue
		}
		keys[q.Key()] = i
		p.Quotas = append(p.Quotas, q)
	}
	return p
}

// trimEntry drops the "groups[0]: " the policy's own check puts first.
func trimEntry(err error) string {
	msg := arbiter.ErrorMessage(err)
	for i := 0; i+2 < len(msg); i++ {
		if msg[i] == ':' && msg[i+1] == ' ' {
			return msg[i+2:]
		}
	}
	return msg
}

package config

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/arbiter-hq/arbiter"
)

// poolEntry is one [[pools]] entry (docs/reference/pools.md).
type poolEntry struct {
	Name          string        `toml:"name"`
	Backing       *backingEntry `toml:"backing" want:"a table such as { gpus = 1, min_vram_gib = 40 }"`
	Slots         *int          `toml:"slots" want:"a whole number"`
	GraceTimeS    *float64      `toml:"grace_time_s" want:"a number of seconds"`
	MinRetentionS float64       `toml:"min_retention_s" want:"a number of seconds"`
	MaxAgeS       float64       `toml:"max_age_s" want:"a number of seconds"`
}

// backingEntry is a pool's backing request: an ordinary GPU request.
type backingEntry struct {
	GPUs        int      `toml:"gpus" want:"a whole number"`
	MinVRAMGiB  float64  `toml:"min_vram_gib" want:"a number of GiB"`
	RequireCUDA bool     `toml:"require_cuda" want:"true or false"`
	MinCompute  string   `toml:"min_compute" want:"a string such as \"8.0\""`
	Model       string   `toml:"model" want:"a string pattern such as \"*H100*\""`
	Tags        []string `toml:"tags" want:"an array of strings"`
	Machine     string   `toml:"machine"`
	Priority    int      `toml:"priority" want:"a whole number"`
}

// DefaultGraceTimeS is a pool's grace_time_s when the entry does not say.
const DefaultGraceTimeS = 60

// maxPoolSeconds bounds grace_time_s, min_retention_s and max_age_s (ten
// years): beyond it, or not a number at all (TOML's inf and nan), a time
// would overflow or never compare.
const maxPoolSeconds = 10 * 365 * 24 * 3600

// expandPools turns [[pools]] into arbiter.Pools. Besides each pool's own
// checks, pools with identical backing requests must agree on slots and
// timings, since a backing serves requests the same way whoever asked.
func (f *file) expandPools(ps *problems) []arbiter.Pool {
	var out []arbiter.Pool
	var from []int // from[k] is the index in f.Pools of out[k]
	seen := map[string]int{}
	for i, e := range f.Pools {
		key := fmt.Sprintf("pools[%d]", i)
		if e.Backing == nil {
			ps.add(key+".backing", "missing: give the request each backing allocation makes, e.g. backing = { gpus = 1, min_vram_gib = 40 }")
			continue
		}
		if e.Slots == nil {
			ps.add(key+".slots", "missing: how many requests one backing serves, e.g. slots = 4")
			continue
		}
		b := e.Backing
		p := arbiter.Pool{
			Name: e.Name,
			Backing: arbiter.Request{GPUs: b.GPUs, MinVRAMGiB: b.MinVRAMGiB, RequireCUDA: b.RequireCUDA, MinCompute: b.MinCompute,
				Model: b.Model, Tags: b.Tags, Machine: b.Machine, Priority: b.Priority},
			Slots:         *e.Slots,
			GraceTimeS:    DefaultGraceTimeS,
			MinRetentionS: e.MinRetentionS,
			MaxAgeS:       e.MaxAgeS,
		}
		if e.GraceTimeS != nil {
			p.GraceTimeS = *e.GraceTimeS
		}
		for _, t := range []struct {
			name string
			v    float64
		}{{"grace_time_s", p.GraceTimeS}, {"min_retention_s", p.MinRetentionS}, {"max_age_s", p.MaxAgeS}} {
			if !finite(t.v) || t.v < 0 || t.v > maxPoolSeconds {
				ps.add(key+"."+t.name, fmt.Sprintf("must be a number of seconds from 0 to %d, got %v", maxPoolSeconds, t.v))
			}
		}
		if ps.has(key) {
			continue
		}
		if err := p.Validate(); err != nil {
			ps.add(key, arbiter.ErrorMessage(err))
			continue
		}
		if j, dup := seen[p.Name]; dup {
			ps.add(key+".name", fmt.Sprintf("pool %q is already declared by pools[%d]", p.Name, j))
			continue
		}
		seen[p.Name] = i
		for j, q := range out {
			if sameRequest(q.Backing, p.Backing) &&
				(q.Slots != p.Slots || q.GraceTimeS != p.GraceTimeS || q.MinRetentionS != p.MinRetentionS || q.MaxAgeS != p.MaxAgeS) {
				ps.add(key, fmt.Sprintf("pool %q has the same backing request as pool %q (pools[%d]) but different slots, grace_time_s, min_retention_s or max_age_s; pools with one backing must agree", p.Name, q.Name, from[j]))
			}
		}
		out = append(out, p)
		from = append(from, i)
	}
	return out
}

// sameRequest reports whether two backing requests ask for the same: tags
// left out or empty, in any order, are the same tags.
func sameRequest(a, b arbiter.Request) bool {
	norm := func(r arbiter.Request) arbiter.Request {
		if len(r.Tags) == 0 {
			r.Tags = nil
		} else {
			r.Tags = slices.Sorted(slices.Values(r.Tags))
		}
		return r
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

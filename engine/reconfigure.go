package engine

import (
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// reconfigure puts a configuration in force as one change
// (arbiter.Reconfigure): every part is checked first, against the machines
// there will be, and only then applied. A part refused after its check
// would be a bug: it panics, so that the control loop throws the batch
// away and reloads rather than keep half a configuration.
func (e *Engine) reconfigure(c arbiter.Reconfigure, now time.Time) (int, error) {
	if c.Services != nil {
		if _, _, err := checkServices(*c.Services); err != nil {
			return 0, err
		}
	}
	ms, err := checkConfigMachines(c.Machines.Machines)
	if err != nil {
		return 0, err
	}
	if _, err := checkConfigPools(c.Pools.Pools); err != nil {
		return 0, err
	}
	if err := c.GPUPolicy.Policy.Validate(); err != nil {
		return 0, err
	}
	if err := c.FairShare.Policy.Validate(); err != nil {
		return 0, err
	}
	// The GPU machines once the configuration's are in force: those it
	// declares, and the others not the server's (as syncConfig keeps).
	declared := make(map[string]string, len(ms))
	for _, m := range ms {
		declared[m.Name] = m.Source
	}
	if _, err := checkGridMachines(c.Grid, func(name string) string {
		if src, ok := declared[name]; ok {
			return src
		}
		if mc := e.byName[name]; mc != nil && mc.m.Source != arbiter.SourceConfig && mc.m.Source != arbiter.SourceLocal {
			return mc.m.Source
		}
		return ""
	}); err != nil {
		return 0, err
	}

	e.grids.init()
	e.swaps.init()
	for _, step := range []struct {
		what  string
		apply func() error
	}{
		{"services", func() error {
			if c.Services == nil {
				return nil
			}
			return e.swaps.sync(e, *c.Services, now, false) // held below, once the machines are in
		}},
		{"machines", func() error { return e.syncConfig(ms, now) }},
		{"pools", func() error { return e.syncPools(c.Pools.Pools, now) }},
		{"[gpus] policy", func() error { return e.gtSetPolicy(c.GPUPolicy.Policy, now) }},
		{"fair-share policy", func() error { return e.fsSetPolicy(c.FairShare.Policy, now) }},
		{"grid machines", func() error { return e.grids.sync(e, c.Grid, now) }},
	} {
		if err := step.apply(); err != nil {
			panic(fmt.Sprintf("engine: reconfigure: %s refused after its check: %v", step.what, err))
		}
	}
	if c.Services != nil {
		e.swaps.holdWaiting(e, now, true) // what no machine's arrival gave them, and why
	}
	return e.sessions.endAllBut(e, c.Sessions.Keep), nil
}

package engine

import (
	"time"

	"github.com/arbiter-hq/arbiter"
)

// An agent that stops says so (arbiter.LeaveMachine): its machine is down
// at once. And one host cannot be registered twice under two names: the
// GPUs' UUIDs tell (issue 12, finding 8).

func (e *Engine) leave(c arbiter.LeaveMachine, now time.Time) (any, error) {
	mc := e.byName[c.Name]
	if mc == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "machine %q is not registered", c.Name)
	}
	if mc.m.Source != arbiter.SourceAgent {
		return nil, arbiter.Errorf(arbiter.EConflict, "machine %q is declared by the server (%s), not by an agent: drain it instead", c.Name, mc.m.Source)
	}
	e.dl.clear(&mc.hb)
	e.markDown(mc, now)
	return mc.m, nil
}

// gpuElsewhere returns the machine other than m that has a GPU with one of
// m's UUIDs, and that UUID; "" when none has. UUIDs are unique to a GPU: a
// match is the same host registered under another name. Only machines that
// saw their GPUs (an agent's, the server's own host) are compared: the
// configuration declares no UUIDs (its fixtures in tests may share some).
func (e *Engine) gpuElsewhere(m *arbiter.Machine) (other *arbiter.Machine, uuid string) {
	mine := make(map[string]bool, len(m.GPUs))
	for _, g := range m.GPUs {
		if g.UUID != "" {
			mine[g.UUID] = true
		}
	}
	if len(mine) == 0 {
		return nil, ""
	}
	for _, mc := range e.ms {
		if mc.m.Name == m.Name || mc.m.Source == arbiter.SourceConfig {
			continue
		}
		for _, g := range mc.m.GPUs {
			if mine[g.UUID] {
				return &mc.m, g.UUID
			}
		}
	}
	return nil, ""
}

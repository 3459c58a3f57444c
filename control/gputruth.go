package control

import (
	"fmt"

	"github.com/arbiter-hq/arbiter"
)

// gpuTruth completes a machine's devices with GPU ground truth
// (docs/reference/gpu-truth.md) from the machine's RecordGPUState and
// RecordGPUSample records: each GPU's state, health, latest usage and
// whether an unmanaged process is on it; and counts as free only the GPUs a
// new allocation could take now. Holders must already be set.
func (v *view) gpuTruth(m *arbiter.Machine, s *arbiter.MachineStatus) {
	var st arbiter.GPUMachineState
	if r, ok := v.records[arbiter.RecordGPUState][m.Name].(arbiter.GPUMachineState); ok {
		st = r
	}
	var sm arbiter.GPUMachineSample
	if r, ok := v.records[arbiter.RecordGPUSample][m.Name].(arbiter.GPUMachineSample); ok {
		sm = r
	}
	s.Free = 0
	for i := range s.Devices {
		d := &s.Devices[i]
		var ent arbiter.GPUStateEntry
		for _, e := range st.GPUs {
			if e.Index == d.Index {
				ent = e
				break
			}
		}
		for _, e := range sm.GPUs {
			if e.Index == d.Index {
				d.Usage = e.Usage
				d.Unmanaged = len(e.Unmanaged) > 0
				break
			}
		}
		d.Health = &arbiter.GPUHealth{OK: true}
		switch {
		case ent.Unhealthy != nil:
			since := ent.Unhealthy.Since
			d.State, d.StateReason, d.StateSince = arbiter.GPUUnhealthy, ent.Unhealthy.Reason, &since
			d.Health = &arbiter.GPUHealth{OK: false, Reason: ent.Unhealthy.Reason, Since: &since}
			d.Healthy = false
		case !d.Healthy:
			d.State, d.StateReason = arbiter.GPUUnhealthy, "the agent's detection could not read the GPU"
			d.Health = &arbiter.GPUHealth{OK: false, Reason: d.StateReason}
		case ent.Drained != nil:
			since := ent.Drained.Since
			d.State, d.StateReason, d.StateSince = arbiter.GPUDrained, ent.Drained.Reason, &since
		case ent.Releasing != nil:
			since := ent.Releasing.Since
			d.State, d.StateSince = arbiter.GPUReleasing, &since
			d.StateReason = fmt.Sprintf("allocation %d ended (%s); waiting for its processes to stop", ent.Releasing.Allocation, ent.Releasing.Reason)
		case d.Allocation != nil:
			d.State = arbiter.GPUHeld
		default:
			d.State = arbiter.GPUFree
		}
		if ent.Drained != nil && d.State != arbiter.GPUDrained && d.StateReason == "" {
			d.StateReason = "drained: " + ent.Drained.Reason
		}
		if d.State == arbiter.GPUFree && !d.Unmanaged {
			s.Free++
		}
	}
}

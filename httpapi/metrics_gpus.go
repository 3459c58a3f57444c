package httpapi

import (
	"strconv"

	"github.com/arbiter-hq/arbiter"
)

// gpuStates are the values of arbiter_gpu_state's state label.
var gpuStates = []string{arbiter.GPUFree, arbiter.GPUHeld, arbiter.GPUReleasing, arbiter.GPUUnhealthy, arbiter.GPUDrained}

// writeGPUs writes each GPU's ground truth (docs/reference/gpu-truth.md)
// as gauges labelled by machine and GPU index, computed from the read view
// at scrape time, so that an existing Grafana can chart utilization,
// memory and state per GPU. A reading the GPU could not give is left out.
func (m *Metrics) writeGPUs(w *exposition) {
	type sample struct {
		labels string
		v      float64
	}
	fams := []struct {
		name, help string
		get        func(d *arbiter.DeviceStatus) (float64, bool)
	}{
		{"arbiter_gpu_utilization_percent", "A GPU's utilization in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil || d.Usage.UtilPct == nil {
				return 0, false
			}
			return float64(*d.Usage.UtilPct), true
		}},
		{"arbiter_gpu_memory_used_bytes", "A GPU's memory in use in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil {
				return 0, false
			}
			return float64(d.Usage.MemUsedMiB) * (1 << 20), true
		}},
		{"arbiter_gpu_memory_total_bytes", "A GPU's memory in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil {
				return 0, false
			}
			return float64(d.Usage.MemTotalMiB) * (1 << 20), true
		}},
		{"arbiter_gpu_temperature_celsius", "A GPU's temperature in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil || d.Usage.TempC == nil {
				return 0, false
			}
			return float64(*d.Usage.TempC), true
		}},
		{"arbiter_gpu_power_watts", "A GPU's power draw in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil || d.Usage.PowerW == nil {
				return 0, false
			}
			return *d.Usage.PowerW, true
		}},
		{"arbiter_gpu_processes", "Compute processes on a GPU in its latest sample.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Usage == nil {
				return 0, false
			}
			return float64(len(d.Usage.Processes)), true
		}},
		{"arbiter_gpu_unmanaged", "1 while a process no allocation accounts for is on the GPU.", func(d *arbiter.DeviceStatus) (float64, bool) {
			if d.Unmanaged {
				return 1, true
			}
			return 0, true
		}},
	}
	samples := make([][]sample, len(fams))
	var states []sample
	for _, mc := range m.p.Machines() {
		if mc.Kind != arbiter.KindGPU {
			continue
		}
		for i := range mc.Devices {
			d := &mc.Devices[i]
			labels := label("gpu", strconv.Itoa(d.Index)) + "," + label("machine", mc.Name)
			for f := range fams {
				if v, ok := fams[f].get(d); ok {
					samples[f] = append(samples[f], sample{labels, v})
				}
			}
			for _, s := range gpuStates {
				v := 0.0
				if d.State == s {
					v = 1
				}
				states = append(states, sample{labels + "," + label("state", s), v})
			}
		}
	}
	for f, fam := range fams {
		w.family(fam.name, "gauge", fam.help)
		for _, s := range samples[f] {
			w.sample(fam.name, s.labels, s.v)
		}
	}
	w.family("arbiter_gpu_state", "gauge", "1 for a GPU's state (free, held, releasing, unhealthy, drained), 0 for the others.")
	for _, s := range states {
		w.sample("arbiter_gpu_state", s.labels, s.v)
	}
}

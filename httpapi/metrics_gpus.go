package httpapi

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-hq/arbiter"
)

// gpuCollector exposes each GPU's ground truth (docs/reference/gpu-truth.md) as
// gauges labelled by machine and GPU index, computed from the read view at
// scrape time, so that an existing Grafana can chart utilization, memory
// and state per GPU. A reading the GPU could not give is left out.
type gpuCollector struct{ p Plane }

var (
	srvGPULabels      = []string{"machine", "gpu"}
	srvDescGPUUtil    = prometheus.NewDesc("arbiter_gpu_utilization_percent", "A GPU's utilization in its latest sample.", srvGPULabels, nil)
	srvDescGPUMemUsed = prometheus.NewDesc("arbiter_gpu_memory_used_bytes", "A GPU's memory in use in its latest sample.", srvGPULabels, nil)
	srvDescGPUMemTot  = prometheus.NewDesc("arbiter_gpu_memory_total_bytes", "A GPU's memory in its latest sample.", srvGPULabels, nil)
	srvDescGPUTemp    = prometheus.NewDesc("arbiter_gpu_temperature_celsius", "A GPU's temperature in its latest sample.", srvGPULabels, nil)
	srvDescGPUPower   = prometheus.NewDesc("arbiter_gpu_power_watts", "A GPU's power draw in its latest sample.", srvGPULabels, nil)
	srvDescGPUProcs   = prometheus.NewDesc("arbiter_gpu_processes", "Compute processes on a GPU in its latest sample.", srvGPULabels, nil)
	srvDescGPUState   = prometheus.NewDesc("arbiter_gpu_state",
		"1 for a GPU's state (free, held, releasing, unhealthy, drained), 0 for the others.", append(srvGPULabels, "state"), nil)
	srvDescGPUUnmanaged = prometheus.NewDesc("arbiter_gpu_unmanaged", "1 while a process no allocation accounts for is on the GPU.", srvGPULabels, nil)
)

var srvGPUStates = []string{arbiter.GPUFree, arbiter.GPUHeld, arbiter.GPUReleasing, arbiter.GPUUnhealthy, arbiter.GPUDrained}

func (c gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{srvDescGPUUtil, srvDescGPUMemUsed, srvDescGPUMemTot, srvDescGPUTemp, srvDescGPUPower,
		srvDescGPUProcs, srvDescGPUState, srvDescGPUUnmanaged} {
		ch <- d
	}
}

func (c gpuCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, m := range c.p.Machines() {
		if m.Kind != arbiter.KindGPU {
			continue
		}
		for _, d := range m.Devices {
			idx := strconv.Itoa(d.Index)
			for _, s := range srvGPUStates {
				v := 0.0
				if d.State == s {
					v = 1
				}
				gauge(srvDescGPUState, v, m.Name, idx, s)
			}
			um := 0.0
			if d.Unmanaged {
				um = 1
			}
			gauge(srvDescGPUUnmanaged, um, m.Name, idx)
			u := d.Usage
			if u == nil {
				continue
			}
			if u.UtilPct != nil {
				gauge(srvDescGPUUtil, float64(*u.UtilPct), m.Name, idx)
			}
			gauge(srvDescGPUMemUsed, float64(u.MemUsedMiB)*(1<<20), m.Name, idx)
			gauge(srvDescGPUMemTot, float64(u.MemTotalMiB)*(1<<20), m.Name, idx)
			if u.TempC != nil {
				gauge(srvDescGPUTemp, float64(*u.TempC), m.Name, idx)
			}
			if u.PowerW != nil {
				gauge(srvDescGPUPower, *u.PowerW, m.Name, idx)
			}
			gauge(srvDescGPUProcs, float64(len(u.Processes)), m.Name, idx)
		}
	}
}

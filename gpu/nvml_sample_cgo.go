//go:build cgo && linux

package gpu

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlSample samples through NVML, kept initialized between samples, with
// an event set that collects critical XID errors as they happen.
type nvmlSample struct {
	events nvml.EventSet // nil when the driver refuses event sets
	notes  []string
}

// openNVMLSampler initializes NVML for sampling. It returns errNoNVML when
// libnvidia-ml cannot be loaded.
func openNVMLSampler() (nvmlSampler, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, errNoNVML
		}
		return nil, fmt.Errorf("nvml init: %v", ret)
	}
	s := &nvmlSample{}
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		s.notes = append(s.notes, fmt.Sprintf("NVML event set: %v; XID errors will not be seen", ret))
		return s, nil
	}
	s.events = set
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("nvml device count: %v", ret)
	}
	for i := 0; i < count; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			s.notes = append(s.notes, fmt.Sprintf("GPU %d: XID events not supported (%v)", i, ret))
		}
	}
	return s, nil
}

func (s *nvmlSample) close() {
	if s.events != nil {
		s.events.Free()
		s.events = nil
	}
	nvml.Shutdown()
}

// sample reads every GPU on a goroutine of its own: NVML calls cannot be
// interrupted and hang on a sick GPU.
func (s *nvmlSample) sample(ctx context.Context) ([]GPUSample, []string, error) {
	type result struct {
		gpus  []GPUSample
		notes []string
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		g, n, err := s.read()
		ch <- result{g, n, err}
	}()
	select {
	case r := <-ch:
		return r.gpus, append(r.notes, s.takeNotes()...), r.err
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("nvml: %w", ctx.Err())
	}
}

func (s *nvmlSample) takeNotes() []string {
	n := s.notes
	s.notes = nil
	return n
}

func (s *nvmlSample) read() ([]GPUSample, []string, error) {
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("nvml device count: %v", ret)
	}
	var notes []string
	gpus := make([]GPUSample, 0, count)
	for i := 0; i < count; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			notes = append(notes, fmt.Sprintf("NVML cannot reach GPU %d (%v): left out of the sample", i, ret))
			continue
		}
		gpus = append(gpus, readSample(i, dev))
	}
	// Drain the XIDs that happened since the last sample.
	for s.events != nil {
		ev, ret := s.events.Wait(0)
		if ret != nvml.SUCCESS {
			break // ERROR_TIMEOUT: none left
		}
		if ev.EventType&nvml.EventTypeXidCriticalError == 0 || ev.Device == nil {
			continue
		}
		uuid, _ := ev.Device.GetUUID()
		placed := false
		for k := range gpus {
			if gpus[k].UUID == uuid && uuid != "" {
				gpus[k].XIDs = append(gpus[k].XIDs, int(ev.EventData))
				placed = true
			}
		}
		if !placed {
			notes = append(notes, fmt.Sprintf("XID %d on a GPU not in the sample (%s)", ev.EventData, uuid))
		}
	}
	return gpus, notes, nil
}

// readSample reads one GPU; what NVML cannot read stays unset.
func readSample(i int, dev nvml.Device) GPUSample {
	g := GPUSample{Index: i}
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		g.UUID = uuid
	}
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.BusID = NormalizeBusID(cString(pci.BusId[:]))
	}
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		v := int(u.Gpu)
		g.UtilPct = &v
	}
	// Memory as nvidia-smi shows it: version 2 leaves out what the driver
	// reserves for itself (about 600 MiB of an idle H200, which version 1
	// counts as used), so the two sources agree. Drivers older than R510
	// have only version 1.
	if m, ret := dev.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		g.MemUsedMiB, g.MemTotalMiB = int64(m.Used>>20), int64(m.Total>>20)
	} else if m, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemUsedMiB, g.MemTotalMiB = int64(m.Used>>20), int64(m.Total>>20)
	}
	if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		v := int(t)
		g.TempC = &v
	}
	if p, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		v := float64(p) / 1000 // milliwatts
		g.PowerW = &v
	}
	if e, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		v := int64(e)
		g.ECCUncorrected = &v
	}
	if ps, ret := dev.GetComputeRunningProcesses(); ret == nvml.SUCCESS {
		for _, p := range ps {
			mem := int64(0)
			if p.UsedGpuMemory != math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE: MIG, WDDM
				mem = int64(p.UsedGpuMemory >> 20)
			}
			g.Processes = append(g.Processes, Process{PID: int(p.Pid), MemMiB: mem})
		}
	} else {
		// In MIG mode, for one, a caller without privileges gets no list:
		// that is not an empty GPU.
		g.ProcessesUnread = fmt.Sprintf("NVML cannot list its processes (%v)", ret)
	}
	return g
}

// cString reads a NUL-terminated C string from a fixed array.
func cString(b []uint8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

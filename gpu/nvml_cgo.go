//go:build cgo && linux

package gpu

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/arbiter-hq/arbiter"
)

// detectNVML reads the GPUs through NVML. It returns errNoNVML when
// libnvidia-ml cannot be loaded (no driver installed).
//
// NVML calls cannot be interrupted and hang on a sick GPU, so they run on
// their own goroutine; if ctx ends first that goroutine is left to finish
// (and shut NVML down) on its own.
func detectNVML(ctx context.Context) (gpuInfo, error) {
	type result struct {
		info gpuInfo
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		info, err := readNVML()
		ch <- result{info, err}
	}()
	select {
	case r := <-ch:
		return r.info, r.err
	case <-ctx.Done():
		return gpuInfo{}, fmt.Errorf("nvml: %w", ctx.Err())
	}
}

func readNVML() (gpuInfo, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return gpuInfo{}, errNoNVML
		}
		return gpuInfo{}, fmt.Errorf("nvml init: %v", ret)
	}
	defer nvml.Shutdown()

	var info gpuInfo
	driver, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return gpuInfo{}, fmt.Errorf("nvml driver version: %v", ret)
	}
	info.Driver = driver
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		// NVML encodes 12.4 as 12040.
		info.CUDA = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return gpuInfo{}, fmt.Errorf("nvml device count: %v", ret)
	}
	for i := 0; i < count; i++ {
		g, note := readDevice(i)
		info.GPUs = append(info.GPUs, g)
		if note != "" {
			info.Notes = append(info.Notes, note)
		}
	}
	return info, nil
}

// readDevice reads GPU i. A GPU NVML cannot fully read is kept, unhealthy,
// with a note saying what failed (the same rule as ParseNvidiaSMI).
func readDevice(i int) (arbiter.GPU, string) {
	g := arbiter.GPU{Index: i, Healthy: true}
	dev, ret := nvml.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		g.Healthy = false
		return g, fmt.Sprintf("GPU %d cannot be reached (%v): it probably fell off the bus; recorded as unhealthy", i, ret)
	}
	var bad []string
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		g.UUID = uuid
	} else {
		bad = append(bad, fmt.Sprintf("uuid (%v)", ret))
	}
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		g.Model = name
	} else {
		bad = append(bad, fmt.Sprintf("name (%v)", ret))
	}
	switch mem, ret := dev.GetMemoryInfo(); ret {
	case nvml.SUCCESS:
		g.VRAMGiB = math.Round(float64(mem.Total)/(1<<30)*100) / 100
	case nvml.ERROR_NOT_SUPPORTED:
		// Unified memory (GB10, GH200): Detect fills in host RAM.
	default:
		bad = append(bad, fmt.Sprintf("memory (%v)", ret))
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		g.Compute = fmt.Sprintf("%d.%d", major, minor)
	} else {
		bad = append(bad, fmt.Sprintf("compute capability (%v)", ret))
	}
	if len(bad) > 0 {
		g.Healthy = false
		return g, fmt.Sprintf("GPU %d is unhealthy: nvml could not read %s", i, strings.Join(bad, ", "))
	}
	return g, ""
}

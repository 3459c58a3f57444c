// Package gpu discovers what a host offers to the scheduler: its name, CPU
// cores, RAM, and NVIDIA GPUs with their driver and CUDA versions.
//
// GPUs are read through NVML (libnvidia-ml) when the binary is built with cgo
// on Linux and the library loads, and otherwise through the nvidia-smi tool,
// whose output ParseNvidiaSMI reads. A host with neither has no GPUs, which
// is not an error: the agent still registers it. A CGO_ENABLED=0 build (the
// usual cross-compiled arm64 binary for DGX Spark hosts) uses nvidia-smi only.
//
// Beside detection, the package samples the GPUs for GPU ground truth
// (docs/reference/gpu-truth.md; sample.go: utilization, memory, temperature, power,
// health and compute processes, through NVML or nvidia-smi, XIDs from NVML
// events or the kernel log) and attributes each process to an allocation
// from /proc (procs.go).
//
// testdata/fake-nvidia-smi is a stand-in for nvidia-smi that prints recorded
// outputs, and samples of the real processes of this machine that carry its
// FAKE_GPU_HOST; tests of other packages put it on PATH (see its header).
package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Host is what Detect found.
type Host struct {
	Hostname string
	Cores    int
	RAMGiB   float64 // MemTotal; 0 when unknown (not Linux)
	CUDA     string  // CUDA version the driver supports ("12.4"); "" without GPUs
	Driver   string  // NVIDIA driver version; "" without GPUs
	GPUs     []arbiter.GPU
	// Source says how the GPUs were found: SourceNVML, SourceNvidiaSMI, or ""
	// when there was nothing to ask.
	Source string
	// Notes are findings worth a warning in a log: unhealthy or unreachable
	// GPUs, a failing NVML that nvidia-smi replaced. Never needed to act.
	Notes []string
}

// Machine describes the host as a machine of the given name ("": its host
// name), source and tags. Its lists are never nil.
func (h *Host) Machine(name, source string, tags []string) arbiter.Machine {
	if name == "" {
		name = h.Hostname
	}
	tags = slices.Clone(tags)
	if tags == nil {
		tags = []string{}
	}
	gpus := slices.Clone(h.GPUs)
	if gpus == nil {
		gpus = []arbiter.GPU{}
	}
	return arbiter.Machine{Name: name, Kind: arbiter.KindGPU, Source: source, Tags: tags,
		Cores: h.Cores, RAMGiB: h.RAMGiB, CUDA: h.CUDA, Driver: h.Driver, GPUs: gpus}
}

// Values of Host.Source.
const (
	SourceNVML      = "nvml"
	SourceNvidiaSMI = "nvidia-smi"
)

// Options tune Detect. The zero value detects everything it can.
type Options struct {
	// NvidiaSMI is the nvidia-smi to run: a path, or a name looked up on
	// PATH. "" means "nvidia-smi" if it is on PATH (its absence is not an
	// error); "none" means never run it.
	NvidiaSMI string
	// DisableNVML skips NVML and goes straight to nvidia-smi.
	DisableNVML bool
	// Timeout bounds the whole detection; 0 means DefaultTimeout. nvidia-smi
	// can take seconds on a host with many GPUs, and hangs on a sick one.
	Timeout time.Duration
}

// DefaultTimeout bounds a detection when Options.Timeout is 0.
const DefaultTimeout = 20 * time.Second

// NoNvidiaSMI is the Options.NvidiaSMI value that disables nvidia-smi.
const NoNvidiaSMI = "none"

// gpuInfo is what one GPU source (NVML or nvidia-smi) reports.
type gpuInfo struct {
	GPUs   []arbiter.GPU
	Driver string
	CUDA   string
	Notes  []string
}

// errNoNVML means NVML is not available in this build or on this host; it
// is the quiet reason to fall back to nvidia-smi.
var errNoNVML = errors.New("nvml not available")

// Detect describes the host it runs on.
//
// GPUs come from NVML unless disabled or unavailable, then from nvidia-smi.
// Finding neither gives a Host without GPUs and a nil error. Detect fails
// when a GPU tool exists but cannot look — nvidia-smi failing because the
// driver is not loaded, an nvidia-smi named in Options that does not exist,
// output it cannot parse — since reporting "no GPUs" then would take every
// GPU away from the scheduler. It also fails when ctx ends or the timeout
// passes.
//
// A healthy GPU that reports no memory of its own (unified memory, as on
// GB10 and GH200) is given the host's RAM as VRAMGiB, because that is what
// it can address.
func Detect(ctx context.Context, opts Options) (Host, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var h Host
	name, err := os.Hostname()
	if err != nil {
		return Host{}, fmt.Errorf("hostname: %w", err)
	}
	h.Hostname = name
	h.Cores = runtime.NumCPU()
	if h.RAMGiB, err = hostRAM(); err != nil {
		h.Notes = append(h.Notes, fmt.Sprintf("RAM unknown: %v", err))
	}

	var info gpuInfo
	var nvmlErr error
	found := false
	if !opts.DisableNVML {
		info, nvmlErr = detectNVML(ctx)
		switch {
		case nvmlErr == nil:
			found, h.Source = true, SourceNVML
		case errors.Is(nvmlErr, errNoNVML):
			nvmlErr = nil
		default:
			h.Notes = append(h.Notes, fmt.Sprintf("NVML failed, trying nvidia-smi: %v", nvmlErr))
		}
	}
	if !found {
		var err error
		info, found, err = detectSMI(ctx, opts.NvidiaSMI)
		if err != nil {
			return Host{}, err
		}
		if found {
			h.Source = SourceNvidiaSMI
		} else if nvmlErr != nil {
			// NVML is there but broken and there is no nvidia-smi to ask:
			// the GPUs exist, we just cannot see them.
			return Host{}, fmt.Errorf("detect gpus: %w (and no nvidia-smi to fall back on)", nvmlErr)
		}
	}
	if err := ctx.Err(); err != nil {
		return Host{}, fmt.Errorf("detect gpus: %w", err)
	}
	h.GPUs, h.Driver, h.CUDA = info.GPUs, info.Driver, info.CUDA
	h.Notes = append(h.Notes, info.Notes...)
	for i := range h.GPUs {
		if g := &h.GPUs[i]; g.Healthy && g.VRAMGiB == 0 {
			g.VRAMGiB = h.RAMGiB
		}
	}
	return h, nil
}

// detectSMI asks nvidia-smi. found is false when there is no nvidia-smi to
// ask and none was named.
func detectSMI(ctx context.Context, name string) (info gpuInfo, found bool, err error) {
	if name == NoNvidiaSMI {
		return gpuInfo{}, false, nil
	}
	explicit := name != ""
	if !explicit {
		name = "nvidia-smi"
	}
	path, err := exec.LookPath(name)
	if err != nil {
		if explicit {
			return gpuInfo{}, false, fmt.Errorf("nvidia-smi %q: %w", name, err)
		}
		return gpuInfo{}, false, nil
	}

	out, runErr := runTool(ctx, path, "--query-gpu="+QueryFields, "--format=csv,noheader,nounits")
	res, parseErr := parseSMI(out)
	switch {
	case runErr != nil && ctx.Err() != nil:
		return gpuInfo{}, false, fmt.Errorf("run %s: %w", path, ctx.Err())
	case runErr != nil && (parseErr != nil || len(res.GPUs) == 0):
		// nvidia-smi prints its complaints on stdout; show the first line.
		return gpuInfo{}, false, fmt.Errorf("run %s: %v: %s; check the NVIDIA driver by running nvidia-smi by hand, or pass --nvidia-smi=none to run without GPUs",
			path, runErr, firstLine(out))
	case parseErr != nil:
		return gpuInfo{}, false, fmt.Errorf("read %s output: %w", path, parseErr)
	case runErr != nil:
		// A lost GPU makes nvidia-smi exit non-zero after printing the rest.
		res.Notes = append(res.Notes, fmt.Sprintf("nvidia-smi: %v", runErr))
	}
	info = gpuInfo{GPUs: res.GPUs, Driver: res.Driver, Notes: res.Notes}
	if len(info.GPUs) > 0 {
		info.CUDA = smiCUDAVersion(ctx, path)
	}
	return info, true, nil
}

// smiCUDAVersion reads the CUDA version from the header of `nvidia-smi -q`
// (limited to the cheap COMPUTE section), then from plain `nvidia-smi`.
// It returns "" if neither says. Exit statuses are ignored: a lost GPU makes
// both fail after printing the header we want.
func smiCUDAVersion(ctx context.Context, path string) string {
	out, _ := runTool(ctx, path, "-q", "-d", "COMPUTE")
	if v := parseCUDAVersion(out); v != "" {
		return v
	}
	out, _ = runTool(ctx, path)
	return parseCUDAVersion(out)
}

// runTool runs a command and returns its stdout.
func runTool(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A grandchild keeping the pipes open must not hang us past ctx.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil && stderr.Len() > 0 {
		err = fmt.Errorf("%w (%s)", err, firstLine(stderr.Bytes()))
	}
	return stdout.Bytes(), err
}

func firstLine(b []byte) string {
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return arbiter.Clip(l, 200)
		}
	}
	return "no output"
}

// hostRAM returns MemTotal in GiB on Linux and 0 elsewhere.
func hostRAM() (float64, error) {
	if runtime.GOOS != "linux" {
		return 0, nil
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read meminfo: %w", err)
	}
	return parseMeminfo(b)
}

// parseMeminfo reads MemTotal (in kB) from /proc/meminfo and returns GiB
// rounded to 0.01.
func parseMeminfo(b []byte) (float64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("meminfo: MemTotal line %q is not \"N kB\"", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo: MemTotal %q: %w", f[0], err)
		}
		return math.Round(float64(kb)/(1<<20)*100) / 100, nil
	}
	return 0, errors.New("meminfo: no MemTotal line")
}

// Summary describes GPUs in a few words for logs and messages:
// "8× NVIDIA H100 80GB HBM3 (79.65 GiB)", "2× Tesla T4 (15 GiB), 1 unhealthy",
// "no GPUs". Models appear in the order of their first GPU.
func Summary(gpus []arbiter.GPU) string {
	if len(gpus) == 0 {
		return "no GPUs"
	}
	type group struct {
		model string
		vram  float64
		n     int
	}
	var groups []group
	unhealthy := 0
next:
	for _, g := range gpus {
		if !g.Healthy {
			unhealthy++
			continue
		}
		for i := range groups {
			if groups[i].model == g.Model && groups[i].vram == g.VRAMGiB {
				groups[i].n++
				continue next
			}
		}
		groups = append(groups, group{g.Model, g.VRAMGiB, 1})
	}
	parts := make([]string, 0, len(groups)+1)
	for _, g := range groups {
		parts = append(parts, fmt.Sprintf("%d× %s (%s GiB)", g.n, g.model, strconv.FormatFloat(g.vram, 'f', -1, 64)))
	}
	if unhealthy > 0 {
		parts = append(parts, fmt.Sprintf("%d unhealthy", unhealthy))
	}
	return strings.Join(parts, ", ")
}

package gpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Sampling (docs/reference/gpu-truth.md): what each GPU is doing now — utilization,
// memory, temperature, power, health and its compute processes — through
// NVML where the build and host have it, else through nvidia-smi.
//
// What each path sees:
//   - NVML: everything, XID errors included (an event set registered for
//     critical XIDs is drained at every sample).
//   - nvidia-smi: everything but XIDs, which it has no query for. They are
//     read from the kernel log instead (/dev/kmsg, "NVRM: Xid (PCI:…): N"),
//     when the agent may read it (root, or kernel.dmesg_restrict = 0);
//     without it an XID is seen only through its consequences (the GPU
//     vanishing from the sample, or an ECC count rising).
//
// A GPU that vanished is simply missing from the sample: the caller, who
// knows which GPUs the host had, reports it as missing.

// SampleFields are the columns of nvidia-smi's GPU sample query, in order:
//
//	nvidia-smi --query-gpu=SampleFields --format=csv,noheader,nounits
const SampleFields = "index,uuid,pci.bus_id,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total"

// AppsFields are the columns of nvidia-smi's compute process query:
//
//	nvidia-smi --query-compute-apps=AppsFields --format=csv,noheader,nounits
const AppsFields = "gpu_uuid,pid,used_memory"

var sampleColumns = strings.Split(SampleFields, ",")

// Sample is one look at the host's GPUs.
type Sample struct {
	At     time.Time
	Source string // SourceNVML or SourceNvidiaSMI
	GPUs   []GPUSample
	// Notes are findings worth a warning: a GPU nvidia-smi could not reach,
	// a kernel log line that names no known GPU.
	Notes []string
}

// GPUSample is one GPU in a sample. A reading the GPU could not give
// ("[N/A]", "[Not Supported]", an NVML error) is nil.
type GPUSample struct {
	Index          int
	UUID           string
	BusID          string // as NormalizeBusID writes it
	UtilPct        *int
	MemUsedMiB     int64
	MemTotalMiB    int64
	TempC          *int
	PowerW         *float64
	ECCUncorrected *int64
	XIDs           []int // seen since the previous sample
	Processes      []Process
	// ProcessesUnread says why the GPU's processes could not be listed;
	// "" when they were. Processes is then not "none" but unknown.
	ProcessesUnread string
}

// Process is a compute process on a GPU, as the GPU reports it.
type Process struct {
	PID    int
	MemMiB int64
}

// SampleOptions tune a Sampler. The zero value samples however it can.
type SampleOptions struct {
	// NvidiaSMI and DisableNVML as in Options.
	NvidiaSMI   string
	DisableNVML bool
	// Timeout bounds one sample; default 10s.
	Timeout time.Duration
	// XIDLog is the kernel log XIDs are read from when NVML does not report
	// them: "" means /dev/kmsg if this process may read it, "none" never,
	// anything else a file that must open (tests append lines to one).
	XIDLog string
}

// NoXIDLog is the SampleOptions.XIDLog value that reads no kernel log.
const NoXIDLog = "none"

// ErrNoGPUTool means there is neither NVML nor nvidia-smi to sample with.
var ErrNoGPUTool = errors.New("no NVML and no nvidia-smi: nothing to sample GPUs with")

// Sampler samples the host's GPUs. It is not safe for concurrent use.
type Sampler struct {
	opts  SampleOptions
	nvml  nvmlSampler // nil: nvidia-smi
	smi   string      // nvidia-smi's path
	xid   *XIDReader
	notes []string
}

// nvmlSampler is the NVML path (nvml_cgo.go), kept open between samples.
type nvmlSampler interface {
	sample(ctx context.Context) ([]GPUSample, []string, error)
	close()
}

// NewSampler opens a sampler: NVML unless disabled or unavailable, else
// nvidia-smi. Errors: ErrNoGPUTool when there is neither; an nvidia-smi or
// an XID log named in opts that cannot be used.
func NewSampler(opts SampleOptions) (*Sampler, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	s := &Sampler{opts: opts}
	if !opts.DisableNVML {
		n, err := openNVMLSampler()
		switch {
		case err == nil:
			s.nvml = n
			return s, nil
		case !errors.Is(err, errNoNVML):
			s.notes = append(s.notes, fmt.Sprintf("NVML failed, sampling with nvidia-smi: %v", err))
		}
	}
	name := opts.NvidiaSMI
	switch name {
	case NoNvidiaSMI:
		return nil, ErrNoGPUTool
	case "":
		path, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return nil, ErrNoGPUTool
		}
		s.smi = path
	default:
		path, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi %q: %w", name, err)
		}
		s.smi = path
	}
	switch opts.XIDLog {
	case NoXIDLog:
	case "":
		x, err := OpenXIDLog("/dev/kmsg")
		if err != nil {
			s.notes = append(s.notes, fmt.Sprintf("XID errors will not be seen (nvidia-smi has no XID query and the kernel log cannot be read: %v)", err))
			break
		}
		s.xid = x
	default:
		x, err := OpenXIDLog(opts.XIDLog)
		if err != nil {
			return nil, fmt.Errorf("XID log: %w", err)
		}
		s.xid = x
	}
	return s, nil
}

// Source says how the sampler samples: SourceNVML or SourceNvidiaSMI.
func (s *Sampler) Source() string {
	if s.nvml != nil {
		return SourceNVML
	}
	return SourceNvidiaSMI
}

// Notes are what opening the sampler found worth a warning.
func (s *Sampler) Notes() []string { return s.notes }

// Close releases NVML and the kernel log. It is safe to call twice.
func (s *Sampler) Close() {
	if s.nvml != nil {
		s.nvml.close()
		s.nvml = nil
	}
	if s.xid != nil {
		s.xid.Close()
		s.xid = nil
	}
}

// Sample looks at every GPU once. It fails when the tool cannot look at
// all (the driver is gone, the output cannot be read, the timeout passed);
// a GPU it cannot reach is left out of the sample with a note.
func (s *Sampler) Sample(ctx context.Context) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	out := Sample{At: time.Now().UTC(), Source: s.Source()}
	var err error
	if s.nvml != nil {
		out.GPUs, out.Notes, err = s.nvml.sample(ctx)
	} else {
		out.GPUs, out.Notes, err = s.sampleSMI(ctx)
	}
	if err != nil {
		return Sample{}, err
	}
	if s.xid != nil {
		evs, err := s.xid.Read()
		if err != nil {
			out.Notes = append(out.Notes, fmt.Sprintf("kernel log: %v", err))
		}
		out.Notes = append(out.Notes, AddXIDs(out.GPUs, evs)...)
	}
	return out, nil
}

// AddXIDs gives each XID event to the GPU on its PCI bus, and returns a
// note for each it could not place.
func AddXIDs(gpus []GPUSample, evs []XIDEvent) []string {
	var notes []string
	for _, ev := range evs {
		placed := false
		for i := range gpus {
			if gpus[i].BusID == ev.BusID {
				gpus[i].XIDs = append(gpus[i].XIDs, ev.XID)
				placed = true
				break
			}
		}
		if !placed {
			notes = append(notes, fmt.Sprintf("XID %d on PCI %s, a GPU not in the sample", ev.XID, ev.BusID))
		}
	}
	return notes
}

func (s *Sampler) sampleSMI(ctx context.Context) ([]GPUSample, []string, error) {
	out, runErr := runTool(ctx, s.smi, "--query-gpu="+SampleFields, "--format=csv,noheader,nounits")
	gpus, notes, parseErr := ParseSampleCSV(out)
	switch {
	case ctx.Err() != nil:
		return nil, nil, fmt.Errorf("run %s: %w", s.smi, ctx.Err())
	case runErr != nil && parseErr == nil && len(gpus) == 0 && len(notes) > 0:
		// Every GPU it lists is lost (the only one fell off the bus): an
		// empty sample, so that each is reported missing, not no sample.
		return nil, append(notes, fmt.Sprintf("nvidia-smi: %v", runErr)), nil
	case runErr != nil && (parseErr != nil || len(gpus) == 0):
		return nil, nil, fmt.Errorf("run %s: %v: %s", s.smi, runErr, firstLine(out))
	case parseErr != nil:
		return nil, nil, fmt.Errorf("read %s output: %w", s.smi, parseErr)
	}
	if len(gpus) == 0 {
		return gpus, notes, nil
	}
	out, runErr = runTool(ctx, s.smi, "--query-compute-apps="+AppsFields, "--format=csv,noheader,nounits")
	apps, parseErr := ParseComputeApps(out)
	switch {
	case ctx.Err() != nil:
		return nil, nil, fmt.Errorf("run %s: %w", s.smi, ctx.Err())
	case parseErr != nil:
		return nil, nil, fmt.Errorf("read %s compute apps: %w", s.smi, parseErr)
	case runErr != nil && len(apps) == 0 && !bytes.Contains(out, []byte(lostPrefix)):
		// Nothing listed because the query failed is not "no processes":
		// a releasing GPU would be freed under a process still running.
		return nil, nil, fmt.Errorf("run %s compute apps: %v: %s", s.smi, runErr, firstLine(out))
	case runErr != nil && len(apps) == 0:
		// A lost GPU makes the query fail after printing what it could.
		notes = append(notes, fmt.Sprintf("nvidia-smi compute apps: %v", runErr))
	}
	for _, a := range apps {
		placed := false
		for i := range gpus {
			if gpus[i].UUID == a.UUID {
				gpus[i].Processes = append(gpus[i].Processes, Process{PID: a.PID, MemMiB: a.MemMiB})
				placed = true
				break
			}
		}
		if !placed {
			notes = append(notes, fmt.Sprintf("process %d on GPU %s, a GPU not in the sample", a.PID, arbiter.Clip(a.UUID, 64)))
		}
	}
	return gpus, notes, nil
}

// ParseSampleCSV parses the output of the sample query (SampleFields) into
// GPUs in the order printed. Readings printed in brackets ("[N/A]",
// "[Not Supported]", "[Unknown Error]") are left nil (memory: 0). A line
// "Unable to determine the device handle for GPU…" is a GPU that cannot be
// reached: it is left out, with a note. "No devices were found" and empty
// output mean no GPUs. Anything else malformed is an error naming the line.
func ParseSampleCSV(out []byte) ([]GPUSample, []string, error) {
	var gpus []GPUSample
	var notes []string
	seen := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line == noDevices:
			continue
		case strings.HasPrefix(line, lostPrefix):
			notes = append(notes, "nvidia-smi cannot reach a GPU: "+arbiter.Clip(line, 160))
			continue
		}
		g, err := parseSampleRow(line)
		if err != nil {
			return nil, nil, fmt.Errorf("nvidia-smi sample line %d %q: %w", n, arbiter.Clip(line, 120), err)
		}
		if seen[g.Index] {
			return nil, nil, fmt.Errorf("nvidia-smi sample line %d: index %d repeats an earlier line", n, g.Index)
		}
		seen[g.Index] = true
		gpus = append(gpus, g)
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("nvidia-smi sample line %d: %w", n+1, err)
	}
	return gpus, notes, nil
}

func parseSampleRow(line string) (GPUSample, error) {
	var g GPUSample
	f := strings.Split(line, ",")
	if len(f) != len(sampleColumns) {
		if strings.HasPrefix(line, "NVIDIA-SMI has failed") || strings.HasPrefix(line, "Failed to initialize NVML") {
			return g, errors.New("nvidia-smi cannot talk to the driver")
		}
		return g, fmt.Errorf("want %d comma-separated fields (%s), got %d", len(sampleColumns), SampleFields, len(f))
	}
	for i := range f {
		f[i] = strings.TrimSpace(f[i])
	}
	idx, err := strconv.Atoi(f[0])
	if err != nil || !isDigits(f[0]) || idx > 1<<16 {
		return g, fmt.Errorf("index %q is not a non-negative integer", f[0])
	}
	g.Index = idx
	if !bracketed(f[1]) {
		if f[1] == "" || strings.ContainsAny(f[1], " \t") {
			return g, fmt.Errorf("uuid %q is empty or holds spaces", f[1])
		}
		g.UUID = f[1]
	}
	if !bracketed(f[2]) {
		g.BusID = NormalizeBusID(f[2])
	}
	if g.UtilPct, err = optInt(f[3], "utilization.gpu", 0, 100); err != nil {
		return g, err
	}
	for i, dst := range []*int64{&g.MemUsedMiB, &g.MemTotalMiB} {
		v, err := optInt(f[4+i], sampleColumns[4+i], 0, math.MaxInt32)
		if err != nil {
			return g, err
		}
		if v != nil {
			*dst = int64(*v)
		}
	}
	if g.TempC, err = optInt(f[6], "temperature.gpu", -100, 300); err != nil {
		return g, err
	}
	if !bracketed(f[7]) {
		p, err := strconv.ParseFloat(f[7], 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 100000 {
			return g, fmt.Errorf("power.draw %q is not a number of watts", f[7])
		}
		g.PowerW = &p
	}
	ecc, err := optInt(f[8], "ecc.errors.uncorrected.volatile.total", 0, math.MaxInt32)
	if err != nil {
		return g, err
	}
	if ecc != nil {
		e := int64(*ecc)
		g.ECCUncorrected = &e
	}
	return g, nil
}

// bracketed reports whether a field is nvidia-smi's "[N/A]"-style note.
func bracketed(f string) bool { return len(f) >= 2 && f[0] == '[' && f[len(f)-1] == ']' }

// optInt parses a whole number in [lo, hi], nil for a bracketed field.
func optInt(f, col string, lo, hi int) (*int, error) {
	if bracketed(f) {
		return nil, nil
	}
	v, err := strconv.Atoi(f)
	if err != nil || v < lo || v > hi {
		return nil, fmt.Errorf("%s %q is not a whole number from %d to %d", col, f, lo, hi)
	}
	return &v, nil
}

// App is one row of the compute process query.
type App struct {
	UUID   string
	PID    int
	MemMiB int64
}

// ParseComputeApps parses the output of the compute process query
// (AppsFields). "No running processes found" and empty output mean none;
// used_memory "[N/A]" (MIG, some platforms) is 0. A malformed row is an
// error naming the line.
func ParseComputeApps(out []byte) ([]App, error) {
	var apps []App
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		// A lost GPU's line comes with the query of every GPU: it is left
		// out of the sample, and so reported missing (sampleSMI notes it).
		if line == "" || strings.HasPrefix(line, "No running processes found") || line == noDevices || strings.HasPrefix(line, lostPrefix) {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("nvidia-smi compute apps line %d %q: want 3 comma-separated fields (%s), got %d", n, arbiter.Clip(line, 120), AppsFields, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 || !isDigits(f[1]) {
			return nil, fmt.Errorf("nvidia-smi compute apps line %d: pid %q is not a process id", n, arbiter.Clip(f[1], 40))
		}
		if f[0] == "" || strings.ContainsAny(f[0], " \t") {
			return nil, fmt.Errorf("nvidia-smi compute apps line %d: gpu_uuid %q is empty or holds spaces", n, arbiter.Clip(f[0], 60))
		}
		mem, err := optInt(f[2], "used_memory", 0, math.MaxInt32)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi compute apps line %d: %w", n, err)
		}
		a := App{UUID: f[0], PID: pid}
		if mem != nil {
			a.MemMiB = int64(*mem)
		}
		apps = append(apps, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nvidia-smi compute apps line %d: %w", n+1, err)
	}
	return apps, nil
}

// NormalizeBusID writes a PCI address the way the kernel log does, so that
// nvidia-smi's "00000000:3B:00.0", NVML's and the kernel's "0000:3b:00"
// compare equal: "0000:3b:00". An address it cannot read comes back
// lower-cased.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return s
	}
	dev, _, _ := strings.Cut(parts[2], ".")
	d, err1 := strconv.ParseUint(parts[0], 16, 32)
	b, err2 := strconv.ParseUint(parts[1], 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	if err1 != nil || err2 != nil || err3 != nil {
		return s
	}
	return fmt.Sprintf("%04x:%02x:%02x", d, b, v)
}

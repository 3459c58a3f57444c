package gpu

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// QueryFields are the columns ParseNvidiaSMI expects, in order: the output of
//
//	nvidia-smi --query-gpu=QueryFields --format=csv,noheader,nounits
const QueryFields = "index,uuid,name,memory.total,compute_cap,driver_version,pci.bus_id"

var queryColumns = strings.Split(QueryFields, ",")

// lostPrefix starts the line nvidia-smi prints in place of a GPU's row when
// it cannot reach the GPU at all, typically because it fell off the PCIe bus
// ("Xid 79"):
//
//	Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error
const lostPrefix = "Unable to determine the device handle for GPU"

// noDevices is what nvidia-smi prints when the driver works but sees no GPU.
const noDevices = "No devices were found"

// smiResult is everything one query tells: the GPUs, the driver version
// their rows agree on, and notes worth a warning in the agent's log.
type smiResult struct {
	GPUs   []arbiter.GPU
	Driver string
	Notes  []string
}

// ParseNvidiaSMI parses the output of
//
//	nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap,driver_version,pci.bus_id --format=csv,noheader,nounits
//
// into GPUs ordered as printed. The format is strict:
//
//   - Each non-blank line is one GPU: exactly the seven QueryFields columns,
//     comma-separated. index is a non-negative integer, unique in the output;
//     memory.total is in MiB and becomes VRAMGiB rounded to 0.01 GiB
//     (81559 → 79.65); compute_cap is "major.minor".
//   - A field nvidia-smi could not read is printed in brackets: "[N/A]",
//     "[Unknown Error]", "[GPU requires reset]", … Such a GPU is kept with
//     Healthy=false, and the unreadable field left empty (zero) — a GPU in
//     that state must not be handed out, but the people looking at the machine
//     should still see it. The one exception is memory.total "[N/A]", which
//     is how unified-memory GPUs (GB10 in a DGX Spark, Grace Hopper) report:
//     the GPU stays healthy with VRAMGiB 0, and Detect fills in the host RAM.
//   - A line "Unable to determine the device handle for GPU<bus id>: <reason>"
//     is a GPU nvidia-smi cannot reach (it fell off the bus). It is recorded
//     as an unhealthy GPU with no UUID, model or memory, so that the machine
//     keeps its shape and the dashboard shows the failure instead of a GPU
//     silently vanishing. Its index is its position among the GPU lines
//     (nvidia-smi prints GPUs in index order), or the lowest index no other
//     line uses if that position is taken.
//   - Empty output and "No devices were found" mean no GPUs.
//
// Anything else — a missing column, a non-numeric index or memory, a repeated
// index, a malformed compute capability — is an error naming the line.
// Driver-level failures ("NVIDIA-SMI has failed because …") are errors too:
// they mean the tool could not look, not that there are no GPUs.
func ParseNvidiaSMI(out []byte) ([]arbiter.GPU, error) {
	r, err := parseSMI(out)
	if err != nil {
		return nil, err
	}
	return r.GPUs, nil
}

// lostGPU is a "device handle" line waiting for its index.
type lostGPU struct {
	pos  int // index into smiResult.GPUs
	line int
}

func parseSMI(out []byte) (smiResult, error) {
	var res smiResult
	var lost []lostGPU
	used := make(map[int]bool)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			continue
		case line == noDevices:
			if len(res.GPUs) > 0 || len(lost) > 0 {
				return smiResult{}, fmt.Errorf("nvidia-smi line %d: %q after GPU lines", lineNo, line)
			}
			continue
		case strings.HasPrefix(line, lostPrefix):
			bus, reason, _ := strings.Cut(strings.TrimPrefix(line, lostPrefix), ": ")
			if bus == "" {
				return smiResult{}, fmt.Errorf("nvidia-smi line %d %q: no PCI bus id", lineNo, line)
			}
			lost = append(lost, lostGPU{pos: len(res.GPUs), line: lineNo})
			res.GPUs = append(res.GPUs, arbiter.GPU{Index: -1})
			res.Notes = append(res.Notes, fmt.Sprintf("GPU at PCI %s cannot be reached (%s): it probably fell off the bus; recorded as unhealthy", bus, strings.TrimSpace(reason)))
			continue
		}
		g, driver, note, err := parseRow(line)
		if err != nil {
			return smiResult{}, fmt.Errorf("nvidia-smi line %d %q: %w", lineNo, arbiter.Clip(line, 120), err)
		}
		if used[g.Index] {
			return smiResult{}, fmt.Errorf("nvidia-smi line %d %q: index %d repeats an earlier line", lineNo, arbiter.Clip(line, 120), g.Index)
		}
		used[g.Index] = true
		if driver != "" {
			if res.Driver != "" && res.Driver != driver {
				return smiResult{}, fmt.Errorf("nvidia-smi line %d: driver version %q differs from %q on an earlier line", lineNo, driver, res.Driver)
			}
			res.Driver = driver
		}
		if note != "" {
			res.Notes = append(res.Notes, note)
		}
		res.GPUs = append(res.GPUs, g)
	}
	if err := sc.Err(); err != nil {
		return smiResult{}, fmt.Errorf("nvidia-smi line %d: %w", lineNo+1, err)
	}
	// Lost GPUs get their index once every explicit index is known, so they
	// never take one a later row claims.
	for _, l := range lost {
		idx := l.pos
		if used[idx] {
			idx = 0
			for used[idx] {
				idx++
			}
		}
		used[idx] = true
		res.GPUs[l.pos].Index = idx
	}
	return res, nil
}

// parseRow parses one CSV row of the query. It returns the driver version
// ("" if unreadable) and a note when the GPU is unhealthy.
func parseRow(line string) (g arbiter.GPU, driver, note string, err error) {
	fields := strings.Split(line, ",")
	if len(fields) != len(queryColumns) {
		if strings.HasPrefix(line, "NVIDIA-SMI has failed") || strings.HasPrefix(line, "Failed to initialize NVML") {
			return g, "", "", fmt.Errorf("nvidia-smi cannot talk to the driver")
		}
		return g, "", "", fmt.Errorf("want %d comma-separated fields (%s), got %d", len(queryColumns), QueryFields, len(fields))
	}
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	g.Healthy = true
	var bad []string // "column: [value]" for unreadable fields
	unreadable := func(i int) bool {
		f := fields[i]
		if len(f) >= 2 && f[0] == '[' && f[len(f)-1] == ']' {
			bad = append(bad, queryColumns[i]+" "+f)
			return true
		}
		return false
	}

	idx, err := strconv.Atoi(fields[0])
	if err != nil || !isDigits(fields[0]) {
		return g, "", "", fmt.Errorf("index %q is not a non-negative integer", fields[0])
	}
	g.Index = idx

	if !unreadable(1) {
		if fields[1] == "" || strings.ContainsAny(fields[1], " \t") {
			return g, "", "", fmt.Errorf("uuid %q is empty or holds spaces", fields[1])
		}
		g.UUID = fields[1]
	}

	if !unreadable(2) {
		if fields[2] == "" {
			return g, "", "", fmt.Errorf("name is empty")
		}
		g.Model = fields[2]
	}

	switch mem := fields[3]; {
	case mem == "[N/A]":
		// Unified memory (GB10, GH200): the GPU has no memory of its own.
	case unreadable(3):
	default:
		mib, err := strconv.ParseUint(mem, 10, 32)
		if err != nil {
			return g, "", "", fmt.Errorf("memory.total %q is not a whole number of MiB", mem)
		}
		g.VRAMGiB = math.Round(float64(mib)/1024*100) / 100
	}

	if !unreadable(4) {
		if _, _, ok := arbiter.ParseCompute(fields[4]); !ok || !strings.Contains(fields[4], ".") {
			return g, "", "", fmt.Errorf("compute_cap %q is not of the form 8.6", fields[4])
		}
		g.Compute = fields[4]
	}

	if !unreadable(5) {
		if fields[5] == "" || strings.ContainsAny(fields[5], " \t") {
			return g, "", "", fmt.Errorf("driver_version %q is empty or holds spaces", fields[5])
		}
		driver = fields[5]
	}

	if !unreadable(6) && fields[6] == "" {
		return g, "", "", fmt.Errorf("pci.bus_id is empty")
	}

	if len(bad) > 0 {
		g.Healthy = false
		note = fmt.Sprintf("GPU %d is unhealthy: nvidia-smi could not read %s", g.Index, strings.Join(bad, ", "))
	}
	return g, driver, note, nil
}

// cudaVersionRE finds the CUDA version in both `nvidia-smi -q` output
// ("CUDA Version                              : 12.4") and the header of plain
// `nvidia-smi` ("Driver Version: 550.54.15      CUDA Version: 12.4").
var cudaVersionRE = regexp.MustCompile(`CUDA Version\s*:\s*([0-9]{1,3}\.[0-9]{1,3})\b`)

// parseCUDAVersion returns the CUDA version nvidia-smi reports, or "" when
// the output has none (no CUDA-capable driver, or "N/A").
func parseCUDAVersion(out []byte) string {
	m := cudaVersionRE.FindSubmatch(out)
	if m == nil {
		return ""
	}
	return string(m[1])
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

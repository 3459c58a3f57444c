package place

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/arbiter-hq/arbiter"
)

// GPUOK reports whether one GPU satisfies a request's per-GPU constraints.
// The machine-level CUDA requirement is checked by MachineOK.
func GPUOK(g *arbiter.GPU, r *arbiter.Request) bool {
	if g.VRAMGiB < r.MinVRAMGiB {
		return false
	}
	if r.MinCompute != "" && (g.Compute == "" || arbiter.CompareCompute(g.Compute, r.MinCompute) < 0) {
		return false
	}
	if r.Model != "" {
		if ok, _ := path.Match(r.Model, g.Model); !ok {
			return false
		}
	}
	return true
}

// MachineOK reports whether a machine's own attributes (name, tags, CUDA)
// satisfy the request, regardless of its state and holdings.
func MachineOK(m *arbiter.Machine, r *arbiter.Request) bool {
	if r.Machine != "" && r.Machine != m.Name {
		return false
	}
	if r.RequireCUDA && m.CUDA == "" {
		return false
	}
	return m.HasTags(r.Tags)
}

// FitGPUs chooses r.GPUs free, healthy GPUs of m that satisfy r, given held[i]
// (the allocation holding m.GPUs[i], 0 when free). It returns positions in
// m.GPUs, or nil when the machine cannot take the request now.
//
// Among suitable GPUs it prefers the smallest VRAM, then the lowest index, so
// that large GPUs stay free for requests that need them.
func FitGPUs(m *arbiter.Machine, held []int64, r *arbiter.Request) []int {
	if !MachineOK(m, r) {
		return nil
	}
	var buf [arbiter.MaxGPUsPerMachine]int
	cand := buf[:0]
	for i := range m.GPUs {
		g := &m.GPUs[i]
		if held[i] == 0 && g.Healthy && GPUOK(g, r) {
			cand = append(cand, i)
		}
	}
	if len(cand) < r.GPUs {
		return nil
	}
	uniform := true
	for _, i := range cand[1:] {
		if m.GPUs[i].VRAMGiB != m.GPUs[cand[0]].VRAMGiB {
			uniform = false
			break
		}
	}
	if !uniform {
		sort.SliceStable(cand, func(a, b int) bool {
			return m.GPUs[cand[a]].VRAMGiB < m.GPUs[cand[b]].VRAMGiB
		})
	}
	out := append([]int(nil), cand[:r.GPUs]...)
	sort.Ints(out)
	return out
}

// stage is one constraint in the order Impossible checks them.
type stage struct {
	what string
	ok   func(g *arbiter.GPU, r *arbiter.Request) bool
}

var stages = []stage{
	{"", func(*arbiter.GPU, *arbiter.Request) bool { return true }},
	{"vram", func(g *arbiter.GPU, r *arbiter.Request) bool { return g.VRAMGiB >= r.MinVRAMGiB }},
	{"compute", func(g *arbiter.GPU, r *arbiter.Request) bool {
		return r.MinCompute == "" || g.Compute != "" && arbiter.CompareCompute(g.Compute, r.MinCompute) >= 0
	}},
	{"model", func(g *arbiter.GPU, r *arbiter.Request) bool {
		if r.Model == "" {
			return true
		}
		ok, _ := path.Match(r.Model, g.Model)
		return ok
	}},
}

// Impossible explains why no machine in ms could ever satisfy r, whatever it
// held and whatever state it was in; it returns "" when some machine could.
// Constraints are checked in a fixed order (machine, tags, CUDA, count, VRAM,
// compute capability, model) and the message names the first that no machine
// passes.
func Impossible(ms []*arbiter.Machine, r *arbiter.Request) string {
	var cands []*arbiter.Machine
	for _, m := range ms {
		if r.Machine == "" || m.Name == r.Machine {
			cands = append(cands, m)
		}
	}
	if len(cands) == 0 {
		if r.Machine != "" {
			return fmt.Sprintf("machine %q is not known", r.Machine)
		}
		return "no machines are registered"
	}
	cands = filter(cands, func(m *arbiter.Machine) bool { return m.HasTags(r.Tags) })
	if len(cands) == 0 {
		return fmt.Sprintf("no machine has all of the tags [%s]", strings.Join(r.Tags, " "))
	}
	if r.RequireCUDA {
		cands = filter(cands, func(m *arbiter.Machine) bool { return m.CUDA != "" })
		if len(cands) == 0 {
			return "no machine has CUDA"
		}
	}
	for si, s := range stages {
		best, bestM := -1, ""
		for _, m := range cands {
			n := 0
			for gi := range m.GPUs {
				g := &m.GPUs[gi]
				pass := true
				for _, t := range stages[:si+1] {
					if !t.ok(g, r) {
						pass = false
						break
					}
				}
				if pass {
					n++
				}
			}
			if n > best {
				best, bestM = n, m.Name
			}
		}
		if best >= r.GPUs {
			continue
		}
		return impossibleReason(s.what, cands, r, best, bestM)
	}
	return ""
}

func filter(ms []*arbiter.Machine, keep func(*arbiter.Machine) bool) []*arbiter.Machine {
	out := ms[:0:0]
	for _, m := range ms {
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

// impossibleReason words the failure of one constraint stage, with what the
// known machines do offer so the user can adjust the request.
func impossibleReason(what string, ms []*arbiter.Machine, r *arbiter.Request, best int, bestM string) string {
	most := fmt.Sprintf("the most is %d, on %s", best, bestM)
	switch what {
	case "":
		return fmt.Sprintf("no machine has %s (%s)", arbiter.Plural(r.GPUs, "GPU"), most)
	case "vram":
		top := 0.0
		for _, m := range ms {
			for _, g := range m.GPUs {
				top = max(top, g.VRAMGiB)
			}
		}
		if best == 0 {
			most = fmt.Sprintf("the largest GPU has %g GiB", top)
		}
		return fmt.Sprintf("no machine has %s with at least %g GiB of VRAM (%s)", arbiter.Plural(r.GPUs, "GPU"), r.MinVRAMGiB, most)
	case "compute":
		top := ""
		for _, m := range ms {
			for _, g := range m.GPUs {
				if g.Compute != "" && (top == "" || arbiter.CompareCompute(g.Compute, top) > 0) {
					top = g.Compute
				}
			}
		}
		if best == 0 {
			most = "the highest is " + top
			if top == "" {
				most = "no GPU reports its compute capability"
			}
		}
		return fmt.Sprintf("no machine has %s with compute capability %s or higher (%s)", arbiter.Plural(r.GPUs, "GPU"), r.MinCompute, most)
	default:
		seen := map[string]bool{}
		var models []string
		for _, m := range ms {
			for _, g := range m.GPUs {
				if !seen[g.Model] && len(models) < 5 {
					seen[g.Model] = true
					models = append(models, fmt.Sprintf("%q", g.Model))
				}
			}
		}
		if best == 0 {
			most = "models here: " + strings.Join(models, ", ")
		}
		return fmt.Sprintf("no machine has %s whose model matches %q and the other constraints (%s)", arbiter.Plural(r.GPUs, "GPU"), r.Model, most)
	}
}

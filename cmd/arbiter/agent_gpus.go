package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/agent"
	"github.com/arbiter-hq/arbiter/gpu"
)

// agentObserve are the GPU observation flags of `arbiter agent`
// (specs/gpu-truth.md).
type agentObserve struct {
	noObserve  bool
	xidLog     string
	sampleOnce bool
	output     string
}

func agentObserveFlags(fs *flag.FlagSet) *agentObserve {
	o := &agentObserve{}
	fs.BoolVar(&o.noObserve, "no-observe", false, "do not sample the GPUs, report what runs on them or stop processes")
	fs.StringVar(&o.xidLog, "xid-log", "", `kernel log to read XID errors from when NVML cannot report them ("" = /dev/kmsg if readable, "none")`)
	fs.BoolVar(&o.sampleOnce, "sample-once", false, "sample the GPUs once, print what would be reported and exit (no server needed)")
	fs.StringVar(&o.output, "o", outTable, "--sample-once output: table or json")
	return o
}

// config is the agent's observation, nil with --no-observe.
func (o *agentObserve) config() (*agent.ObserveConfig, error) {
	if o.output != outTable && o.output != outJSON {
		return nil, usagef("-o %q: want table or json", o.output)
	}
	if o.noObserve {
		return nil, nil
	}
	return &agent.ObserveConfig{XIDLog: o.xidLog}, nil
}

// agentSampleOnce is `arbiter agent --sample-once`: detect, sample once,
// attribute, print.
func agentSampleOnce(ctx context.Context, env *Env, opts gpu.Options, o *agentObserve) error {
	if _, err := o.config(); err != nil {
		return err
	}
	host, err := gpu.Detect(ctx, opts)
	if err != nil {
		return fmt.Errorf("detect: %w", err)
	}
	s, err := gpu.NewSampler(gpu.SampleOptions{NvidiaSMI: opts.NvidiaSMI, DisableNVML: opts.DisableNVML, XIDLog: o.xidLog})
	if err != nil {
		return err
	}
	defer s.Close()
	rep, smp, err := agent.SampleOnce(ctx, s, "", host.GPUs)
	if err != nil {
		return err
	}
	notes := append(append(append([]string{}, host.Notes...), s.Notes()...), smp.Notes...)
	if o.output == outJSON {
		return writeJSON(env.Stdout, struct {
			Source string            `json:"source"`
			GPUs   []arbiter.GPU     `json:"gpus"`
			Notes  []string          `json:"notes"`
			Report arbiter.GPUReport `json:"report"`
		}{s.Source(), host.GPUs, notes, rep})
	}
	fmt.Fprintf(env.Stdout, "sampled through %s at %s\n", s.Source(), rep.SampledAt.Format("2006-01-02T15:04:05Z07:00"))
	for _, n := range notes {
		fmt.Fprintf(env.Stdout, "note: %s\n", n)
	}
	return printReadings(env.Stdout, rep.GPUs)
}

// printReadings prints GPU readings, one line per GPU, then each process.
func printReadings(w io.Writer, gs []arbiter.GPUReading) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUTIL\tMEMORY\tTEMP\tPOWER\tECC\tXIDS\tPROCESSES")
	for _, g := range gs {
		if g.Missing {
			fmt.Fprintf(tw, "%d\tmissing\t\t\t\t\t\t\n", g.Index)
			continue
		}
		ecc := "-"
		if g.ECCUncorrected != nil {
			ecc = fmt.Sprint(*g.ECCUncorrected)
		}
		xids := make([]string, len(g.XIDs))
		for i, x := range g.XIDs {
			xids[i] = fmt.Sprint(x)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, pctText(g.UtilPct), memText(g.MemUsedMiB, g.MemTotalMiB),
			optText(g.TempC, "°C"), wattText(g.PowerW), ecc, orDash(strings.Join(xids, ",")), processesText(g.Processes))
	}
	return tw.Flush()
}

func pctText(p *int) string {
	if p == nil {
		return "?"
	}
	return fmt.Sprintf("%d%%", *p)
}

func optText(p *int, unit string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%d%s", *p, unit)
}

func wattText(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0fW", *p)
}

func memText(used, total int64) string {
	if total == 0 {
		return fmt.Sprintf("%.1fGiB", float64(used)/1024)
	}
	return fmt.Sprintf("%.1f/%.0fGiB", float64(used)/1024, float64(total)/1024)
}

// processesText is "pid user (allocation N) command" per process, joined.
func processesText(ps []arbiter.GPUProcess) string {
	if len(ps) == 0 {
		return "-"
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		who := p.User
		if who == "" {
			who = "?"
		}
		alloc := "no allocation"
		if p.Allocation != nil {
			alloc = fmt.Sprintf("allocation %d", *p.Allocation)
		}
		cmd := p.Command
		if len(cmd) > 40 {
			cmd = cmd[:40] + "…"
		}
		parts[i] = fmt.Sprintf("%d %s (%s) %s", p.PID, who, alloc, cmd)
	}
	return strings.Join(parts, "; ")
}

package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/agent"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/gpu"
)

// agentObserve are the GPU observation flags of `arbiter agent`
// (docs/reference/gpu-truth.md).
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
	fs.StringVar(&o.output, "o", "table", "--sample-once output: table or json")
	return o
}

// config is the agent's observation, nil with --no-observe.
func (o *agentObserve) config() (*agent.ObserveConfig, error) {
	if o.output != "table" && o.output != "json" {
		return nil, cli.Usagef("-o %q: want table or json", o.output)
	}
	if o.noObserve {
		return nil, nil
	}
	return &agent.ObserveConfig{XIDLog: o.xidLog}, nil
}

// agentSampleOnce is `arbiter agent --sample-once`: detect, sample once,
// attribute, print.
func agentSampleOnce(ctx context.Context, env *cli.Env, opts gpu.Options, o *agentObserve) error {
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
	if o.output == "json" {
		return cli.WriteJSON(env.Stdout, struct {
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
	return cli.PrintReadings(env.Stdout, rep.GPUs)
}

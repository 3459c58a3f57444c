package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/agent"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/gpu"
)

// `arbiter agent`: the host agent's command line (package agent is the
// agent). version is what its task worker reports to the server.

// cmdAgent runs the host agent until ctx ends (SIGTERM or SIGINT), which is
// a clean exit. It logs to stderr; the first line says what was detected.
func agentCommand(version string) func(context.Context, *Env, []string) error {
	return func(ctx context.Context, env *Env, args []string) error { return runAgent(ctx, env, args, version) }
}

func runAgent(ctx context.Context, env *Env, args []string, version string) error {
	fs := flag.NewFlagSet("arbiter agent", flag.ContinueOnError)
	var (
		urlFlag, token, name, nvidiaSMI string
		tags                            StringList
		heartbeat                       time.Duration
		noNVML                          bool
	)
	obs := agentObserveFlags(fs)
	// The URL and token defaults are read after parsing so that -h never
	// prints a token.
	fs.StringVar(&urlFlag, "url", "", "server URL, or the replicas' separated by commas (default $ARBITER_URL, else "+DefaultURL+")")
	fs.StringVar(&token, "token", "", "bearer token with the agent role (default $ARBITER_TOKEN)")
	fs.StringVar(&name, "name", "", "machine name (default: this host's name)")
	fs.Var(&tags, "tag", "tag the machine carries; repeat for several (--tag default --tag h100)")
	durationVar(fs, &heartbeat, "heartbeat", agent.DefaultHeartbeatInterval, "time between heartbeats (10s, or seconds)")
	fs.StringVar(&nvidiaSMI, "nvidia-smi", "", `nvidia-smi to run: a path, a name on PATH, or "none" (default: nvidia-smi if on PATH)`)
	fs.BoolVar(&noNVML, "no-nvml", false, "read GPUs with nvidia-smi only, not through NVML")
	taskFlags := agentTaskFlags(fs, version)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter agent [flags]\n\n"+
			"Register this host with the server as a machine, with its GPUs, and\n"+
			"heartbeat until stopped (SIGTERM or Ctrl-C). It runs the tasks the work\n"+
			"queue gives it, and watches its GPUs: it reports what really runs on\n"+
			"them and stops the processes the server orders stopped.\n\n"+
			"arbiter agent --sample-once [-o json] samples the GPUs once, prints what\n"+
			"it would report (each process attributed) and exits: no server needed.\n\nflags:\n")
		fs.PrintDefaults()
	}
	pos, err := ParseFlags(env, fs, args, false)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) > 0 {
		return Usagef("unexpected argument %q; arbiter agent takes only flags", pos[0])
	}
	server, err := serverURL(env, urlFlag)
	if err != nil {
		return err
	}
	if token == "" {
		token = env.Getenv("ARBITER_TOKEN")
	}
	if heartbeat <= 0 {
		return Usagef("--heartbeat %v must be positive, like 15s", heartbeat)
	}
	tasks, err := taskFlags()
	if err != nil {
		return err
	}
	gopts := gpu.Options{NvidiaSMI: nvidiaSMI, DisableNVML: noNVML}
	if obs.sampleOnce {
		return agentSampleOnce(ctx, env, gopts, obs)
	}
	observe, err := obs.config()
	if err != nil {
		return err
	}

	log := slog.New(slog.NewTextHandler(env.Stderr, nil))
	return agent.Run(ctx, agent.Config{
		Server:            client.New(server, token),
		Name:              name,
		Tags:              tags,
		HeartbeatInterval: heartbeat,
		GPU:               gopts,
		Logger:            log.With("server", server),
		Tasks:             tasks,
		Observe:           observe,
	})
}

// agentTaskFlags registers the task worker's flags of `arbiter agent` and
// returns a function that checks them after parsing and gives the worker's
// configuration (nil with --no-tasks).
func agentTaskFlags(fs *flag.FlagSet, version string) func() (*agent.WorkerConfig, error) {
	var (
		noTasks               bool
		dir                   string
		maxTasks, cpuTasks    int
		beat, poll, killGrace time.Duration
	)
	fs.BoolVar(&noTasks, "no-tasks", false, "do not claim and run tasks (only register and heartbeat)")
	fs.StringVar(&dir, "work-dir", "arbiter-work", "directory for the tasks' working directories and logs")
	fs.IntVar(&maxTasks, "max-tasks", 0, "tasks run at once (0: one per GPU plus --cpu-tasks)")
	fs.IntVar(&cpuTasks, "cpu-tasks", 1, "tasks that need no GPU run at once (0: none)")
	durationVar(fs, &beat, "task-heartbeat", agent.DefaultTaskHeartbeat, "time between a running task's heartbeats")
	durationVar(fs, &poll, "task-poll", agent.DefaultTaskPoll, "time between claims when nothing fits")
	durationVar(fs, &killGrace, "kill-grace", agent.DefaultKillGrace, "time a stopped task has between SIGTERM and SIGKILL")
	return func() (*agent.WorkerConfig, error) {
		switch {
		case noTasks:
			return nil, nil
		case maxTasks < 0 || maxTasks > 1024:
			return nil, Usagef("--max-tasks %d: want 0 (automatic) to 1024", maxTasks)
		case cpuTasks < 0 || cpuTasks > 1024:
			return nil, Usagef("--cpu-tasks %d: want 0 to 1024", cpuTasks)
		case beat <= 0 || poll <= 0 || killGrace <= 0:
			return nil, Usagef("--task-heartbeat, --task-poll and --kill-grace must be positive, like 30s")
		case dir == "":
			return nil, Usagef("--work-dir must not be empty")
		}
		wc := &agent.WorkerConfig{Dir: dir, MaxTasks: maxTasks, CPUTasks: cpuTasks, Heartbeat: beat, Poll: poll,
			KillGrace: killGrace, Version: version}
		if cpuTasks == 0 {
			wc.CPUTasks = -1
		}
		return wc, nil
	}
}

// agentObserve are the GPU observation flags of `arbiter agent`
// (docs/reference/gpu-truth.md).
type agentObserve struct {
	noObserve  bool
	xidLog     string
	sampleOnce bool
	output     string
	trustPIDs  bool
}

func agentObserveFlags(fs *flag.FlagSet) *agentObserve {
	o := &agentObserve{}
	fs.BoolVar(&o.noObserve, "no-observe", false, "do not sample the GPUs, report what runs on them or stop processes")
	fs.StringVar(&o.xidLog, "xid-log", "", `kernel log to read XID errors from when NVML cannot report them ("" = /dev/kmsg if readable, "none")`)
	fs.BoolVar(&o.sampleOnce, "sample-once", false, "sample the GPUs once, print what would be reported and exit (no server needed)")
	fs.StringVar(&o.output, "o", "table", "--sample-once output: table or json")
	fs.BoolVar(&o.trustPIDs, "trust-pids", false, "in a PID namespace other than the host's (a container without --pid=host), still trust the pids the GPU tool reports to be this namespace's, and stop processes by them")
	return o
}

// config is the agent's observation, nil with --no-observe.
func (o *agentObserve) config() (*agent.ObserveConfig, error) {
	if o.output != "table" && o.output != "json" {
		return nil, Usagef("-o %q: want table or json", o.output)
	}
	if o.noObserve {
		return nil, nil
	}
	return &agent.ObserveConfig{XIDLog: o.xidLog, TrustPIDs: o.trustPIDs}, nil
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
	rep, smp, err := agent.SampleOnce(ctx, s, agent.ObserveConfig{TrustPIDs: o.trustPIDs}, host.GPUs)
	if err != nil {
		return err
	}
	notes := append(append(append([]string{}, host.Notes...), s.Notes()...), smp.Notes...)
	if o.output == "json" {
		return WriteJSON(env.Stdout, struct {
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
	return PrintReadings(env.Stdout, rep.GPUs)
}

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/arbiter-hq/arbiter/agent"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/gpu"
)

// cmdAgent runs the host agent until ctx ends (SIGTERM or SIGINT), which is
// a clean exit. It logs to stderr; the first line says what was detected.
func cmdAgent(ctx context.Context, env *cli.Env, args []string) error {
	fs := flag.NewFlagSet("arbiter agent", flag.ContinueOnError)
	var (
		serverURL, token, name, nvidiaSMI string
		tags                              cli.StringList
		heartbeat                         time.Duration
		noNVML                            bool
	)
	obs := agentObserveFlags(fs) // agent_gpus.go
	// The URL and token defaults are read after parsing so that -h never
	// prints a token.
	fs.StringVar(&serverURL, "url", "", "server URL, or the replicas' separated by commas (default $ARBITER_URL, else "+cli.DefaultURL+")")
	fs.StringVar(&token, "token", "", "bearer token with the agent role (default $ARBITER_TOKEN)")
	fs.StringVar(&name, "name", "", "machine name (default: this host's name)")
	fs.Var(&tags, "tag", "tag the machine carries; repeat for several (--tag default --tag h100)")
	fs.DurationVar(&heartbeat, "heartbeat", agent.DefaultHeartbeatInterval, "time between heartbeats")
	fs.StringVar(&nvidiaSMI, "nvidia-smi", "", `nvidia-smi to run: a path, a name on PATH, or "none" (default: nvidia-smi if on PATH)`)
	fs.BoolVar(&noNVML, "no-nvml", false, "read GPUs with nvidia-smi only, not through NVML")
	taskFlags := agentTaskFlags(fs) // agent_tasks.go
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
	pos, err := cli.ParseFlags(env, fs, args, false)
	if err != nil {
		return cli.HelpOK(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q; arbiter agent takes only flags", pos[0])
	}
	if serverURL == "" {
		serverURL = env.Getenv("ARBITER_URL")
	}
	if serverURL == "" {
		serverURL = cli.DefaultURL
	}
	if token == "" {
		token = env.Getenv("ARBITER_TOKEN")
	}
	if _, err := client.ParseURLs(serverURL); err != nil {
		return cli.Usagef("--url %q is not an http:// or https:// URL like %s (or several, separated by commas)", serverURL, cli.DefaultURL)
	}
	if heartbeat <= 0 {
		return cli.Usagef("--heartbeat %v must be positive, like 15s", heartbeat)
	}
	tasks, err := taskFlags()
	if err != nil {
		return err
	}
	gopts := gpu.Options{NvidiaSMI: nvidiaSMI, DisableNVML: noNVML}
	if obs.sampleOnce {
		return agentSampleOnce(ctx, env, gopts, obs) // agent_gpus.go
	}
	observe, err := obs.config()
	if err != nil {
		return err
	}

	log := slog.New(slog.NewTextHandler(env.Stderr, nil))
	return agent.Run(ctx, agent.Config{
		Server:            client.New(serverURL, token),
		Name:              name,
		Tags:              tags,
		HeartbeatInterval: heartbeat,
		GPU:               gopts,
		Logger:            log.With("server", serverURL),
		Tasks:             tasks,
		Observe:           observe,
	})
}

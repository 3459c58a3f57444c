// Command arbiter is the one binary of the arbiter control plane: the server,
// the host agent, and the client commands people and scripts use.
//
// This is the only package that wires concrete pieces together (DESIGN §3).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Env is what a subcommand may touch of the outside world, so that tests can
// run the real commands in-process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// command is one subcommand. run returns a usageError for bad arguments
// (exit 2), an exitError to exit with a given status, any other error to
// print it and exit 1.
type command struct {
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

func commands() map[string]command {
	return map[string]command{
		"server":    {"run the control plane server", cmdServer},
		"agent":     {"run the host agent: register this machine and heartbeat", cmdAgent},
		"status":    {"show machines, their GPUs and who holds each", cmdStatus},
		"ps":        {"list allocations", cmdPs},
		"pools":     {"show pools, their backings and slot occupancy", cmdPools},
		"alloc":     {"allocate GPUs, optionally running a command with them", cmdAlloc},
		"keepalive": {"refresh an allocation's keepalive", cmdKeepalive},
		"release":   {"release an allocation", cmdRelease},
		"drain":     {"stop placing new allocations on a machine (admin)", cmdDrain},
		"undrain":   {"place allocations on a drained machine again (admin)", cmdUndrain},
		"events":    {"follow the event stream", cmdEvents},
		"lock":      {"acquire, extend, release and show named locks", cmdLock},
		"services":  {"list the inference services and the model each serves", cmdServices},
		"catalog":   {"list, set, remove or validate a service's models", cmdCatalog},
		"swap":      {"swap the model a service serves (--dry-run, --follow)", cmdSwap},
		"swaps":     {"list swaps, or show or follow one", cmdSwaps},
		"webhooks":  {"manage webhook subscriptions and show deliveries (admin)", cmdWebhooks},
		"schedules": {"list, add or remove registered schedules", cmdSchedules},
		"bench":     {"load-test a running server (bench alloc)", cmdBench},
		"tasks":     {"the work queue: status, list, show, cancel, requeue, reload, workers", cmdTasks},
		"artifacts": {"list and download the artifacts tasks uploaded", cmdArtifacts},
		"reload":    {"make the server read its configuration again, as SIGHUP (admin)", cmdReload},
		"gpu":       {"drain, undrain or free one GPU (admin)", cmdGPU},
		"report":    {"GPU-hours per owner, machine, model or day", cmdReport},
		"version":   {"print the version", cmdVersion},
	}
}

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func cmdVersion(_ context.Context, env *Env, _ []string) error {
	fmt.Fprintln(env.Stdout, "arbiter", version)
	return nil
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(run(ctx, env, os.Args[1:]))
}

// run dispatches args to a subcommand and returns the process exit status.
func run(ctx context.Context, env *Env, args []string) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(env.Stderr, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "arbiter: unknown command %q\n\n", args[0])
		printUsage(env.Stderr, cmds)
		return 2
	}
	err := c.run(ctx, env, args[1:])
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(env.Stderr, "arbiter %s: %s\n", args[0], ue.msg)
		return 2
	default:
		fmt.Fprintf(env.Stderr, "arbiter %s: %v\n", args[0], err)
		return 1
	}
}

func printUsage(w io.Writer, cmds map[string]command) {
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: arbiter COMMAND [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-10s %s\n", n, cmds[n].summary)
	}
	b.WriteString("\nRun 'arbiter COMMAND -h' for a command's flags. Client commands read ARBITER_URL and ARBITER_TOKEN.\n")
	io.WriteString(w, b.String())
}

// Package cli is arbiter's command line: the client commands people and
// scripts use (status, alloc, ps, release, tasks, lock, swap, events …),
// each speaking the HTTP API through package client; `arbiter agent`,
// the command line of package agent; and the small
// framework every subcommand of the binary follows — the Env a command may
// touch, flags parsed with the standard flag package, usage errors that
// exit 2 after saying what to do, -o json printing exactly one document.
//
// cmd/arbiter adds the server and the load tools (package bench) to
// Commands and calls Run.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Env is what a subcommand may touch of the outside world, so that tests can
// run the real commands in-process.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Command is one subcommand. Run returns a UsageError for bad arguments
// (exit 2), an ExitError to exit with a given status, any other error to
// print it and exit 1.
type Command struct {
	Summary string
	Run     func(ctx context.Context, env *Env, args []string) error
}

// Commands returns the client commands and `arbiter agent`; version is
// what `arbiter version` and the agent's task worker report.
func Commands(version string) map[string]Command {
	return map[string]Command{
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
		"tasks":     {"the work queue: status, list, show, cancel, requeue, reload, workers", cmdTasks},
		"artifacts": {"list and download the artifacts tasks uploaded", cmdArtifacts},
		"reload":    {"make the server read its configuration again, as SIGHUP (admin)", cmdReload},
		"audit":     {"list the audit trail: admin actions and refused requests (admin)", cmdAudit},
		"gpu":       {"drain, undrain or free one GPU (admin)", cmdGPU},
		"report":    {"GPU-hours per owner, machine, model or day", cmdReport},
		// Fair share (fairshare.go).
		"quotas":       {"list quotas and their use; set or remove one (admin)", cmdQuotas},
		"fairshare":    {"the groups' fair-share standings: why the queue is in its order", cmdFairShare},
		"reserve":      {"reserve GPUs for a group, once or recurring (admin)", cmdReserve},
		"reservations": {"list reservations on a timeline; remove one (admin)", cmdReservations},
		"extend":       {"extend an allocation's time limit", cmdExtend},
		"notify":       {"tell me (a webhook, Slack-compatible) when my GPUs are ready, idle, ending, preempted …", cmdNotify},
		"version":      {"print the version", versionCommand(version)},
		"agent":        {"run the host agent: register this machine and heartbeat", agentCommand(version)},
	}
}

// UsageError is a mistake in a command's arguments: Run prints it and
// exits 2.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Usagef returns a UsageError with a formatted message.
func Usagef(format string, args ...any) error { return UsageError{fmt.Sprintf(format, args...)} }

// ExitError asks Run to exit with Code (a command run by `arbiter alloc --
// CMD` exiting non-zero, say), having printed Msg, if any, as it prints a
// command's error.
type ExitError struct {
	Code int
	Msg  string
}

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Run dispatches args to one of cmds and returns the process exit status.
func Run(ctx context.Context, env *Env, args []string, cmds map[string]Command) int {
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
	// Whatever a command prints, it prints escaped (term.go).
	tenv := *env
	tenv.Stdout, tenv.Stderr = newTermWriter(env.Stdout), newTermWriter(env.Stderr)
	err := c.Run(ctx, &tenv, args[1:])
	var ue UsageError
	var ee ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.Msg != "" {
			fmt.Fprintf(tenv.Stderr, "arbiter %s: %s\n", args[0], ee.Msg)
		}
		return ee.Code
	case errors.As(err, &ue):
		fmt.Fprintf(tenv.Stderr, "arbiter %s: %s\n", args[0], ue.Msg)
		return 2
	case errors.Is(err, context.Canceled):
		// Ctrl-C or SIGTERM: say so in words, not Go's "context canceled".
		fmt.Fprintf(tenv.Stderr, "arbiter %s: interrupted\n", args[0])
		return 130
	default:
		fmt.Fprintf(tenv.Stderr, "arbiter %s: %v\n", args[0], err)
		return 1
	}
}

func printUsage(w io.Writer, cmds map[string]Command) {
	names := make([]string, 0, len(cmds))
	width := 0
	for n := range cmds {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: arbiter COMMAND [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-*s %s\n", width, n, cmds[n].Summary)
	}
	b.WriteString("\nRun 'arbiter COMMAND -h' for a command's flags. Client commands read ARBITER_URL and ARBITER_TOKEN.\n")
	io.WriteString(w, b.String())
}

// versionCommand prints the version: "arbiter VERSION", or with -o json
// {"version": VERSION}.
func versionCommand(version string) func(ctx context.Context, env *Env, args []string) error {
	return func(_ context.Context, env *Env, args []string) error {
		fs, cf := NewClientFlags(env, "version", "")
		if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
			return HelpOK(err)
		}
		if cf.JSON() {
			return WriteJSON(env.Stdout, struct {
				Version string `json:"version"`
			}{version})
		}
		_, err := fmt.Fprintln(env.Stdout, "arbiter", version)
		return err
	}
}

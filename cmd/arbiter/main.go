// Command arbiter is the one binary of the arbiter control plane: the server,
// the host agent, the client commands people and scripts use, and the load
// tools.
//
// This is the only package that wires concrete pieces together
// (docs/architecture.md §3): the client commands and `arbiter agent` live
// in package cli, the load tools in package bench; here are main and
// `arbiter server`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/arbiter-hq/arbiter/cli"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// commands are every subcommand of the binary.
func commands() map[string]cli.Command {
	cmds := cli.Commands(version)
	cmds["server"] = cli.Command{Summary: "run the control plane server", Run: cmdServer}
	cmds["bench"] = cli.Command{Summary: "load-test a running server (bench alloc|spalloc|tasks, --ceiling to compare with a do-nothing server), write a big state (bench state), or serve a ceiling (bench ceiling)", Run: cmdBench}
	return cmds
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := &cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(run(ctx, env, os.Args[1:]))
}

// run runs one command line in-process and returns its exit status.
func run(ctx context.Context, env *cli.Env, args []string) int {
	return cli.Run(ctx, env, args, commands())
}

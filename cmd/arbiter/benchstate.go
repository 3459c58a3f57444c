package main

import (
	"context"

	"github.com/arbiter-hq/arbiter/bench"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/sqlite"
)

// cmdBench is `arbiter bench`: the load tools of package bench, and `bench
// state`, which writes a large state into a data directory to measure a
// start against, in a SQLite store wired here.
func cmdBench(ctx context.Context, env *cli.Env, args []string) error {
	if len(args) > 0 && args[0] == "state" {
		return bench.State(ctx, env, args[1:], func(path string) (bench.StateStore, error) {
			return sqlite.Open(path, sqlite.Options{Synchronous: "normal"})
		})
	}
	return bench.Run(ctx, env, args)
}

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"

	"github.com/arbiter-hq/arbiter/cli"
)

// benchCeiling is `arbiter bench ceiling`: the do-nothing servers of
// --ceiling and --durable-ceiling in a process of their own, until
// interrupted. In the load tool's process a ceiling costs less to reach
// than any server (with one client, no other process has to wake), which
// overstates what a server could do; in a process of their own they are
// reached as a server is, and bench/pairs.py can set them beside builds
// of the server.
func benchCeiling(ctx context.Context, env *cli.Env, args []string) error {
	fs := flag.NewFlagSet("arbiter bench ceiling", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	listen := fs.String("listen", "127.0.0.1:0", "the HTTP listener, for bench alloc and bench tasks (port 0: any free port)")
	spallocListen := fs.String("spalloc-listen", "127.0.0.1:0", `the spalloc listener, for bench spalloc ("" for none)`)
	durableLog := fs.Bool("durable", false, "make each change durable as arbiter must: one record appended to a batch log and synced per batch of the requests that change state")
	dir := fs.String("durable-dir", "", "where the durable log goes (default: the system's temporary directory): a directory on the disk the server writes to")
	tasks := fs.Int64("tasks", 10000, "claims answered with a job after each manifest reload (bench tasks reloads once; give it the same --tasks)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter bench ceiling [flags]\n\nServes the do-nothing servers of --ceiling (fixed replies in the real wire\nformats) in this process until interrupted, so that a load tool measures them\nas it measures a server in a process of its own. It prints where it listens.\n\n")
		fs.PrintDefaults()
	}
	pos, err := cli.ParseFlags(env, fs, args, false)
	if err != nil {
		return cli.HelpOK(err)
	}
	switch {
	case len(pos) > 0:
		return cli.Usagef("unexpected argument %q; arbiter bench ceiling takes only flags", pos[0])
	case *tasks < 1 || *tasks > 1e9:
		return cli.Usagef("--tasks %d: want 1 to 1000000000", *tasks)
	case *dir != "" && !*durableLog:
		return cli.Usagef("--durable-dir needs --durable")
	}
	var d *durable // nil: the plain ceiling
	if *durableLog {
		if d, err = openDurable(*dir, "--durable-dir", env.Stderr); err != nil {
			return fmt.Errorf("open the durable log: %w", err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		d.Close()
		return fmt.Errorf("listen: %w", err)
	}
	h := serveCeilingHTTP(ln, d, *tasks)
	var sp *ceilingSpalloc
	if *spallocListen != "" {
		sln, err := net.Listen("tcp", *spallocListen)
		if err != nil {
			return errors.Join(fmt.Errorf("spalloc listen: %w", err), h.Close())
		}
		sp = serveCeilingSpalloc(sln, d)
	}
	kind := "ceiling"
	if d != nil {
		kind = "durable ceiling, log in " + d.dir
	}
	fmt.Fprintf(env.Stdout, "serving the %s: %s", kind, h.URL())
	if sp != nil {
		fmt.Fprintf(env.Stdout, ", spalloc %s", sp.Addr())
	}
	fmt.Fprintln(env.Stdout)
	<-ctx.Done()
	err = h.Close() // closes the log the spalloc ceiling shares, which Close allows twice
	if sp != nil {
		err = errors.Join(err, sp.Close())
	}
	return err
}

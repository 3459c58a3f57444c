package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/engine"
	"github.com/arbiter-hq/arbiter/manifest"
)

// StateStore is what State writes into: a store (arbiter.Store) that also
// keeps the webhook delivery log, as the SQLite store does.
type StateStore interface {
	arbiter.Store
	EnqueueDeliveries(ctx context.Context, ds []arbiter.Delivery, cursor int64) error
}

// State is `arbiter bench state`: it fills a new store, opened by open
// (the binary wires SQLite in), with the restart budget's state
// (docs/guides/performance.md): pending tasks, live allocations on
// registered hosts of 8 GPUs, and events from allocate → release cycles on
// one more host. Run the server on the directory afterwards with
// [events] keep at least --events, or it trims them at start.
func State(ctx context.Context, env *cli.Env, args []string, open func(path string) (StateStore, error)) error {
	fs := flag.NewFlagSet("arbiter bench state", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "the new data directory to fill (required; must not hold a database)")
	tasks := fs.Int("tasks", 100000, "pending tasks")
	allocs := fs.Int("allocations", 10000, "live allocations of one GPU each")
	events := fs.Int("events", 1000000, "events in the store, about")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter bench state --data-dir DIR [flags]\n\nWrites a large state into a new data directory, to time a server's start on it:\n  arbiter bench state --data-dir /tmp/big\n  arbiter server --data-dir /tmp/big --no-local   (with [events] keep = 1000000,\n    and [tasks] manifest = \"/tmp/big/bench-state.toml\" to read the tasks' manifest at start)\n\n")
		fs.PrintDefaults()
	}
	if _, err := cli.ParseFlags(env, fs, args, false); err != nil {
		return cli.HelpOK(err)
	}
	switch {
	case *dataDir == "":
		return cli.Usagef("--data-dir: name a new directory to fill")
	case *tasks < 0 || *allocs < 0 || *events < 0:
		return cli.Usagef("--tasks, --allocations and --events must not be negative")
	}
	store, err := open(filepath.Join(*dataDir, "arbiter.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	st, err := store.Load(ctx)
	if err != nil {
		return err
	}
	if len(st.Machines) > 0 || len(st.Records) > 0 || len(st.Allocations) > 0 {
		return fmt.Errorf("%s already holds a state: give bench state a new directory", *dataDir)
	}
	now := time.Now()
	eng := engine.New(engine.Config{EventsKeep: int64(*events) + 1<<20}, st, now)
	admin := arbiter.Caller{Role: arbiter.RoleAdmin}
	// do applies cmd; every few thousand commands the batch is saved, as
	// the server's group commit would.
	pending := 0
	do := func(cmd arbiter.Command) (any, error) {
		res, err := eng.Apply(cmd, now)
		if err != nil {
			return nil, err
		}
		if pending++; pending >= 4096 {
			pending = 0
			return res, store.Save(ctx, eng.Flush())
		}
		return res, nil
	}
	start := time.Now()

	if *tasks > 0 {
		var b strings.Builder
		b.WriteString("name = \"bench state\"\n[defaults]\ncommand = [\"true\"]\nstale_after_s = 600\n")
		for i := 0; i < *tasks; i++ {
			fmt.Fprintf(&b, "[[jobs]]\nmodel = \"state\"\nmode = \"m%d\"\nseed = %d\n", i%97, i)
		}
		// The manifest stays in the directory, for a server configured
		// to read it at start ([tasks] manifest), as a work queue's would be.
		path := filepath.Join(*dataDir, "bench-state.toml")
		if err := os.WriteFile(path, []byte(b.String()), 0o640); err != nil {
			return err
		}
		man, err := manifest.Read(path, strings.NewReader(b.String()))
		if err != nil {
			return err
		}
		if _, err := do(arbiter.SyncTasks{Manifest: man.TaskManifest()}); err != nil {
			return fmt.Errorf("queue the tasks: %w", err)
		}
	}
	// Hosts of 8 GPUs for the live allocations, and one for the churn.
	hosts := (*allocs+7)/8 + 1
	for h := 0; h < hosts; h++ {
		m := arbiter.Machine{Name: fmt.Sprintf("state-%05d", h), Kind: arbiter.KindGPU, Source: arbiter.SourceAgent,
			Tags: []string{"state"}, Cores: 64, RAMGiB: 512, CUDA: "12.4", Driver: "550.54.15"}
		for g := 0; g < 8; g++ {
			m.GPUs = append(m.GPUs, arbiter.GPU{Index: g, UUID: fmt.Sprintf("GPU-%05d-%d", h, g), Model: "NVIDIA H100 80GB HBM3",
				VRAMGiB: 80, Compute: "9.0", Healthy: true})
		}
		if _, err := do(arbiter.RegisterMachine{Machine: m}); err != nil {
			return fmt.Errorf("register %s: %w", m.Name, err)
		}
	}
	churn := fmt.Sprintf("state-%05d", hosts-1)
	for i := 0; i < *allocs; i++ {
		req := arbiter.Request{Owner: fmt.Sprintf("user-%d", i%300), GPUs: 1, Machine: fmt.Sprintf("state-%05d", i/8)}
		if _, err := do(arbiter.Allocate{Caller: admin, Request: req}); err != nil {
			return fmt.Errorf("allocate: %w", err)
		}
	}
	// Each allocate → release cycle adds two events.
	for n := 0; eng.LastSeq() < int64(*events) && ctx.Err() == nil; n++ {
		res, err := do(arbiter.Allocate{Caller: admin, Request: arbiter.Request{Owner: fmt.Sprintf("churn-%d", n%50), GPUs: 1, Machine: churn}})
		if err != nil {
			return fmt.Errorf("churn: %w", err)
		}
		if _, err := do(arbiter.Release{Caller: admin, ID: res.(arbiter.Allocation).ID, Reason: "churn"}); err != nil {
			return fmt.Errorf("churn: %w", err)
		}
	}
	if err := store.Save(ctx, eng.Flush()); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// A server that ran all along has turned every event into webhook
	// deliveries (none, without webhooks): its dispatcher's cursor is at
	// the end.
	if err := store.EnqueueDeliveries(ctx, nil, eng.LastSeq()); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "wrote %d tasks, %d live allocations on %d hosts and %d events to %s in %.1fs\n",
		*tasks, *allocs, hosts, eng.LastSeq(), *dataDir, time.Since(start).Seconds())
	if *tasks > 0 {
		fmt.Fprintf(env.Stdout, "the tasks' manifest is %s\n", filepath.Join(*dataDir, "bench-state.toml"))
	}
	return store.Close()
}

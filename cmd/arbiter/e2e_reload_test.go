package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
)

// TestReloadAppliesMachinesAndPools: `arbiter reload` (the admin API, as
// SIGHUP) applies the configuration's GPU machines and pools as a restart
// would; a file that does not load, or that the server refuses in part,
// changes nothing.
func TestReloadAppliesMachinesAndPools(t *testing.T) {
	ctx := context.Background()
	m, _ := startServerWith(t, poolRestartConfig(true, true), t.TempDir(), nil, nil)
	url := m.URL()
	c := client.New(url, "")
	held, err := c.Allocate(ctx, arbiter.Request{Owner: "u", GPUs: 1, Machine: "gpu2"})
	if err != nil {
		t.Fatal(err)
	}
	slot, err := c.Allocate(ctx, arbiter.Request{Owner: "nb", Pool: "small-gpu"})
	if err != nil || slot.State != arbiter.StateReady || slot.Backing == nil {
		t.Fatalf("slot: %+v, %v", slot, err)
	}
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(m.cfg.Path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	state := func(id int64) arbiter.Allocation {
		t.Helper()
		a, err := c.Allocation(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	// A file that does not load is refused, naming file, line and key, and
	// changes nothing.
	write(poolRestartConfig(false, false) + "\n[[machines]]\nname = \"gpu3\"\ngpus = 3\n")
	if _, stderr, code := cmdline(t, url, "reload"); code == 0 || !strings.Contains(stderr, "arbiter.toml:") || !strings.Contains(stderr, "machines[1].gpus") {
		t.Fatalf("reload of a broken file: exit %d, %q; want a failure naming file, line and key", code, stderr)
	}
	if a := state(held.ID); a.State != arbiter.StateReady {
		t.Fatalf("after a refused reload the allocation on gpu2 is %s", a.State)
	}

	// A file that loads but that the server refuses in part (a grid
	// machine named like an agent's GPU machine, which the file alone
	// cannot show) changes nothing either: gpu2, which it leaves out, keeps
	// its allocation.
	agent := arbiter.Machine{Name: "node7", Kind: arbiter.KindGPU, CUDA: "12.4", Tags: []string{},
		GPUs: []arbiter.GPU{{Index: 0, Model: "NVIDIA L4", VRAMGiB: 24, Healthy: true}}}
	if _, err := c.RegisterMachine(ctx, agent); err != nil {
		t.Fatal(err)
	}
	write(poolRestartConfig(false, false) + "\n[[grid_machines]]\nname = \"node7\"\nsingle_board = { ip = \"10.12.0.1\", controller = \"10.12.0.0\" }\n")
	if _, stderr, code := cmdline(t, url, "reload"); code == 0 || !strings.Contains(stderr, "node7") || !strings.Contains(stderr, "previous configuration stays in force") {
		t.Fatalf("reload refused by the engine: exit %d, %q; want a failure naming node7", code, stderr)
	}
	if a := state(held.ID); a.State != arbiter.StateReady {
		t.Fatalf("after a reload refused in part the allocation on gpu2 is %s, want ready", a.State)
	}
	if p, err := c.Pool(ctx, "small-gpu"); err != nil || !p.Configured {
		t.Fatalf("after a reload refused in part the pool is %+v (%v), want still configured", p, err)
	}

	// gpu2 and the pool go, gpu3 comes.
	write(poolRestartConfig(false, false) + `
[[machines]]
name = "gpu3"
gpus = [ { model = "NVIDIA L4", vram_gib = 24, count = 2 } ]
`)
	if stdout, stderr, code := cmdline(t, url, "reload"); code != 0 {
		t.Fatalf("reload: exit %d: %s%s", code, stdout, stderr)
	}
	if a := state(held.ID); a.State != arbiter.StateDestroyed || !strings.Contains(arbiter.StrOr(a.Reason, ""), "gpu2 was removed from the configuration") {
		t.Fatalf("allocation on the removed machine: %s (%s), want destroyed naming why", a.State, arbiter.StrOr(a.Reason, ""))
	}
	ms, err := c.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mc := range ms {
		names = append(names, mc.Name)
	}
	if strings.Join(names, " ") != "gpu1 gpu3 node7" {
		t.Fatalf("machines after the reload: %v, want gpu1 gpu3 node7", names)
	}
	p, err := c.Pool(ctx, "small-gpu")
	if err != nil || p.Configured || len(p.Backings) != 1 || !p.Backings[0].Draining {
		t.Fatalf("removed pool after the reload: %+v (%v), want its backing draining", p, err)
	}
	if a := state(slot.ID); a.State != arbiter.StateReady {
		t.Fatalf("the slot of a draining backing is %s, want kept until released", a.State)
	}
	if _, err := c.Release(ctx, slot.ID, "done"); err != nil {
		t.Fatal(err)
	}
	if b := state(*slot.Backing); b.State != arbiter.StateDestroyed {
		t.Fatalf("backing of the removed pool once empty: %s, want given back", b.State)
	}
}

// TestReloadOfABrokenFileKeepsTheManifest: a configuration file that does
// not load changes nothing, the task manifest it names included, even
// when that changed too.
func TestReloadOfABrokenFileKeepsTheManifest(t *testing.T) {
	ctx := context.Background()
	job := func(mode string) string {
		return "[[jobs]]\nmodel = \"m\"\nmode = \"" + mode + "\"\ncommand = [\"true\"]\n"
	}
	man := filepath.Join(t.TempDir(), "m.toml")
	if err := os.WriteFile(man, []byte(job("a")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgText := "[[machines]]\nname = \"gpu1\"\ngpus = [ { model = \"L4\", vram_gib = 24 } ]\n[tasks]\nmanifest = \"" + man + "\"\n"
	m, url := startServer(t, cfgText, nil)
	c := client.New(url, "")
	count := func() int {
		ts, err := c.Tasks(ctx, client.TaskFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	if n := count(); n != 1 {
		t.Fatalf("start: %d tasks, want 1", n)
	}
	os.WriteFile(man, []byte(job("a")+job("b")), 0o600)
	os.WriteFile(m.cfg.Path, []byte(cfgText+"[server]\nlisten_typo = 1\n"), 0o600)
	if _, errs, code := cmdline(t, url, "reload"); code == 0 || !strings.Contains(errs, "listen_typo") {
		t.Fatalf("reload of a broken file: exit %d, %s", code, errs)
	}
	if n := count(); n != 1 {
		t.Fatalf("after a refused reload: %d tasks, want 1 (nothing changes)", n)
	}
}

// TestFlagsOverrideTheFileBeforeItIsChecked: --insecure-no-auth and
// --listen make right a file that, alone, listens beyond loopback without
// tokens; a reload keeps them.
func TestFlagsOverrideTheFileBeforeItIsChecked(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "a.toml")
	os.WriteFile(cfg, []byte("[server]\nlisten = \"0.0.0.0:7070\"\n"), 0o600)
	env := &cli.Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	if _, err := newServerMain(env, []string{"--config", cfg}); err == nil || !strings.Contains(err.Error(), "server.listen") {
		t.Fatalf("the file alone: %v, want refused at server.listen", err)
	}
	for _, flags := range [][]string{{"--insecure-no-auth"}, {"--listen", "127.0.0.1:0"}} {
		m, err := newServerMain(env, append([]string{"--config", cfg, "--data-dir", filepath.Join(dir, "data")}, flags...))
		if err != nil {
			t.Fatalf("%v: %v, want the flags to make the file right", flags, err)
		}
		if _, err := m.rereadConfig(); err != nil {
			t.Fatalf("%v: reading the file again: %v", flags, err)
		}
	}
}

// TestServerCheck: arbiter server --check loads the configuration, with
// the flags, and the manifest it names, says ok or what is wrong, and
// starts nothing.
func TestServerCheck(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "a.toml")
	man := filepath.Join(dir, "m.toml")
	os.WriteFile(man, []byte("[[jobs]]\nmodel = \"m\"\ncommand = [\"true\"]\n"), 0o600)
	os.WriteFile(cfg, []byte("[server]\nlisten = \"0.0.0.0:7070\"\n[tasks]\nmanifest = \"m.toml\"\n"), 0o600)
	if _, errs, code := cmdline(t, "", "server", "--config", cfg, "--check"); code != 1 || !strings.Contains(errs, "server.listen") {
		t.Fatalf("--check of a file refused: exit %d, %q", code, errs)
	}
	out, errs, code := cmdline(t, "", "server", "--config", cfg, "--insecure-no-auth", "--check")
	if code != 0 || !strings.Contains(out, "ok") || !strings.Contains(out, "m.toml") {
		t.Fatalf("--check with the flag that makes it right: exit %d, %q %q", code, out, errs)
	}
	os.WriteFile(man, []byte("[[jobs]]\nmodel = 3\n"), 0o600)
	if _, errs, code := cmdline(t, "", "server", "--config", cfg, "--insecure-no-auth", "--check"); code != 1 || !strings.Contains(errs, "m.toml:") {
		t.Fatalf("--check of a broken manifest: exit %d, %q", code, errs)
	}
}

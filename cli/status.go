package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdStatus prints the machines, their GPUs and who holds each.
// -o json prints the machines list.
func cmdStatus(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "status", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ms, err := cf.Client().Machines(ctx)
	if err != nil {
		return err
	}
	if cf.JSON() {
		if ms == nil {
			ms = []arbiter.MachineStatus{}
		}
		return WriteJSON(env.Stdout, ms)
	}
	now := time.Now()
	if err := printStatus(env.Stdout, ms, now); err != nil {
		return err
	}
	ps, err := cf.Client().Pools(ctx)
	if err != nil || len(ps) == 0 {
		return err
	}
	fmt.Fprintln(env.Stdout)
	return printPools(env.Stdout, ps, now)
}

// printStatus prints one line per machine, then each machine's GPUs.
func printStatus(w io.Writer, ms []arbiter.MachineStatus, now time.Time) error {
	if len(ms) == 0 {
		_, err := fmt.Fprintln(w, "no machines: start `arbiter agent` on a GPU host or declare [[machines]] in the server config")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MACHINE\tSTATE\tTAGS\tFREE/GPUS\tCORES\tRAM\tCUDA\tLAST SEEN")
	for _, m := range ms {
		seen := "-"
		if m.LastSeen != nil {
			seen = ago(*m.LastSeen, now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\n", m.Name, m.State, safe(strings.Join(m.Tags, ",")),
			m.Free, len(m.Devices), m.Cores, gib(m.RAMGiB), orDash(m.CUDA), seen)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Grid != nil {
			printGridStatus(w, &m, now) // boards, by holder: cli_grid.go
			continue
		}
		if len(m.Devices) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", m.Name)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  GPU\tMODEL\tVRAM\tCOMPUTE\tHEALTH\tHOLDER\tALLOCATION\tSINCE")
		for _, d := range m.Devices {
			health := "ok"
			if !d.Healthy {
				health = "unhealthy"
			}
			holder, alloc, since := "-", "-", "-"
			if d.Allocation != nil {
				holder = safe(arbiter.StrOr(d.Owner, "?"))
				alloc = fmt.Sprint(*d.Allocation)
				if d.Since != nil {
					since = ago(*d.Since, now)
				}
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Index, safe(d.Model), gib(d.VRAMGiB), orDash(d.Compute),
				health, holder, alloc, since)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// orDash is s as one escaped value (safe), or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return safe(s)
}

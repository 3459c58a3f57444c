package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
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
		return WriteJSON(env.Stdout, nonNil(ms))
	}
	now := time.Now()
	if err := printStatus(env.Stdout, ms, now); err != nil {
		return err
	}
	// Several replicas: who leads. A server without HA (or one too old to
	// say) shows nothing here.
	if cl, err := cf.Client().Cluster(ctx); err == nil && cl != nil {
		fmt.Fprintln(env.Stdout)
		if err := printCluster(env.Stdout, cl, now); err != nil {
			return err
		}
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
	tw := newTable(w, 0)
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
		tw := newTable(w, 0)
		fmt.Fprintln(tw, "  GPU\tMODEL\tVRAM\tCOMPUTE\tSTATE\tUTIL\tMEMORY\tHOLDER\tALLOCATION\tSINCE")
		for _, d := range m.Devices {
			holder, alloc, since := "-", "-", "-"
			if d.Allocation != nil {
				holder = safe(arbiter.ShortOwner(arbiter.StrOr(d.Owner, "?")))
				alloc = fmt.Sprint(*d.Allocation)
				if d.Since != nil {
					since = ago(*d.Since, now)
				}
			}
			util, mem := "-", "-"
			if u := d.Usage; u != nil {
				util, mem = pctText(u.UtilPct), memText(u.MemUsedMiB, u.MemTotalMiB)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Index, safe(d.Model), gib(d.VRAMGiB), orDash(d.Compute),
				safe(deviceState(d)), util, mem, holder, alloc, since)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printDeviceNotes(w, m.Devices)
	}
	return nil
}

// deviceState is a GPU's state for the table (docs/reference/gpu-truth.md), marked
// when an unmanaged process is on it; a server without GPU ground truth
// says only whether the GPU is healthy.
func deviceState(d arbiter.DeviceStatus) string {
	s := d.State
	if s == "" {
		s = "ok"
		if !d.Healthy {
			s = arbiter.GPUUnhealthy
		}
	}
	if d.Unmanaged {
		s += ", UNMANAGED"
	}
	return s
}

// printDeviceNotes lists, under a machine's GPU table, why GPUs are not
// simply free or held, and the processes on each GPU.
func printDeviceNotes(w io.Writer, ds []arbiter.DeviceStatus) {
	for _, d := range ds {
		if d.StateReason != "" {
			fmt.Fprintf(w, "  GPU %d %s: %s\n", d.Index, safe(d.State), safe(d.StateReason))
		}
		if d.Usage == nil {
			continue
		}
		for _, p := range d.Usage.Processes {
			owner := "no allocation"
			if p.Allocation != nil {
				owner = fmt.Sprintf("allocation %d", *p.Allocation)
			}
			mark := ""
			if d.Unmanaged && (p.Allocation == nil && d.Allocation == nil || p.Allocation != nil && (d.Allocation == nil || *p.Allocation != *d.Allocation)) {
				mark = " UNMANAGED"
			}
			fmt.Fprintf(w, "  GPU %d process %d (%s, %s, %s): %s%s\n", d.Index, p.PID, orDash(p.User), owner,
				memText(p.MemMiB, 0), orDash(p.Command), mark)
		}
	}
}

// orDash is s as one escaped value (safe), or "-" when empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return safe(s)
}

// PrintReadings prints GPU readings (arbiter agent --sample-once), one line per GPU, then each process.
func PrintReadings(w io.Writer, gs []arbiter.GPUReading) error {
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "GPU\tUTIL\tMEMORY\tTEMP\tPOWER\tECC\tXIDS\tPROCESSES")
	for _, g := range gs {
		if g.Missing {
			fmt.Fprintf(tw, "%d\tmissing\t\t\t\t\t\t\n", g.Index)
			continue
		}
		ecc := "-"
		if g.ECCUncorrected != nil {
			ecc = fmt.Sprint(*g.ECCUncorrected)
		}
		xids := make([]string, len(g.XIDs))
		for i, x := range g.XIDs {
			xids[i] = fmt.Sprint(x)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Index, pctText(g.UtilPct), memText(g.MemUsedMiB, g.MemTotalMiB),
			optText(g.TempC, "°C"), wattText(g.PowerW), ecc, orDash(strings.Join(xids, ",")), processesText(g.Processes))
	}
	return tw.Flush()
}

func pctText(p *int) string {
	if p == nil {
		return "?"
	}
	return fmt.Sprintf("%d%%", *p)
}

func optText(p *int, unit string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%d%s", *p, unit)
}

func wattText(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.0fW", *p)
}

func memText(used, total int64) string {
	if total == 0 {
		return fmt.Sprintf("%.1fGiB", float64(used)/1024)
	}
	return fmt.Sprintf("%.1f/%.0fGiB", float64(used)/1024, float64(total)/1024)
}

// processesText is "pid user (allocation N) command" per process, joined.
func processesText(ps []arbiter.GPUProcess) string {
	if len(ps) == 0 {
		return "-"
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		who := p.User
		if who == "" {
			who = "?"
		}
		alloc := "no allocation"
		if p.Allocation != nil {
			alloc = fmt.Sprintf("allocation %d", *p.Allocation)
		}
		cmd := p.Command
		if len(cmd) > 40 {
			cmd = cmd[:40] + "…"
		}
		parts[i] = fmt.Sprintf("%d %s (%s) %s", p.PID, who, alloc, cmd)
	}
	return strings.Join(parts, "; ")
}

// printCluster lists the replicas of a highly available server and who
// leads them.
func printCluster(w io.Writer, c *arbiter.Cluster, now time.Time) error {
	switch {
	case c.LeaderID == "":
		fmt.Fprintf(w, "replicas: no leader right now (term %d; a failover is under way)\n", c.Term)
	default:
		fmt.Fprintf(w, "replicas: %s leads (term %d, %d failovers seen by %s)\n", safe(c.LeaderID), c.Term, c.Failovers, safe(c.NodeID))
	}
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "  NODE\tROLE\tURL\tHOST\tPID\tVERSION\tSEEN")
	for _, r := range c.Replicas {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%s\t%s\n", safe(r.ID), safe(r.Role), safe(r.URL), safe(r.Host), r.PID, orDash(r.Version), ago(r.Seen, now))
	}
	return tw.Flush()
}

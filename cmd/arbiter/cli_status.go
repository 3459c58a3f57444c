package main

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
	fs, cf := newClientFlagSet(env, "status", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return helpOK(err)
	}
	ms, err := cf.client().Machines(ctx)
	if err != nil {
		return err
	}
	if cf.json() {
		if ms == nil {
			ms = []arbiter.MachineStatus{}
		}
		return writeJSON(env.Stdout, ms)
	}
	now := time.Now()
	if err := printStatus(env.Stdout, ms, now); err != nil {
		return err
	}
	ps, err := cf.client().Pools(ctx)
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\n", m.Name, m.State, strings.Join(m.Tags, ","),
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
		fmt.Fprintln(tw, "  GPU\tMODEL\tVRAM\tCOMPUTE\tSTATE\tUTIL\tMEMORY\tHOLDER\tALLOCATION\tSINCE")
		for _, d := range m.Devices {
			holder, alloc, since := "-", "-", "-"
			if d.Allocation != nil {
				holder = deref(d.Owner, "?")
				alloc = fmt.Sprint(*d.Allocation)
				if d.Since != nil {
					since = ago(*d.Since, now)
				}
			}
			util, mem := "-", "-"
			if u := d.Usage; u != nil {
				util, mem = pctText(u.UtilPct), memText(u.MemUsedMiB, u.MemTotalMiB)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Index, d.Model, gib(d.VRAMGiB), orDash(d.Compute),
				deviceState(d), util, mem, holder, alloc, since)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printDeviceNotes(w, m.Devices)
	}
	return nil
}

// deviceState is a GPU's state for the table (specs/gpu-truth.md), marked
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
			fmt.Fprintf(w, "  GPU %d %s: %s\n", d.Index, d.State, d.StateReason)
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

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

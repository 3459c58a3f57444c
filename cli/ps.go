package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdPs lists allocations: the live ones by default, all with --all.
// -o json prints the list.
func cmdPs(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "ps", "")
	var f arbiter.AllocationFilter
	all := fs.Bool("all", false, "include destroyed allocations (the bounded history)")
	fs.StringVar(&f.State, "state", "", "only this state: queued, power, ready, destroyed or live")
	fs.StringVar(&f.Owner, "owner", "", "only this owner")
	fs.StringVar(&f.Machine, "machine", "", "only allocations on this machine")
	queue := fs.Bool("queue", false, "the queue in its order, with positions, groups' fair-share factors and ETAs")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	if *queue {
		f.State = arbiter.StateQueued
	}
	switch f.State {
	case "":
		if !*all {
			f.State = "live"
		}
	case arbiter.StateQueued, arbiter.StatePower, arbiter.StateReady, arbiter.StateDestroyed, "live":
	default:
		return Usagef("--state %q: want queued, power, ready, destroyed or live", f.State)
	}
	as, err := cf.Client().Allocations(ctx, f)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, nonNil(as))
	}
	if *queue {
		return printQueue(ctx, env.Stdout, cf.Client(), as, time.Now()) // fairshare.go
	}
	if len(as) == 0 {
		_, err := fmt.Fprintln(env.Stdout, "no allocations")
		return err
	}
	return printAllocations(env.Stdout, as, time.Now())
}

// printAllocations prints a table of allocations, one per line. A LABEL
// column comes after OWNER when any allocation has a label: the owner is
// who holds it (with tokens, the token's name), the label only describes it.
func printAllocations(w io.Writer, as []arbiter.Allocation, now time.Time) error {
	labels := false
	for i := range as {
		labels = labels || as[i].Label != ""
	}
	tw := newTable(w, 0)
	if labels {
		fmt.Fprintln(tw, "ID\tOWNER\tLABEL\tSTATE\tMACHINE\tGPUS\tUSE\tAGE\tKEEPALIVE\tREASON")
	} else {
		fmt.Fprintln(tw, "ID\tOWNER\tSTATE\tMACHINE\tGPUS\tUSE\tAGE\tKEEPALIVE\tREASON")
	}
	for _, a := range as {
		who := safe(arbiter.ShortOwner(a.Owner))
		if labels {
			label := "-"
			if a.Label != "" {
				label = safe(a.Label)
			}
			who += "\t" + label
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, who, a.State, safe(arbiter.StrOr(a.Machine, "-")),
			allocGPUs(a), allocUse(a, now), ago(a.CreatedAt, now), allocKeepalive(a, now), safe(allocWhy(a)))
	}
	return tw.Flush()
}

// allocUse says whether a ready allocation's GPUs are in use
// (docs/reference/gpu-truth.md): "idle 2h" once it is idle, else the busy share of
// its GPU time so far, "-" without samples.
func allocUse(a arbiter.Allocation, now time.Time) string {
	if a.State != arbiter.StateReady {
		return "-"
	}
	if a.IdleSince != nil {
		return "IDLE " + shortDuration(now.Sub(*a.IdleSince))
	}
	if u := a.Usage; u != nil && u.BusyGPUS+u.IdleGPUS > 0 {
		return fmt.Sprintf("busy %d%%", int(100*u.BusyGPUS/(u.BusyGPUS+u.IdleGPUS)+0.5))
	}
	return "-"
}

// allocGPUs shows the held GPU indices, or how many are wanted while queued.
func allocGPUs(a arbiter.Allocation) string {
	if a.Request.Grid != nil {
		return allocBoards(a) // cli_grid.go
	}
	if len(a.Devices) > 0 {
		return deviceIndices(a.Devices)
	}
	return fmt.Sprintf("(%d)", a.Request.GPUs)
}

// allocKeepalive shows the keepalive interval and when it runs out.
func allocKeepalive(a arbiter.Allocation, now time.Time) string {
	ka := a.KeepaliveS
	if ka == nil {
		ka = a.Request.KeepaliveS
	}
	if ka == nil {
		return "never"
	}
	s := seconds(*ka)
	if a.Live() && a.ExpiresAt != nil {
		if a.ExpiresAt.After(now) {
			s += ", expires " + ago(*a.ExpiresAt, now)
		} else {
			s += ", overdue"
		}
	}
	return s
}

// allocWhy is the reason a destroyed allocation ended or a queued one waits.
func allocWhy(a arbiter.Allocation) string {
	if a.State == arbiter.StateDestroyed {
		return arbiter.StrOr(a.Reason, "-")
	}
	return arbiter.StrOr(a.WhyQueued, arbiter.StrOr(a.Reason, "-"))
}

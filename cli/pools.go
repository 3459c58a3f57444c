package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdPools prints each pool, its backings and their slots. -o json prints
// the pools list.
func cmdPools(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "pools", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ps, err := cf.Client().Pools(ctx)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, ps)
	}
	if len(ps) == 0 {
		_, err := fmt.Fprintln(env.Stdout, "no pools: declare [[pools]] in the server config")
		return err
	}
	return printPools(env.Stdout, ps, time.Now())
}

// printPools prints one line per pool, then one per backing with its slots
// ("-" for a free one) and when it is given back.
func printPools(w io.Writer, ps []arbiter.PoolStatus, now time.Time) error {
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "POOL\tBACKING REQUEST\tSLOTS\tBACKINGS\tIN USE\tGRACE")
	for _, p := range ps {
		used, total := 0, 0
		for _, b := range p.Backings {
			total += len(b.Slots)
			for _, s := range b.Slots {
				if s != nil {
					used++
				}
			}
		}
		name := p.Name
		if !p.Configured {
			name += " (removed, draining)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%s\n", name, describeRequest(p.Backing), p.Slots, len(p.Backings), used, total, seconds(p.GraceTimeS))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range ps {
		if len(p.Backings) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", p.Name)
		tw := newTable(w, 0)
		fmt.Fprintln(tw, "  BACKING\tSTATE\tMACHINE\tSLOTS\tRELEASE")
		for _, b := range p.Backings {
			slots := make([]string, len(b.Slots))
			for i, s := range b.Slots {
				slots[i] = "-"
				if s != nil {
					slots[i] = strconv.FormatInt(*s, 10)
				}
			}
			release := "-"
			switch {
			case b.ReleaseAt != nil:
				release = "in " + shortDuration(b.ReleaseAt.Sub(now).Round(time.Second))
			case b.Draining:
				release = "draining: when empty"
			case b.DrainAt != nil:
				release = "drains in " + shortDuration(b.DrainAt.Sub(now).Round(time.Second))
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t[%s]\t%s\n", b.Allocation, b.State, arbiter.StrOr(b.Machine, "-"), strings.Join(slots, " "), release)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// describeRequest words a GPU request briefly: "1 GPU ≥40GiB *H100*".
func describeRequest(r arbiter.Request) string {
	s := fmt.Sprintf("%d GPU", r.GPUs)
	if r.GPUs != 1 {
		s += "s"
	}
	if r.MinVRAMGiB > 0 {
		s += " ≥" + gib(r.MinVRAMGiB)
	}
	if r.Model != "" {
		s += " " + r.Model
	}
	if r.Machine != "" {
		s += " on " + r.Machine
	}
	for _, t := range r.Tags {
		s += " #" + t
	}
	return s
}

package cli

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/arbiter-hq/arbiter"
)

// cmdReport prints GPU-hours per owner, machine, model or day
// (docs/reference/gpu-truth.md): -o json the server's document, -o csv its rows.
func cmdReport(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "report", "")
	since := fs.String("since", "", "first day, YYYY-MM-DD or an RFC 3339 time (default: 29 days before --until)")
	until := fs.String("until", "", "last day, included (default: today, UTC)")
	by := fs.String("by", arbiter.UsageByOwner, "group by owner, machine, model or day")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: arbiter report [--since T] [--until T] [--by owner|machine|model|day] [-o table|json|csv]

GPU-hours held, busy (sampled utilization at or above the idle threshold)
and idle-held, allocations granted and their mean queue wait, over whole
UTC days.

flags:
`)
		fs.PrintDefaults()
	}
	cf.Offer("csv")
	fs.Lookup("o").Usage = "output: table, json or csv"
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	switch *by {
	case arbiter.UsageByOwner, arbiter.UsageByMachine, arbiter.UsageByModel, arbiter.UsageByDay:
	default:
		return Usagef("--by %q: want owner, machine, model or day", *by)
	}
	rep, err := cf.Client().Usage(ctx, *since, *until, *by)
	if err != nil {
		return err
	}
	switch {
	case cf.Output() == "csv":
		return writeUsageCSV(env.Stdout, rep)
	case cf.JSON():
		return WriteJSON(env.Stdout, rep)
	}
	return printUsageReport(env.Stdout, rep)
}

// usageCSVHeader are the columns of -o csv: the rows' JSON names.
var usageCSVHeader = []string{"key", "gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "allocations", "mean_wait_s"}

func writeUsageCSV(w io.Writer, rep arbiter.UsageReport) error {
	cw := csv.NewWriter(w)
	cw.Write(usageCSVHeader)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, r := range rep.Rows {
		cw.Write([]string{r.Key, f(r.GPUHours), f(r.BusyGPUHours), f(r.IdleGPUHours), strconv.Itoa(r.Allocations), f(r.MeanWaitS)})
	}
	cw.Flush()
	return cw.Error()
}

func printUsageReport(w io.Writer, rep arbiter.UsageReport) error {
	fmt.Fprintf(w, "GPU usage %s to %s, by %s\n", rep.Since, rep.Until, rep.By)
	if len(rep.Rows) == 0 {
		_, err := fmt.Fprintln(w, "no GPU time in this range")
		return err
	}
	tw := newTable(w, tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tGPU-HOURS\tBUSY\tIDLE\tALLOCATIONS\tMEAN WAIT\t\n", map[string]string{"owner": "OWNER", "machine": "MACHINE", "model": "MODEL", "day": "DAY"}[rep.By])
	var t arbiter.UsageRow
	for _, r := range rep.Rows {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%d\t%s\t\n", r.Key, r.GPUHours, r.BusyGPUHours, r.IdleGPUHours, r.Allocations, seconds(round1(r.MeanWaitS)))
		t.GPUHours += r.GPUHours
		t.BusyGPUHours += r.BusyGPUHours
		t.IdleGPUHours += r.IdleGPUHours
		t.Allocations += r.Allocations
	}
	fmt.Fprintf(tw, "total\t%.2f\t%.2f\t%.2f\t%d\t\t\n", t.GPUHours, t.BusyGPUHours, t.IdleGPUHours, t.Allocations)
	return tw.Flush()
}

func round1(v float64) float64 { return float64(int64(v*10+0.5)) / 10 }

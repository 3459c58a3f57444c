package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// Fair share (docs/guides/fair-share.md): quotas, standings, reservations,
// extend, notifications, and the queue as ps --queue shows it.

// cmdQuotas lists quotas, or sets or removes one (admin).
func cmdQuotas(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && (args[0] == "set" || args[0] == "rm") {
		return quotaChange(ctx, env, args[0], args[1:])
	}
	fs, cf := NewClientFlags(env, "quotas", " [set|rm flags]")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	qs, err := cf.Client().Quotas(ctx)
	if err != nil {
		return err
	}
	return printList(env, cf, qs, "no quotas", "QUOTA\tMAX GPUS\tHELD\tMAX GPU-HOURS\tUSED\tCOMMITTED\tWINDOW\tSOURCE", func(tw io.Writer, q arbiter.QuotaStatus) {
		maxG, maxH, win := "-", "-", "-"
		if q.MaxGPUs != nil {
			maxG = strconv.Itoa(*q.MaxGPUs)
		}
		if q.MaxGPUHours != nil {
			maxH = fmt.Sprintf("%g", *q.MaxGPUHours)
			win = arbiter.HumanDuration(q.Window())
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.1f\t%.1f\t%s\t%s\n", q.Key, maxG, q.HeldGPUs, maxH, q.UsedGPUHours, q.CommittedGPUHours, win, q.Source)
	})
}

// quotaChange is `arbiter quotas set|rm`.
func quotaChange(ctx context.Context, env *Env, verb string, args []string) error {
	fs, cf := NewClientFlags(env, "quotas "+verb, "")
	var q arbiter.Quota
	fs.StringVar(&q.Group, "group", "", "the group it limits")
	fs.StringVar(&q.Principal, "principal", "", "or the person (token name; owner without tokens)")
	fs.StringVar(&q.Model, "model", "", "count only GPUs whose model matches this pattern (with --max-gpus)")
	maxGPUs := fs.Int("max-gpus", -1, "GPUs held at once")
	maxHours := fs.Float64("max-gpu-hours", -1, "GPU-hours in any window")
	window := fs.String("window", "", "the window of --max-gpu-hours: a duration (168h) or seconds (default a week)")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	var st arbiter.QuotaStatus
	var err error
	if verb == "rm" {
		if (q.Group == "") == (q.Principal == "") {
			return Usagef("name the quota with --group or --principal")
		}
		st, err = c.DeleteQuota(ctx, q)
	} else {
		if *maxGPUs >= 0 {
			q.MaxGPUs = maxGPUs
		}
		if *maxHours >= 0 {
			q.MaxGPUHours = maxHours
		}
		if q.WindowS, err = coordParseSeconds("--window", *window); err != nil {
			return err
		}
		if err := q.Validate(); err != nil {
			return UsageError{arbiter.ErrorMessage(err)}
		}
		st, err = c.SetQuota(ctx, q)
	}
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, st)
	}
	what := "set"
	if verb == "rm" {
		what = "removed"
	}
	_, err = fmt.Fprintf(env.Stdout, "quota %s %s\n", st.Key, what)
	return err
}

// cmdFairShare shows the groups' standings.
func cmdFairShare(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "fairshare", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	st, err := cf.Client().FairShare(ctx)
	if err != nil {
		return err
	}
	if cf.JSON() {
		st.Groups = nonNil(st.Groups)
		return WriteJSON(env.Stdout, st)
	}
	if len(st.Groups) == 0 {
		_, err := fmt.Fprintln(env.Stdout, "no groups are configured: the queue is priority, then age")
		return err
	}
	fmt.Fprintf(env.Stdout, "factor F = 2^(-usage%%/share%%), usage decayed with a half-life of %s; the queue is priority, then F, then age\n",
		arbiter.HumanDuration(time.Duration(st.HalfLifeS*float64(time.Second))))
	tw := newTable(env.Stdout, 0)
	fmt.Fprintln(tw, "RANK\tGROUP\tSHARE\tSHARE%\tUSAGE GPU-H\tUSAGE%\tFACTOR\tHOLDS\tWAITING")
	for _, g := range st.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%g\t%.0f%%\t%.1f\t%.0f%%\t%s\t%d\t%d\n", g.Rank, g.Group, g.Share, g.SharePct, g.UsageGPUHours, g.UsagePct,
			arbiter.FormatShare(g.Factor), g.HeldGPUs, g.Queued)
	}
	return tw.Flush()
}

// printQueue prints queued allocations in queue order, with their group's
// standing and ETA (ps --queue).
func printQueue(ctx context.Context, w io.Writer, c *client.Client, as []arbiter.Allocation, now time.Time) error {
	var q []arbiter.Allocation
	for _, a := range as {
		if a.State == arbiter.StateQueued {
			q = append(q, a)
		}
	}
	if len(q) == 0 {
		_, err := fmt.Fprintln(w, "nobody is waiting")
		return err
	}
	sort.SliceStable(q, func(i, j int) bool { return queueLess(q[i], q[j]) })
	factors := map[string]arbiter.GroupStanding{}
	if st, err := c.FairShare(ctx); err == nil {
		for _, g := range st.Groups {
			factors[g.Group] = g
		}
	}
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "POS\tID\tOWNER\tGROUP\tGPUS\tPRIO\tFACTOR\tWAITING\tETA\tWHY")
	for _, a := range q {
		pos, group, factor, eta := "-", orDash(a.Group), "-", "unknown"
		if a.Position != nil {
			pos = strconv.Itoa(*a.Position)
		}
		if g, ok := factors[a.Group]; ok {
			factor = fmt.Sprintf("%s (#%d)", arbiter.FormatShare(g.Factor), g.Rank)
		}
		if a.ETA != nil {
			eta = "in " + shortDuration(max(a.ETA.Sub(now), 0))
		}
		why := arbiter.StrOr(a.WhyQueued, "-")
		if i := strings.LastIndex(why, "; ETA "); i >= 0 {
			why = why[:i]
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", pos, a.ID, arbiter.ShortOwner(a.Owner), group, a.Request.GPUs, a.Priority,
			factor, shortDuration(now.Sub(a.CreatedAt)), eta, why)
	}
	return tw.Flush()
}

// queueLess orders queued allocations by their position, then id.
func queueLess(a, b arbiter.Allocation) bool {
	pa, pb := 1<<30, 1<<30
	if a.Position != nil {
		pa = *a.Position
	}
	if b.Position != nil {
		pb = *b.Position
	}
	if pa != pb {
		return pa < pb
	}
	return a.ID < b.ID
}

// cmdReserve makes a reservation (admin).
func cmdReserve(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "reserve", "")
	var r arbiter.Reservation
	var tags StringList
	fs.IntVar(&r.GPUs, "gpus", 0, "how many GPUs")
	fs.StringVar(&r.Machine, "machine", "", "GPUs of this machine")
	fs.Var(&tags, "tag", "or GPUs of machines carrying this tag (repeatable)")
	fs.StringVar(&r.Group, "for", "", "the group it is for")
	fs.StringVar(&r.Cron, "cron", "", "recurring: a cron expression in UTC, e.g. \"0 2 * * 0\" (Sunday 02:00)")
	fs.StringVar(&r.ID, "id", "", "its id (default r1, r2 …)")
	start := fs.String("start", "", "when it starts: RFC 3339 (2026-11-25T18:00:00Z), or a duration from now (2h); with --cron, when the recurrence begins")
	duration := fs.String("duration", "", "how long each window lasts: a duration (6h) or seconds")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	r.Tags = tags
	var err error
	if r.DurationS, err = coordParseSeconds("--duration", *duration); err != nil {
		return err
	}
	if *start != "" {
		if d, derr := time.ParseDuration(*start); derr == nil {
			r.Start = time.Now().Add(d).UTC().Truncate(time.Second)
		} else if r.Start, err = time.Parse(time.RFC3339, *start); err != nil {
			return Usagef("--start %q: want an RFC 3339 time (2026-11-25T18:00:00Z) or a duration from now (2h)", *start)
		}
	}
	if err := r.Validate(); err != nil {
		return UsageError{arbiter.ErrorMessage(err)}
	}
	res, err := cf.Client().Reserve(ctx, r)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, res)
	}
	_, err = fmt.Fprintf(env.Stdout, "reservation %s: %s for group %s, %s\n", res.ID, resDevices(res), res.Group, resWindow(res, time.Now()))
	return err
}

// cmdReservations lists reservations as a timeline, or removes one.
func cmdReservations(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && args[0] == "rm" {
		fs, cf := NewClientFlags(env, "reservations rm", " ID")
		rest, err := parseArgs(env, fs, cf, args[1:], 1, "a reservation id")
		if err != nil {
			return HelpOK(err)
		}
		res, err := cf.Client().Unreserve(ctx, rest[0])
		if err != nil {
			return err
		}
		if cf.JSON() {
			return WriteJSON(env.Stdout, res)
		}
		_, err = fmt.Fprintf(env.Stdout, "reservation %s removed\n", res.ID)
		return err
	}
	fs, cf := NewClientFlags(env, "reservations", " [rm ID]")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	rs, err := cf.Client().Reservations(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, rs, "no reservations", "ID\tGROUP\tGPUS\tWINDOW\tREPEATS\tTIMELINE (next 7 days)", func(tw io.Writer, r arbiter.Reservation) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Group, resDevices(r), resWindow(r, now), orDash(r.Cron), resTimeline(r, now, 7*24*time.Hour, 28))
	})
}

// resDevices is "8 GPUs on gpu1" or "8 GPUs on gpu1, gpu2".
func resDevices(r arbiter.Reservation) string {
	var ms []string
	for _, d := range r.Devices {
		if len(ms) == 0 || ms[len(ms)-1] != d.Machine {
			ms = append(ms, d.Machine)
		}
	}
	return fmt.Sprintf("%s on %s", arbiter.Plural(r.GPUs, "GPU"), strings.Join(ms, ", "))
}

// resWindow says when the open or next window is.
func resWindow(r arbiter.Reservation, now time.Time) string {
	if r.WindowStart == nil {
		return "no window left"
	}
	if r.Active {
		return fmt.Sprintf("open until %s (%s left)", r.WindowEnd.UTC().Format(time.RFC3339), shortDuration(r.WindowEnd.Sub(now)))
	}
	return fmt.Sprintf("%s for %s (in %s)", r.WindowStart.UTC().Format(time.RFC3339), arbiter.HumanDuration(r.Duration()), shortDuration(r.WindowStart.Sub(now)))
}

// resTimeline draws the open or next window on a line of width cells
// spanning span from now: '#' where it is, '.' elsewhere.
func resTimeline(r arbiter.Reservation, now time.Time, span time.Duration, width int) string {
	if r.WindowStart == nil {
		return strings.Repeat(".", width)
	}
	b := []byte(strings.Repeat(".", width))
	cell := span / time.Duration(width)
	for i := range b {
		from, to := now.Add(time.Duration(i)*cell), now.Add(time.Duration(i+1)*cell)
		if r.WindowStart.Before(to) && r.WindowEnd.After(from) {
			b[i] = '#'
		}
	}
	return "|" + string(b) + "|"
}

// cmdExtend extends an allocation's time limit.
func cmdExtend(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "extend", " ID --by DURATION")
	by := fs.String("by", "", "how much longer: a duration (2h) or seconds")
	rest, err := parseArgs(env, fs, cf, args, 1, "an allocation id")
	if err != nil {
		return HelpOK(err)
	}
	id, err := parseID(rest[0])
	if err != nil {
		return err
	}
	s, err := coordParseSeconds("--by", *by)
	if err != nil {
		return err
	}
	if s < 1 {
		return Usagef("--by is required: how much longer, e.g. --by 2h")
	}
	a, err := cf.Client().Extend(ctx, id, time.Duration(s*float64(time.Second)))
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, a)
	}
	_, err = fmt.Fprintf(env.Stdout, "allocation %d now ends at %s\n", a.ID, a.EndsAt.UTC().Format(time.RFC3339))
	return err
}

// cmdNotify manages the caller's notification subscriptions.
func cmdNotify(ctx context.Context, env *Env, args []string) error {
	verb := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[0], args[1:]
	}
	if len(args) > 0 && verb == "list" && (args[0] == "-h" || args[0] == "--help") || verb == "help" {
		fmt.Fprintln(env.Stderr, "usage: arbiter notify [list] | add URL [flags] | rm ID\n\n"+
			"  list  your subscriptions (the default)\n"+
			"  add   send notifications to URL (arbiter notify add -h for what to hear of)\n"+
			"  rm    remove a subscription")
		return nil
	}
	switch verb {
	case "add":
		return notifyAdd(ctx, env, args)
	case "rm":
		fs, cf := NewClientFlags(env, "notify rm", " ID")
		rest, err := parseArgs(env, fs, cf, args, 1, "a subscription id")
		if err != nil {
			return HelpOK(err)
		}
		w, err := cf.Client().Unnotify(ctx, rest[0])
		if err != nil {
			return err
		}
		if cf.JSON() {
			return WriteJSON(env.Stdout, w)
		}
		_, err = fmt.Fprintf(env.Stdout, "subscription %s removed\n", w.ID)
		return err
	case "list":
		fs, cf := NewClientFlags(env, "notify list", "")
		if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
			return HelpOK(err)
		}
		ws, err := cf.Client().Notifications(ctx)
		if err != nil {
			return err
		}
		return printList(env, cf, ws, "no subscriptions (arbiter notify add URL)", "ID\tFOR\tFORMAT\tURL\tKINDS", func(tw io.Writer, w arbiter.Webhook) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.ID, w.Principal, w.Format, w.URL, strings.Join(w.Kinds, ","))
		})
	}
	return Usagef("arbiter notify: unknown %q; want add, list or rm", verb)
}

// notifyAdd is `arbiter notify add URL`.
func notifyAdd(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "notify add", " URL")
	var w arbiter.Webhook
	var m arbiter.NotifyMatch
	var kinds, tags StringList
	slack := fs.Bool("slack", false, "send Slack-compatible JSON ({\"text\": …})")
	fs.Var(&kinds, "kind", "a kind to hear of (repeatable; default all): "+strings.Join(arbiter.NotifyKinds(), ", "))
	fs.StringVar(&w.Principal, "for", "", "whose allocations (admin, or a server without tokens; default the caller: your token's name, or $USER@hostname without a token)")
	fs.StringVar(&w.Secret, "secret", "", "the signing secret, whsec_… (default: one is drawn and shown once)")
	fs.IntVar(&m.GPUs, "gpus", 0, "gpu.free: how many GPUs must be free on one machine (default 1)")
	fs.StringVar(&m.Model, "model", "", "gpu.free: GPU model pattern")
	fs.Var(&tags, "tag", "gpu.free: the machine must carry this tag (repeatable)")
	fs.StringVar(&m.Machine, "machine", "", "gpu.free: only this machine")
	fs.Float64Var(&m.MinVRAMGiB, "min-vram", 0, "gpu.free: minimum VRAM per GPU in GiB")
	fs.StringVar(&m.Task, "task", "", "task.completed, task.failed: only tasks whose name matches this pattern")
	rest, err := parseArgs(env, fs, cf, args, 1, "the URL to send notifications to")
	if err != nil {
		return HelpOK(err)
	}
	w.URL, w.Kinds = rest[0], kinds
	if w.Principal == "" && cf.Token() == "" {
		// No token: a server without tokens, where the caller has no
		// name; the allocations made from this shell are $USER@hostname's.
		w.Principal = defaultOwner(env)
	}
	m.Tags = tags
	if m.GPUs > 0 || m.Model != "" || len(m.Tags) > 0 || m.Machine != "" || m.MinVRAMGiB > 0 || m.Task != "" {
		w.Match = &m
	}
	if *slack {
		w.Format = arbiter.WebhookSlack
	}
	res, err := cf.Client().Notify(ctx, w)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, res)
	}
	_, err = fmt.Fprintf(env.Stdout, "subscription %s for %s: %s\nsecret (shown once): %s\n", res.ID, res.Principal, strings.Join(res.Kinds, ", "), res.Secret)
	return err
}

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// cmdTasks is `arbiter tasks SUBCOMMAND`: the work queue's operator CLI
// (docs/reference/fleet.md §6).
func cmdTasks(ctx context.Context, env *Env, args []string) error {
	subs := map[string]func(context.Context, *Env, []string) error{
		"status": tasksStatus, "list": tasksList, "show": tasksShow, "cancel": tasksCancel,
		"requeue": tasksRequeue, "reload": tasksReload, "workers": tasksWorkers,
	}
	return runSub(ctx, env, "tasks", args, subs, `usage: arbiter tasks COMMAND [flags]

commands:
  status            counts by status, the manifest in force, recent failures
  list              tasks (--status S, --worker W, --model M)
  show ID           one task: its spec, attempts, last error, artifact
  cancel ID         cancel a task (operator)
  requeue ID        make a failed or cancelled task pending again (operator)
  reload            make the server read its manifest again (operator)
  workers           workers: last seen, capability

ID may be the first 12 hex digits a table shows. Operator commands use
$ARBITER_OPERATOR_TOKEN (the fleet API's X-Operator-Token) when it is set,
else the bearer token ($ARBITER_TOKEN, which must have the admin role).`)
}

// cmdArtifacts is `arbiter artifacts list|get`.
func cmdArtifacts(ctx context.Context, env *Env, args []string) error {
	subs := map[string]func(context.Context, *Env, []string) error{"list": artifactsList, "get": artifactsGet}
	return runSub(ctx, env, "artifacts", args, subs, `usage: arbiter artifacts COMMAND [flags]

commands:
  list [--task ID]      artifacts with their task, worker and size
  get ID [--out FILE]   download one (default ./<task name>-<id>.tar.zst; - for stdout)`)
}

func runSub(ctx context.Context, env *Env, name string, args []string, subs map[string]func(context.Context, *Env, []string) error, usage string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(env.Stderr, usage)
		if len(args) == 0 {
			return Usagef("want a command")
		}
		return nil
	}
	f, ok := subs[args[0]]
	if !ok {
		names := make([]string, 0, len(subs))
		for n := range subs {
			names = append(names, n)
		}
		sort.Strings(names)
		return Usagef("unknown command %q: want %s", args[0], strings.Join(names, ", "))
	}
	return f(ctx, env, args[1:])
}

// taskCmd parses a subcommand with only the common flags and want
// positional arguments.
func taskCmd(env *Env, name, usage string, args []string, want int) (*ClientFlags, []string, error) {
	f, cf := NewClientFlags(env, name, usage)
	pos, err := ParseFlags(env, f, args, true)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) != want {
		if want == 0 {
			return nil, nil, Usagef("unexpected argument %q", pos[0])
		}
		return nil, nil, Usagef("want %d argument(s), got %d", want, len(pos))
	}
	return cf, pos, cf.Resolve()
}

// resolveTask turns an id or a unique prefix of one (at least 6 hex
// digits) into a task id.
func resolveTask(ctx context.Context, c *client.Client, arg string) (string, error) {
	arg = strings.ToLower(arg)
	if arbiter.ValidateSHA256("task id", arg) == nil {
		return arg, nil
	}
	if len(arg) < 6 || strings.Trim(arg, "0123456789abcdef") != "" {
		return "", Usagef("task id %q: give the 64 hex digits or at least the first 6 (see arbiter tasks list)", arg)
	}
	ts, err := c.Tasks(ctx, client.TaskFilter{})
	if err != nil {
		return "", err
	}
	var found []string
	for _, t := range ts {
		if strings.HasPrefix(t.ID, arg) {
			found = append(found, t.ID)
		}
	}
	switch len(found) {
	case 0:
		return "", arbiter.Errorf(arbiter.ENotFound, "no task id starts with %s (see arbiter tasks list)", arg)
	case 1:
		return found[0], nil
	}
	return "", Usagef("%d tasks have ids starting with %s: give more digits", len(found), arg)
}

func tasksStatus(ctx context.Context, env *Env, args []string) error {
	cf, _, err := taskCmd(env, "tasks status", "", args, 0)
	if err != nil {
		return HelpOK(err)
	}
	s, err := cf.Client().TaskSummary(ctx)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, s)
	}
	w := env.Stdout
	if m := s.Manifest; m != nil {
		name := m.Name
		if name == "" {
			name = "(unnamed)"
		}
		fmt.Fprintf(w, "manifest %s: %s, from %s, loaded %s\n", name, arbiter.Plural(m.Tasks, "task"), m.Source, ago(m.LoadedAt, time.Now()))
	} else {
		fmt.Fprintln(w, "no manifest loaded: set [tasks] manifest in the server's configuration")
	}
	var parts []string
	for _, st := range arbiter.TaskStatuses {
		parts = append(parts, fmt.Sprintf("%s %d", st, s.Counts[st]))
	}
	fmt.Fprintf(w, "%s: %s; %s\n", arbiter.Plural(s.Total, "task"), strings.Join(parts, ", "), arbiter.Plural(s.Workers, "worker"))
	if len(s.Failed) > 0 {
		fmt.Fprintln(w, "\nfailed:")
		tw := newTable(w, 0)
		fmt.Fprintln(tw, "ID\tNAME\tATTEMPTS\tWORKER\tERROR")
		for _, t := range s.Failed {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", arbiter.ShortID(t.ID), safe(t.Name), t.Attempts, orDash(t.ClaimedBy), orDash(arbiter.ClipLine(t.LastError, 80)))
		}
		return tw.Flush()
	}
	return nil
}

func tasksList(ctx context.Context, env *Env, args []string) error {
	var f client.TaskFilter
	fs, cf := NewClientFlags(env, "tasks list", "")
	fs.StringVar(&f.Status, "status", "", "only tasks in this status: "+strings.Join(arbiter.TaskStatuses, ", "))
	fs.StringVar(&f.Worker, "worker", "", "only tasks last claimed by this worker")
	fs.StringVar(&f.Model, "model", "", "only tasks of this model")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ts, err := cf.Client().Tasks(ctx, f)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, nonNil(ts))
	}
	if len(ts) == 0 {
		_, err := fmt.Fprintln(env.Stdout, "no tasks")
		return err
	}
	return printTasks(env.Stdout, ts, time.Now())
}

func printTasks(w io.Writer, ts []arbiter.Task, now time.Time) error {
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tPRIO\tGPUS\tATTEMPTS\tWORKER\tUPDATED\tLAST ERROR")
	for _, t := range ts {
		gpus := strconv.Itoa(t.Spec.GPUs)
		if len(t.GPUs) > 0 && (t.Status == arbiter.TaskClaimed || t.Status == arbiter.TaskRunning) {
			gpus += " (" + intsCSV(t.GPUs) + ")"
		}
		name := safe(t.Name)
		if !t.InManifest {
			name += " (removed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d/%d\t%s\t%s\t%s\n", arbiter.ShortID(t.ID), name, t.Status, t.Spec.Priority,
			gpus, t.Attempts, t.Spec.MaxAttempts, orDash(t.ClaimedBy), ago(t.UpdatedAt, now), orDash(arbiter.ClipLine(currentError(t), 60)))
	}
	return tw.Flush()
}

func intsCSV(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// currentError is the task's last error while it says something about the
// task as it stands (pending again after a failed attempt, failed,
// cancelled); "" while a new attempt is claimed or running.
func currentError(t arbiter.Task) string {
	if t.Status == arbiter.TaskClaimed || t.Status == arbiter.TaskRunning {
		return ""
	}
	return t.LastError
}

func tasksShow(ctx context.Context, env *Env, args []string) error {
	cf, pos, err := taskCmd(env, "tasks show", " ID", args, 1)
	if err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	id, err := resolveTask(ctx, c, pos[0])
	if err != nil {
		return err
	}
	t, err := c.Task(ctx, id)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, t)
	}
	now := time.Now()
	tw := newTable(env.Stdout, 0)
	s := t.Spec
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, safe(v)) }
	row("id", t.ID)
	row("name", t.Name)
	row("status", t.Status)
	row("attempts", fmt.Sprintf("%d of %d", t.Attempts, s.MaxAttempts))
	row("model / mode", s.Model+" / "+s.Mode)
	row("hyper", string(s.Hyper))
	row("split / seed", fmt.Sprintf("%s / %d", orDash(s.SplitRecipe), s.Seed)) // "-" stays "-"
	if len(s.TrainHosts) > 0 {
		row("train hosts", strings.Join(s.TrainHosts, ", "))
	}
	row("priority", strconv.Itoa(s.Priority))
	var needs []string
	if s.GPUs > 0 {
		needs = append(needs, arbiter.Plural(s.GPUs, "GPU"))
	}
	if s.MinVRAMGiB > 0 {
		needs = append(needs, gib(s.MinVRAMGiB)+" VRAM")
	}
	if s.MinRAMGiB > 0 {
		needs = append(needs, gib(s.MinRAMGiB)+" RAM")
	}
	if s.RequireCUDA {
		needs = append(needs, "CUDA")
	}
	if s.PreferCUDA {
		needs = append(needs, "prefers CUDA")
	}
	if len(s.AllowedHosts) > 0 {
		needs = append(needs, "hosts "+strings.Join(s.AllowedHosts, ","))
	}
	if len(needs) == 0 {
		needs = []string{"nothing special"}
	}
	row("needs", strings.Join(needs, ", "))
	row("command", strings.Join(s.Command, " "))
	row("stale after", seconds(s.StaleAfterS))
	if t.ClaimedBy != "" {
		row("worker", t.ClaimedBy)
	}
	if t.ClaimedAt != nil {
		row("claimed", ago(*t.ClaimedAt, now))
	}
	if t.HeartbeatAt != nil {
		row("heartbeat", ago(*t.HeartbeatAt, now))
	}
	if t.AllocationID != 0 {
		what := "allocation"
		if t.Status != arbiter.TaskClaimed && t.Status != arbiter.TaskRunning {
			what = "last ran in" // the allocation has ended: the record keeps where
		}
		row(what, fmt.Sprintf("allocation %d on %s, GPUs %s", t.AllocationID, t.Machine, intsCSV(t.GPUs)))
	}
	if t.CompletedAt != nil {
		row("completed", ago(*t.CompletedAt, now))
	}
	if t.ArtifactID != "" {
		row("artifact", t.ArtifactID+"  (arbiter artifacts get "+arbiter.ShortID(t.ArtifactID)+")")
	}
	if !t.InManifest {
		row("manifest", "no longer listed; stays until cancelled")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if t.LastError != "" {
		what := "last error"
		if currentError(t) == "" {
			what = "the previous attempt's error" // this attempt is going well so far
		}
		fmt.Fprintf(env.Stdout, "%s:\n%s\n", what, strings.TrimRight(t.LastError, "\n"))
	}
	return nil
}

// operatorToken is $ARBITER_OPERATOR_TOKEN: operator commands then use the
// fleet API with it instead of the bearer token.
func operatorToken(env *Env) string { return env.Getenv("ARBITER_OPERATOR_TOKEN") }

func tasksCancel(ctx context.Context, env *Env, args []string) error {
	var reason string
	fs, cf := NewClientFlags(env, "tasks cancel", " ID")
	fs.StringVar(&reason, "reason", "", "why (recorded as the task's last error)")
	pos, err := parseArgs(env, fs, cf, args, 1, "exactly one task ID")
	if err != nil {
		return HelpOK(err)
	}
	if reason != "" && operatorToken(env) != "" {
		// The fleet API's cancel takes no reason: say so rather than drop it.
		fmt.Fprintln(env.Stderr, "note: with $ARBITER_OPERATOR_TOKEN the cancel goes through the fleet API, which records no --reason (the task's error says \"by the operator\"); unset it to use your bearer token")
	}
	return taskOperator(ctx, env, cf, "cancel", pos[0], func(c *client.Client, id string) (arbiter.Task, error) {
		r := reason
		if r == "" {
			r = "by " + defaultOwner(env)
		}
		return c.CancelTask(ctx, id, r)
	})
}

func tasksRequeue(ctx context.Context, env *Env, args []string) error {
	cf, pos, err := taskCmd(env, "tasks requeue", " ID", args, 1)
	if err != nil {
		return HelpOK(err)
	}
	return taskOperator(ctx, env, cf, "requeue", pos[0], func(c *client.Client, id string) (arbiter.Task, error) {
		return c.RequeueTask(ctx, id)
	})
}

// taskOperator runs cancel or requeue: through the fleet API with the
// operator token when one is set, else natively.
func taskOperator(ctx context.Context, env *Env, cf *ClientFlags, action, arg string, native func(*client.Client, string) (arbiter.Task, error)) error {
	c := cf.Client()
	var id string
	if op := operatorToken(env); op != "" {
		id = strings.ToLower(arg)
		if arbiter.ValidateSHA256("task id", id) != nil {
			// A prefix needs a listing, which needs a bearer token when the
			// server has tokens; try it.
			var err error
			if id, err = resolveTask(ctx, c, arg); err != nil {
				return err
			}
		}
		res, err := c.FleetOperator(ctx, action, id, op)
		if err != nil {
			return err
		}
		if cf.JSON() {
			if err := WriteJSON(env.Stdout, struct {
				ID string `json:"id"`
				client.FleetResult
			}{id, res}); err != nil || res.OK {
				return err
			}
			return ExitError{Code: 1} // refused: what was printed says why
		}
		if !res.OK {
			return fmt.Errorf("task %s was not %sed: %s", arbiter.ShortID(id), strings.TrimSuffix(action, "e"), res.Reason)
		}
		_, err = fmt.Fprintf(env.Stdout, "task %s %sed\n", arbiter.ShortID(id), strings.TrimSuffix(action, "e"))
		return err
	}
	id, err := resolveTask(ctx, c, arg)
	if err != nil {
		return err
	}
	t, err := native(c, id)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, t)
	}
	_, err = fmt.Fprintf(env.Stdout, "task %s (%s) is %s\n", t.Name, arbiter.ShortID(t.ID), t.Status)
	return err
}

func tasksReload(ctx context.Context, env *Env, args []string) error {
	cf, _, err := taskCmd(env, "tasks reload", "", args, 0)
	if err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	var rep arbiter.TaskSyncReport
	if op := operatorToken(env); op != "" {
		res, err := c.FleetOperator(ctx, "reload", "", op)
		if err != nil {
			return err
		}
		rep = arbiter.TaskSyncReport{Tasks: res.NJobs, Added: res.Counts["added"], Updated: res.Counts["updated"],
			Unchanged: res.Counts["unchanged"], Removed: res.Counts["removed"]}
	} else if rep, err = c.ReloadTasks(ctx); err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, rep)
	}
	fmt.Fprintf(env.Stdout, "manifest reloaded: %d tasks; %d added, %d updated, %d unchanged, %d no longer listed (they stay until cancelled)\n",
		rep.Tasks, rep.Added, rep.Updated, rep.Unchanged, rep.Removed)
	for _, l := range []struct {
		what  string
		names []string
	}{{"added", rep.AddedNames}, {"updated", rep.UpdatedNames}, {"no longer listed", rep.RemovedNames}} {
		if len(l.names) > 0 {
			fmt.Fprintf(env.Stdout, "  %s: %s\n", l.what, strings.Join(l.names, ", "))
		}
	}
	return nil
}

func tasksWorkers(ctx context.Context, env *Env, args []string) error {
	cf, _, err := taskCmd(env, "tasks workers", "", args, 0)
	if err != nil {
		return HelpOK(err)
	}
	ws, err := cf.Client().Workers(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, ws, "no workers yet: run arbiter agent on a host, or point a fleet worker at /v1", "WORKER\tLAST SEEN\tCORES\tRAM\tCUDA\tGPUS\tFIRST SEEN", func(tw io.Writer, w arbiter.Worker) {
		cp := w.Capability
		cuda := "no"
		if cp.CUDA {
			cuda = "yes"
		}
		gpus := "-"
		if len(cp.GPUs) > 0 {
			names := map[string]int{}
			for _, g := range cp.GPUs {
				names[fmt.Sprintf("%s %s", g.Name, gib(g.VRAMGiB))]++
			}
			var parts []string
			for n, k := range names {
				parts = append(parts, fmt.Sprintf("%d× %s", k, n))
			}
			sort.Strings(parts)
			gpus = strings.Join(parts, ", ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", w.Name, ago(w.LastSeen, now), cp.Cores, gib(cp.RAMGiB), cuda, gpus, ago(w.FirstSeen, now))
	})
}

func artifactsList(ctx context.Context, env *Env, args []string) error {
	var task string
	fs, cf := NewClientFlags(env, "artifacts list", "")
	fs.StringVar(&task, "task", "", "only the artifacts of this task (id or prefix)")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	if task != "" {
		var err error
		if task, err = resolveTask(ctx, c, task); err != nil {
			return err
		}
	}
	as, err := c.Artifacts(ctx, task)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, as, "no artifacts", "ID\tTASK\tMODEL\tMODE\tWORKER\tSIZE\tCREATED", func(tw io.Writer, a arbiter.Artifact) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", arbiter.ShortID(a.ID), safe(a.TaskName), safe(a.Model), orDash(a.Mode), safe(a.Worker), byteSize(a.SizeBytes), ago(a.CreatedAt, now))
	})
}

func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func artifactsGet(ctx context.Context, env *Env, args []string) error {
	var out string
	fs, cf := NewClientFlags(env, "artifacts get", " ID")
	fs.StringVar(&out, "out", "", "file to write (default ./<task name>-<id>.tar.zst; - for stdout)")
	pos, err := parseArgs(env, fs, cf, args, 1, "exactly one artifact ID")
	if err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	id := strings.ToLower(pos[0])
	if arbiter.ValidateSHA256("artifact id", id) != nil {
		if len(id) < 6 || strings.Trim(id, "0123456789abcdef") != "" {
			return Usagef("artifact id %q: give the 64 hex digits or at least the first 6", pos[0])
		}
		as, err := c.Artifacts(ctx, "")
		if err != nil {
			return err
		}
		var found []string
		for _, a := range as {
			if strings.HasPrefix(a.ID, id) {
				found = append(found, a.ID)
			}
		}
		switch len(found) {
		case 0:
			return arbiter.Errorf(arbiter.ENotFound, "no artifact has an id starting with %s (see arbiter artifacts)", id)
		case 1:
		default:
			return Usagef("%d artifacts have ids starting with %s: give more of it", len(found), id)
		}
		id = found[0]
	}
	a, err := c.Artifact(ctx, id)
	if err != nil {
		return err
	}
	if out == "-" {
		if cf.JSON() {
			return Usagef("-o json prints the artifact's metadata; it cannot go with --out -")
		}
		_, err := c.DownloadArtifact(ctx, id, rawOut(env.Stdout)) // bytes, not text
		return err
	}
	if out == "" {
		out = fmt.Sprintf("%s-%s.tar.zst", a.TaskName, a.ID[:12])
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".arbiter-download-*")
	if err != nil {
		return err
	}
	n, err := c.DownloadArtifact(ctx, id, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), out)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, struct {
			arbiter.Artifact
			Path string `json:"path"`
		}{a, out})
	}
	_, err = fmt.Fprintf(env.Stdout, "wrote %s (%s, sha256 verified)\n", out, byteSize(n))
	return err
}

package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/procgroup"
)

// Defaults of arbiter alloc.
const (
	// allocCmdKeepalive is the keepalive of an allocation that runs a
	// command: the command's exit releases it, a crash of arbiter itself
	// lets it expire within a minute.
	allocCmdKeepalive = 60.0
	// allocMaxPoll bounds one long-poll, so that a keepalive is sent and a
	// change of why_queued is shown now and then while waiting.
	allocMaxPoll = 60 * time.Second
	// allocReleaseTimeout bounds the release after the command (or the
	// wait) ends; it runs after ctx may have been cancelled by a signal.
	allocReleaseTimeout = 10 * time.Second
	// allocKillGrace is how long a command stopped with SIGTERM (its
	// allocation was lost) has before it is killed.
	allocKillGrace = 10 * time.Second
)

// allocCmd is arbiter alloc. Its signal hooks are fields so that tests can
// deliver signals without sending them to the test process.
type allocCmd struct {
	env *Env
	// notify starts delivering SIGINT and SIGTERM to c; stop undoes it.
	notify func(c chan<- os.Signal)
	stop   func(c chan<- os.Signal)
	// killGrace is how long the command has between SIGTERM and SIGKILL.
	killGrace time.Duration
}

// cmdAlloc allocates GPUs and either prints the allocation (held until
// released) or runs a command with them and releases them when it exits.
func cmdAlloc(ctx context.Context, env *Env, args []string) error {
	ac := &allocCmd{
		env:       env,
		notify:    func(c chan<- os.Signal) { signal.Notify(c, os.Interrupt, syscall.SIGTERM) },
		stop:      func(c chan<- os.Signal) { signal.Stop(c) },
		killGrace: allocKillGrace,
	}
	return ac.run(ctx, args)
}

func (ac *allocCmd) run(ctx context.Context, args []string) error {
	env := ac.env
	fs, cf := NewClientFlags(env, "alloc", " [-- CMD ARGS...]")
	var (
		r         arbiter.Request
		tags      StringList
		keepalive = fs.String("keepalive", "", "keepalive in seconds or as a duration (90, 5m), or \"never\"\n(default: never without CMD, 60s with CMD)")
		wait      = fs.Bool("wait", true, "wait until the allocation is ready")
		noWait    = fs.Bool("no-wait", false, "print the allocation at once, even if queued (not with CMD)")
		timeout   = new(time.Duration)
		timeLimit = fs.String("time-limit", "", "end the allocation this long after it is granted: a duration (2h) or seconds (default: the group's)")
	)
	durationVar(fs, timeout, "timeout", 0, "give up waiting after this long (15m, or seconds) and release the allocation (0 = wait until interrupted)")
	fs.BoolVar(&r.Preemptible, "preemptible", false, "a waiting request of higher priority may preempt it (after the grace period)")
	fs.StringVar(&r.Reservation, "reservation", "", "allocate inside this reservation of your group")
	fs.IntVar(&r.GPUs, "gpus", 1, "number of GPUs, all on one machine")
	fs.Float64Var(&r.MinVRAMGiB, "min-vram", 0, "minimum VRAM per GPU in GiB")
	fs.StringVar(&r.Model, "model", "", "GPU model pattern, e.g. '*H100*'")
	fs.Var(&tags, "tag", "the machine must carry this tag (repeatable)")
	fs.StringVar(&r.Machine, "machine", "", "only this machine")
	fs.IntVar(&r.Priority, "priority", 0, "queue priority, higher first")
	fs.BoolVar(&r.RequireCUDA, "require-cuda", false, "only machines whose driver supports CUDA")
	fs.StringVar(&r.MinCompute, "min-compute", "", "minimum compute capability, e.g. 8.0")
	fs.StringVar(&r.Owner, "owner", "", "who holds the allocation on a server without tokens (default $USER@hostname);\nwith tokens the owner is your token's name, and this becomes the label")
	fs.StringVar(&r.Label, "label", "", "free text describing the allocation, shown beside its owner")
	fs.StringVar(&r.Pool, "pool", "", "take one slot of this pool's shared GPUs instead (docs/reference/pools.md); GPU flags do not apply")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: arbiter alloc [flags] [-- CMD ARGS...]

Without CMD: allocate, wait until ready, print the allocation and leave it
held (release it with 'arbiter release ID').
With CMD: allocate, wait until ready, run CMD with CUDA_VISIBLE_DEVICES and
ARBITER_ALLOCATION_ID (and, for a pool slot, ARBITER_SLOT) set, keep the
allocation alive while CMD runs, release it when CMD exits and exit with
CMD's status. CMD's output is its own: -o json does not apply to it.

flags:
`)
		fs.PrintDefaults()
	}
	argv, err := ParseFlags(env, fs, args, false)
	if err != nil {
		return HelpOK(err)
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	r.Tags = tags
	if r.Pool != "" {
		gpusSet := false
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "gpus", "min-vram", "model", "tag", "machine", "require-cuda", "min-compute":
				gpusSet = true
			}
		})
		if gpusSet {
			return Usagef("--pool takes one slot of the pool's GPUs: leave out --gpus, --min-vram, --model, --tag, --machine, --require-cuda and --min-compute")
		}
		r.GPUs = 0
	}
	if r.Owner == "" {
		r.Owner = defaultOwner(env)
	}
	if *noWait {
		*wait = false
	}
	if *timeout < 0 {
		return Usagef("--timeout %s must not be negative", *timeout)
	}
	if len(argv) > 0 && !*wait {
		return Usagef("--no-wait cannot run a command: the command needs the GPUs")
	}
	ka, err := parseKeepalive(*keepalive)
	if err != nil {
		return err
	}
	if *keepalive == "" && len(argv) > 0 {
		v := allocCmdKeepalive
		ka = &v
	}
	r.KeepaliveS = ka
	if *timeLimit != "" {
		s, err := coordParseSeconds("--time-limit", *timeLimit)
		if err != nil {
			return err
		}
		r.TimeLimitS = &s
	}
	if err := r.Validate(); err != nil {
		return UsageError{arbiter.ErrorMessage(err)}
	}

	c := cf.Client()
	a, err := c.Allocate(ctx, r)
	if err != nil {
		return err
	}
	if a.State == arbiter.StateDestroyed {
		return fmt.Errorf("allocation %d cannot be satisfied: %s", a.ID, arbiter.StrOr(a.Reason, "destroyed at once"))
	}
	if *wait {
		if a, err = ac.waitReady(ctx, c, a, *timeout); err != nil {
			return err
		}
	}
	if len(argv) > 0 {
		return ac.runCommand(ctx, c, a, argv)
	}
	if cf.JSON() {
		err = WriteJSON(env.Stdout, a)
	} else {
		err = printAllocations(env.Stdout, []arbiter.Allocation{a}, time.Now())
	}
	if err != nil {
		return err
	}
	// Until when it is held: its release, or a time limit (its own or its
	// group's) first.
	until := "until released"
	if a.EndsAt != nil {
		why := a.EndReason
		if why == "" {
			why = "its time limit"
		}
		until = fmt.Sprintf("until %s (%s; arbiter extend %d --by DURATION) unless released first",
			a.EndsAt.Local().Format(time.DateTime), why, a.ID)
	}
	hint := fmt.Sprintf("allocation %d is held %s: arbiter release %d", a.ID, until, a.ID)
	if a.State == arbiter.StateQueued {
		hint = fmt.Sprintf("allocation %d is queued and will be held once granted %s: arbiter release %d", a.ID, until, a.ID)
	}
	if a.KeepaliveS != nil {
		hint = fmt.Sprintf("allocation %d expires unless kept alive every %s: arbiter keepalive %d; release it with arbiter release %d",
			a.ID, seconds(*a.KeepaliveS), a.ID, a.ID)
		if a.EndsAt != nil {
			hint += "\nit is held at most " + until
		}
	}
	if a.State == arbiter.StateReady {
		hint += fmt.Sprintf("\non %s: export CUDA_VISIBLE_DEVICES=%s", arbiter.StrOr(a.Machine, "?"), deviceIndices(a.Devices))
		if a.Slot != nil {
			hint += fmt.Sprintf(" ARBITER_SLOT=%d", *a.Slot)
		}
	}
	fmt.Fprintln(env.Stderr, hint)
	return nil
}

// parseKeepalive reads --keepalive: "" (the default), "never", a number of
// seconds or a Go duration.
func parseKeepalive(s string) (*float64, error) {
	switch s {
	case "":
		return nil, nil
	case "never", "none", "null":
		return nil, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		d, derr := time.ParseDuration(s)
		if derr != nil {
			return nil, Usagef("--keepalive %q: want seconds (60), a duration (5m) or never", s)
		}
		v = d.Seconds()
	}
	return &v, nil
}

// waitReady long-polls until a is ready, keeping it alive meanwhile. When
// the wait times out or is interrupted it releases the allocation, so that
// nothing stays queued on behalf of a caller who left.
func (ac *allocCmd) waitReady(ctx context.Context, c *client.Client, a arbiter.Allocation, timeout time.Duration) (arbiter.Allocation, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	shownWhy := ""
	for a.State == arbiter.StateQueued || a.State == arbiter.StatePower {
		if why := arbiter.StrOr(a.WhyQueued, a.State); why != shownWhy {
			fmt.Fprintf(ac.env.Stderr, "allocation %d is %s: %s; waiting (Ctrl-C gives up and releases it)\n", a.ID, a.State, why)
			shownWhy = why
		}
		poll := allocMaxPoll
		if a.KeepaliveS != nil {
			poll = min(poll, max(time.Duration(*a.KeepaliveS*float64(time.Second))/3, time.Second))
		}
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return a, ac.giveUp(c, a, fmt.Sprintf("timed out after %s waiting for allocation %d (%s)", timeout, a.ID, shownWhy),
					"gave up waiting after "+timeout.String())
			}
			poll = min(poll, left)
		}
		next, err := c.WaitAllocation(ctx, a.ID, poll)
		if err == nil && next.Live() && next.State != arbiter.StateReady && next.KeepaliveS != nil {
			next, err = c.Keepalive(ctx, a.ID)
		}
		if ctx.Err() != nil { // exit 130, as any interrupted command, having said what became of it
			return a, ExitError{Code: 130, Msg: ac.giveUp(c, a, fmt.Sprintf("interrupted while waiting for allocation %d", a.ID), "interrupted while waiting").Error()}
		}
		if err != nil {
			return a, fmt.Errorf("waiting for allocation %d: %w (it may still be queued: arbiter release %d)", a.ID, err, a.ID)
		}
		a = next
	}
	if a.State == arbiter.StateDestroyed {
		return a, fmt.Errorf("allocation %d was destroyed while queued: %s", a.ID, arbiter.StrOr(a.Reason, "no reason given"))
	}
	return a, nil
}

// giveUp releases a after a wait ended without it and says so.
func (ac *allocCmd) giveUp(c *client.Client, a arbiter.Allocation, msg, reason string) error {
	rctx, cancel := context.WithTimeout(context.Background(), allocReleaseTimeout)
	defer cancel()
	if _, err := c.Release(rctx, a.ID, reason); err != nil {
		return fmt.Errorf("%s; releasing it failed too: %w (run arbiter release %d)", msg, err, a.ID)
	}
	return fmt.Errorf("%s; released it", msg)
}

// runCommand runs argv with a's GPUs, keeps a alive while it runs, forwards
// SIGINT and SIGTERM to it, and releases a when it exits. It returns
// ExitError with the command's status, saying so first when the allocation
// was lost under the command.
//
// Unless it shares a terminal in the foreground with alloc, the command
// runs in a process group of its own, signalled whole: when the
// allocation is lost, what it started (a wrapper's workers) stops with it.
// In the terminal's foreground it stays in alloc's group, to read the
// terminal; the terminal's Ctrl-C then reaches it directly, and is not
// forwarded a second time.
func (ac *allocCmd) runCommand(ctx context.Context, c *client.Client, a arbiter.Allocation, argv []string) error {
	env := ac.env
	visible := deviceIndices(a.Devices)
	fmt.Fprintf(env.Stderr, "allocation %d ready on %s (GPUs %s); running %s\n", a.ID, arbiter.StrOr(a.Machine, "?"), visible, argv[0])

	// The command and its keepalive outlive ctx: a signal cancels ctx, and
	// then the command gets the signal and decides when to exit.
	bg := context.WithoutCancel(ctx)
	cctx, kill := context.WithCancel(bg)
	defer kill()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	// The command's output is its own, not the server's: not escaped, and
	// a terminal stays a terminal for it.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = env.Stdin, rawOut(env.Stdout), rawOut(env.Stderr)
	cmd.Env = append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+visible,
		"ARBITER_ALLOCATION_ID="+strconv.FormatInt(a.ID, 10))
	if a.Slot != nil {
		cmd.Env = append(cmd.Env, "ARBITER_SLOT="+strconv.Itoa(*a.Slot))
	}
	own := !foreground(env.Stdin)
	signal := func(s os.Signal) error { return cmd.Process.Signal(s) }
	reap := func() {}
	if own {
		signal = func(s os.Signal) error { return procgroup.Signal(cmd, s) }
		reap = procgroup.StopOnCancel(cmd, ac.killGrace)
	} else {
		cmd.Cancel = func() error { return signal(syscall.SIGTERM) }
		cmd.WaitDelay = ac.killGrace
	}
	if err := cmd.Start(); err != nil {
		ac.release(c, a.ID, "command failed to start")
		return fmt.Errorf("cannot run %s: %w", argv[0], err)
	}

	sigs := make(chan os.Signal, 4)
	ac.notify(sigs)
	defer ac.stop(sigs)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				if s == os.Interrupt && !own {
					continue // the terminal sent it to the command too
				}
				_ = signal(s)
			case <-done:
				return
			}
		}
	}()

	lost := make(chan string, 1)
	kaDone := make(chan struct{})
	go func() {
		defer close(kaDone)
		ac.keepAlive(bg, c, a, done, func(why string) {
			lost <- why
			kill()
		})
	}()

	werr := cmd.Wait()
	reap() // stopped (the allocation lost): what it started, on GPUs no longer its, too
	close(done)
	<-kaDone
	status := exitStatus(cmd, werr)
	select {
	case why := <-lost:
		return ExitError{Code: status, Msg: fmt.Sprintf("allocation %d was lost while the command ran (%s); stopped the command (status %d)", a.ID, why, status)}
	default:
	}
	reason := fmt.Sprintf("command exited with status %d", status)
	if got, ok := ac.release(c, a.ID, reason); ok && got.Reason != nil && *got.Reason != reason {
		// It ended under the command (reclaimed idle, expired, released by
		// an admin) and the agent stopped the command before the next
		// keepalive could tell.
		// The agent stops it at once, or at its next keepalive; a
		// command that was done by then exited on its own.
		how := fmt.Sprintf("the command exited with status %d", status)
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() < 0 {
			how = fmt.Sprintf("the command was stopped (%s)", cmd.ProcessState)
		}
		return ExitError{Code: status, Msg: fmt.Sprintf("allocation %d ended while the command ran (%s); %s", a.ID, *got.Reason, how)}
	}
	if status != 0 {
		return ExitError{Code: status}
	}
	return nil
}

// foreground reports whether in is a terminal in whose foreground alloc
// runs (procgroup.Foreground).
func foreground(in io.Reader) bool {
	f, ok := in.(*os.File)
	return ok && procgroup.Foreground(f)
}

// keepAlive refreshes a every third of its keepalive until done. When the
// server says the allocation is gone it calls lost with the reason and
// returns; other failures are reported and retried at the next beat.
func (ac *allocCmd) keepAlive(ctx context.Context, c *client.Client, a arbiter.Allocation, done <-chan struct{}, lost func(string)) {
	if a.KeepaliveS == nil {
		return
	}
	every := max(time.Duration(*a.KeepaliveS*float64(time.Second))/3, 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	idleShown := false
	sick := map[int]bool{} // GPUs already said to be unhealthy
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		got, err := c.Keepalive(ctx, a.ID)
		switch code := arbiter.ErrorCode(err); {
		case err == nil && got.State != arbiter.StateDestroyed:
			// The server judged the allocation idle (allocation.idle): say so once.
			if got.IdleSince != nil && !idleShown {
				fmt.Fprintf(ac.env.Stderr, "arbiter: allocation %d is idle: its GPUs have been unused since %s (%s); it may be reclaimed\n",
					a.ID, got.IdleSince.Local().Format("15:04:05"), ago(*got.IdleSince, time.Now()))
			}
			idleShown = got.IdleSince != nil
			ac.tellUnhealthy(ctx, c, got, sick)
			continue
		case err == nil:
			lost(arbiter.StrOr(got.Reason, "destroyed"))
			return
		case code == arbiter.ENotFound || code == arbiter.EConflict:
			why := arbiter.ErrorMessage(err)
			if cur, gerr := c.Allocation(ctx, a.ID); gerr == nil && cur.Reason != nil {
				why = *cur.Reason
			}
			lost(why)
			return
		default:
			fmt.Fprintf(ac.env.Stderr, "arbiter: keepalive of allocation %d failed: %v; retrying in %s\n", a.ID, err, every.Round(100*time.Millisecond))
		}
	}
}

// tellUnhealthy says once, for each GPU a holds that has become unhealthy
// (a critical XID, an ECC error, gone), that it has and why: the holder
// keeps it, but should save its work.
func (ac *allocCmd) tellUnhealthy(ctx context.Context, c *client.Client, a arbiter.Allocation, told map[int]bool) {
	if a.Machine == nil || len(a.Devices) == 0 {
		return
	}
	m, err := c.Machine(ctx, *a.Machine)
	if err != nil {
		return // the next beat asks again
	}
	for _, d := range m.Devices {
		if d.Allocation == nil || *d.Allocation != a.ID || d.State != arbiter.GPUUnhealthy || told[d.Index] {
			continue
		}
		told[d.Index] = true
		fmt.Fprintf(ac.env.Stderr, "arbiter: GPU %d of %s, held by allocation %d, is unhealthy (%s); save your work: nothing new will be placed on it\n",
			d.Index, m.Name, a.ID, d.StateReason)
	}
}

// release releases id after the command, reporting (not returning) a
// failure: the command's status is what the caller wants to see. It
// returns the allocation as released (ok), whose reason tells whether it
// had already ended.
func (ac *allocCmd) release(c *client.Client, id int64, reason string) (arbiter.Allocation, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), allocReleaseTimeout)
	defer cancel()
	a, err := c.Release(ctx, id, reason)
	if err != nil {
		fmt.Fprintf(ac.env.Stderr, "arbiter: could not release allocation %d: %v; run arbiter release %d\n", id, err, id)
		return a, false
	}
	return a, true
}

// exitStatus is the command's exit status, 128+N when signal N killed it,
// as shells report it.
func exitStatus(cmd *exec.Cmd, werr error) int {
	ps := cmd.ProcessState
	if ps == nil {
		return 1
	}
	if code := ps.ExitCode(); code >= 0 {
		if code == 0 && werr != nil && !errors.Is(werr, exec.ErrWaitDelay) {
			return 1 // the process exited 0 but copying its output failed
		}
		return code
	}
	if ws, ok := ps.Sys().(interface {
		Signaled() bool
		Signal() syscall.Signal
	}); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return 1
}

package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// The coordination commands (docs/reference/coordination.md): lock, swap, swaps,
// services, catalog, webhooks, schedules.

// coordSubcommand dispatches "arbiter NAME SUB …" to subs.
func coordSubcommand(ctx context.Context, env *Env, name string, args []string, subs map[string]func(context.Context, *Env, []string) error, order string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(env.Stderr, "usage: arbiter %s {%s} [flags]\n\nRun 'arbiter %s SUBCOMMAND -h' for its flags.\n", name, order, name)
		if len(args) == 0 {
			return ExitError{Code: 2}
		}
		return nil
	}
	f, ok := subs[args[0]]
	if !ok {
		return Usagef("unknown subcommand %q; want one of %s", args[0], strings.ReplaceAll(order, "|", ", "))
	}
	return f(ctx, env, args[1:])
}

// coordParseSeconds reads a duration flag given as a Go duration ("90s", "15m")
// or a plain number of seconds ("900").
func coordParseSeconds(flagName, v string) (float64, error) {
	if v == "" {
		return 0, nil
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil {
		d, derr := time.ParseDuration(v)
		if derr != nil {
			return 0, Usagef("%s %q: want a duration such as 15m or a number of seconds", flagName, v)
		}
		secs = d.Seconds()
	}
	if !(secs > 0) || math.IsInf(secs, 0) {
		return 0, Usagef("%s %q: want more than 0, such as 15m or 900", flagName, v)
	}
	return secs, nil
}

// coordPrintLock prints a lock's public state for people.
func coordPrintLock(w io.Writer, name string, st arbiter.LockState) error {
	if !st.Held {
		_, err := fmt.Fprintf(w, "lock %s is free\n", name)
		return err
	}
	note := ""
	if st.Note != nil && *st.Note != "" {
		note = " — " + *st.Note
	}
	_, err := fmt.Fprintf(w, "lock %s is held by %s (fence %d) until %s (%ds left)%s\n", name, safe(st.Holder), st.Fence,
		st.ExpiresAt.Local().Format(time.DateTime), *st.SecondsRemaining, note)
	return err
}

// printLockHeld explains a refusal by a lock on stderr-bound errors.
func coordLockHeldMessage(err error) error {
	var held *arbiter.LockHeldError
	if errors.As(err, &held) && held.Lock.ExpiresAt != nil {
		return fmt.Errorf("%w (fence %d, %ds left)", err, held.Lock.Fence, *held.Lock.SecondsRemaining)
	}
	return err
}

func cmdLock(ctx context.Context, env *Env, args []string) error {
	return coordSubcommand(ctx, env, "lock", args, map[string]func(context.Context, *Env, []string) error{
		"acquire": cmdLockAcquire, "extend": cmdLockExtend, "release": cmdLockRelease, "status": cmdLockStatus, "list": cmdLockList,
	}, "acquire|extend|release|status|list")
}

// coordOneName parses flags and exactly one NAME argument.
func coordOneName(env *Env, fs *flag.FlagSet, cf *ClientFlags, args []string, what string) (string, error) {
	pos, err := parseArgs(env, fs, cf, args, 1, "exactly one "+what)
	if err != nil {
		return "", err
	}
	return pos[0], nil
}

func cmdLockAcquire(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "lock acquire", " NAME")
	holder := fs.String("holder", "", "who takes the lock, shown to others (default USER@HOST); not a credential")
	ttl := fs.String("ttl", "", "how long it is held unless extended: 90s, 15m, 2h or seconds (default 15m, at most 24h)")
	note := fs.String("note", "", "a note shown with the lock")
	token := fs.String("lock-token", "", "the token of a lock you hold, to extend it (default $ARBITER_LOCK_TOKEN)")
	name, err := coordOneName(env, fs, cf, args, "lock name")
	if err != nil {
		return HelpOK(err)
	}
	secs, err := coordParseSeconds("--ttl", *ttl)
	if err != nil {
		return err
	}
	if *holder == "" {
		*holder = defaultOwner(env)
	}
	if *token == "" {
		*token = env.Getenv("ARBITER_LOCK_TOKEN")
	}
	req := client.LockRequest{Holder: *holder, Note: *note, Token: *token}
	if secs != 0 {
		req.TTLS = &secs
	}
	g, err := cf.Client().AcquireLock(ctx, name, req)
	if err != nil {
		return coordLockHeldMessage(err)
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, g)
	}
	if err := coordPrintLock(env.Stdout, name, g.LockState); err != nil {
		return err
	}
	if *token != "" && g.Token == *token {
		return nil // extended: the token is the one already known
	}
	_, err = fmt.Fprintf(env.Stdout, "token: %s\n(shown only now: extend, release and guarded swaps need it; export ARBITER_LOCK_TOKEN=%s)\n", g.Token, g.Token)
	return err
}

func coordLockToken(env *Env, flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	return env.Getenv("ARBITER_LOCK_TOKEN")
}

func cmdLockExtend(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "lock extend", " NAME")
	ttl := fs.String("ttl", "", "new time left: 90s, 15m, 2h or seconds (default 15m)")
	note := fs.String("note", "", "replace the note")
	token := fs.String("lock-token", "", "the lock's token (default $ARBITER_LOCK_TOKEN)")
	name, err := coordOneName(env, fs, cf, args, "lock name")
	if err != nil {
		return HelpOK(err)
	}
	secs, err := coordParseSeconds("--ttl", *ttl)
	if err != nil {
		return err
	}
	tok := coordLockToken(env, *token)
	if tok == "" {
		return Usagef("extending a lock needs its token: --lock-token or $ARBITER_LOCK_TOKEN")
	}
	var notep *string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "note" {
			notep = note
		}
	})
	g, err := cf.Client().ExtendLock(ctx, name, tok, secs, notep)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, g)
	}
	return coordPrintLock(env.Stdout, name, g.LockState)
}

func cmdLockRelease(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "lock release", " NAME")
	token := fs.String("lock-token", "", "the lock's token (default $ARBITER_LOCK_TOKEN)")
	force := fs.Bool("force", false, "release without the token (admin: the human override)")
	name, err := coordOneName(env, fs, cf, args, "lock name")
	if err != nil {
		return HelpOK(err)
	}
	tok := coordLockToken(env, *token)
	if tok == "" && !*force {
		return Usagef("releasing a lock needs its token (--lock-token or $ARBITER_LOCK_TOKEN), or --force from an admin")
	}
	rel, err := cf.Client().ReleaseLock(ctx, name, tok, *force)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, rel)
	}
	_, err = fmt.Fprintf(env.Stdout, "lock %s released (it was held by %s)\n", name, safe(rel.Lock.Holder))
	return err
}

func cmdLockStatus(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "lock status", " NAME")
	name, err := coordOneName(env, fs, cf, args, "lock name")
	if err != nil {
		return HelpOK(err)
	}
	st, err := cf.Client().Lock(ctx, name)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, st)
	}
	return coordPrintLock(env.Stdout, name, st)
}

func cmdLockList(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "lock list", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ls, err := cf.Client().Locks(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, ls, "no locks are held", "NAME\tHOLDER\tFENCE\tEXPIRES\tNOTE", func(tw io.Writer, l arbiter.LockState) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", l.Name, safe(l.Holder), l.Fence, ago(*l.ExpiresAt, now), orDash(arbiter.StrOr(l.Note, "")))
	})
}

// Services, catalog and swaps.

func cmdServices(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "services", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ss, err := cf.Client().Services(ctx)
	if err != nil {
		return err
	}
	return printList(env, cf, ss, "no services are configured ([[services]] in the configuration)", "NAME\tMACHINE\tKIND\tENDPOINT\tMODEL\tSWAP\tDEFAULT", func(tw io.Writer, s arbiter.Service) {
		def := ""
		if s.Default {
			def = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Machine, s.Kind, orDash(s.Endpoint), orDash(s.Model), orDash(s.Swap), def)
	})
}

// coordDefaultServiceName is the service a command acts on without --service:
// the default one.
func coordDefaultServiceName(ctx context.Context, c *client.Client) (string, error) {
	ss, err := c.Services(ctx)
	if err != nil {
		return "", err
	}
	for _, s := range ss {
		if s.Default {
			return s.Name, nil
		}
	}
	return "", Usagef("no default service: name one with --service (see arbiter services)")
}

func cmdCatalog(ctx context.Context, env *Env, args []string) error {
	return coordSubcommand(ctx, env, "catalog", args, map[string]func(context.Context, *Env, []string) error{
		"list": cmdCatalogList, "set": cmdCatalogSet, "rm": cmdCatalogRm, "validate": cmdCatalogValidate,
	}, "list|set|rm|validate")
}

func cmdCatalogList(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "catalog list", " [SERVICE]")
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) > 1 {
		return Usagef("want at most one service name, got %d arguments", len(pos))
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	c := cf.Client()
	svc := ""
	if len(pos) == 1 {
		svc = pos[0]
	} else if svc, err = coordDefaultServiceName(ctx, c); err != nil {
		return err
	}
	cat, err := c.Catalog(ctx, svc)
	if err != nil {
		return err
	}
	return printList(env, cf, cat, "", "KEY\tMODEL\tARGS\tSOURCE", func(tw io.Writer, e arbiter.CatalogEntry) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Key, e.Model(), orDash(strings.Join(e.Args, " ")), e.Source)
	})
}

func cmdCatalogSet(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "catalog set", " SERVICE KEY (--repo R | --local-path P)")
	var e arbiter.CatalogEntry
	var a StringList
	fs.StringVar(&e.Repo, "repo", "", "a hub id such as google/gemma-3-27b-it")
	fs.StringVar(&e.LocalPath, "local-path", "", "an absolute directory on the service's host, inside its local_path_roots")
	fs.Var(&a, "arg", "a launch argument; repeat for several (--arg --max-model-len --arg 8192)")
	fs.StringVar(&e.ServedName, "served-name", "", "the name the endpoint lists the model under, if neither repo nor path")
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) != 2 {
		return Usagef("want SERVICE KEY, got %d arguments", len(pos))
	}
	if (e.Repo == "") == (e.LocalPath == "") {
		return Usagef("give exactly one of --repo and --local-path")
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	e.Service, e.Key, e.Args = pos[0], pos[1], nonNil([]string(a))
	out, err := cf.Client().PutCatalogEntry(ctx, e)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, out)
	}
	_, err = fmt.Fprintf(env.Stdout, "model %s of service %s: %s\n", out.Key, out.Service, out.Model())
	return err
}

func cmdCatalogRm(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "catalog rm", " SERVICE KEY")
	pos, err := parseArgs(env, fs, cf, args, 2, "SERVICE KEY")
	if err != nil {
		return HelpOK(err)
	}
	out, err := cf.Client().DeleteCatalogEntry(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, out)
	}
	_, err = fmt.Fprintf(env.Stdout, "model %s removed from service %s\n", out.Key, out.Service)
	return err
}

func cmdCatalogValidate(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "catalog validate", " SERVICE KEY")
	pos, err := parseArgs(env, fs, cf, args, 2, "SERVICE KEY")
	if err != nil {
		return HelpOK(err)
	}
	v, err := cf.Client().ValidateModel(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if cf.JSON() {
		if err := WriteJSON(env.Stdout, v); err != nil {
			return err
		}
	} else if v.OK {
		fmt.Fprintf(env.Stdout, "model %s of service %s is valid; a swap runs: %s\n", v.ModelKey, v.Service, strings.Join(v.Command, " "))
	} else {
		fmt.Fprintf(env.Stdout, "model %s of service %s is not valid:\n  %s\n", v.ModelKey, v.Service, strings.Join(v.Errors, "\n  "))
	}
	if !v.OK {
		return ExitError{Code: 1}
	}
	return nil
}

// cmdSwap asks for a swap and, with --follow, streams its log until it ends
// and exits 0 only if it completed.
func cmdSwap(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "swap", " MODEL")
	service := fs.String("service", "", "the service (default: the default service)")
	dry := fs.Bool("dry-run", false, "validate and show the command without running it")
	follow := fs.Bool("follow", false, "stream the swap's log until it ends; exit 1 if it fails")
	token := fs.String("lock-token", "", "the token of the lock guarding the service (default $ARBITER_LOCK_TOKEN)")
	force := fs.Bool("force", false, "swap past the service's lock (admin)")
	model, err := coordOneName(env, fs, cf, args, "model key")
	if err != nil {
		return HelpOK(err)
	}
	c := cf.Client()
	svc := *service
	if svc == "" {
		if svc, err = coordDefaultServiceName(ctx, c); err != nil {
			return err
		}
	}
	sw, err := c.RequestSwap(ctx, svc, model, client.SwapOptions{DryRun: *dry, LockToken: coordLockToken(env, *token), Force: *force})
	if err != nil {
		if arbiter.ErrorCode(err) == arbiter.ELocked {
			// The server names its HTTP header; say what to type here.
			return fmt.Errorf("%w; here: --lock-token or $ARBITER_LOCK_TOKEN, or --force as an admin", coordLockHeldMessage(err))
		}
		return coordLockHeldMessage(err)
	}
	if !*follow {
		if cf.JSON() {
			return WriteJSON(env.Stdout, sw)
		}
		if sw.DryRun {
			for _, l := range sw.Log {
				fmt.Fprintln(env.Stdout, l)
			}
			return nil
		}
		_, err := fmt.Fprintf(env.Stdout, "swap %s of %s to %s is %s (arbiter swaps %s --follow)\n", sw.ID, sw.Service, sw.ModelKey, sw.State, sw.ID)
		return err
	}
	return coordFollowSwap(ctx, env, cf, c, sw.ID)
}

// coordFollowSwap streams a swap's log to stdout (not with -o json) and prints
// its end; it fails when the swap did.
func coordFollowSwap(ctx context.Context, env *Env, cf *ClientFlags, c *client.Client, id string) error {
	end, err := c.FollowSwap(ctx, id, func(_ int, l string) {
		if !cf.JSON() {
			fmt.Fprintln(env.Stdout, l)
		}
	})
	if err != nil {
		return err
	}
	if cf.JSON() {
		full, err := c.Swap(ctx, id)
		if err != nil {
			return err
		}
		if err := WriteJSON(env.Stdout, full); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(env.Stdout, "swap %s %s", end.ID, end.State)
		if end.Reason != "" {
			fmt.Fprintf(env.Stdout, ": %s", safe(end.Reason))
		}
		fmt.Fprintln(env.Stdout)
	}
	if end.State != arbiter.SwapComplete {
		return ExitError{Code: 1}
	}
	return nil
}

// cmdSwaps lists swaps, or shows one (with --follow, streams it).
func cmdSwaps(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "swaps", " [ID]")
	service := fs.String("service", "", "only this service's swaps")
	state := fs.String("state", "", "only swaps in this state: pending, running, complete or failed")
	follow := fs.Bool("follow", false, "with ID: stream its log until it ends")
	cancel := fs.Bool("cancel", false, "with ID: cancel it (your own, or as an admin); its agent stops the command")
	reason := fs.String("reason", "", "with --cancel: why")
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) > 1 {
		return Usagef("want at most one swap id, got %d arguments", len(pos))
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	c := cf.Client()
	if *cancel && len(pos) != 1 {
		return Usagef("--cancel needs the swap's id")
	}
	if len(pos) == 1 {
		if *cancel {
			sw, err := c.CancelSwap(ctx, pos[0], *reason)
			if err != nil {
				return err
			}
			if cf.JSON() {
				return WriteJSON(env.Stdout, sw)
			}
			_, err = fmt.Fprintf(env.Stdout, "swap %s of %s to %s: %s (%s)\n", sw.ID, sw.Service, sw.ModelKey, sw.State, safe(sw.Reason))
			return err
		}
		if *follow {
			return coordFollowSwap(ctx, env, cf, c, pos[0])
		}
		sw, err := c.Swap(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.JSON() {
			return WriteJSON(env.Stdout, sw)
		}
		fmt.Fprintf(env.Stdout, "swap %s of %s to %s: %s", sw.ID, sw.Service, sw.ModelKey, sw.State)
		if sw.Reason != "" {
			fmt.Fprintf(env.Stdout, " (%s)", safe(sw.Reason))
		}
		fmt.Fprintln(env.Stdout)
		for _, l := range sw.Log {
			fmt.Fprintln(env.Stdout, "  "+l)
		}
		return nil
	}
	ss, err := c.Swaps(ctx, *service, *state, 0)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, ss, "", "ID\tSERVICE\tMODEL\tSTATE\tBY\tCREATED\tREASON", func(tw io.Writer, s arbiter.Swap) {
		state := s.State
		if s.DryRun {
			state += " (dry run)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Service, s.ModelKey, state, orDash(s.RequestedBy), ago(s.CreatedAt, now), orDash(s.Reason))
	})
}

// Webhooks.

func cmdWebhooks(ctx context.Context, env *Env, args []string) error {
	return coordSubcommand(ctx, env, "webhooks", args, map[string]func(context.Context, *Env, []string) error{
		"list": cmdWebhooksList, "add": cmdWebhooksAdd, "rm": cmdWebhooksRm, "enable": cmdWebhooksEnable,
		"disable": cmdWebhooksDisable, "deliveries": cmdWebhooksDeliveries,
	}, "list|add|rm|enable|disable|deliveries")
}

func coordPrintWebhooks(w io.Writer, ws []arbiter.Webhook) error {
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "ID\tURL\tFORMAT\tKINDS\tENABLED")
	for _, h := range ws {
		en := "yes"
		if !h.Enabled {
			en = "no: " + h.DisabledReason
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", h.ID, h.URL, h.Format, strings.Join(h.Kinds, ","), en)
	}
	return tw.Flush()
}

func cmdWebhooksList(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "webhooks list", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ws, err := cf.Client().Webhooks(ctx)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, nonNil(ws))
	}
	return coordPrintWebhooks(env.Stdout, ws)
}

func cmdWebhooksAdd(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "webhooks add", " URL")
	var kinds StringList
	fs.Var(&kinds, "kind", "an event kind to deliver (swap.complete), a prefix (swap.*) or *; repeat for several")
	format := fs.String("format", "standard", "standard (Standard Webhooks signatures) or spark (x-spark-signature; swap ends only)")
	secret := fs.String("secret", "", "the signing secret (standard: whsec_…; default: generated and shown once)")
	id := fs.String("id", "", "the subscription's id (default: generated)")
	u, err := coordOneName(env, fs, cf, args, "URL")
	if err != nil {
		return HelpOK(err)
	}
	w, err := cf.Client().CreateWebhook(ctx, arbiter.Webhook{ID: *id, URL: u, Secret: *secret, Kinds: kinds, Format: *format})
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, w)
	}
	fmt.Fprintf(env.Stdout, "webhook %s: %s events %s to %s\n", w.ID, w.Format, strings.Join(w.Kinds, ","), w.URL)
	if w.Secret != "" && *secret == "" {
		fmt.Fprintf(env.Stdout, "secret: %s\n(shown only now: the receiver verifies signatures with it)\n", w.Secret)
	}
	return nil
}

func coordWebhookByID(ctx context.Context, env *Env, args []string, name string, do func(c *client.Client, id string) (arbiter.Webhook, error), verb string) error {
	fs, cf := NewClientFlags(env, "webhooks "+name, " ID")
	id, err := coordOneName(env, fs, cf, args, "webhook id")
	if err != nil {
		return HelpOK(err)
	}
	w, err := do(cf.Client(), id)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, w)
	}
	_, err = fmt.Fprintf(env.Stdout, "webhook %s %s\n", w.ID, verb)
	return err
}

func cmdWebhooksRm(ctx context.Context, env *Env, args []string) error {
	return coordWebhookByID(ctx, env, args, "rm", func(c *client.Client, id string) (arbiter.Webhook, error) { return c.DeleteWebhook(ctx, id) }, "deleted")
}

func cmdWebhooksEnable(ctx context.Context, env *Env, args []string) error {
	return coordWebhookByID(ctx, env, args, "enable", func(c *client.Client, id string) (arbiter.Webhook, error) {
		return c.SetWebhookEnabled(ctx, id, true)
	}, "enabled")
}

func cmdWebhooksDisable(ctx context.Context, env *Env, args []string) error {
	return coordWebhookByID(ctx, env, args, "disable", func(c *client.Client, id string) (arbiter.Webhook, error) {
		return c.SetWebhookEnabled(ctx, id, false)
	}, "disabled")
}

func cmdWebhooksDeliveries(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "webhooks deliveries", "")
	var f arbiter.DeliveryFilter
	fs.StringVar(&f.Webhook, "webhook", "", "only this subscription's")
	fs.StringVar(&f.State, "state", "", "only pending, delivered or failed ones")
	fs.IntVar(&f.Limit, "limit", 50, "at most this many, newest first (1 to 1000)")
	attempts := fs.Bool("attempts", false, "show every attempt")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ds, err := cf.Client().Deliveries(ctx, f)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, ds, "", "ID\tWEBHOOK\tEVENT\tSTATE\tATTEMPTS\tLAST\tNEXT", func(tw io.Writer, d arbiter.Delivery) {
		last := "-"
		if d.LastStatus != 0 {
			last = strconv.Itoa(d.LastStatus)
		}
		if d.LastError != "" {
			last = d.LastError
		}
		next := "-"
		if d.NextAttemptAt != nil {
			next = ago(*d.NextAttemptAt, now)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, d.Webhook, d.EventKind, d.State, d.Attempts, last, next)
		if *attempts {
			for _, a := range d.History {
				what := strconv.Itoa(a.Status)
				if a.Error != "" {
					what = a.Error
				}
				fmt.Fprintf(tw, "\t#%d\t%s\t%.1fms\t\t%s\t\n", a.N, a.At.Local().Format(time.DateTime), a.DurationMS, what)
			}
		}
	})
}

// Schedules.

func cmdSchedules(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && (args[0] == "add" || args[0] == "rm") {
		return coordSubcommand(ctx, env, "schedules", args, map[string]func(context.Context, *Env, []string) error{
			"add": cmdSchedulesAdd, "rm": cmdSchedulesRm,
		}, "add|rm")
	}
	fs, cf := NewClientFlags(env, "schedules", " [add|rm]")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	ss, err := cf.Client().Schedules(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	return printList(env, cf, ss, "no schedules are registered", "ID\tNAME\tOWNER\tCRON\tNEXT RUN\tUPDATED", func(tw io.Writer, s arbiter.Schedule) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, safe(s.Name), orDash(s.Owner), orDash(s.Cron), orDash(s.NextRun), ago(s.UpdatedAt, now))
	})
}

func cmdSchedulesAdd(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "schedules add", "")
	var s arbiter.Schedule
	fs.StringVar(&s.ID, "id", "", "its id, ^[A-Za-z0-9_.-]{1,64}$ (default: generated); an existing id is updated")
	fs.StringVar(&s.Name, "name", "", "its name (required)")
	fs.StringVar(&s.Owner, "owner", "", "who runs it (default $USER@hostname)")
	fs.StringVar(&s.Cron, "cron", "", "5-field cron expression or @daily-style, in UTC")
	fs.StringVar(&s.NextRun, "next-run", "", "its next run, RFC 3339 (default: computed from --cron)")
	fs.StringVar(&s.Description, "description", "", "what it does")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	if s.Owner == "" {
		s.Owner = defaultOwner(env)
	}
	out, err := cf.Client().RegisterSchedule(ctx, s)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, out)
	}
	_, err = fmt.Fprintf(env.Stdout, "schedule %s (%s) registered; next run %s\n", out.ID, safe(out.Name), orDash(out.NextRun))
	return err
}

func cmdSchedulesRm(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "schedules rm", " ID")
	id, err := coordOneName(env, fs, cf, args, "schedule id")
	if err != nil {
		return HelpOK(err)
	}
	out, err := cf.Client().DeleteSchedule(ctx, id)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, out)
	}
	_, err = fmt.Fprintf(env.Stdout, "schedule %s (%s) deleted\n", out.ID, safe(out.Name))
	return err
}

package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdKeepalive refreshes an allocation's keepalive deadline.
func cmdKeepalive(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "keepalive", " ID")
	id, err := parseOneID(env, fs, cf, args)
	if err != nil {
		return HelpOK(err)
	}
	a, err := cf.Client().Keepalive(ctx, id)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, a)
	}
	msg := fmt.Sprintf("allocation %d kept alive", a.ID)
	if a.ExpiresAt != nil {
		msg += "; expires " + ago(*a.ExpiresAt, time.Now())
	} else if a.KeepaliveS == nil {
		msg += "; it never expires"
	}
	_, err = fmt.Fprintln(env.Stdout, msg)
	return err
}

// cmdRelease releases an allocation.
func cmdRelease(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "release", " ID")
	reason := fs.String("reason", "", "why (recorded with the allocation; default \"released by USER@HOST\")")
	id, err := parseOneID(env, fs, cf, args)
	if err != nil {
		return HelpOK(err)
	}
	if *reason == "" {
		*reason = "released by " + defaultOwner(env)
	}
	a, err := cf.Client().Release(ctx, id, *reason)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, a)
	}
	if a.Reason != nil && *a.Reason != *reason {
		// Releasing is idempotent: an allocation that had ended answers
		// as it ended, with its own reason.
		_, err = fmt.Fprintf(env.Stdout, "allocation %d had already ended (%s)\n", a.ID, *a.Reason)
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "allocation %d released (%s)\n", a.ID, arbiter.StrOr(a.Reason, *reason))
	return err
}

// parseOneID parses the flags and the single ID argument of a command.
func parseOneID(env *Env, fs *flag.FlagSet, cf *ClientFlags, args []string) (int64, error) {
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return 0, err
	}
	if len(pos) != 1 {
		return 0, Usagef("want exactly one allocation ID, got %d arguments", len(pos))
	}
	id, err := parseID(pos[0])
	if err != nil {
		return 0, err
	}
	return id, cf.Resolve()
}

// cmdDrain stops new placements on a machine.
func cmdDrain(ctx context.Context, env *Env, args []string) error {
	return setDraining(ctx, env, "drain", args, true)
}

// cmdUndrain lets a drained machine take allocations again.
func cmdUndrain(ctx context.Context, env *Env, args []string) error {
	return setDraining(ctx, env, "undrain", args, false)
}

func setDraining(ctx context.Context, env *Env, name string, args []string, draining bool) error {
	fs, cf := NewClientFlags(env, name, " MACHINE")
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) != 1 {
		return Usagef("want exactly one machine name, got %d arguments", len(pos))
	}
	if err := arbiter.ValidateName("machine name", pos[0]); err != nil {
		return UsageError{err.Error()}
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	m, err := cf.Client().SetDraining(ctx, pos[0], draining)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, m)
	}
	msg := fmt.Sprintf("machine %s is %s", m.Name, m.State)
	if draining {
		held := len(m.Devices) - m.Free
		msg += fmt.Sprintf("; nothing new is placed on it (%s still held; see arbiter ps --machine %s)", arbiter.Plural(held, "GPU"), m.Name)
	}
	_, err = fmt.Fprintln(env.Stdout, msg)
	return err
}

package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdKeepalive refreshes an allocation's keepalive deadline.
func cmdKeepalive(ctx context.Context, env *Env, args []string) error {
	fs, cf := newClientFlagSet(env, "keepalive", " ID")
	id, err := parseOneID(env, fs, cf, args)
	if err != nil {
		return helpOK(err)
	}
	a, err := cf.client().Keepalive(ctx, id)
	if err != nil {
		return err
	}
	if cf.json() {
		return writeJSON(env.Stdout, a)
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
	fs, cf := newClientFlagSet(env, "release", " ID")
	reason := fs.String("reason", "", "why (recorded with the allocation; default \"released by USER@HOST\")")
	id, err := parseOneID(env, fs, cf, args)
	if err != nil {
		return helpOK(err)
	}
	if *reason == "" {
		*reason = "released by " + defaultOwner(env)
	}
	a, err := cf.client().Release(ctx, id, *reason)
	if err != nil {
		return err
	}
	if cf.json() {
		return writeJSON(env.Stdout, a)
	}
	_, err = fmt.Fprintf(env.Stdout, "allocation %d released (%s)\n", a.ID, deref(a.Reason, *reason))
	return err
}

// parseOneID parses the flags and the single ID argument of a command.
func parseOneID(env *Env, fs *flag.FlagSet, cf *clientFlags, args []string) (int64, error) {
	pos, err := parseFlags(env, fs, args, true)
	if err != nil {
		return 0, err
	}
	if len(pos) != 1 {
		return 0, usagef("want exactly one allocation ID, got %d arguments", len(pos))
	}
	id, err := parseID(pos[0])
	if err != nil {
		return 0, err
	}
	return id, cf.resolve()
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
	fs, cf := newClientFlagSet(env, name, " MACHINE")
	pos, err := parseFlags(env, fs, args, true)
	if err != nil {
		return helpOK(err)
	}
	if len(pos) != 1 {
		return usagef("want exactly one machine name, got %d arguments", len(pos))
	}
	if err := arbiter.ValidateName("machine name", pos[0]); err != nil {
		return usageError{err.Error()}
	}
	if err := cf.resolve(); err != nil {
		return err
	}
	m, err := cf.client().SetDraining(ctx, pos[0], draining)
	if err != nil {
		return err
	}
	if cf.json() {
		return writeJSON(env.Stdout, m)
	}
	msg := fmt.Sprintf("machine %s is %s", m.Name, m.State)
	if draining {
		held := len(m.Devices) - m.Free
		msg += fmt.Sprintf("; nothing new is placed on it (%d GPUs still held; see arbiter ps --machine %s)", held, m.Name)
	}
	_, err = fmt.Fprintln(env.Stdout, msg)
	return err
}

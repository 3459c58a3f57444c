package cli

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdAudit lists the audit trail (admin): admin actions and refused
// requests, newest first. -o json prints the entries.
func cmdAudit(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "audit", "")
	var f arbiter.AuditFilter
	fs.StringVar(&f.Kind, "kind", "", "only action (admin actions) or refused (refused requests)")
	fs.IntVar(&f.Limit, "limit", 50, "at most this many entries (1 to 1000)")
	fs.Int64Var(&f.Before, "before", 0, "only entries older than this sequence number (the next page)")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	switch f.Kind {
	case "", arbiter.AuditAction, arbiter.AuditRefused:
	default:
		return Usagef("--kind %q: want action or refused", f.Kind)
	}
	if f.Limit < 1 || f.Limit > 1000 {
		return Usagef("--limit %d: want 1 to 1000", f.Limit)
	}
	page, err := cf.Client().Audit(ctx, f)
	if err != nil {
		return err
	}
	if cf.JSON() {
		return WriteJSON(env.Stdout, nonNil(page.Entries))
	}
	if len(page.Entries) == 0 {
		_, err := fmt.Fprintln(env.Stdout, "the audit trail is empty")
		return err
	}
	now := time.Now()
	tw := newTable(env.Stdout, 0)
	fmt.Fprintln(tw, "SEQ\tWHEN\tKIND\tWHO\tFROM\tACTION\tSTATUS\tDETAIL")
	for _, e := range page.Entries {
		who := orDash(e.Principal)
		if e.Via != "" {
			who += " (" + safe(e.Via) + ")"
		}
		status := "-"
		if e.Status != 0 {
			status = strconv.Itoa(e.Status)
		}
		detail := e.Target
		if e.Detail != "" {
			detail += ": " + e.Detail
		}
		if e.Count > 1 {
			detail = fmt.Sprintf("×%d until %s: %s", e.Count, ago(*e.Until, now), detail)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, ago(e.Time, now), e.Kind, who, orDash(e.Address),
			safe(e.Action), status, orDash(arbiter.ClipLine(detail, 120)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next > 0 {
		fmt.Fprintf(env.Stderr, "older entries: arbiter audit --before %d\n", page.Next)
	}
	return nil
}

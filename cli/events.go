package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/arbiter-hq/arbiter"
)

// cmdEvents follows the event stream until interrupted. It is the one client
// command that streams: with -o json it prints one JSON event per line
// (NDJSON) rather than one document, so that a pipe sees each event as it
// happens.
func cmdEvents(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "events", "")
	since := fs.Int64("since", -1, "print the events after this sequence number first (-1: none, only new events)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter events [flags]\n\n"+
			"Follows the event stream until interrupted, one line per event.\n"+
			"With -o json each line is one JSON event (NDJSON), not one document.\n\nflags:\n")
		fs.PrintDefaults()
	}
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return HelpOK(err)
	}
	if len(pos) > 0 {
		return Usagef("unexpected argument %q", pos[0])
	}
	if *since < -1 {
		return Usagef("--since %d: want a sequence number, 0 for the whole stored history", *since)
	}
	if err := cf.Resolve(); err != nil {
		return err
	}
	enc := json.NewEncoder(jsonOut(env.Stdout))
	return cf.Client().Events(ctx, *since, func(ev arbiter.Event) error {
		if cf.JSON() {
			return enc.Encode(ev)
		}
		return printEvent(env.Stdout, ev)
	})
}

// printEvent prints one event on one line: local time, seq, kind, subject,
// and the few fields of its record a person looks for.
func printEvent(w io.Writer, ev arbiter.Event) error {
	_, err := fmt.Fprintf(w, "%s  %6d  %-22s  %-18s  %s\n", ev.Time.Local().Format("2006-01-02 15:04:05"),
		ev.Seq, safe(ev.Kind), safe(ev.Subject), safe(arbiter.EventSummary(ev)))
	return err
}

package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	osuser "os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/client"
)

// Defaults the client commands share (docs/reference/native.md).
const (
	DefaultURL = "http://127.0.0.1:7070"
	outTable   = "table"
	outJSON    = "json"
)

// ClientFlags are the flags every client command takes. The URL and token
// defaults come from the environment after parsing, so that -h never
// prints a token.
type ClientFlags struct {
	env    *Env
	url    string
	token  string
	output string
	// more are the outputs besides table and json a command offers (csv).
	more []string
}

// NewClientFlags returns a flag set for a client command with the common
// flags registered. Parse it with ParseFlags.
func NewClientFlags(env *Env, name, args string) (*flag.FlagSet, *ClientFlags) {
	fs := flag.NewFlagSet("arbiter "+name, flag.ContinueOnError)
	cf := &ClientFlags{env: env}
	fs.StringVar(&cf.url, "url", "", "server URL, or the replicas' separated by commas (default $ARBITER_URL, else "+DefaultURL+")")
	fs.StringVar(&cf.token, "token", "", "bearer token (default $ARBITER_TOKEN)")
	fs.StringVar(&cf.output, "o", outTable, "output: table or json")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: arbiter %s [flags]%s\n\nflags:\n", name, args)
		fs.PrintDefaults()
	}
	return fs, cf
}

// errHelp means -h was asked for and the usage was printed: exit 0.
var errHelp = errors.New("help requested")

// ParseFlags parses args, allowing flags after positional arguments when
// interspersed is set (`arbiter release 12 --reason done`), and returns the
// positional arguments. -h prints the usage and returns errHelp (see
// HelpOK). A parse error comes back as a UsageError that says what was
// wrong first, suggests the flag that was probably meant, and points to -h
// rather than printing the whole usage.
func ParseFlags(env *Env, fs *flag.FlagSet, args []string, interspersed bool) ([]string, error) {
	// The flag package prints its error and the usage itself; keep it quiet
	// and say it once, through Run's UsageError.
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		err := fs.Parse(args)
		if err != nil {
			fs.SetOutput(env.Stderr)
			if errors.Is(err, flag.ErrHelp) {
				fs.Usage()
				return nil, errHelp
			}
			return nil, UsageError{flagError(fs, err)}
		}
		args = fs.Args()
		if !interspersed || len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	fs.SetOutput(env.Stderr)
	return append(pos, args...), nil
}

// flagError words a flag parse error for a person: the flag package's
// message, the flag that was probably meant for an unknown one, and where
// to find the rest.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + name
		if near := nearestFlag(fs, name); near != "" {
			msg += " (did you mean --" + near + "?)"
		}
	}
	return msg + "; run '" + fs.Name() + " -h' for its flags"
}

// nearestFlag is the defined flag closest to name: one that starts with it
// or that it starts with, else one a single edit away; "" for none.
func nearestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", 2
	fs.VisitAll(func(f *flag.Flag) {
		d := arbiter.EditDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) || strings.HasPrefix(name, f.Name) {
			d = min(d, 1)
		}
		if d < bestD || (d == bestD && best != "" && f.Name < best) {
			best, bestD = f.Name, d
		}
	})
	return best
}

// helpOK turns errHelp into success, for commands to return.
// parseArgs parses a client command's flags (they may follow the
// arguments), requires exactly n positional arguments — what describes them
// in the usage error, e.g. "exactly one task ID" — and resolves the common
// client flags. Return its error through helpOK: after -h (the usage was
// printed) the command ends without error.
func parseArgs(env *Env, fs *flag.FlagSet, cf *ClientFlags, args []string, n int, what string) ([]string, error) {
	pos, err := ParseFlags(env, fs, args, true)
	if err != nil {
		return nil, err
	}
	switch {
	case n == 0 && len(pos) > 0:
		return nil, Usagef("unexpected argument %q", pos[0])
	case len(pos) != n:
		return nil, Usagef("want %s, got %d arguments", what, len(pos))
	}
	return pos, cf.Resolve()
}

func HelpOK(err error) error {
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

// resolve fills the defaults from the environment and checks the flags.
func (cf *ClientFlags) Resolve() error {
	var err error
	if cf.url, err = serverURL(cf.env, cf.url); err != nil {
		return err
	}
	if cf.token == "" {
		cf.token = cf.env.Getenv("ARBITER_TOKEN")
	}
	if cf.output != outTable && cf.output != outJSON && !slices.Contains(cf.more, cf.output) {
		return Usagef("-o %q: want %s", cf.output, strings.Join(append([]string{outTable, outJSON}, cf.more...), ", "))
	}
	return nil
}

// client returns a client for the resolved flags.
func (cf *ClientFlags) Client() *client.Client { return client.New(cf.url, cf.token) }

func (cf *ClientFlags) JSON() bool { return cf.output == outJSON }

// writeJSON prints v as one indented JSON document.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(jsonOut(w))
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// parseID parses an allocation id argument. Spaces around it are
// ignored: an id cut out of another command's output often keeps them.
func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || id <= 0 {
		return 0, Usagef("allocation id %q must be a positive integer (see arbiter ps)", s)
	}
	return id, nil
}

// defaultOwner is $USER@hostname, the owner recorded for allocations made
// from this shell. Without $USER or $LOGNAME (cron, systemd, docker exec)
// the user is the account the process runs as.
func defaultOwner(env *Env) string {
	user := env.Getenv("USER")
	if user == "" {
		user = env.Getenv("LOGNAME")
	}
	if user == "" {
		if u, err := osuser.Current(); err == nil && u.Username != "" && arbiter.ValidateText("user", u.Username, 64) == nil {
			user = u.Username
		}
	}
	if user == "" {
		user = "unknown"
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return user
	}
	return user + "@" + host
}

// ago says how long before now t was, for people: "12s ago", "3m ago".
// Times after now read "in 40s".
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + shortDuration(-d)
	}
	if d < time.Second {
		return "just now"
	}
	return shortDuration(d) + " ago"
}

// shortDuration prints d in its largest unit: 40s, 3m, 2h, 5d.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 10*time.Hour && int(d.Minutes())%60 != 0:
		// "1h59m", not "1h": a 2h keepalive just refreshed must not read
		// as half of it.
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// seconds prints a number of seconds briefly: 60s, 1.5s, 2m, 1h.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Minute && d%time.Minute == 0 {
		return shortDuration(d)
	}
	return strconv.FormatFloat(s, 'f', -1, 64) + "s"
}

// gib prints a size in GiB without needless decimals.
func gib(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64) + "GiB"
}

// deviceIndices returns the indices of an allocation's devices, sorted, as
// CUDA_VISIBLE_DEVICES wants them: "0,2,3".
func deviceIndices(devs []arbiter.DeviceRef) string {
	idx := make([]int, len(devs))
	for i, d := range devs {
		idx[i] = d.Index
	}
	slices.Sort(idx)
	parts := make([]string, len(idx))
	for i, v := range idx {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

// StringList is a repeatable string flag.
type StringList []string

func (l *StringList) String() string { return strings.Join(*l, ",") }
func (l *StringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// Offer lets -o take these outputs too (csv), for a command that writes them.
func (cf *ClientFlags) Offer(outputs ...string) { cf.more = append(cf.more, outputs...) }

// Output is the -o value: table, json, or one the command offered.
func (cf *ClientFlags) Output() string { return cf.output }

// URL is the server URL, once resolved.
func (cf *ClientFlags) URL() string { return cf.url }

// Token is the bearer token, once resolved ("" for none).
func (cf *ClientFlags) Token() string { return cf.token }

// nonNil is s, or an empty slice for nil: a list printed as JSON is [],
// never null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// printList prints what a list command fetched: the items as JSON with
// -o json, else empty when there are none (unless empty is ""), else a
// table — header, then what row writes for each item, tab-separated.
func printList[T any](env *Env, cf *ClientFlags, items []T, empty, header string, row func(tw io.Writer, item T)) error {
	if cf.JSON() {
		return WriteJSON(env.Stdout, nonNil(items))
	}
	if len(items) == 0 && empty != "" {
		_, err := fmt.Fprintln(env.Stdout, empty)
		return err
	}
	tw := newTable(env.Stdout, 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		row(tw, it)
	}
	return tw.Flush()
}

// table lines up tab-separated columns. It is a tabwriter over a buffer:
// a tabwriter alone writes each cell with a write of its own, a system
// call each on a terminal or a pipe (~1,850 for a listing of a hundred
// allocations); through the buffer the table goes out in a few writes.
type table struct {
	*tabwriter.Writer
	buf *bufio.Writer
}

// newTable returns a table writing to w, its columns two spaces apart;
// flags are tabwriter's (tabwriter.AlignRight for numbers). The buffer is
// under w's escaping (a termWriter escapes each write on its own, and the
// tabwriter writes whole cells; a buffer above it would cut a character
// in two at its size).
func newTable(w io.Writer, flags uint) *table {
	b := bufio.NewWriter(rawOut(w))
	var out io.Writer = b
	if _, ok := w.(*termWriter); ok {
		out = newTermWriter(b)
	}
	return &table{Writer: tabwriter.NewWriter(out, 0, 4, 2, ' ', flags), buf: b}
}

// Flush writes what is left of the table.
func (t *table) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	return t.buf.Flush()
}

// serverURL is the server's URL: --url's value when given, else
// $ARBITER_URL, else DefaultURL. Several replicas of one server are a
// comma-separated list, tried in turn (client.ParseURLs). Errors: a usage
// error naming where the malformed value came from.
func serverURL(env *Env, flagValue string) (string, error) {
	u, from := flagValue, "--url"
	if u == "" {
		u, from = env.Getenv("ARBITER_URL"), "ARBITER_URL"
	}
	if u == "" {
		return DefaultURL, nil
	}
	if _, err := client.ParseURLs(u); err != nil {
		return "", Usagef("%s %q is not an http:// or https:// URL like %s (or several, separated by commas)", from, u, DefaultURL)
	}
	return u, nil
}

// durationVar defines a duration flag that takes a Go duration ("90s",
// "15m") or a plain number of seconds ("90"), as --ttl and --keepalive
// do; negative is refused.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationValue{p}, name, usage)
}

type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if secs, ferr := strconv.ParseFloat(s, 64); ferr == nil && !math.IsNaN(secs) && !math.IsInf(secs, 0) && math.Abs(secs) < 1e9 {
		d, err = time.Duration(secs*float64(time.Second)), nil
	}
	if err != nil {
		return errors.New("want a duration such as 15m or a number of seconds")
	}
	if d < 0 {
		return errors.New("want 0 or more, such as 15m or 900")
	}
	*v.d = d
	return nil
}

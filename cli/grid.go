package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// cmdReload makes the server read its configuration file again, as SIGHUP
// does (admin): grid machines, [spalloc] settings and the task manifest.
// -o json prints {"reloaded": […]}.
func cmdReload(ctx context.Context, env *Env, args []string) error {
	fs, cf := NewClientFlags(env, "reload", "")
	if _, err := parseArgs(env, fs, cf, args, 0, ""); err != nil {
		return HelpOK(err)
	}
	done, err := cf.Client().Reload(ctx)
	if err != nil {
		return err
	}
	done = nonNil(done)
	if cf.JSON() {
		return WriteJSON(env.Stdout, map[string][]string{"reloaded": done})
	}
	if len(done) == 0 {
		_, err = fmt.Fprintln(env.Stdout, "nothing to reload")
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "reloaded: %s\n", strings.Join(done, ", "))
	return err
}

// printGridStatus prints a grid machine's boards grouped by holder, not one
// line per board: a machine may have thousands.
func printGridStatus(w io.Writer, m *arbiter.MachineStatus, now time.Time) {
	g := m.Grid
	fmt.Fprintf(w, "\n%s: grid of %d×%d triads, %d boards (%d dead), %d free, queue %s, priority %d\n",
		m.Name, g.Width, g.Height, len(m.Devices), g.DeadBoards, m.Free, g.Queue, g.Priority)
	type holder struct {
		id       int64
		owner    string
		since    *time.Time
		boards   []string
		settling bool
	}
	var hs []*holder
	byID := map[int64]*holder{}
	for _, d := range m.Devices {
		if d.Allocation == nil || d.Board == nil {
			continue
		}
		h := byID[*d.Allocation]
		if h == nil {
			h = &holder{id: *d.Allocation, owner: arbiter.ShortOwner(arbiter.StrOr(d.Owner, "?")), since: d.Since, settling: d.Board.Settling}
			byID[h.id] = h
			hs = append(hs, h)
		}
		h.boards = append(h.boards, fmt.Sprintf("(%d,%d,%d)", d.Board.X, d.Board.Y, d.Board.Z))
	}
	if len(hs) == 0 {
		return
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].id < hs[j].id })
	tw := newTable(w, 0)
	fmt.Fprintln(tw, "  ALLOCATION\tHOLDER\tBOARDS\tSINCE")
	for _, h := range hs {
		since := "-"
		if h.since != nil {
			since = ago(*h.since, now)
		}
		owner := h.owner
		if h.settling {
			owner = "(settling)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", h.id, owner, boardList(h.boards), since)
	}
	tw.Flush()
}

// boardList shows a few boards and how many more.
func boardList(bs []string) string {
	if len(bs) <= 4 {
		return strings.Join(bs, " ")
	}
	return fmt.Sprintf("%s … (%d boards)", strings.Join(bs[:3], " "), len(bs))
}

// allocBoards shows a grid allocation's boards, or its request while
// queued.
func allocBoards(a arbiter.Allocation) string {
	if len(a.Boards) > 0 {
		bs := make([]string, len(a.Boards))
		for i, b := range a.Boards {
			bs[i] = b.String()
		}
		return boardList(bs)
	}
	switch g := a.Request.Grid; g.Form {
	case arbiter.GridBoards:
		return fmt.Sprintf("(%d boards)", g.Boards)
	case arbiter.GridBlock:
		return fmt.Sprintf("(%d×%d triads)", g.Width, g.Height)
	case arbiter.GridBoard:
		return fmt.Sprintf("(board %v)", g.Board)
	}
	return "(1 board)"
}

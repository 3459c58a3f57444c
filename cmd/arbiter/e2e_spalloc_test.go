package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/bmp"
	"github.com/arbiter-hq/arbiter/cli"
	"github.com/arbiter-hq/arbiter/client"
	"github.com/arbiter-hq/arbiter/clock"
	"github.com/arbiter-hq/arbiter/poll"
)

// gridConfig is a server with one 4×2 grid machine "m" (with dead boards
// given as a TOML array) and the spalloc listener on a free port.
func gridConfig(extra string) string {
	return `
[server]
spalloc_listen = "127.0.0.1:0"

[spalloc]
seconds_before_free = 5
max_retired_jobs = 3

[[grid_machines]]
name = "m"
width = 4
height = 2
locations = "identity"
base_ip = "10.11.0.0"
power_delay_s = 1
` + extra
}

// rawConn is a spalloc client speaking raw JSON lines, as the spalloc
// library does.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialSpalloc(t *testing.T, m *serverMain) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", m.SpallocAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (r *rawConn) send(line string) {
	r.t.Helper()
	if _, err := r.c.Write([]byte(line + "\n")); err != nil {
		r.t.Fatalf("send %s: %v", line, err)
	}
}

// recv reads one line (without "\n"); "" and an error at EOF.
func (r *rawConn) recv() (string, error) {
	r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := r.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func (r *rawConn) mustRecv() string {
	r.t.Helper()
	line, err := r.recv()
	if err != nil {
		r.t.Fatalf("recv: %v (got %q)", err, line)
	}
	return line
}

// call sends a request and returns the reply line.
func (r *rawConn) call(line string) string {
	r.t.Helper()
	r.send(line)
	return r.mustRecv()
}

// expect sends a request and checks the reply line exactly.
func (r *rawConn) expect(line, want string) {
	r.t.Helper()
	if got := r.call(line); got != want {
		r.t.Fatalf("%s\n got  %s\n want %s", line, got, want)
	}
}

// ret decodes a reply's "return" value into v.
func (r *rawConn) ret(line string, v any) {
	r.t.Helper()
	reply := r.call(line)
	var env struct {
		Return    json.RawMessage `json:"return"`
		Exception *string         `json:"exception"`
	}
	if err := json.Unmarshal([]byte(reply), &env); err != nil || env.Exception != nil {
		r.t.Fatalf("%s: %s", line, reply)
	}
	if err := json.Unmarshal(env.Return, v); err != nil {
		r.t.Fatalf("%s: %s: %v", line, reply, err)
	}
}

// closed checks that the server closed the connection without a reply.
func (r *rawConn) closed() {
	r.t.Helper()
	if line, err := r.recv(); err == nil {
		r.t.Fatalf("got %q, want the connection closed without a reply", line)
	}
}

// tick moves the fake clock and lets the server act on it.
func tick(m *serverMain, clk *clock.Fake, d time.Duration) {
	clk.Advance(d)
	m.loop.Wake()
}

// waitState polls get_job_state until the job is in state want.
func waitState(t *testing.T, c *rawConn, id int64, want int) map[string]any {
	t.Helper()
	var st map[string]any
	err := poll.Try(10*time.Second, func() error {
		c.ret(fmt.Sprintf(`{"command": "get_job_state", "args": [%d], "kwargs": {}}`, id), &st)
		if int(st["state"].(float64)) != want {
			return fmt.Errorf("job %d: state %v, want %d", id, st["state"], want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSpallocJobLifeCycle(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 4, 5, 6, 7, 250000000, time.UTC))
	m, _ := startServer(t, gridConfig(""), clk, "--no-local")
	c := dialSpalloc(t, m)
	c.expect(`{"command": "version", "args": [], "kwargs": {}}`, `{"return": "1.0.0"}`)
	c.expect(`{"command": "list_machines", "args": [], "kwargs": {}}`,
		`{"return": [{"name": "m", "tags": ["default"], "width": 4, "height": 2, "dead_boards": [], "dead_links": []}]}`)
	// The current client's create_job: every kwarg, most of them null.
	c.expect(`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "keepalive": 60.0, "machine": null, "tags": null, "min_ratio": 0.333, "max_dead_boards": 0, "max_dead_links": null, "require_torus": false}}`,
		`{"return": 1}`)
	c.expect(`{"command": "get_job_state", "args": [1], "kwargs": {}}`,
		`{"return": {"state": 2, "power": true, "keepalive": 60.0, "reason": null, "start_time": 1772600767.25, "keepalivehost": "127.0.0.1"}}`)
	tick(m, clk, time.Second)
	waitState(t, c, 1, 3)
	c.expect(`{"command": "get_job_machine_info", "args": [1], "kwargs": {}}`,
		`{"return": {"width": 8, "height": 8, "connections": [[[0, 0], "10.11.0.1"]], "machine_name": "m", "boards": [[0, 0, 0]]}}`)
	c.expect(`{"command": "list_jobs", "args": [], "kwargs": {}}`,
		`{"return": [{"job_id": 1, "owner": "me", "start_time": 1772600767.25, "keepalive": 60.0, "state": 3, "power": true, "args": [], "kwargs": {"machine":null,"max_dead_boards":0,"max_dead_links":null,"min_ratio":0.333,"require_torus":false,"tags":null}, "allocated_machine_name": "m", "boards": [[0, 0, 0]], "keepalivehost": "127.0.0.1"}]}`)
	c.expect(`{"command": "where_is", "args": [], "kwargs": {"machine": "m", "x": 0, "y": 0, "z": 0}}`,
		`{"return": {"machine": "m", "logical": [0, 0, 0], "physical": [0, 0, 0], "chip": [0, 0], "board_chip": [0, 0], "job_id": 1, "job_chip": [0, 0]}}`)
	c.expect(`{"command": "destroy_job", "args": [1, null], "kwargs": {}}`, `{"return": null}`)
	c.expect(`{"command": "get_job_state", "args": [1], "kwargs": {}}`,
		`{"return": {"state": 4, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`)
	c.expect(`{"command": "get_job_state", "args": [99], "kwargs": {}}`,
		`{"return": {"state": 0, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`)
}

// quiet checks that nothing more arrives for a moment.
func (r *rawConn) quiet() {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if line, err := r.r.ReadString('\n'); err == nil {
		r.t.Fatalf("unexpected message %q", line)
	}
}

func (r *rawConn) expectLine(want string) {
	r.t.Helper()
	if got := r.mustRecv(); got != want {
		r.t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// expectChanges reads notifications until every job and machine named has
// been said to change, in whatever grouping: the notifier may fold the
// events of batches committed close together into one notification.
func (r *rawConn) expectChanges(jobs []int64, machines []string) {
	r.t.Helper()
	wantJ, wantM := map[int64]bool{}, map[string]bool{}
	for _, j := range jobs {
		wantJ[j] = true
	}
	for _, m := range machines {
		wantM[m] = true
	}
	for len(wantJ) > 0 || len(wantM) > 0 {
		line := r.mustRecv()
		var n struct {
			Jobs     []int64  `json:"jobs_changed"`
			Machines []string `json:"machines_changed"`
		}
		if err := json.Unmarshal([]byte(line), &n); err != nil || (n.Jobs == nil && n.Machines == nil) {
			r.t.Fatalf("got %q, want a jobs_changed or machines_changed notification", line)
		}
		for _, j := range n.Jobs {
			if !wantJ[j] && !slices.Contains(jobs, j) {
				r.t.Fatalf("job %d said to change (in %q), want only %v", j, line, jobs)
			}
			delete(wantJ, j)
		}
		for _, m := range n.Machines {
			if !wantM[m] && !slices.Contains(machines, m) {
				r.t.Fatalf("machine %s said to change (in %q), want only %v", m, line, machines)
			}
			delete(wantM, m)
		}
	}
}

func TestSpallocNotifications(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	m, _ := startServer(t, gridConfig(""), clk, "--no-local")
	a, b := dialSpalloc(t, m), dialSpalloc(t, m)
	a.expect(`{"command": "notify_job", "args": [], "kwargs": {}}`, `{"return": null}`)
	a.expect(`{"command": "notify_machine", "args": [null], "kwargs": {}}`, `{"return": null}`)
	b.expect(`{"command": "notify_job", "args": [7], "kwargs": {}}`, `{"return": null}`)
	b.expect(`{"command": "notify_job", "args": [], "kwargs": {"job_id": 1}}`, `{"return": null}`)

	// The reply first, then one message per kind.
	b.expect(`{"command": "create_job", "args": [1], "kwargs": {"owner": "b"}}`, `{"return": 1}`)
	b.expectLine(`{"jobs_changed": [1]}`)
	a.expectLine(`{"jobs_changed": [1]}`)
	a.expectLine(`{"machines_changed": ["m"]}`)

	// Power completes: the job changes, the machine does not.
	tick(m, clk, time.Second)
	a.expectLine(`{"jobs_changed": [1]}`)
	b.expectLine(`{"jobs_changed": [1]}`)

	// Power off and on: each goes through state 2 and back.
	b.expect(`{"command": "power_off_job_boards", "args": [1], "kwargs": {}}`, `{"return": null}`)
	b.expectLine(`{"jobs_changed": [1]}`)
	a.expectLine(`{"jobs_changed": [1]}`)
	waitState(t, b, 1, 2)
	tick(m, clk, time.Second)
	b.expectLine(`{"jobs_changed": [1]}`)
	a.expectLine(`{"jobs_changed": [1]}`)
	if st := waitState(t, b, 1, 3); st["power"] != false {
		t.Fatalf("after power off: %v", st)
	}

	// b stops watching 1; a queued job 2 is only a's business.
	b.expect(`{"command": "no_notify_job", "args": [1], "kwargs": {}}`, `{"return": null}`)
	b.expect(`{"command": "create_job", "args": [4, 2], "kwargs": {"owner": "b"}}`, `{"return": 2}`)
	a.expectLine(`{"jobs_changed": [2]}`)
	b.expect(`{"command": "destroy_job", "args": [1], "kwargs": {"reason": "done"}}`, `{"return": null}`)
	a.expectLine(`{"jobs_changed": [1]}`)
	a.expectLine(`{"machines_changed": ["m"]}`)
	b.quiet()
	// After seconds_before_free the whole machine is free: job 2 runs.
	tick(m, clk, 5*time.Second)
	a.expectLine(`{"jobs_changed": [2]}`)
	a.expectLine(`{"machines_changed": ["m"]}`)
	a.expect(`{"command": "no_notify_job", "args": [], "kwargs": {}}`, `{"return": null}`)
	a.expect(`{"command": "no_notify_machine", "args": [], "kwargs": {}}`, `{"return": null}`)
	b.expect(`{"command": "destroy_job", "args": [2], "kwargs": {}}`, `{"return": null}`)
	a.quiet()
	b.expect(`{"command": "get_job_state", "args": [1], "kwargs": {}}`,
		`{"return": {"state": 4, "power": null, "keepalive": null, "reason": "done", "start_time": null, "keepalivehost": null}}`)
}

func TestSpallocErrorsKeepTheConnection(t *testing.T) {
	m, _ := startServer(t, gridConfig(""), nil, "--no-local")
	c := dialSpalloc(t, m)
	for _, tc := range []struct{ req, want string }{
		{`{"command": "create_job", "args": [], "kwargs": {}}`, `{"exception": "owner must be specified for all jobs"}`},
		{`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "machine": "m", "tags": ["default"]}}`, `{"exception": "Only one of machine and tags may be specified for a job."}`},
		{`{"command": "create_job", "args": [1, 1, 1], "kwargs": {"owner": "me", "require_torus": true}}`, `{"exception": "require_torus must be False when allocating boards."}`},
		{`{"command": "create_job", "args": [1, 2, 3, 4], "kwargs": {"owner": "me"}}`, ""},
		{`{"command": "get_job_state", "args": [], "kwargs": {}}`, ""},
		{`{"command": "get_job_state", "args": ["x"], "kwargs": {}}`, ""},
		{`{"command": "where_is", "args": [], "kwargs": {"machine": "m", "x": 0}}`, ""},
		// Tags and a machine that would drive a terminal are refused.
		{`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "tags": ["x\u001b[2Jy"]}}`, ""},
		{`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "machine": "m\r\u001b[1A"}}`, ""},
	} {
		got := c.call(tc.req)
		if tc.want != "" && got != tc.want {
			t.Errorf("%s\n got  %s\n want %s", tc.req, got, tc.want)
		}
		if !strings.HasPrefix(got, `{"exception": "`) {
			t.Errorf("%s: %s, want an exception", tc.req, got)
		}
	}
	// No id was used by the failures.
	c.expect(`{"command": "create_job", "args": [], "kwargs": {"owner": "me"}}`, `{"return": 1}`)
	// A destroy reason is kept as text: what could drive a terminal
	// escaped, a long one cut between characters.
	c.call(`{"command": "destroy_job", "args": [1, "done\u001b[2J\n\u202e` + strings.Repeat("é", 600) + `"]}`)
	a, _ := m.loop.Allocation(1)
	if r := arbiter.StrOr(a.Reason, ""); !strings.HasPrefix(r, `done\x1b[2J\n\u202e`) || arbiter.ValidateText("reason", r, 1<<20) != nil || len(r) > 1100 {
		t.Errorf("stored reason %q: want it escaped, valid and bounded", arbiter.Clip(r, 80))
	}
	// A request that cannot be dispatched closes the connection, and only it.
	other := dialSpalloc(t, m)
	for _, bad := range []string{`not json`, `[1]`, `{"args": []}`, `{"command": "nope"}`, `{"command": "version", "args": {}}`, "{\"command\": \"version\", \"kwargs\": {\"x\": \"\xff\"}}", strings.Repeat("x", 70000)} {
		d := dialSpalloc(t, m)
		d.send(bad)
		d.closed()
	}
	other.expect(`{"command": "version"}`, `{"return": "1.0.0"}`)
	c.expect(`{"command": "get_job_state", "kwargs": {"job_id": 1}}`,
		c.call(`{"command": "get_job_state", "args": [1]}`))
}

func TestSpallocPlacementsAndReasons(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	m, _ := startServer(t, gridConfig("dead_boards = [[0, 0, 2]]\n"), clk, "--no-local")
	c := dialSpalloc(t, m)
	create := func(args string, kwargs string) int64 {
		var id int64
		c.ret(`{"command": "create_job", "args": `+args+`, "kwargs": {"owner": "me", "keepalive": null`+kwargs+`}}`, &id)
		return id
	}
	info := func(id int64) (boards [][3]int) {
		var mi struct{ Boards [][3]int }
		c.ret(fmt.Sprintf(`{"command": "get_job_machine_info", "args": [%d]}`, id), &mi)
		return mi.Boards
	}
	reason := func(id int64) any {
		var st map[string]any
		c.ret(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, id), &st)
		return st["reason"]
	}
	// 24 boards cannot be had without dead ones; 23 take the whole machine.
	bad := create(`[24]`, `, "max_dead_boards": 0`)
	if r := reason(bad); r != "Cancelled: No suitable machines available." {
		t.Fatalf("24 boards: %v", r)
	}
	whole := create(`[23]`, `, "max_dead_boards": 0`)
	if n := len(info(whole)); n != 23 {
		t.Fatalf("23 boards: got %d", n)
	}
	c.call(fmt.Sprintf(`{"command": "destroy_job", "args": [%d]}`, whole))
	tick(m, clk, 5*time.Second)
	// Single boards: the triad with the dead board first, its live boards.
	var got []string
	for i := 0; i < 4; i++ {
		got = append(got, fmt.Sprint(info(create(`[]`, ""))))
	}
	if want := "[[[0 0 0]] [[0 0 1]] [[0 1 0]] [[0 1 1]]]"; fmt.Sprint(got) != want {
		t.Fatalf("single boards %v, want %v", got, want)
	}
	// Three-arg form on a dead board: impossible; on a held one: queued.
	if r := reason(create(`[0, 0, 2]`, `, "machine": "m", "tags": null`)); r != "Cancelled: No suitable machines available." {
		t.Fatalf("dead board: %v", r)
	}
	q := create(`[0, 0, 0]`, `, "machine": "m"`)
	var st map[string]any
	c.ret(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, q), &st)
	if st["state"] != 1.0 || st["power"] != nil {
		t.Fatalf("held board: %v, want queued with power null", st)
	}
	c.call(fmt.Sprintf(`{"command": "destroy_job", "args": [%d, "changed my mind"]}`, q))
	if r := reason(q); r != "Cancelled: changed my mind" {
		t.Fatalf("cancelled: %v", r)
	}
	// Keepalive expiry; then retired jobs beyond max_retired_jobs (3) are
	// unknown.
	k := create(`[]`, "")
	c.call(fmt.Sprintf(`{"command": "destroy_job", "args": [%d]}`, k))
	short := int64(0)
	c.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "keepalive": 5}}`, &short)
	tick(m, clk, 6*time.Second)
	if r := reason(short); r != "Job timed out." {
		t.Fatalf("expired: %v", r)
	}
	var old map[string]any
	c.ret(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, bad), &old)
	if old["state"] != 0.0 {
		t.Fatalf("job %d beyond max_retired_jobs: %v, want state 0", bad, old)
	}
}

func TestSpallocReloadByAdminAPI(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	twoMachines := gridConfig(`
[[grid_machines]]
name = "n"
single_board = { ip = "10.12.0.1", controller = "10.12.0.0" }
`)
	m, url := startServer(t, twoMachines, clk, "--no-local")
	c, w := dialSpalloc(t, m), dialSpalloc(t, m)
	w.expect(`{"command": "notify_machine", "args": [], "kwargs": {}}`, `{"return": null}`)
	w.expect(`{"command": "notify_job", "args": [], "kwargs": {}}`, `{"return": null}`)
	var onM, onN, queued int64
	c.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "keepalive": null}}`, &onM)
	c.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "keepalive": null, "machine": "n"}}`, &onN)
	c.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me", "keepalive": null, "machine": "n"}}`, &queued)
	w.expectChanges([]int64{onM, onN, queued}, []string{"m", "n"}) // the queued one changes no machine

	// m loses a board and gets a tag: its job stays. n becomes a 1×1 triad
	// of its own (a new layout): removed and added again, its job ends, the
	// queued one now fits. list_machines follows the file's order.
	path := m.cfg.Path
	next := strings.Replace(twoMachines, `base_ip = "10.11.0.0"`, `base_ip = "10.11.0.0"`+"\ndead_boards = [[3, 1, 2]]\ntags = [\"default\", \"big\"]", 1)
	next = strings.Replace(next, `single_board = { ip = "10.12.0.1", controller = "10.12.0.0" }`, "width = 1\nheight = 1\nlocations = \"identity\"\nbase_ip = \"10.12.0.0\"", 1)
	if err := os.WriteFile(path, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := cmdline(t, url, "reload")
	if code != 0 || out != "reloaded: configuration\n" {
		t.Fatalf("reload: %d %q %q", code, out, errs)
	}
	w.expectChanges([]int64{2, 3}, []string{"m", "n"})
	c.expect(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, onN),
		`{"return": {"state": 4, "power": null, "keepalive": null, "reason": "Machine removed.", "start_time": null, "keepalivehost": null}}`)
	if st := waitState(t, c, queued, 2); st["keepalivehost"] != "127.0.0.1" {
		t.Fatalf("queued job after reload: %v", st)
	}
	if st := waitState(t, c, onM, 2); st["reason"] != nil {
		t.Fatalf("job on m after reload: %v", st)
	}
	c.expect(`{"command": "list_machines"}`,
		`{"return": [{"name": "m", "tags": ["default", "big"], "width": 4, "height": 2, "dead_boards": [[3, 1, 2]], "dead_links": []}, {"name": "n", "tags": ["default"], "width": 1, "height": 1, "dead_boards": [], "dead_links": []}]}`)

	// A file that does not load changes nothing and says why.
	if err := os.WriteFile(path, []byte(next+"\n[[grid_machines]]\nname = \"x\"\nwidth = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code = cmdline(t, url, "reload")
	if code != 1 || !strings.Contains(errs, "arbiter.toml:26: grid_machines[2].") || !strings.Contains(errs, "previous configuration stays in force") {
		t.Fatalf("broken reload: %d %q", code, errs)
	}
	var ms []map[string]any
	c.ret(`{"command": "list_machines"}`, &ms)
	if len(ms) != 2 {
		t.Fatalf("after a broken file: %d machines", len(ms))
	}
	// The native API lists the grid machines with their boards.
	st := cliJSON[[]arbiter.MachineStatus](t, url, "status")
	if len(st) != 2 || st[0].Kind != arbiter.KindGrid || len(st[0].Devices) != 24 || st[0].Grid == nil || st[0].Free != 22 {
		t.Fatalf("status: %+v", st)
	}
	held := 0
	for _, d := range st[0].Devices {
		if d.Allocation != nil && *d.Allocation == onM {
			held++
		}
	}
	if held != 1 {
		t.Fatalf("status shows job %d on %d boards", onM, held)
	}
	as := cliJSON[[]arbiter.Allocation](t, url, "ps")
	if len(as) != 2 || len(as[0].Boards) != 1 || as[0].Request.Grid == nil {
		t.Fatalf("ps: %+v", as)
	}
	out, _, _ = cmdline(t, url, "status")
	if !strings.Contains(out, "m: grid of 4×2 triads, 24 boards (1 dead), 22 free, queue backfill, priority 0") ||
		!strings.Contains(out, fmt.Sprintf("  %d           me      (0,0,0)", onM)) {
		t.Fatalf("status:\n%s", out)
	}
	out, _, _ = cmdline(t, url, "ps")
	if !strings.Contains(out, "(0,0,0)") || !strings.Contains(out, "power") {
		t.Fatalf("ps:\n%s", out)
	}
}

func TestSpallocAllowList(t *testing.T) {
	m, _ := startServer(t, gridConfig("")+"\n", nil, "--no-local")
	dialSpalloc(t, m).expect(`{"command": "version"}`, `{"return": "1.0.0"}`)
	cfg := strings.Replace(gridConfig(""), "max_retired_jobs = 3", "max_retired_jobs = 3\nallow = [\"10.0.0.0/8\"]", 1)
	m2, _ := startServer(t, cfg, nil, "--no-local")
	c := dialSpalloc(t, m2)
	c.send(`{"command": "version"}`)
	c.closed()
}

// TestSpallocSIGHUP runs the binary with a spalloc listener: SIGHUP applies
// a changed machine; a broken file is refused, logged, and changes nothing.
func TestSpallocSIGHUP(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "a.toml")
	sp := freePort(t)
	conf := func(width int) string {
		return fmt.Sprintf("[server]\nlocal = false\nspalloc_listen = \"127.0.0.1:%s\"\n[[grid_machines]]\nname = \"m\"\nwidth = %d\nheight = 1\nlocations = \"identity\"\nbase_ip = \"10.11.0.0\"\npower_delay_s = 0\n", sp, width)
	}
	os.WriteFile(cfgPath, []byte(conf(1)), 0o600)
	port := freePort(t)
	srv := exec.Command(bin, "server", "--config", cfgPath, "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:"+port)
	logs := &syncBuffer{}
	srv.Stderr = logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGTERM); srv.Wait() })
	// Serving HTTP means the server handles SIGHUP.
	api := client.New("http://127.0.0.1:"+port, "")
	poll.Until(t, 30*time.Second, "the server to serve HTTP", func() bool { _, err := api.Machines(context.Background()); return err == nil })
	var nc net.Conn
	poll.Until(t, 30*time.Second, "the spalloc port to accept", func() bool {
		var err error
		nc, err = net.Dial("tcp", "127.0.0.1:"+sp)
		return err == nil
	})
	defer nc.Close()
	c := &rawConn{t: t, c: nc, r: bufio.NewReader(nc)}
	var id int64
	c.ret(`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "me"}}`, &id)
	os.WriteFile(cfgPath, []byte(conf(2)), 0o600)
	srv.Process.Signal(syscall.SIGHUP)
	err := poll.Try(20*time.Second, func() error {
		var st map[string]any
		c.ret(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, id), &st)
		if st["reason"] != "Machine removed." {
			return fmt.Errorf("job state %v, want the machine removed; server log:\n%s", st, logs.String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(cfgPath, []byte(conf(2)+"queue = \"lifo\"\n"), 0o600)
	srv.Process.Signal(syscall.SIGHUP)
	poll.Until(t, 30*time.Second, "the server to log the failed reload", func() bool { return strings.Contains(logs.String(), "reload failed") })
	if !strings.Contains(logs.String(), "grid_machines[0].queue") {
		t.Errorf("the log does not say what is wrong:\n%s", logs.String())
	}
	c.expect(`{"command": "list_machines"}`, `{"return": [{"name": "m", "tags": ["default"], "width": 2, "height": 1, "dead_boards": [], "dead_links": []}]}`)
}

// startServerWith is startServer with a hook run before Open (to wire an
// external power controller) and a data directory that may be reused.
func startServerWith(t testing.TB, configText, dataDir string, clk *clock.Fake, setup func(*serverMain), extra ...string) (*serverMain, func()) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "arbiter.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o600); err != nil {
		t.Fatal(err)
	}
	env := &cli.Env{Stdout: &strings.Builder{}, Stderr: &syncBuffer{}, Getenv: func(string) string { return "" }}
	args := append([]string{"--config", cfg, "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--no-local"}, extra...)
	m, err := newServerMain(env, args)
	if err != nil {
		t.Fatal(err)
	}
	if clk != nil {
		m.now = clk.Now
	}
	if setup != nil {
		setup(m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatalf("open: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	return m, stop
}

// fakePower is an external power controller the test drives: each frame
// request waits for the test's answer.
type fakePower struct {
	reqs chan bmp.Request
	errs chan error
}

func (f *fakePower) Power(ctx context.Context, r bmp.Request) error {
	select {
	case f.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.Final {
		return nil
	}
	select {
	case err := <-f.errs:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestSpallocExternalPowerController(t *testing.T) {
	f := &fakePower{reqs: make(chan bmp.Request, 16), errs: make(chan error)}
	m, _ := startServerWith(t, gridConfig(""), t.TempDir(), nil, func(m *serverMain) { m.grid.power = f })
	c := dialSpalloc(t, m)
	var id int64
	c.ret(`{"command": "create_job", "args": [2, 1], "kwargs": {"owner": "me"}}`, &id)
	// One request per frame (a 2×1 block: two frames), carried out at once.
	r1, r2 := <-f.reqs, <-f.reqs
	if !r1.On || !r2.On || r1.Frame.Cabinet == r2.Frame.Cabinet || len(r1.Frame.Boards) != 3 || len(r1.Frame.LinksOff) == 0 {
		t.Fatalf("requests %+v %+v", r1, r2)
	}
	f.errs <- nil
	f.errs <- fmt.Errorf("BMP at %s did not answer", r2.Frame.Address) // one of them fails: retried
	retry := <-f.reqs
	if retry.Frame.Attempt != 2 {
		t.Fatalf("retry %+v", retry)
	}
	if st := waitState(t, c, id, 2); st["state"] != 2.0 {
		t.Fatal(st)
	}
	f.errs <- nil
	waitState(t, c, id, 3)
	// Power off: both frames fail twice: the job ends naming a controller.
	c.expect(fmt.Sprintf(`{"command": "power_off_job_boards", "args": [%d]}`, id), `{"return": null}`)
	<-f.reqs
	<-f.reqs
	f.errs <- fmt.Errorf("no route to host")
	f.errs <- fmt.Errorf("no route to host")
	<-f.reqs
	<-f.reqs
	f.errs <- fmt.Errorf("no route to host")
	st := waitState(t, c, id, 4)
	reason, _ := st["reason"].(string)
	if !strings.HasPrefix(reason, "Machine configuration failed. Error: board-management controller 10.11.") || !strings.Contains(reason, "no route to host") {
		t.Fatalf("reason %q", reason)
	}
	// The boards are switched off once more, without waiting for it.
	if r := <-f.reqs; !r.Final || r.On {
		t.Fatalf("final request %+v", r)
	}
}

func TestSpallocSurvivesRestart(t *testing.T) {
	clk := clock.NewFake(time.Now().UTC())
	data := t.TempDir()
	m, stop := startServerWith(t, gridConfig(""), data, clk, nil)
	c := dialSpalloc(t, m)
	var a, b, q int64
	c.ret(`{"command": "create_job", "args": [3, 1], "kwargs": {"owner": "me"}}`, &a)
	c.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me"}}`, &b)
	c.ret(`{"command": "create_job", "args": [4, 2], "kwargs": {"owner": "me"}}`, &q)
	tick(m, clk, time.Second)
	waitState(t, c, a, 3)
	before := c.call(fmt.Sprintf(`{"command": "get_job_machine_info", "args": [%d]}`, a))
	var bInfo struct{ Boards [][3]int }
	c.ret(fmt.Sprintf(`{"command": "get_job_machine_info", "args": [%d]}`, b), &bInfo)
	c.call(fmt.Sprintf(`{"command": "destroy_job", "args": [%d]}`, b))
	stop()

	m2, _ := startServerWith(t, gridConfig(""), data, clk, nil)
	c2 := dialSpalloc(t, m2)
	if got := c2.call(fmt.Sprintf(`{"command": "get_job_machine_info", "args": [%d]}`, a)); got != before {
		t.Fatalf("after restart:\n got  %s\n want %s", got, before)
	}
	waitState(t, c2, a, 3)
	waitState(t, c2, q, 1)
	c2.expect(fmt.Sprintf(`{"command": "get_job_state", "args": [%d]}`, b),
		`{"return": {"state": 4, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`)
	var next int64
	c2.ret(`{"command": "create_job", "args": [], "kwargs": {"owner": "me"}}`, &next)
	if next != q+1 {
		t.Fatalf("next id %d, want %d", next, q+1)
	}
	// b's board is still settling: the new single board is elsewhere.
	var mi struct{ Boards [][3]int }
	c2.ret(fmt.Sprintf(`{"command": "get_job_machine_info", "args": [%d]}`, next), &mi)
	if len(mi.Boards) != 1 || len(bInfo.Boards) != 1 || mi.Boards[0] == bInfo.Boards[0] {
		t.Fatalf("new job's boards %v; the settling job's %v", mi.Boards, bInfo.Boards)
	}
}

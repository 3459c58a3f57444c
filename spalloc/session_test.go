package spalloc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// run sends lines through a new session of peer "10.0.0.9" against b and
// returns the replies, decoded.
func run(t *testing.T, b Backend, lines ...string) []map[string]any {
	t.Helper()
	s := NewSession("10.0.0.9")
	var out []map[string]any
	for _, l := range lines {
		reply, err := s.Handle(b, []byte(l))
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		var m map[string]any
		if err := json.Unmarshal(reply, &m); err != nil {
			t.Fatalf("%s: reply %q is not JSON: %v", l, reply, err)
		}
		if !bytes.HasSuffix(reply, []byte("}\n")) || bytes.Count(reply, []byte("\n")) != 1 {
			t.Fatalf("%s: reply %q is not one line", l, reply)
		}
		out = append(out, m)
	}
	return out
}

func reply1(t *testing.T, b Backend, line string) string {
	t.Helper()
	reply, err := NewSession("10.0.0.9").Handle(b, []byte(line))
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return strings.TrimSuffix(string(reply), "\n")
}

func machine4x2() arbiter.GridMachine { return identityMachine("m", 4, 2, "10.2.0.0") }

// TestExceptions checks every error message of the spec and the messages
// for wrong argument counts and types: each is an exception, the
// connection stays open, and a failing create_job creates nothing.
func TestExceptions(t *testing.T) {
	tests := []struct{ line, msg string }{
		// create_job (docs/reference/spalloc.md §2)
		{`{"command": "create_job"}`, "owner must be specified for all jobs"},
		{`{"command": "create_job", "args": [2], "kwargs": {"owner": null}}`, "owner must be specified for all jobs"},
		{`{"command": "create_job", "kwargs": {"owner": ""}}`, "owner must be specified for all jobs"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "machine": "m", "tags": ["default"]}}`, "Only one of machine and tags may be specified for a job."},
		{`{"command": "create_job", "kwargs": {"owner": "me", "machine": "m", "tags": []}}`, "Only one of machine and tags may be specified for a job."},
		{`{"command": "create_job", "kwargs": {"owner": "me", "machine": ""}}`, "machine must name a machine (see list_machines), not be empty"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "require_torus": true}}`, "require_torus must be False when allocating boards."},
		{`{"command": "create_job", "args": [1], "kwargs": {"owner": "me", "require_torus": true}}`, "require_torus must be False when allocating boards."},
		{`{"command": "create_job", "args": [0, 0, 1], "kwargs": {"owner": "me", "require_torus": true}}`, "require_torus must be False when allocating boards."},
		{`{"command": "create_job", "args": [1, 2, 3, 4], "kwargs": {"owner": "me"}}`, "create_job takes 0 to 3 positional arguments (nothing, n boards, width and height in triads, or x, y, z), not 4"},
		{`{"command": "create_job", "args": ["two"], "kwargs": {"owner": "me"}}`, `create_job() positional argument 1 must be an integer, not "two"`},
		{`{"command": "create_job", "args": [1.5], "kwargs": {"owner": "me"}}`, "create_job() positional argument 1 must be an integer, not 1.5"},
		{`{"command": "create_job", "args": [null], "kwargs": {"owner": "me"}}`, "create_job() positional argument 1 must be an integer, not null"},
		{`{"command": "create_job", "args": [99999999999], "kwargs": {"owner": "me"}}`, "create_job() positional argument 1 must be an integer between -2147483648 and 2147483647, not 99999999999"},
		{`{"command": "create_job", "kwargs": {"owner": 7}}`, "owner must be a string, not 7"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "keepalive": "long"}}`, `keepalive must be a number, not "long"`},
		{`{"command": "create_job", "kwargs": {"owner": "me", "keepalive": -1}}`, "keepalive must be more than 0 and at most 604800 seconds, or null for never"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "machine": 3}}`, "machine must be a string, not 3"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "tags": "default"}}`, `tags must be a list of strings, not "default"`},
		{`{"command": "create_job", "kwargs": {"owner": "me", "tags": [1]}}`, "tags must be a list of strings, not [1]"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "tags": [""]}}`, `a tag must be 1 to 64 characters, not ""`},
		{`{"command": "create_job", "args": [3], "kwargs": {"owner": "me", "min_ratio": "square"}}`, `min_ratio must be a number, not "square"`},
		{`{"command": "create_job", "args": [3], "kwargs": {"owner": "me", "min_ratio": -0.5}}`, "min_ratio must be a number from 0 (any shape) to 1 (square), got -0.5"},
		{`{"command": "create_job", "args": [3], "kwargs": {"owner": "me", "max_dead_boards": 0.5}}`, "max_dead_boards must be an integer, not 0.5"},
		{`{"command": "create_job", "args": [3], "kwargs": {"owner": "me", "max_dead_links": "x"}}`, `max_dead_links must be an integer, not "x"`},
		{`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "me", "require_torus": 1}}`, "require_torus must be true or false, not 1"},
		{`{"command": "create_job", "kwargs": {"owner": "me", "colour": "red"}}`, "create_job() got an unexpected keyword argument 'colour'"},
		// argument counts and names, as Python words them
		{`{"command": "get_job_state"}`, "get_job_state() missing required argument 'job_id'"},
		{`{"command": "get_job_state", "args": [null]}`, "get_job_state() missing required argument 'job_id'"},
		{`{"command": "get_job_state", "args": [1, 2]}`, "get_job_state() takes 1 argument (2 given)"},
		{`{"command": "destroy_job", "args": [1, "r", 3]}`, "destroy_job() takes at most 2 arguments (3 given)"},
		{`{"command": "version", "args": [1]}`, "version() takes no arguments (1 given)"},
		{`{"command": "get_board_position", "args": ["m", 0, 0]}`, "get_board_position() missing required argument 'z'"},
		{`{"command": "get_board_position", "args": ["m", 0, 0, 0, 0]}`, "get_board_position() takes 4 arguments (5 given)"},
		{`{"command": "get_job_state", "args": [1], "kwargs": {"job_id": 1}}`, "get_job_state() got multiple values for argument 'job_id'"},
		{`{"command": "get_job_state", "kwargs": {"id": 1}}`, "get_job_state() got an unexpected keyword argument 'id'"},
		{`{"command": "get_job_state", "args": ["1"]}`, `job_id must be an integer, not "1"`},
		{`{"command": "job_keepalive", "args": [true]}`, "job_id must be an integer, not true"},
		{`{"command": "get_job_machine_info", "args": [1e400]}`, "job_id must be an integer, not 1e400"},
		{`{"command": "power_on_job_boards", "args": [{}]}`, "job_id must be an integer, not {}"},
		{`{"command": "power_off_job_boards", "args": [[1]]}`, "job_id must be an integer, not [1]"},
		{`{"command": "destroy_job", "args": [1, 5]}`, "reason must be a string, not 5"},
		{`{"command": "notify_job", "args": ["all"]}`, `job_id must be an integer, not "all"`},
		{`{"command": "no_notify_job", "args": [1.25]}`, "job_id must be an integer, not 1.25"},
		{`{"command": "notify_machine", "args": [1]}`, "machine_name must be a string, not 1"},
		{`{"command": "no_notify_machine", "kwargs": {"machine_name": false}}`, "machine_name must be a string, not false"},
		{`{"command": "get_board_position", "args": [1, 0, 0, 0]}`, "machine_name must be a string, not 1"},
		{`{"command": "get_board_at_position", "args": ["m", 0, "f", 0]}`, `y must be an integer, not "f"`},
		// where_is (docs/reference/spalloc.md §2): any other key set
		{`{"command": "where_is"}`, "Invalid arguments: "},
		{`{"command": "where_is", "kwargs": {"machine": "m", "x": 0, "y": 0}}`, "Invalid arguments: machine, x, y"},
		{`{"command": "where_is", "kwargs": {"machine": "m", "x": 0, "y": 0, "z": 0, "chip_x": 1}}`, "Invalid arguments: chip_x, machine, x, y, z"},
		{`{"command": "where_is", "kwargs": {"job_id": 1, "chip_x": 0, "chip_y": 0, "machine": "m"}}`, "Invalid arguments: chip_x, chip_y, job_id, machine"},
		{`{"command": "where_is", "args": ["m"]}`, "where_is() takes keyword arguments only (1 positional given)"},
		{`{"command": "where_is", "kwargs": {"machine": 5, "chip_x": 0, "chip_y": 0}}`, "machine must be a string, not 5"},
		{`{"command": "where_is", "kwargs": {"job_id": "j", "chip_x": 0, "chip_y": 0}}`, `job_id must be an integer, not "j"`},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			b := newFakeBackend(machine4x2())
			s := NewSession("10.0.0.9")
			reply, err := s.Handle(b, []byte(tt.line))
			if err != nil {
				t.Fatalf("error %v: the connection must stay open", err)
			}
			want := string(EncodeException(tt.msg))
			if string(reply) != want {
				t.Errorf("got  %s\nwant %s", reply, want)
			}
			if len(b.created) != 0 || b.next != 1 {
				t.Errorf("a failing command created a job")
			}
			// The connection goes on.
			if got := reply1(t, b, `{"command": "version"}`); got != `{"return": "1.0.0"}` {
				t.Errorf("after the exception: %s", got)
			}
		})
	}
}

// TestUndispatchable checks the requests that close the connection without
// a reply.
func TestUndispatchable(t *testing.T) {
	for _, line := range []string{
		`{"command": "version"`,
		`[1, 2]`,
		`"version"`,
		`null`,
		`42`,
		`{}`,
		`{"args": []}`,
		`{"command": 5}`,
		`{"command": null}`,
		`{"command": ["version"]}`,
		`{"command": "launch_missiles"}`,
		`{"command": "Version"}`,
		`{"command": "version", "args": {}}`,
		`{"command": "version", "args": null}`,
		`{"command": "version", "args": "x"}`,
		`{"command": "version", "kwargs": []}`,
		`{"command": "version", "kwargs": null}`,
		`{"command": "version"} {"command": "version"}`,
		"{\"command\": \"version\", \"kwargs\": {\"a\": \"\xff\"}}",
		`{"command": "version", "x": NaN}`,
	} {
		reply, err := NewSession("h").Handle(newFakeBackend(), []byte(line))
		var de *DispatchError
		if !errors.As(err, &de) || reply != nil {
			t.Errorf("%q: reply %q, error %v; want no reply and a DispatchError", line, reply, err)
		}
	}
	for _, line := range []string{"", "   ", "\t", " \r"} {
		if reply, err := NewSession("h").Handle(newFakeBackend(), []byte(line)); reply != nil || err != nil {
			t.Errorf("blank %q: %q %v", line, reply, err)
		}
	}
}

func TestVersionAndArguments(t *testing.T) {
	b := newFakeBackend(machine4x2())
	tests := []struct{ line, want string }{
		{`{"command": "version"}`, `{"return": "1.0.0"}`},
		{`{"command": "version", "args": [], "kwargs": {}, "extra": 1}`, `{"return": "1.0.0"}`},
		{`{"command": "version", "kwargs": {"client": "spalloc-7"}}`, `{"return": "1.0.0"}`},
		{`  {"command": "version"}  `, `{"return": "1.0.0"}`},
		// unknown ids: state 0, all null; by position, by name, 1.0 is 1
		{`{"command": "get_job_state", "args": [77]}`, `{"return": {"state": 0, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`},
		{`{"command": "get_job_state", "kwargs": {"job_id": 77}}`, `{"return": {"state": 0, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`},
		{`{"command": "get_job_state", "args": [77.0], "kwargs": {"client": 1}}`, `{"return": {"state": 0, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}`},
		{`{"command": "get_job_machine_info", "args": [77]}`, `{"return": {"width": null, "height": null, "connections": null, "machine_name": null, "boards": null}}`},
		{`{"command": "job_keepalive", "args": [77]}`, `{"return": null}`},
		{`{"command": "destroy_job", "args": [77, null]}`, `{"return": null}`},
		{`{"command": "power_on_job_boards", "args": [77]}`, `{"return": null}`},
		{`{"command": "list_jobs"}`, `{"return": []}`},
		{`{"command": "list_machines"}`, `{"return": [{"name": "m", "tags": ["default"], "width": 4, "height": 2, "dead_boards": [], "dead_links": []}]}`},
		{`{"command": "get_board_position", "args": ["m", 3, 1, 2]}`, `{"return": [3, 1, 2]}`},
		{`{"command": "get_board_position", "kwargs": {"machine_name": "m", "x": 4, "y": 0, "z": 0}}`, `{"return": null}`},
		{`{"command": "get_board_position", "args": ["nope", 0, 0, 0]}`, `{"return": null}`},
		{`{"command": "get_board_at_position", "args": ["m", 2, 1, 0]}`, `{"return": [2, 1, 0]}`},
		{`{"command": "get_board_at_position", "args": ["m", 9, 9, 9]}`, `{"return": null}`},
		{`{"command": "notify_job", "args": [null]}`, `{"return": null}`},
	}
	for _, tt := range tests {
		if got := reply1(t, b, tt.line); got != tt.want {
			t.Errorf("%s\ngot  %s\nwant %s", tt.line, got, tt.want)
		}
	}
}

// TestJobLifeCycle drives a job through the codec: creation with the
// current client's explicit nulls, state, machine info, list_jobs, power,
// destruction, and the impossible request.
func TestJobLifeCycle(t *testing.T) {
	b := newFakeBackend(machine4x2())
	r := run(t, b,
		`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "alice", "keepalive": 60.0, "machine": null, "tags": null, "min_ratio": 0.333, "max_dead_boards": 0, "max_dead_links": null, "require_torus": false}}`,
		`{"command": "create_job", "kwargs": {"owner": "bob", "keepalive": null}}`,
		`{"command": "create_job", "args": [100], "kwargs": {"owner": "carol"}}`,
	)
	if r[0]["return"] != 1.0 || r[1]["return"] != 2.0 || r[2]["return"] != 3.0 {
		t.Fatalf("ids: %v", r)
	}
	c := b.created[0]
	zero := 0
	want := arbiter.GridRequest{Form: arbiter.GridBlock, Width: 1, Height: 1, Args: []int{1, 1}, MinRatio: 0.333, MaxDeadBoards: &zero,
		KeepaliveHost: "10.0.0.9", Kwargs: c.Request.Kwargs}
	if c.Owner != "alice" || *c.Keepalive != 60 || c.Machine != "" || !reflect.DeepEqual(c.Tags, []string{"default"}) ||
		!reflect.DeepEqual(c.Request, want) || c.Peer != "10.0.0.9" {
		t.Errorf("create_job: %+v", c)
	}
	if got := string(c.Request.Kwargs); got != `{"machine":null,"max_dead_boards":0,"max_dead_links":null,"min_ratio":0.333,"require_torus":false,"tags":null}` {
		t.Errorf("echoed kwargs: %s", got)
	}
	if b.created[1].Keepalive != nil || b.created[1].Request.Form != arbiter.GridOneBoard {
		t.Errorf("keepalive null: %+v", b.created[1])
	}

	tests := []struct{ line, want string }{
		{`{"command": "get_job_state", "args": [1]}`, `{"return": {"state": 3, "power": true, "keepalive": 60.0, "reason": null, "start_time": 1700000000.25, "keepalivehost": "10.0.0.9"}}`},
		{`{"command": "get_job_state", "args": [2]}`, `{"return": {"state": 3, "power": true, "keepalive": null, "reason": null, "start_time": 1700000000.25, "keepalivehost": "10.0.0.9"}}`},
		{`{"command": "get_job_state", "args": [3]}`, `{"return": {"state": 4, "power": null, "keepalive": null, "reason": "Cancelled: No suitable machines available.", "start_time": null, "keepalivehost": null}}`},
		{`{"command": "get_job_machine_info", "args": [1]}`, `{"return": {"width": 16, "height": 16, "connections": [[[0, 0], "10.2.0.1"], [[8, 4], "10.2.0.9"], [[4, 8], "10.2.0.17"]], "machine_name": "m", "boards": [[0, 0, 0], [0, 0, 1], [0, 0, 2]]}}`},
		{`{"command": "get_job_machine_info", "args": [2]}`, `{"return": {"width": 8, "height": 8, "connections": [[[0, 0], "10.2.1.1"]], "machine_name": "m", "boards": [[0, 1, 0]]}}`},
		{`{"command": "list_jobs"}`, `{"return": [` +
			`{"job_id": 1, "owner": "alice", "start_time": 1700000000.25, "keepalive": 60.0, "state": 3, "power": true, "args": [1, 1], "kwargs": {"machine":null,"max_dead_boards":0,"max_dead_links":null,"min_ratio":0.333,"require_torus":false,"tags":null}, "allocated_machine_name": "m", "boards": [[0, 0, 0], [0, 0, 1], [0, 0, 2]], "keepalivehost": "10.0.0.9"}, ` +
			`{"job_id": 2, "owner": "bob", "start_time": 1700000000.25, "keepalive": null, "state": 3, "power": true, "args": [], "kwargs": {}, "allocated_machine_name": "m", "boards": [[0, 1, 0]], "keepalivehost": "10.0.0.9"}]}`},
		{`{"command": "power_off_job_boards", "args": [2]}`, `{"return": null}`},
		{`{"command": "get_job_state", "kwargs": {"job_id": 2}}`, `{"return": {"state": 2, "power": false, "keepalive": null, "reason": null, "start_time": 1700000000.25, "keepalivehost": "10.0.0.9"}}`},
		{`{"command": "destroy_job", "args": [1, "done"]}`, `{"return": null}`},
		{`{"command": "get_job_state", "args": [1]}`, `{"return": {"state": 4, "power": null, "keepalive": null, "reason": "done", "start_time": null, "keepalivehost": null}}`},
		{`{"command": "get_job_machine_info", "args": [1]}`, `{"return": {"width": null, "height": null, "connections": null, "machine_name": null, "boards": null}}`},
	}
	for _, tt := range tests {
		if got := reply1(t, b, tt.line); got != tt.want {
			t.Errorf("%s\ngot  %s\nwant %s", tt.line, got, tt.want)
		}
	}
	if !reflect.DeepEqual(b.powered, []string{"2 off"}) {
		t.Errorf("power calls: %v", b.powered)
	}
	// Keepalive refreshed by exactly the spec's commands.
	b.touched = nil
	for _, l := range []string{
		`{"command": "job_keepalive", "args": [2]}`,
		`{"command": "get_job_state", "args": [2]}`,
		`{"command": "get_job_machine_info", "args": [2]}`,
		`{"command": "list_jobs"}`,
		`{"command": "where_is", "kwargs": {"job_id": 2, "chip_x": 0, "chip_y": 0}}`,
		`{"command": "destroy_job", "args": [99]}`,
	} {
		reply1(t, b, l)
	}
	if want := []string{"2@10.0.0.9", "2@10.0.0.9", "2@10.0.0.9"}; !reflect.DeepEqual(b.touched, want) {
		t.Errorf("keepalives: %v, want %v", b.touched, want)
	}
}

func TestCreateJobTags(t *testing.T) {
	b := newFakeBackend(machine4x2())
	run(t, b,
		`{"command": "create_job", "kwargs": {"owner": "a", "tags": []}}`,
		`{"command": "create_job", "kwargs": {"owner": "a", "tags": ["big", "default"]}}`,
		`{"command": "create_job", "kwargs": {"owner": "a", "machine": "m"}}`,
		`{"command": "create_job", "args": [3.0, 2], "kwargs": {"owner": "a", "min_ratio": 1, "keepalive": 5}}`,
	)
	if got := b.created[0].Tags; got == nil || len(got) != 0 {
		t.Errorf("tags []: %#v", got)
	}
	if got := b.created[1].Tags; !reflect.DeepEqual(got, []string{"big", "default"}) {
		t.Errorf("tags: %v", got)
	}
	if c := b.created[2]; c.Machine != "m" || c.Tags != nil {
		t.Errorf("machine: %+v", c)
	}
	if c := b.created[3]; c.Request.Width != 3 || c.Request.Height != 2 || c.Request.MinRatio != 1 || *c.Keepalive != 5 {
		t.Errorf("3×2: %+v", c)
	}
}

func TestWhereIs(t *testing.T) {
	b := newFakeBackend(machine4x2())
	run(t, b,
		`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "a"}}`, // triad (0,0)
		`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "a"}}`, // triad (0,1)
	)
	tests := []struct{ kwargs, want string }{
		{`{"machine": "m", "x": 0, "y": 1, "z": 1}`, `{"machine": "m", "logical": [0, 1, 1], "physical": [0, 1, 1], "chip": [8, 16], "board_chip": [0, 0], "job_id": 2, "job_chip": [8, 4]}`},
		{`{"machine": "m", "cabinet": 3, "frame": 0, "board": 2}`, `{"machine": "m", "logical": [3, 0, 2], "physical": [3, 0, 2], "chip": [40, 8], "board_chip": [0, 0], "job_id": null, "job_chip": null}`},
		{`{"machine": "m", "chip_x": 10, "chip_y": 17}`, `{"machine": "m", "logical": [0, 1, 1], "physical": [0, 1, 1], "chip": [10, 17], "board_chip": [2, 1], "job_id": 2, "job_chip": [10, 5]}`},
		{`{"machine": "m", "chip_x": 58, "chip_y": 41}`, `{"machine": "m", "logical": [0, 1, 1], "physical": [0, 1, 1], "chip": [10, 17], "board_chip": [2, 1], "job_id": 2, "job_chip": [10, 5]}`}, // wraps
		{`{"job_id": 2, "chip_x": 10, "chip_y": 5}`, `{"machine": "m", "logical": [0, 1, 1], "physical": [0, 1, 1], "chip": [10, 17], "board_chip": [2, 1], "job_id": 2, "job_chip": [10, 5]}`},
		{`{"job_id": 1, "chip_x": 0, "chip_y": 0}`, `{"machine": "m", "logical": [0, 0, 0], "physical": [0, 0, 0], "chip": [0, 0], "board_chip": [0, 0], "job_id": 1, "job_chip": [0, 0]}`},
		{`{"job_id": 1, "chip_x": 12, "chip_y": 0}`, `null`}, // chip of a board the job does not hold
		{`{"job_id": 9, "chip_x": 0, "chip_y": 0}`, `null`},
		{`{"machine": "nope", "x": 0, "y": 0, "z": 0}`, `null`},
		{`{"machine": "m", "x": 4, "y": 0, "z": 0}`, `null`},
		{`{"machine": "m", "cabinet": 9, "frame": 0, "board": 0}`, `null`},
		{`{"machine": "m", "x": 0, "y": 0, "z": 0, "client": "x"}`, `{"machine": "m", "logical": [0, 0, 0], "physical": [0, 0, 0], "chip": [0, 0], "board_chip": [0, 0], "job_id": 1, "job_chip": [0, 0]}`},
	}
	for _, tt := range tests {
		line := `{"command": "where_is", "kwargs": ` + tt.kwargs + `}`
		if got := reply1(t, b, line); got != `{"return": `+tt.want+`}` {
			t.Errorf("where_is %s\ngot  %s\nwant {\"return\": %s}", tt.kwargs, got, tt.want)
		}
	}
	// A key sent as null still counts, as in the reference's set(kwargs):
	// a key set of no form is an exception.
	for _, kwargs := range []string{
		`{"machine": "m", "x": 0, "y": 0, "z": 0, "bogus": null}`,
		`{"machine": "m", "x": 0, "y": 0, "z": 0, "job_id": null}`,
		`{"job_id": 1, "chip_x": 0, "chip_y": 0, "machine": null}`,
	} {
		if got := reply1(t, b, `{"command": "where_is", "kwargs": `+kwargs+`}`); !strings.HasPrefix(got, `{"exception": "Invalid arguments: `) {
			t.Errorf("where_is %s: %s, want Invalid arguments", kwargs, got)
		}
	}
}

// TestNotifications checks the watch rules of docs/reference/spalloc.md §5.
func TestNotifications(t *testing.T) {
	b := newFakeBackend(machine4x2())
	do := func(s *Session, line string) {
		t.Helper()
		if _, err := s.Handle(b, []byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	changedJobs := []int64{1, 2, 3}
	changedMachines := []string{"m", "n"}
	check := func(s *Session, want string) {
		t.Helper()
		if got := string(s.Notify(changedJobs, changedMachines)); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	s := NewSession("h")
	check(s, "")
	if s.Watching() {
		t.Errorf("a new session watches")
	}
	do(s, `{"command": "notify_job", "args": [2]}`)
	do(s, `{"command": "notify_job", "kwargs": {"job_id": 3}}`)
	do(s, `{"command": "notify_job", "args": [7]}`)
	check(s, "{\"jobs_changed\": [2, 3]}\n")
	do(s, `{"command": "no_notify_job", "args": [3]}`)
	check(s, "{\"jobs_changed\": [2]}\n")
	do(s, `{"command": "no_notify_job", "args": [2]}`)
	do(s, `{"command": "no_notify_job", "args": [7]}`) // the set is empty: the watch goes
	check(s, "")
	do(s, `{"command": "notify_job"}`)
	do(s, `{"command": "notify_job", "args": [1]}`)    // no effect when watching all
	do(s, `{"command": "no_notify_job", "args": [1]}`) // no effect when watching all
	check(s, "{\"jobs_changed\": [1, 2, 3]}\n")
	do(s, `{"command": "notify_machine", "args": ["n"]}`)
	check(s, "{\"jobs_changed\": [1, 2, 3]}\n{\"machines_changed\": [\"n\"]}\n")
	do(s, `{"command": "no_notify_job"}`)
	check(s, "{\"machines_changed\": [\"n\"]}\n")
	do(s, `{"command": "notify_machine", "args": [null]}`)
	check(s, "{\"machines_changed\": [\"m\", \"n\"]}\n")
	do(s, `{"command": "no_notify_machine", "args": ["m"]}`)
	check(s, "{\"machines_changed\": [\"m\", \"n\"]}\n")
	do(s, `{"command": "no_notify_machine"}`)
	check(s, "")
	if s.Watching() {
		t.Errorf("still watching")
	}
	if got := s.Notify(nil, nil); got != nil {
		t.Errorf("no changes: %q", got)
	}
}

func TestLineReader(t *testing.T) {
	in := "{\"a\":1}\n\r\n{\"b\":2}\r\n" + strings.Repeat("x", 100) + "\n" + strings.Repeat("y", 101) + "\nnever"
	lr := NewLineReader(strings.NewReader(in), 100)
	for _, want := range []string{`{"a":1}`, ``, `{"b":2}`, strings.Repeat("x", 100)} {
		got, err := lr.ReadLine()
		if err != nil || string(got) != want {
			t.Fatalf("got %q %v, want %q", got, err, want)
		}
	}
	if _, err := lr.ReadLine(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("101 bytes: %v, want ErrLineTooLong", err)
	}
	// Longer than the reader's buffer, and one over the limit without
	// ever seeing "\n".
	long := strings.Repeat("z", 10000)
	lr = NewLineReader(strings.NewReader(long+"\n"+long+"zz"), 10000)
	if got, err := lr.ReadLine(); err != nil || string(got) != long {
		t.Fatalf("10000 bytes: %d %v", len(got), err)
	}
	if _, err := lr.ReadLine(); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("10002 bytes without a newline: %v", err)
	}
	lr = NewLineReader(strings.NewReader("partial"), 0)
	if _, err := lr.ReadLine(); err != io.EOF {
		t.Fatalf("partial last line: %v, want EOF", err)
	}
}

func TestEncoders(t *testing.T) {
	for f, want := range map[float64]string{60: "60.0", 0: "0.0", 0.5: "0.5", 1700000000.25: "1700000000.25", 1e-5: "1e-05", 1e16: "1e+16", -3: "-3.0", 0.333: "0.333"} {
		if got := string(appendFloat(nil, f)); got != want {
			t.Errorf("appendFloat(%v) = %s, want %s", f, got, want)
		}
	}
	for s, want := range map[string]string{"a\"b\\c": `"a\"b\\c"`, "\n\t\x01": `"\n\t\u0001"`, "é": `"é"`, "\xff": `"\ufffd"`, "\u2028": `"\u2028"`} {
		got := appendString(nil, s)
		if string(got) != want {
			t.Errorf("appendString(%q) = %s, want %s", s, got, want)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("appendString(%q) is not JSON: %v", s, err)
		}
	}
	if got := string(EncodeException("x \"y\"")); got != "{\"exception\": \"x \\\"y\\\"\"}\n" {
		t.Errorf("exception: %q", got)
	}
	if got := string(EncodeJobsChanged([]int64{3, 1})); got != "{\"jobs_changed\": [3, 1]}\n" {
		t.Errorf("jobs changed: %q", got)
	}
	if len(Commands()) != 17 {
		t.Errorf("%d commands, want 17: %v", len(Commands()), Commands())
	}
}

// A retired job with no reason reports reason null.
func TestDestroyedWithoutReason(t *testing.T) {
	b := newFakeBackend(machine4x2())
	run(t, b, `{"command": "create_job", "kwargs": {"owner": "a"}}`, `{"command": "destroy_job", "args": [1]}`)
	if got := reply1(t, b, `{"command": "get_job_state", "args": [1]}`); got != `{"return": {"state": 4, "power": null, "keepalive": null, "reason": null, "start_time": null, "keepalivehost": null}}` {
		t.Errorf("got %s", got)
	}
	// A queued job destroyed: "Cancelled: " + reason.
	b = newFakeBackend(identityMachine("m", 1, 1, "10.3.0.0"))
	run(t, b,
		`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "a"}}`,
		`{"command": "create_job", "args": [1, 1], "kwargs": {"owner": "a"}}`,
		`{"command": "destroy_job", "args": [2]}`,
	)
	if got := reply1(t, b, `{"command": "get_job_state", "args": [2]}`); !strings.Contains(got, `"reason": "Cancelled: "`) {
		t.Errorf("got %s", got)
	}
}

// backendError checks that a backend's errors become exceptions: an
// *arbiter.Error's message, anything else "internal error".
type failing struct{ fakeBackend }

func (f *failing) ListJobs() ([]Job, error) {
	return nil, arbiter.Errorf(arbiter.EUnavailable, "the server is shutting down")
}
func (f *failing) Machines() ([]*arbiter.GridMachine, error) { return nil, errors.New("disk on fire") }

func TestBackendErrors(t *testing.T) {
	b := &failing{*newFakeBackend()}
	if got := reply1(t, b, `{"command": "list_jobs"}`); got != `{"exception": "the server is shutting down"}` {
		t.Errorf("list_jobs: %s", got)
	}
	if got := reply1(t, b, `{"command": "list_machines"}`); got != `{"exception": "internal error"}` {
		t.Errorf("list_machines: %s", got)
	}
}

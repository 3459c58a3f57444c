package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
	"github.com/arbiter-hq/arbiter/tomlpos"
)

func TestGridMachinesGood(t *testing.T) {
	doc := `
[[grid_machines]]
name = "m"
tags = ["default", "big"]
width = 2
height = 1
dead_boards = [[0, 0, 1]]
dead_links = [[1, 0, 1, "north"], [0, 0, 0, 3]]
locations = "identity"
base_ip = "10.11.0.0"
queue = "fifo"
power_delay_s = 1.5

[[grid_machines.boards]]   # move one board and give another its own address
x = 1
y = 0
z = 2
cabinet = 7
frame = 3
board = 4

[[grid_machines.boards]]
x = 0
y = 0
z = 2
ip = "10.99.0.1"

[[grid_machines.frames]]
cabinet = 0
frame = 0
address = "bmp-0-0.example.org"

[[grid_machines]]
name = "desk"
tags = []
single_board = { ip = "192.168.240.1", controller = "192.168.240.0" }

[[grid_machines]]
name = "three"
width = 1
height = 1
frames = [{ cabinet = 0, frame = 0, address = "192.168.241.0" }]
boards = [
  { x = 0, y = 0, z = 0, cabinet = 0, frame = 0, board = 0, ip = "192.168.241.1" },
  { x = 0, y = 0, z = 1, cabinet = 0, frame = 0, board = 2, ip = "192.168.241.17" },
  { x = 0, y = 0, z = 2, cabinet = 0, frame = 0, board = 5, ip = "192.168.241.41" },
]

[spalloc]
max_retired_jobs = 10
seconds_before_free = 0
`
	c, err := Parse("good.toml", []byte(doc), env)
	if err != nil {
		t.Fatalf("Parse = %v", err)
	}
	if len(c.GridMachines) != 3 {
		t.Fatalf("got %d grid machines, want 3", len(c.GridMachines))
	}
	m := c.GridMachines[0]
	b := func(x, y, z int) arbiter.Board { return arbiter.Board{X: x, Y: y, Z: z} }
	if m.Name != "m" || !reflect.DeepEqual(m.Tags, []string{"default", "big"}) || m.Width != 2 || m.Height != 1 ||
		m.Queue != arbiter.GridQueueFIFO || m.PowerDelay != 1500*time.Millisecond {
		t.Errorf("machine m: %+v", m)
	}
	if want := []arbiter.Board{b(0, 0, 1)}; !reflect.DeepEqual(m.DeadBoards, want) {
		t.Errorf("dead boards %v, want %v", m.DeadBoards, want)
	}
	if want := []arbiter.BoardLink{{Board: b(0, 0, 0), Link: arbiter.LinkWest}, {Board: b(1, 0, 1), Link: arbiter.LinkNorth}}; !reflect.DeepEqual(m.DeadLinks, want) {
		t.Errorf("dead links %v, want %v", m.DeadLinks, want)
	}
	infos := map[arbiter.Board]arbiter.BoardInfo{}
	for _, bi := range m.Boards {
		infos[bi.Board] = bi
	}
	for _, tc := range []struct {
		b   arbiter.Board
		loc arbiter.BoardLocation
		ip  string
	}{
		{b(0, 0, 0), arbiter.BoardLocation{}, "10.11.0.1"},
		{b(0, 0, 1), arbiter.BoardLocation{Board: 1}, "10.11.0.9"},   // dead, located by identity, addressed by base_ip
		{b(0, 0, 2), arbiter.BoardLocation{Board: 2}, "10.99.0.1"},   // its own address
		{b(1, 0, 0), arbiter.BoardLocation{Cabinet: 1}, "10.11.5.1"}, // cabinet stride 0.0.5.0
		{b(1, 0, 1), arbiter.BoardLocation{Cabinet: 1, Board: 1}, "10.11.5.9"},
		{b(1, 0, 2), arbiter.BoardLocation{Cabinet: 7, Frame: 3, Board: 4}, "10.11.38.33"}, // 7×5+3 = 38, 4×8+1
	} {
		got, ok := infos[tc.b]
		if !ok || got.Location != tc.loc || got.IP != tc.ip {
			t.Errorf("board %v: got %+v, want %v %s", tc.b, got, tc.loc, tc.ip)
		}
	}
	wantFrames := []arbiter.GridFrame{{Cabinet: 0, Frame: 0, Address: "bmp-0-0.example.org"}, {Cabinet: 1, Frame: 0, Address: "10.11.5.0"}, {Cabinet: 7, Frame: 3, Address: "10.11.38.0"}}
	if !reflect.DeepEqual(m.Frames, wantFrames) {
		t.Errorf("frames %v, want %v", m.Frames, wantFrames)
	}

	desk := c.GridMachines[1]
	want := grid.SingleBoard("desk", []string{}, "192.168.240.1", "192.168.240.0")
	want.PowerDelay = 200 * time.Millisecond
	if !reflect.DeepEqual(desk, want) {
		t.Errorf("single board:\ngot  %+v\nwant %+v", desk, want)
	}

	three := c.GridMachines[2]
	if !reflect.DeepEqual(three.Tags, []string{"default"}) || len(three.Boards) != 3 || three.Boards[2].IP != "192.168.241.41" ||
		three.Boards[1].Location.Board != 2 || len(three.Frames) != 1 || three.Queue != arbiter.GridQueueBackfill {
		t.Errorf("explicit machine: %+v", three)
	}
	if c.Spalloc.MaxRetiredJobs != 10 || c.Spalloc.SecondsBeforeFree != 0 {
		t.Errorf("spalloc: %+v", c.Spalloc)
	}
	for _, m := range c.GridMachines {
		if err := m.Validate(); err != nil {
			t.Errorf("machine %s: %v", m.Name, err)
		}
	}
}

func TestSpallocDefaults(t *testing.T) {
	c, err := Parse("good.toml", []byte("[spalloc]\n"), env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Spalloc.MaxRetiredJobs != 1200 || c.Spalloc.SecondsBeforeFree != 30 || len(c.GridMachines) != 0 {
		t.Errorf("got %+v, %d grid machines", c.Spalloc, len(c.GridMachines))
	}
}

func TestGridMachinesBad(t *testing.T) {
	const m = "[[grid_machines]]\nname = \"m\"\nwidth = 2\nheight = 1\n" // lines 1-4
	const std = m + "locations = \"identity\"\nbase_ip = \"10.0.0.0\"\n" // lines 5-6
	tests := []struct {
		name, doc string
		line      int
		key, msg  string
	}{
		{"no name", "[[grid_machines]]\nwidth = 1\nheight = 1\n", 1, "grid_machines[0].name", "must not be empty"},
		{"bad name", "[[grid_machines]]\nname = \"a b\"\nsingle_board = { ip = \"a\", controller = \"b\" }\n", 2, "grid_machines[0].name", "may only hold"},
		{"duplicate name", std + "[[grid_machines]]\nname = \"m\"\nsingle_board = { ip = \"h1\", controller = \"h2\" }\n", 8, "grid_machines[1].name", `"m" is already used by grid_machines[0]`},
		{"name of a gpu machine", "[[machines]]\nname = \"m\"\n" + std, 4, "grid_machines[0].name", "already used by machines[0]"},
		{"no height", "[[grid_machines]]\nname = \"m\"\nwidth = 1\n", 1, "grid_machines[0].height", "missing"},
		{"width zero", m + "width = 0\n", 0, "", ""}, // duplicate key: TOML error
		{"width big", "[[grid_machines]]\nname = \"m\"\nwidth = 300\nheight = 1\n", 3, "grid_machines[0].width", "must be 1 to 256 triads, got 300"},
		{"width type", "[[grid_machines]]\nname = \"m\"\nwidth = \"2\"\n", 3, "grid_machines[0].width", "must be a whole number of triads"},
		{"unknown key", m + "colour = \"red\"\n", 5, "grid_machines[0].colour", "unknown key"},
		{"dead board off", std + "dead_boards = [[0, 0, 0], [2, 0, 0]]\n", 7, "grid_machines[0].dead_boards[1]", "(2,0,0) is not on the 2×1 machine"},
		{"dead board z", std + "dead_boards = [[0, 0, 3]]\n", 7, "grid_machines[0].dead_boards[0]", "not on the 2×1 machine"},
		{"dead board arity", std + "dead_boards = [[0, 0]]\n", 7, "grid_machines[0].dead_boards[0]", "[x, y, z], not 2 numbers"},
		{"dead board type", std + "dead_boards = [[0, 0, \"a\"]]\n", 7, "grid_machines[0].dead_boards[0][2]", "whole number"},
		{"dead link name", std + "dead_links = [[0, 0, 0, \"up\"]]\n", 7, "grid_machines[0].dead_links[0]", "link up is not one of east"},
		{"dead link number", std + "dead_links = [[0, 0, 0, 6]]\n", 7, "grid_machines[0].dead_links[0]", "not one of"},
		{"dead link off", std + "dead_links = [[0, 1, 0, \"east\"]]\n", 7, "grid_machines[0].dead_links[0]", "(0,1,0) is not on"},
		{"dead link arity", std + "dead_links = [[0, 1, 0]]\n", 7, "grid_machines[0].dead_links[0]", "not 3 values"},
		{"locations", m + "locations = \"spinner\"\n", 5, "grid_machines[0].locations", `unknown value "spinner"`},
		{"no location", m + "base_ip = \"10.0.0.0\"\n", 1, "grid_machines[0]", "live board (0,0,0) has no location"},
		{"no address", m + "locations = \"identity\"\n", 1, "grid_machines[0]", "live board (0,0,0) has no address"},
		{"dead without location", m + "base_ip = \"10.0.0.0\"\ndead_boards = [[0,0,1],[0,0,2],[1,0,0],[1,0,1],[1,0,2]]\n" +
			"boards = [{ x = 0, y = 0, z = 0 }]\n", 7, "grid_machines[0].boards[0]", "has no location: give cabinet"},
		{"board off", std + "boards = [{ x = 0, y = 0, z = 5, ip = \"h\" }]\n", 7, "grid_machines[0].boards[0]", "(0,0,5) is not on"},
		{"board partial", std + "[[grid_machines.boards]]\nx = 0\ny = 0\nz = 0\ncabinet = 1\n", 7, "grid_machines[0].boards[0]", "all of cabinet, frame and board"},
		{"board no z", std + "[[grid_machines.boards]]\nx = 0\ny = 0\n", 7, "grid_machines[0].boards[0]", "needs x, y and z"},
		{"board twice", std + "boards = [{ x = 0, y = 0, z = 0, ip = \"h1\" }, { x = 0, y = 0, z = 0, ip = \"h2\" }]\n", 7, "grid_machines[0].boards[1]", "already described by grid_machines[0].boards[0]"},
		{"board negative", std + "boards = [{ x = 0, y = 0, z = 0, cabinet = -1, frame = 0, board = 0 }]\n", 7, "grid_machines[0].boards[0]", "negative"},
		{"board ip", std + "boards = [{ x = 0, y = 0, z = 0, ip = \"not an ip\" }]\n", 7, "grid_machines[0].boards[0].ip", "not an IP address or host name"},
		{"same location", std + "\n[[grid_machines.boards]]\nx = 1\ny = 0\nz = 0\ncabinet = 0\nframe = 0\nboard = 0\n", 8, "grid_machines[0].boards[0]", "boards (0,0,0) and (1,0,0) are both at c:0 f:0 b:0"},
		{"same ip in machine", std + "[[grid_machines.boards]]\nx = 1\ny = 0\nz = 2\nip = \"10.0.0.1\"\n", 11, "grid_machines[0].boards[0].ip", "address 10.0.0.1 of board (1,0,2) is already used by board (0,0,0)"},
		{"same ip across machines", std + "[[grid_machines]]\nname = \"n\"\nwidth = 1\nheight = 1\nlocations = \"identity\"\nbase_ip = \"10.0.0.0\"\n", 12, "grid_machines[1].base_ip", "already used by board (0,0,0) of grid_machines[0]"},
		{"board ip is a controller", std + "[[grid_machines]]\nname = \"n\"\nsingle_board = { ip = \"10.0.5.0\", controller = \"h\" }\n", 9, "grid_machines[1].single_board.ip", "already used by frame c:1 f:0 of grid_machines[0]"},
		{"base ip", std[:len(std)-len("base_ip = \"10.0.0.0\"\n")] + "base_ip = \"10.0.0\"\n", 6, "grid_machines[0].base_ip", "not an IPv4 address"},
		{"base ip v6", m + "locations = \"identity\"\nbase_ip = \"::1\"\n", 6, "grid_machines[0].base_ip", "not an IPv4 address"},
		{"base ip overflow", m + "locations = \"identity\"\nbase_ip = \"255.255.255.0\"\n", 6, "grid_machines[0].base_ip", "passes 255.255.255.255"},
		{"standard ips overlap", "[[grid_machines]]\nname = \"m\"\nwidth = 2\nheight = 6\nlocations = \"identity\"\nbase_ip = \"10.0.0.0\"\n", 6, "grid_machines[0].base_ip", "address 10.0.5.1 of board (1,0,0) is already used by board (0,5,0); every board and controller needs its own address (the standard addresses leave room for 5 frames per cabinet"},
		{"frame without board", std + "frames = [{ cabinet = 9, frame = 0, address = \"h\" }]\n", 7, "grid_machines[0].frames[0]", "holds none of the machine's boards"},
		{"frame twice", std + "frames = [{ cabinet = 0, frame = 0, address = \"h\" }, { cabinet = 0, frame = 0, address = \"i\" }]\n", 7, "grid_machines[0].frames[1]", "already described"},
		{"frame address", std + "frames = [{ cabinet = 0, frame = 0, address = \"\" }]\n", 7, "grid_machines[0].frames[0].address", "not an IP address"},
		{"frame missing", "[[grid_machines]]\nname = \"m\"\nwidth = 1\nheight = 1\nlocations = \"identity\"\n" +
			"boards = [{ x = 0, y = 0, z = 0, ip = \"a\" }, { x = 0, y = 0, z = 1, ip = \"b\" }, { x = 0, y = 0, z = 2, ip = \"c\" }]\n",
			1, "grid_machines[0]", "frame c:0 f:0 has no controller address"},
		{"frame same address", std + "frames = [{ cabinet = 1, frame = 0, address = \"10.0.0.0\" }]\n", 7, "grid_machines[0].frames[0].address", "controller address 10.0.0.0 of frame c:1 f:0 is already used by frame c:0 f:0"},
		{"single board and width", "[[grid_machines]]\nname = \"s\"\nwidth = 1\nsingle_board = { ip = \"a\", controller = \"b\" }\n", 3, "grid_machines[0].width", "not allowed with single_board"},
		{"single board ip", "[[grid_machines]]\nname = \"s\"\nsingle_board = { controller = \"b\" }\n", 3, "grid_machines[0].single_board.ip", "give the board's address"},
		{"single board same", "[[grid_machines]]\nname = \"s\"\nsingle_board = { ip = \"a\", controller = \"a\" }\n", 3, "grid_machines[0].single_board.controller", "already used by board (0,0,0)"},
		{"single board key", "[[grid_machines]]\nname = \"s\"\nsingle_board = { ip = \"a\", bmp = \"b\" }\n", 3, "grid_machines[0].single_board.bmp", "unknown key"},
		{"queue", std + "queue = \"lifo\"\n", 7, "grid_machines[0].queue", `unknown value "lifo"; want backfill or fifo`},
		{"power delay", std + "power_delay_s = -1\n", 7, "grid_machines[0].power_delay_s", "must be 0 to 3600 seconds"},
		{"tag", std + "tags = [\"a,b\"]\n", 7, "grid_machines[0].tags[0]", "without spaces or commas"},
		{"seconds before free", "[spalloc]\nseconds_before_free = -1\n", 2, "spalloc.seconds_before_free", "0 to 3600 seconds"},
		{"spalloc key", "[spalloc]\nport = 22244\n", 2, "spalloc.port", "unknown key; the keys allowed here are max_retired_jobs, seconds_before_free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("bad.toml", []byte(tt.doc), env)
			if err == nil {
				t.Fatalf("Parse = nil error, want one at %d %s", tt.line, tt.key)
			}
			if c != nil {
				t.Errorf("Parse returned a Config with an error")
			}
			if tt.key == "" {
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			if e.Line != tt.line || e.Key != tt.key || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("got %q\nwant bad.toml:%d: %s: …%s", err, tt.line, tt.key, tt.msg)
			}
		})
	}
}

// FuzzParseGrid fuzzes configurations seeded with grid machines.
func FuzzParseGrid(f *testing.F) {
	for _, s := range []string{
		"[[grid_machines]]\nname = \"m\"\nwidth = 2\nheight = 2\nlocations = \"identity\"\nbase_ip = \"10.0.0.0\"\ndead_boards = [[0,0,1]]\ndead_links = [[1,1,1,\"north\"]]\n",
		"[[grid_machines]]\nname = \"s\"\nsingle_board = { ip = \"a\", controller = \"b\" }\n[spalloc]\nmax_retired_jobs = 3\n",
		"[[grid_machines]]\nname = \"m\"\nwidth = 1\nheight = 1\n[[grid_machines.boards]]\nx = 0\ny = 0\nz = 0\ncabinet = 0\nframe = 0\nboard = 0\nip = \"h\"\n[[grid_machines.frames]]\ncabinet = 0\nframe = 0\naddress = \"c\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("/nonexistent/fuzz.toml", data, env)
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned a Config and %v", err)
			}
			return
		}
		for _, m := range c.GridMachines {
			if err := m.Validate(); err != nil {
				t.Fatalf("Parse accepted a grid machine that Validate rejects: %v", err)
			}
			if _, err := grid.MachineAllocator(&m); err != nil {
				t.Fatalf("no allocator for an accepted machine: %v", err)
			}
		}
		_ = fmt.Sprint(c.Spalloc)
	})
}

// TestExampleGrid checks that example.toml documents [spalloc] with its
// defaults and that its commented grid machine parses once uncommented.
func TestExampleGrid(t *testing.T) {
	data, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range tomlpos.FieldNames(reflect.TypeOf(Spalloc{})) {
		if !regexp.MustCompile(`(?m)^` + key + ` = `).Match(data) {
			t.Errorf("example.toml lacks spalloc.%s", key)
		}
	}
	setting := regexp.MustCompile(`(?m)^# (\[\[[a-z_]+\]\]|[a-z_]+ = .*)$`)
	getenv := func(name string) string {
		return map[string]string{"ARBITER_ADMIN_TOKEN": secret1, "ARBITER_AGENT_TOKEN": secret2}[name]
	}
	c, err := Parse("example.toml", setting.ReplaceAll(data, []byte("$1")), getenv)
	if err != nil {
		t.Fatalf("example.toml uncommented: %v", err)
	}
	if len(c.GridMachines) != 1 {
		t.Fatalf("uncommented: %d grid machines, want 1", len(c.GridMachines))
	}
	m := c.GridMachines[0]
	if m.Name != "spin5" || m.Width != 1 || m.Height != 2 || len(m.Boards) != 6 || len(m.Frames) != 2 || len(m.DeadBoards) != 1 || len(m.DeadLinks) != 1 {
		t.Errorf("uncommented grid machine: %+v", m)
	}
}

func TestSpallocAllow(t *testing.T) {
	c, err := Parse("a.toml", []byte("[server]\nspalloc_listen = \"0.0.0.0:22244\"\n[spalloc]\nallow = [\"10.1.2.3\", \"192.168.0.0/16\", \"::1\"]\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.Spalloc.AllowPrefixes {
		got = append(got, p.String())
	}
	if want := []string{"10.1.2.3/32", "192.168.0.0/16", "::1/128"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("allow %v, want %v", got, want)
	}
	d := Default()
	if len(d.Spalloc.AllowPrefixes) != 2 || d.Server.SpallocListen != "" {
		t.Fatalf("defaults: %+v %q", d.Spalloc, d.Server.SpallocListen)
	}
}

// Destroyed spalloc jobs have a history of their own: max_retired_jobs
// may exceed allocations.history.
func TestSpallocHistoryOfItsOwn(t *testing.T) {
	doc := "[allocations]\nhistory = 100\n[spalloc]\nmax_retired_jobs = 200\n[[grid_machines]]\nname = \"m\"\nsingle_board = { ip = \"10.0.0.1\", controller = \"10.0.0.2\" }\n"
	if _, err := Parse("a.toml", []byte(doc), func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
}

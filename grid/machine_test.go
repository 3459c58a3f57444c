package grid

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// identityMachine is a w×h machine located by identity with standard IPs
// from 10.0.0.0.
func identityMachine(t *testing.T, w, h int) arbiter.GridMachine {
	t.Helper()
	m := arbiter.GridMachine{Name: "m", Tags: []string{"default"}, Width: w, Height: h, Queue: arbiter.GridQueueBackfill}
	frames := map[[2]int]bool{}
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				l := arbiter.BoardLocation{Cabinet: x, Frame: y, Board: z}
				ip, err := StandardBoardIP("10.0.0.0", l)
				if err != nil {
					t.Fatal(err)
				}
				m.Boards = append(m.Boards, arbiter.BoardInfo{Board: bd(x, y, z), Location: l, IP: ip})
				if !frames[[2]int{x, y}] {
					frames[[2]int{x, y}] = true
					addr, _ := StandardFrameIP("10.0.0.0", x, y)
					m.Frames = append(m.Frames, arbiter.GridFrame{Cabinet: x, Frame: y, Address: addr})
				}
			}
		}
	}
	m.Sort()
	return m
}

func TestStandardIPs(t *testing.T) {
	tests := []struct {
		base string
		loc  arbiter.BoardLocation
		want string
	}{
		{"10.11.0.0", arbiter.BoardLocation{}, "10.11.0.1"},
		{"10.11.0.0", arbiter.BoardLocation{Board: 1}, "10.11.0.9"},
		{"10.11.0.0", arbiter.BoardLocation{Frame: 1}, "10.11.1.1"},
		{"10.11.0.0", arbiter.BoardLocation{Cabinet: 1}, "10.11.5.1"},
		{"10.11.0.0", arbiter.BoardLocation{Cabinet: 2, Frame: 3, Board: 23}, "10.11.13.185"},
		{"192.168.255.0", arbiter.BoardLocation{Cabinet: 1}, "192.169.4.1"}, // carries into the next byte, as 32-bit sums do
	}
	for _, tt := range tests {
		if got, err := StandardBoardIP(tt.base, tt.loc); err != nil || got != tt.want {
			t.Errorf("StandardBoardIP(%s, %v) = %s, %v; want %s", tt.base, tt.loc, got, err, tt.want)
		}
	}
	if got, err := StandardFrameIP("10.11.0.0", 2, 3); err != nil || got != "10.11.13.0" {
		t.Errorf("StandardFrameIP = %s, %v", got, err)
	}
	for _, bad := range []string{"", "10.0.0", "::1", "10.0.0.256", "host"} {
		if _, err := StandardFrameIP(bad, 0, 0); err == nil {
			t.Errorf("base %q accepted", bad)
		}
	}
	if _, err := StandardBoardIP("255.255.255.250", arbiter.BoardLocation{Board: 1}); err == nil {
		t.Errorf("address past 255.255.255.255 accepted")
	}
	if _, err := StandardBoardIP("10.0.0.0", arbiter.BoardLocation{Board: -1}); err == nil {
		t.Errorf("negative location accepted")
	}
}

func TestMachineValidate(t *testing.T) {
	good := identityMachine(t, 2, 2)
	if err := good.Validate(); err != nil {
		t.Fatalf("identity machine: %v", err)
	}
	single := SingleBoard("desk", nil, "192.168.240.1", "192.168.240.0")
	if err := single.Validate(); err != nil {
		t.Fatalf("single board: %v", err)
	}
	if single.LiveBoards() != 1 || !single.Dead(bd(0, 0, 1)) || single.Dead(bd(0, 0, 0)) {
		t.Errorf("single board: %d live", single.LiveBoards())
	}

	tests := []struct {
		name   string
		change func(m *arbiter.GridMachine)
		msg    string
	}{
		{"name", func(m *arbiter.GridMachine) { m.Name = "" }, "must not be empty"},
		{"tag", func(m *arbiter.GridMachine) { m.Tags = []string{"a b"} }, "tag"},
		{"size", func(m *arbiter.GridMachine) { m.Width = 0 }, "1 to 256 triads"},
		{"dead board off", func(m *arbiter.GridMachine) { m.DeadBoards = []arbiter.Board{bd(2, 0, 0)} }, "dead board (2,0,0) is outside"},
		{"dead link off", func(m *arbiter.GridMachine) { m.DeadLinks = []arbiter.BoardLink{{Board: bd(0, 2, 0)}} }, "dead link (0,2,0):east is outside"},
		{"board off", func(m *arbiter.GridMachine) {
			m.Boards = append(m.Boards, arbiter.BoardInfo{Board: bd(5, 5, 5), IP: "x"})
		}, "outside"},
		{"board twice", func(m *arbiter.GridMachine) { m.Boards = append(m.Boards[:1], m.Boards...) }, "described twice"},
		{"same location", func(m *arbiter.GridMachine) { m.Boards[1].Location = m.Boards[0].Location }, "are both at c:0 f:0 b:0"},
		{"same ip", func(m *arbiter.GridMachine) { m.Boards[1].IP = m.Boards[0].IP }, "both have address 10.0.0.1"},
		{"bad ip", func(m *arbiter.GridMachine) { m.Boards[1].IP = "a b" }, "not an IP address or host name"},
		{"no ip", func(m *arbiter.GridMachine) { m.Boards[1].IP = "" }, "board (0,0,1) has no IP address"},
		{"no location", func(m *arbiter.GridMachine) { m.Boards = m.Boards[1:] }, "live board (0,0,0) has no location"},
		{"no frame", func(m *arbiter.GridMachine) { m.Frames = m.Frames[1:] }, "no controller address for frame c:0 f:0"},
		{"frame of nothing", func(m *arbiter.GridMachine) { m.Frames = append(m.Frames, arbiter.GridFrame{Cabinet: 9, Address: "h"}) }, "frame c:9 f:0 holds no board"},
		{"frame twice", func(m *arbiter.GridMachine) { m.Frames = append(m.Frames[:1], m.Frames...) }, "described twice"},
		{"frame same address", func(m *arbiter.GridMachine) { m.Frames[1].Address = m.Frames[0].Address }, "both have controller address"},
		{"frame address of a board", func(m *arbiter.GridMachine) { m.Frames[1].Address = "10.0.0.1" }, "has the address 10.0.0.1 of board (0,0,0)"},
		{"unsorted", func(m *arbiter.GridMachine) { m.Boards[0], m.Boards[1] = m.Boards[1], m.Boards[0] }, "not sorted"},
		{"queue", func(m *arbiter.GridMachine) { m.Queue = "lifo" }, `queue "lifo"`},
		{"power delay", func(m *arbiter.GridMachine) { m.PowerDelay = -time.Second }, "power delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := identityMachine(t, 2, 2)
			tt.change(&m)
			err := m.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.msg) || arbiter.ErrorCode(err) != arbiter.EInvalid {
				t.Errorf("got %v, want an invalid error containing %q", err, tt.msg)
			}
		})
	}
	// A dead board needs neither location nor address.
	m := identityMachine(t, 2, 2)
	m.DeadBoards = []arbiter.Board{bd(0, 0, 0)}
	m.Boards = m.Boards[1:]
	if err := m.Validate(); err != nil {
		t.Errorf("dead board without location: %v", err)
	}
}

func TestMachineLookups(t *testing.T) {
	m := identityMachine(t, 3, 2)
	bi, ok := m.Info(bd(2, 1, 2))
	if !ok || bi.Location != (arbiter.BoardLocation{Cabinet: 2, Frame: 1, Board: 2}) || bi.IP != "10.0.11.17" {
		t.Errorf("Info: %+v %v", bi, ok)
	}
	if _, ok := m.Info(bd(3, 0, 0)); ok {
		t.Errorf("Info of a board off the machine")
	}
	if b, ok := m.At(arbiter.BoardLocation{Cabinet: 1, Frame: 1, Board: 0}); !ok || b != bd(1, 1, 0) {
		t.Errorf("At: %v %v", b, ok)
	}
	if _, ok := m.At(arbiter.BoardLocation{Cabinet: 9}); ok {
		t.Errorf("At of an empty slot")
	}
	if addr, ok := m.FrameAddress(2, 1); !ok || addr != "10.0.11.0" {
		t.Errorf("FrameAddress: %s %v", addr, ok)
	}
	o := identityMachine(t, 3, 2)
	o.Tags, o.DeadBoards, o.Queue = nil, []arbiter.Board{bd(0, 0, 0)}, arbiter.GridQueueFIFO
	if !m.SameLayout(&o) {
		t.Errorf("tags, dead boards and queue changed the layout")
	}
	o.Boards[0].IP = "10.9.9.9"
	if m.SameLayout(&o) {
		t.Errorf("an address change kept the layout")
	}
	if _, err := MachineAllocator(&m); err != nil {
		t.Errorf("MachineAllocator: %v", err)
	}
}

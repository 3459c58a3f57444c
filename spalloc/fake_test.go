package spalloc

import (
	"slices"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/grid"
)

// fakeBackend is a Backend in memory: jobs are placed at once when they fit
// (straight to ready, power on), else queued; impossible ones are retired
// at once. It records what it was asked.
type fakeBackend struct {
	machines []*arbiter.GridMachine
	allocs   map[string]*grid.Allocator
	next     int64
	jobs     map[int64]*Job
	order    []int64
	retired  map[int64]*string
	now      time.Time

	created []*CreateJob
	touched []string // "id@peer"
	powered []string
}

func newFakeBackend(ms ...arbiter.GridMachine) *fakeBackend {
	f := &fakeBackend{allocs: map[string]*grid.Allocator{}, next: 1, jobs: map[int64]*Job{}, retired: map[int64]*string{},
		now: time.Unix(1700000000, 250000000)}
	for i := range ms {
		m := ms[i]
		a, err := grid.MachineAllocator(&m)
		if err != nil {
			panic(err)
		}
		f.machines = append(f.machines, &m)
		f.allocs[m.Name] = a
	}
	return f
}

func (f *fakeBackend) candidates(c *CreateJob) []*arbiter.GridMachine {
	var out []*arbiter.GridMachine
	for _, m := range f.machines {
		if c.Machine != "" {
			if m.Name == c.Machine {
				out = append(out, m)
			}
			continue
		}
		ok := true
		for _, t := range c.Tags {
			ok = ok && slices.Contains(m.Tags, t)
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

func (f *fakeBackend) CreateJob(c *CreateJob) (int64, error) {
	f.created = append(f.created, c)
	id := f.next
	f.next++
	j := &Job{ID: id, State: StateQueued, Owner: c.Owner, Start: f.now, Keepalive: c.Keepalive, KeepaliveHost: c.Peer, Args: c.Request.EchoArgs(), Kwargs: c.Request.Kwargs}
	possible := false
	for _, m := range f.candidates(c) {
		a := f.allocs[m.Name]
		if !a.Possible(&c.Request) {
			continue
		}
		possible = true
		if p := a.Allocate(id, &c.Request); p != nil {
			j.State, j.Power, j.Machine, j.Placement = StateReady, true, m.Name, p
			break
		}
	}
	if !possible {
		r := ReasonImpossible
		f.retired[id] = &r
		return id, nil
	}
	f.jobs[id] = j
	f.order = append(f.order, id)
	return id, nil
}

func (f *fakeBackend) Job(id int64, touch bool, peer string) (Job, error) {
	if j := f.jobs[id]; j != nil {
		if touch {
			f.touched = append(f.touched, itoa(int(id))+"@"+peer)
			j.KeepaliveHost = peer
		}
		return *j, nil
	}
	if r, ok := f.retired[id]; ok {
		return Job{ID: id, State: StateDestroyed, Reason: r}, nil
	}
	return Job{ID: id, State: StateUnknown}, nil
}

func (f *fakeBackend) PowerJob(id int64, on bool, peer string) error {
	f.powered = append(f.powered, itoa(int(id))+map[bool]string{true: " on", false: " off"}[on])
	if j := f.jobs[id]; j != nil && j.Placement != nil {
		j.State, j.Power = StatePower, on
	}
	return nil
}

func (f *fakeBackend) DestroyJob(id int64, reason *string) error {
	j := f.jobs[id]
	if j == nil {
		return nil
	}
	delete(f.jobs, id)
	f.order = slices.DeleteFunc(f.order, func(k int64) bool { return k == id })
	if j.Placement != nil {
		f.allocs[j.Machine].Free(id)
		f.retired[id] = reason
		return nil
	}
	r := CancelledPrefix
	if reason != nil {
		r += *reason
	}
	f.retired[id] = &r
	return nil
}

func (f *fakeBackend) ListJobs() ([]Job, error) {
	var out []Job
	for _, id := range f.order {
		out = append(out, *f.jobs[id])
	}
	return out, nil
}

func (f *fakeBackend) Machines() ([]*arbiter.GridMachine, error) { return f.machines, nil }

func (f *fakeBackend) BoardJob(machine string, b arbiter.Board) (int64, error) {
	if a := f.allocs[machine]; a != nil {
		return a.Holder(b), nil
	}
	return 0, nil
}

// identityMachine is a w×h machine located by identity with standard IPs
// from base.
func identityMachine(name string, w, h int, base string, dead ...arbiter.Board) arbiter.GridMachine {
	m := arbiter.GridMachine{Name: name, Tags: []string{"default"}, Width: w, Height: h, DeadBoards: dead, Queue: arbiter.GridQueueBackfill}
	seen := map[[2]int]bool{}
	for x := 0; x < w; x++ {
		for y := 0; y < h; y++ {
			for z := 0; z < 3; z++ {
				l := arbiter.BoardLocation{Cabinet: x, Frame: y, Board: z}
				ip, err := grid.StandardBoardIP(base, l)
				if err != nil {
					panic(err)
				}
				m.Boards = append(m.Boards, arbiter.BoardInfo{Board: arbiter.Board{X: x, Y: y, Z: z}, Location: l, IP: ip})
				if !seen[[2]int{x, y}] {
					seen[[2]int{x, y}] = true
					addr, _ := grid.StandardFrameIP(base, x, y)
					m.Frames = append(m.Frames, arbiter.GridFrame{Cabinet: x, Frame: y, Address: addr})
				}
			}
		}
	}
	m.Sort()
	if err := m.Validate(); err != nil {
		panic(err)
	}
	return m
}

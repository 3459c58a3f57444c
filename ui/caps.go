package ui

import (
	"encoding/json"
	"sort"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// Panels of the capabilities that keep their state in records: each reads
// its kind with records and shows only when there is something to show.

// records returns the committed records of one kind whose value is a T.
func records[T any](v *view, kind string) []T {
	var out []T
	for _, r := range v.plane.Records(kind) {
		switch x := r.Value.(type) {
		case T:
			out = append(out, x)
		case *T:
			if x != nil {
				out = append(out, *x)
			}
		case json.RawMessage:
			var t T
			if json.Unmarshal(x, &t) == nil {
				out = append(out, t)
			}
		}
	}
	return out
}

// Locks: a banner while any lock is held (a swap lock pauses manual swaps),
// with the holder, the note, the time left and, for admins, force release.

func locksData(v *view) (any, bool) {
	var held []arbiter.LockState
	for _, l := range records[arbiter.Lock](v, arbiter.RecordLock) {
		if l.ExpiresAt.After(v.Now) {
			held = append(held, l.Public(v.Now))
		}
	}
	return held, len(held) > 0
}

// Schedules: what external schedulers registered about their recurring
// jobs; arbiter shows them and never runs them.

type schedule struct {
	arbiter.Schedule
	Next *time.Time // NextRun when it is a time
}

func schedulesData(v *view) (any, bool) {
	var out []schedule
	for _, s := range records[arbiter.Schedule](v, arbiter.RecordSchedule) {
		u := schedule{Schedule: s}
		if t, err := time.Parse(time.RFC3339, s.NextRun); err == nil {
			u.Next = &t
		}
		out = append(out, u)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Next, out[j].Next
		switch {
		case a != nil && b != nil && !a.Equal(*b):
			return a.Before(*b)
		case (a == nil) != (b == nil):
			return a != nil
		}
		return out[i].ID < out[j].ID
	})
	return out, len(out) > 0
}

// Pools: each pool's backings and who holds each slot.

func poolsData(v *view) (any, bool) {
	ps := records[arbiter.PoolStatus](v, arbiter.RecordPool)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
	return ps, len(ps) > 0
}

// SlotOwner names the holder of a pool slot by its allocation id.
func (v *view) SlotOwner(id *int64) string {
	if id == nil {
		return ""
	}
	if a, ok := v.plane.Allocation(*id); ok {
		return a.Owner
	}
	return ""
}

// Tasks: the work queue of the task manifest — how many tasks are in each
// state, the ones running now, and the latest that failed for good.

const taskFailedRows = 10

type tasks struct {
	Counts  []count
	Active  []arbiter.Task // claimed or running, oldest claim first
	Pending int
	Failed  []arbiter.Task // latest first
}

type count struct {
	Status string
	N      int
}

func tasksData(v *view) (any, bool) {
	ts := records[arbiter.Task](v, arbiter.KindTask)
	if len(ts) == 0 {
		return nil, false
	}
	var d tasks
	n := map[string]int{}
	for _, t := range ts {
		n[t.Status]++
		switch t.Status {
		case arbiter.TaskClaimed, arbiter.TaskRunning:
			d.Active = append(d.Active, t)
		case arbiter.TaskFailed:
			d.Failed = append(d.Failed, t)
		}
	}
	for _, st := range arbiter.TaskStatuses {
		d.Counts = append(d.Counts, count{st, n[st]})
	}
	d.Pending = n[arbiter.TaskPending]
	sort.SliceStable(d.Active, func(i, j int) bool {
		return taskTime(d.Active[i].ClaimedAt).Before(taskTime(d.Active[j].ClaimedAt))
	})
	sort.SliceStable(d.Failed, func(i, j int) bool { return d.Failed[i].UpdatedAt.After(d.Failed[j].UpdatedAt) })
	if len(d.Failed) > taskFailedRows {
		d.Failed = d.Failed[:taskFailedRows]
	}
	return d, true
}

func taskTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

package engine

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// schedules is the schedule registry (docs/reference/coordination.md §4): what
// external schedulers report about their recurring jobs, stored and shown,
// never run.
type schedules struct {
	m map[string]*arbiter.Schedule
}

// maxSchedules bounds the registry.
const maxSchedules = 10000

func (r *schedules) init() {
	if r.m == nil {
		r.m = map[string]*arbiter.Schedule{}
	}
}

func (r *schedules) kinds() []string { return []string{arbiter.RecordSchedule} }

func (r *schedules) load(_ *Engine, recs []arbiter.Record, _ time.Time) error {
	r.init()
	var bad []string
	for _, rec := range recs {
		s, err := coordDecode[arbiter.Schedule](rec)
		if err != nil || s.ID != rec.Key {
			bad = append(bad, fmt.Sprintf("schedule %q: unreadable record", rec.Key))
			continue
		}
		r.m[s.ID] = &s
	}
	if len(bad) > 0 {
		return fmt.Errorf("schedules: %s", strings.Join(bad, "; "))
	}
	return nil
}

func (r *schedules) apply(e *Engine, cmd arbiter.Command, now time.Time) (any, error, bool) {
	r.init()
	switch c := cmd.(type) {
	case arbiter.RegisterSchedule:
		res, err := r.register(e, c, now)
		return res, err, true
	case arbiter.DeleteSchedule:
		res, err := r.delete(e, c, now)
		return res, err, true
	}
	return nil, nil, false
}

func (r *schedules) records() []arbiter.Record {
	ids := make([]string, 0, len(r.m))
	for id := range r.m {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make([]arbiter.Record, len(ids))
	for i, id := range ids {
		out[i] = arbiter.Record{Kind: arbiter.RecordSchedule, Key: id, Value: *r.m[id]}
	}
	return out
}

func (r *schedules) register(e *Engine, c arbiter.RegisterSchedule, now time.Time) (any, error) {
	s := c.Schedule
	s.Name = strings.TrimSpace(s.Name)
	s.ID = strings.TrimSpace(s.ID)
	s.Owner = strings.TrimSpace(s.Owner)
	s.Cron = strings.TrimSpace(s.Cron)
	s.NextRun = strings.TrimSpace(s.NextRun)
	if s.Name == "" {
		return nil, arbiter.Errorf(arbiter.EInvalid, "name is required")
	}
	if s.ID != "" && !arbiter.ValidScheduleID(s.ID) {
		return nil, arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)")
	}
	// A description is prose schedulers of seed 000 sent as they liked:
	// line breaks are kept as sent (CRLF too; a lone CR, which rewrites a
	// terminal's line, is refused), other control characters are refused,
	// as in every other field.
	if err := arbiter.ValidateLines("description", strings.ReplaceAll(s.Description, "\r\n", "\n"), arbiter.MaxScheduleDescription); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		what, v string
		max     int
	}{
		{"name", s.Name, arbiter.MaxScheduleName},
		{"owner", s.Owner, arbiter.MaxScheduleOwner},
		{"cron", s.Cron, arbiter.MaxScheduleCron},
		{"next_run", s.NextRun, arbiter.MaxScheduleNextRun},
	} {
		if err := arbiter.ValidateText(f.what, f.v, f.max); err != nil {
			return nil, err
		}
	}
	if s.Cron != "" && c.CronSpec == nil {
		return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q was not checked (a transport bug)", arbiter.Clip(s.Cron, 60))
	}
	if s.NextRun == "" && c.CronSpec != nil {
		next := c.CronSpec.Next(now)
		if next.IsZero() {
			return nil, arbiter.Errorf(arbiter.EInvalid, "cron %q never fires", arbiter.Clip(s.Cron, 60))
		}
		// As schedulers of seed 000 reported next_run and their dashboards
		// read it.
		s.NextRun = arbiter.PyISOFormat(next)
	}
	s.Principal = c.Caller.Name
	if old := r.m[s.ID]; s.ID != "" && old != nil {
		if err := mayChangeSchedule(c.Caller, old, "change"); err != nil {
			return nil, err
		}
		s.Principal = old.Principal
		s.RegisteredAt, s.UpdatedAt = old.RegisteredAt, now
		r.m[s.ID] = &s
		e.putRecord(arbiter.RecordSchedule, s.ID, s)
		e.emit(now, arbiter.EventScheduleUpdated, "schedule/"+s.ID, s)
		return s, nil
	}
	if len(r.m) >= maxSchedules {
		return nil, arbiter.Errorf(arbiter.EConflict, "the registry already holds %d schedules; delete some first", maxSchedules)
	}
	if s.ID == "" {
		if !arbiter.ValidScheduleID(c.GeneratedID) || r.m[c.GeneratedID] != nil {
			return nil, arbiter.Errorf(arbiter.EConflict, "the generated schedule id is unusable; retry")
		}
		s.ID = c.GeneratedID
	}
	s.RegisteredAt, s.UpdatedAt = now, now
	r.m[s.ID] = &s
	e.putRecord(arbiter.RecordSchedule, s.ID, s)
	e.emit(now, arbiter.EventScheduleRegistered, "schedule/"+s.ID, s)
	return s, nil
}

func (r *schedules) delete(e *Engine, c arbiter.DeleteSchedule, now time.Time) (any, error) {
	if !arbiter.ValidScheduleID(c.ID) {
		return nil, arbiter.Errorf(arbiter.EInvalid, "id must match [A-Za-z0-9_.-] (max 64 chars)")
	}
	s := r.m[c.ID]
	if s == nil {
		return nil, arbiter.Errorf(arbiter.ENotFound, "schedule %q is not registered", c.ID)
	}
	if err := mayChangeSchedule(c.Caller, s, "delete"); err != nil {
		return nil, err
	}
	delete(r.m, c.ID)
	e.removeRecord(arbiter.RecordSchedule, c.ID)
	e.emit(now, arbiter.EventScheduleDeleted, "schedule/"+c.ID, *s)
	return *s, nil
}

// mayChangeSchedule says whether the caller may change or delete s: an
// admin may, and the token that registered it; one registered without a
// token is anyone's. Errors: forbidden.
func mayChangeSchedule(c arbiter.Caller, s *arbiter.Schedule, what string) error {
	if c.Role == arbiter.RoleAdmin || s.Principal == "" || s.Principal == c.Name {
		return nil
	}
	return arbiter.Errorf(arbiter.EForbidden, "schedule %q was registered by %q; only it or an admin may %s it", s.ID, s.Principal, what)
}

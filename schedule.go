package arbiter

import (
	"time"
)

// RecordSchedule is the record kind of registered schedules (key: id).
const RecordSchedule = "schedule"

// Event kinds of the schedule registry; the data is the Schedule.
const (
	EventScheduleRegistered = "schedule.registered"
	EventScheduleUpdated    = "schedule.updated"
	EventScheduleDeleted    = "schedule.deleted"
)

// Limits of a schedule entry's fields.
const (
	MaxScheduleName        = 200
	MaxScheduleOwner       = 200
	MaxScheduleCron        = 200
	MaxScheduleDescription = 2000
	MaxScheduleNextRun     = 64
)

// Schedule is what an external scheduler registered about one of its
// recurring jobs (docs/reference/coordination.md §4). arbiter stores and shows it,
// never runs it. NextRun is the time the scheduler gave, or one computed
// from Cron when it gave none ("" when there is no cron either).
type Schedule struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Owner       string `json:"owner"`
	Cron        string `json:"cron"`
	NextRun     string `json:"next_run"`
	Description string `json:"description"`
	// Principal is the name of the token that registered it ("" on a
	// server without tokens): only it or an admin may change or delete it.
	Principal    string    `json:"principal,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// ValidScheduleID reports whether s may be a caller-supplied schedule id:
// ^[A-Za-z0-9_.-]{1,64}$. Ids reach URLs (DELETE /api/schedule/{id}) and
// the dashboard, so nothing else is accepted.
func ValidScheduleID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// CronSchedule is a parsed cron expression: Next returns the first time
// after t it fires, or the zero time if never. The transport parses the
// expression (github.com/robfig/cron/v3) and passes it in, so the engine
// computes next_run at its own now without depending on the parser.
type CronSchedule interface {
	Next(t time.Time) time.Time
}

// RegisterSchedule registers a schedule, or updates the one with the same
// id (keeping RegisteredAt). Schedule.ID "" registers a new entry under
// GeneratedID (a short random hex id the transport draws). The transport
// validates Cron and passes it parsed in CronSpec (nil when Cron is ""); when
// NextRun is "" the engine computes it from CronSpec at now. Result:
// Schedule. Errors: invalid for a missing name, a bad id or over-long field;
// forbidden for an update of a schedule another token registered, unless
// the caller is an admin (the schedule keeps its principal).
type RegisterSchedule struct {
	Caller      Caller
	Schedule    Schedule
	GeneratedID string
	CronSpec    CronSchedule
}

// DeleteSchedule removes a schedule. Result: Schedule (as it was). Errors:
// invalid for an id that fails ValidScheduleID, not_found when absent,
// forbidden when another token registered it and the caller is no admin.
type DeleteSchedule struct {
	Caller Caller
	ID     string
}

func (RegisterSchedule) isCommand()       {}
func (RegisterSchedule) result() Schedule { return Schedule{} }
func (DeleteSchedule) isCommand()         {}
func (DeleteSchedule) result() Schedule   { return Schedule{} }

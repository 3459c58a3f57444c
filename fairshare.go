package arbiter

import (
	"fmt"
	"math"
	"path"
	"sort"
	"strings"
	"time"
)

// Fair shares for small teams (docs/guides/fair-share.md): groups of people,
// quotas, a queue ordered by usage-based fair share, time limits with
// extend, preemption with a grace period, reservations and per-person
// notifications. The engine decides (engine/fairshare.go and its
// neighbours); this file holds the names everything shares.

// DefaultGroup is the group of an allocation that matches no [[groups]]
// entry, once any group is configured.
const DefaultGroup = "default"

// Event kinds of fair share.
const (
	// EventAllocationPreempting: a preemptible allocation is being
	// preempted; it ends at its ends_at, grace_s from now. Data: the
	// allocation (Preempting set).
	EventAllocationPreempting = "allocation.preempting"
	// EventAllocationTimeLimit: an allocation's time limit is near (notice_s
	// before its ends_at). Data: the allocation.
	EventAllocationTimeLimit = "allocation.time_limit"
	// EventAllocationExtended: an allocation's time limit was extended.
	EventAllocationExtended = "allocation.extended"
	// Reservations: data is the Reservation.
	EventReservationCreated = "reservation.created"
	EventReservationStarted = "reservation.started"
	EventReservationEnded   = "reservation.ended"
	EventReservationDeleted = "reservation.deleted"
	// EventQuotaUpdated, EventQuotaDeleted: an admin changed a quota. Data:
	// the Quota.
	EventQuotaUpdated = "quota.updated"
	EventQuotaDeleted = "quota.deleted"
	// EventNotification is a notification to one person, for one personal
	// subscription (subject "notify/<subscription id>"). Data: Notification.
	EventNotification = "notification"
)

// Reasons an allocation ends for fair share start with these.
const (
	ReasonPreemptedBy = "preempted by"
	ReasonTimeLimit   = "time limit"
)

// Record kinds of fair share. Policy, API quotas, usage accumulators,
// window usage and reservations are saved; standings and quota statuses
// are shown in the read view only (they change with time).
const (
	RecordFairSharePolicy = "fairshare.policy"   // key "config": FairSharePolicy
	RecordQuota           = "fairshare.quota"    // key Quota.Key(): a quota set through the API
	RecordGroupUsage      = "fairshare.usage"    // key group: GroupUsage
	RecordWindowUsage     = "fairshare.window"   // key subject: WindowUsage
	RecordStanding        = "fairshare.standing" // key group: GroupStanding (read view only)
	RecordQuotaStatus     = "fairshare.status"   // key Quota.Key(): QuotaStatus (read view only)
	RecordReservation     = "reservation"        // key id: Reservation
	RecordAllocationEnd   = "fairshare.end"      // key allocation id: AllocationEnd
)

// AllocationEnd is what a restart needs, beyond the allocation's EndsAt,
// to keep its end as it was: the reservation that moved the end earlier
// and the end it had before (which deleting that reservation gives back),
// and whether the notice of the end went out (not to be sent twice).
type AllocationEnd struct {
	Reservation string     `json:"reservation,omitempty"`
	OwnEndsAt   *time.Time `json:"own_ends_at,omitempty"`
	OwnReason   string     `json:"own_reason,omitempty"`
	Noticed     bool       `json:"noticed,omitempty"`
}

// Bounds.
const (
	MaxTimeLimitS    = 366 * 24 * 3600
	MaxGroups        = 1000
	MaxQuotas        = 1000
	MaxGroupMembers  = 10000
	MaxReservations  = 1000
	MaxFairShareS    = 366 * 24 * 3600
	DefaultHalfLifeS = 24 * 3600
	DefaultWindowS   = 7 * 24 * 3600
	MaxShare         = 1e6
)

// Group is a [[groups]] entry: people who share a fair-share account and
// quotas. A member is a principal (token) name, or a shell pattern over
// the owner ("alice", "bob@*", "task:*"): an allocation belongs to the
// first group, in configuration order, with a member equal to its
// principal or matching its owner.
type Group struct {
	Name    string   `json:"name"`
	Members []string `json:"members"`
	// TimeLimitS is the time limit of its members' requests that carry
	// none (0: none).
	TimeLimitS float64 `json:"time_limit_s,omitempty"`
	// Preemptible makes every allocation of the group preemptible.
	Preemptible bool `json:"preemptible,omitempty"`
}

// Has reports whether an allocation with this principal and owner belongs
// to g by its members.
func (g *Group) Has(principal, owner string) bool {
	for _, m := range g.Members {
		if principal != "" && m == principal {
			return true
		}
		if m == owner {
			return true
		}
		if ok, _ := path.Match(m, owner); ok {
			return true
		}
	}
	return false
}

// Quota limits a group or a person (a principal; the owner on a server
// without tokens): MaxGPUs held at once (only GPUs whose model matches
// Model when it is set), and MaxGPUHours used in any window of WindowS
// seconds. Nil means no limit of that kind.
type Quota struct {
	Group       string   `json:"group,omitempty"`
	Principal   string   `json:"principal,omitempty"`
	MaxGPUs     *int     `json:"max_gpus,omitempty"`
	Model       string   `json:"model,omitempty"`
	MaxGPUHours *float64 `json:"max_gpu_hours,omitempty"`
	WindowS     float64  `json:"window_s,omitempty"`
	// Source is "config" ([[quotas]]) or "api" (set by an admin; kept
	// across reloads, and over a configured quota of the same key).
	Source string `json:"source,omitempty"`
}

// Quota sources.
const (
	QuotaFromConfig = "config"
	QuotaFromAPI    = "api"
)

// Subject is "group:NAME" or "principal:NAME".
func (q *Quota) Subject() string {
	if q.Group != "" {
		return "group:" + q.Group
	}
	return "principal:" + q.Principal
}

// Key names the quota: its subject, and "/MODEL" when it counts one model
// pattern.
func (q *Quota) Key() string {
	if q.Model != "" {
		return q.Subject() + "/" + q.Model
	}
	return q.Subject()
}

// Window is the rolling window of MaxGPUHours (default a week).
func (q *Quota) Window() time.Duration {
	if q.WindowS <= 0 {
		return DefaultWindowS * time.Second
	}
	return time.Duration(q.WindowS * float64(time.Second))
}

// Validate checks a quota. Errors: invalid, naming the field.
func (q *Quota) Validate() error {
	switch {
	case (q.Group == "") == (q.Principal == ""):
		return Errorf(EInvalid, "a quota names exactly one of group or principal")
	case q.MaxGPUs == nil && q.MaxGPUHours == nil:
		return Errorf(EInvalid, "a quota sets max_gpus, max_gpu_hours or both")
	case q.MaxGPUs != nil && (*q.MaxGPUs < 0 || *q.MaxGPUs > 1000000):
		return Errorf(EInvalid, "max_gpus must be 0 to 1000000")
	case q.MaxGPUHours != nil && (!finite(*q.MaxGPUHours) || *q.MaxGPUHours < 0 || *q.MaxGPUHours > 1e9):
		return Errorf(EInvalid, "max_gpu_hours must be a number of GPU-hours, 0 to 1e9")
	case !finite(q.WindowS) || q.WindowS < 0 || q.WindowS > MaxFairShareS:
		return Errorf(EInvalid, "window_s must be 0 (a week) to %d seconds", MaxFairShareS)
	case q.Model != "" && q.MaxGPUs == nil:
		return Errorf(EInvalid, "model counts GPUs held: it needs max_gpus")
	case q.Model != "" && q.MaxGPUHours != nil:
		return Errorf(EInvalid, "a quota with a model counts GPUs held only: set max_gpu_hours in a quota without model")
	}
	if q.Group != "" {
		if err := ValidateName("group", q.Group); err != nil {
			return err
		}
	}
	if q.Principal != "" {
		if err := ValidateText("principal", q.Principal, 128); err != nil {
			return err
		}
	}
	if q.Model != "" {
		if _, err := path.Match(q.Model, ""); err != nil || len(q.Model) > 256 {
			return Errorf(EInvalid, "model pattern %q is malformed", Clip(q.Model, 60))
		}
	}
	return nil
}

// FairSharePolicy is what the configuration says of fair share: [[groups]],
// [[quotas]], [fairshare] and [preemption].
type FairSharePolicy struct {
	Groups []Group `json:"groups"`
	Quotas []Quota `json:"quotas"`
	// HalfLifeS is the half-life of the usage decay ([fairshare]
	// half_life_s, default a day).
	HalfLifeS float64 `json:"half_life_s"`
	// Shares is each group's share ([fairshare] shares; default 1 each).
	Shares map[string]float64 `json:"shares"`
	// NoticeS is how long before an allocation's time limit its holder is
	// told (allocation.time_limit; [fairshare] notice_s, default 300).
	NoticeS float64 `json:"notice_s"`
	// GraceS is the time between allocation.preempting and the end
	// ([preemption] grace_s, default 300); MinRuntimeS protects new work
	// from preemption ([preemption] min_runtime_s, default 600).
	GraceS      float64 `json:"grace_s"`
	MinRuntimeS float64 `json:"min_runtime_s"`
}

// DefaultFairSharePolicy is the policy of a configuration without any of
// the sections: no groups, no quotas.
func DefaultFairSharePolicy() FairSharePolicy {
	return FairSharePolicy{HalfLifeS: DefaultHalfLifeS, Shares: map[string]float64{}, NoticeS: 300, GraceS: 300, MinRuntimeS: 600}
}

// Share returns group g's share (1 when not configured).
func (p *FairSharePolicy) Share(g string) float64 {
	if s, ok := p.Shares[g]; ok {
		return s
	}
	return 1
}

// Validate checks a policy. Errors: invalid, naming the entry.
func (p *FairSharePolicy) Validate() error {
	if len(p.Groups) > MaxGroups {
		return Errorf(EInvalid, "at most %d groups", MaxGroups)
	}
	if len(p.Quotas) > MaxQuotas {
		return Errorf(EInvalid, "at most %d quotas", MaxQuotas)
	}
	names := map[string]bool{}
	for i, g := range p.Groups {
		if err := ValidateName("group name", g.Name); err != nil {
			return Errorf(EInvalid, "groups[%d]: %s", i, ErrorMessage(err))
		}
		if names[g.Name] {
			return Errorf(EInvalid, "groups[%d]: group %q is listed twice", i, g.Name)
		}
		names[g.Name] = true
		if len(g.Members) > MaxGroupMembers {
			return Errorf(EInvalid, "groups[%d]: at most %d members", i, MaxGroupMembers)
		}
		for j, m := range g.Members {
			if m == "" || len(m) > 128 {
				return Errorf(EInvalid, "groups[%d].members[%d]: a member is a principal name or owner pattern of 1 to 128 bytes", i, j)
			}
			if _, err := path.Match(m, ""); err != nil {
				return Errorf(EInvalid, "groups[%d].members[%d]: pattern %q is malformed", i, j, Clip(m, 60))
			}
		}
		if !finite(g.TimeLimitS) || g.TimeLimitS < 0 || g.TimeLimitS > MaxTimeLimitS {
			return Errorf(EInvalid, "groups[%d].time_limit_s must be 0 (none) to %d seconds", i, MaxTimeLimitS)
		}
	}
	keys := map[string]bool{}
	for i := range p.Quotas {
		q := &p.Quotas[i]
		if err := q.Validate(); err != nil {
			return Errorf(EInvalid, "quotas[%d]: %s", i, ErrorMessage(err))
		}
		if keys[q.Key()] {
			return Errorf(EInvalid, "quotas[%d]: a quota for %s is listed twice", i, q.Key())
		}
		keys[q.Key()] = true
	}
	if !finite(p.HalfLifeS) || p.HalfLifeS < 1 || p.HalfLifeS > MaxFairShareS {
		return Errorf(EInvalid, "half_life_s must be 1 to %d seconds", MaxFairShareS)
	}
	for g, s := range p.Shares {
		if !finite(s) || s <= 0 || s > MaxShare {
			return Errorf(EInvalid, "shares.%s must be more than 0 and at most %g", g, MaxShare)
		}
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"notice_s", p.NoticeS}, {"grace_s", p.GraceS}, {"min_runtime_s", p.MinRuntimeS}} {
		if !finite(v.v) || v.v < 0 || v.v > MaxFairShareS {
			return Errorf(EInvalid, "%s must be 0 to %d seconds", v.name, MaxFairShareS)
		}
	}
	return nil
}

// GroupOf returns the group an allocation of this principal and owner
// belongs to: the first with a matching member, DefaultGroup when none
// matches, "" when no group is configured.
func (p *FairSharePolicy) GroupOf(principal, owner string) *Group {
	for i := range p.Groups {
		if p.Groups[i].Has(principal, owner) {
			return &p.Groups[i]
		}
	}
	return nil
}

// FairShareFactor is the documented factor of a group
// (docs/guides/fair-share.md): F = 2^(-U/S), where U is the group's
// fraction of all groups' decayed usage and S its fraction of all shares.
// It is 1 for a group that used nothing, 0.5 for one whose usage matches
// its share, and never 0: the queue orders groups by the exponent U/S, so
// that even factors too small to print keep their order.
func FairShareFactor(usageFrac, shareFrac float64) float64 {
	return math.Exp2(-FairShareExponent(usageFrac, shareFrac))
}

// FairShareExponent is U/S of FairShareFactor (0 when there is no usage).
func FairShareExponent(usageFrac, shareFrac float64) float64 {
	if usageFrac <= 0 || shareFrac <= 0 {
		return 0
	}
	return usageFrac / shareFrac
}

// DecayedUsage brings a decayed GPU-seconds accumulator forward by d during
// which n GPUs were held: u·2^(-d/H) + n·H/ln2·(1 − 2^(-d/H)), the exact
// integral of the GPUs held weighted by 2^(-age/H).
func DecayedUsage(u float64, n int, d, halfLife time.Duration) float64 {
	if d <= 0 {
		return u
	}
	h := halfLife.Seconds()
	k := math.Exp2(-d.Seconds() / h)
	return u*k + float64(n)*h/math.Ln2*(1-k)
}

// GroupUsage is the saved decayed usage of a group: GPU-seconds, decayed,
// as of At.
type GroupUsage struct {
	Group  string    `json:"group"`
	GPUSec float64   `json:"gpu_s"`
	At     time.Time `json:"at"`
}

// GroupStanding is a group's fair-share standing, as GET /api/v1/fairshare
// shows it. UsageGPUSec (decayed GPU-seconds as of UsageAt, while it held
// HeldGPUs) and HalfLifeS are what StandingsAt brings forward.
type GroupStanding struct {
	Group       string    `json:"group"`
	UsageGPUSec float64   `json:"usage_gpu_s"`
	UsageAt     time.Time `json:"usage_at"`
	HalfLifeS   float64   `json:"half_life_s"`
	// Share and SharePct: its configured share, and its fraction of all.
	Share    float64 `json:"share"`
	SharePct float64 `json:"share_pct"`
	// UsageGPUHours is its decayed usage; UsagePct its fraction of all
	// groups' decayed usage.
	UsageGPUHours float64 `json:"usage_gpu_hours"`
	UsagePct      float64 `json:"usage_pct"`
	// Factor is 2^(-usage_pct/share_pct); Rank is its place in the queue
	// order among groups (1 first).
	Factor   float64   `json:"factor"`
	Rank     int       `json:"rank"`
	HeldGPUs int       `json:"held_gpus"`
	Queued   int       `json:"queued"`
	AsOf     time.Time `json:"as_of"`
}

// StandingsAt brings standings forward to now (each group's usage decayed
// and grown by the GPUs it holds) and works out the fractions, factors and
// ranks across them, in rank order (then name).
func StandingsAt(in []GroupStanding, now time.Time) []GroupStanding {
	out := append([]GroupStanding(nil), in...)
	var total, shares float64
	for i := range out {
		s := &out[i]
		if now.After(s.UsageAt) && s.HalfLifeS > 0 {
			s.UsageGPUSec = DecayedUsage(s.UsageGPUSec, s.HeldGPUs, now.Sub(s.UsageAt), time.Duration(s.HalfLifeS*float64(time.Second)))
			s.UsageAt = now
		}
		total += s.UsageGPUSec
		shares += s.Share
	}
	x := make(map[string]float64, len(out))
	for i := range out {
		s := &out[i]
		s.AsOf = now
		s.UsageGPUHours = s.UsageGPUSec / 3600
		uf, sf := 0.0, 0.0
		if total > 0 {
			uf = s.UsageGPUSec / total
		}
		if shares > 0 {
			sf = s.Share / shares
		}
		s.UsagePct, s.SharePct = 100*uf, 100*sf
		s.Factor = FairShareFactor(uf, sf)
		x[s.Group] = FairShareExponent(uf, sf)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if x[out[i].Group] != x[out[j].Group] {
			return x[out[i].Group] < x[out[j].Group]
		}
		return out[i].Group < out[j].Group
	})
	for i := range out {
		out[i].Rank = i + 1
		if i > 0 && x[out[i].Group] == x[out[i-1].Group] {
			out[i].Rank = out[i-1].Rank
		}
	}
	return out
}

// QuotaStatus is a quota with its use, as GET /api/v1/quotas shows it.
type QuotaStatus struct {
	Quota
	Key string `json:"key"`
	// HeldGPUs counts the GPUs its subject holds now (of Model, if set).
	HeldGPUs int `json:"held_gpus"`
	// UsedGPUHours is what its subject used in the window up to AsOf;
	// CommittedGPUHours what its live allocations may still use until
	// their time limits (max_gpu_hours quotas only).
	UsedGPUHours      float64   `json:"used_gpu_hours"`
	CommittedGPUHours float64   `json:"committed_gpu_hours"`
	AsOf              time.Time `json:"as_of"`
}

// WindowUsage is the saved usage of a quota subject that ended within the
// longest window of its max_gpu_hours quotas: spans of GPUs held.
type WindowUsage struct {
	Subject string      `json:"subject"`
	Spans   []UsageSpan `json:"spans"`
}

// UsageSpan is GPUs held from Start to End.
type UsageSpan struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	GPUs  float64   `json:"gpus"`
}

// Preempting says that an allocation is being preempted: by whom, since
// when; it ends at the allocation's EndsAt.
type Preempting struct {
	By    string    `json:"by"`
	Since time.Time `json:"since"`
	// For is the queued allocation it is preempted for; absent when a
	// reservation preempts it. Its GPUs are kept for that one.
	For int64 `json:"for,omitempty"`
}

// Reservation keeps GPUs free for a group during a window, once (Start,
// DurationS) or recurring (Cron, each window DurationS long, from Start
// on). Devices are chosen when it is made: GPUs of Machine, or of the
// machines carrying all of Tags.
type Reservation struct {
	ID        string      `json:"id"`
	GPUs      int         `json:"gpus"`
	Machine   string      `json:"machine,omitempty"`
	Tags      []string    `json:"tags,omitempty"`
	Start     time.Time   `json:"start"`
	DurationS float64     `json:"duration_s"`
	Group     string      `json:"group"`
	Cron      string      `json:"cron,omitempty"`
	Devices   []DeviceRef `json:"devices"`
	CreatedBy string      `json:"created_by,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
	// Active: a window is open now. WindowStart and WindowEnd are the open
	// window, or the next one (null when none is left).
	Active      bool       `json:"active"`
	WindowStart *time.Time `json:"window_start"`
	WindowEnd   *time.Time `json:"window_end"`
}

// Duration is the length of each window.
func (r *Reservation) Duration() time.Duration {
	return time.Duration(r.DurationS * float64(time.Second))
}

// Validate checks what the caller gives of a reservation. Errors: invalid.
func (r *Reservation) Validate() error {
	switch {
	case r.GPUs < 1 || r.GPUs > 100000:
		return Errorf(EInvalid, "gpus must be 1 to 100000")
	case r.Machine != "" && len(r.Tags) > 0:
		return Errorf(EInvalid, "give machine or tags, not both")
	case r.Machine == "" && len(r.Tags) == 0:
		return Errorf(EInvalid, "give machine (one machine's GPUs) or tags (GPUs of machines carrying them)")
	case !finite(r.DurationS) || r.DurationS < 60 || r.DurationS > MaxFairShareS:
		return Errorf(EInvalid, "duration_s must be 60 to %d seconds", MaxFairShareS)
	case r.Start.IsZero() && r.Cron == "":
		return Errorf(EInvalid, "start is required for a one-off reservation (RFC 3339); give cron for a recurring one")
	case len(r.Cron) > MaxScheduleCron:
		return Errorf(EInvalid, "cron is longer than %d bytes", MaxScheduleCron)
	}
	if r.Machine != "" {
		if err := ValidateName("machine", r.Machine); err != nil {
			return err
		}
	}
	for _, t := range r.Tags {
		if t == "" || len(t) > 64 {
			return Errorf(EInvalid, "tags must be 1 to 64 bytes each")
		}
	}
	if err := ValidateName("group", r.Group); err != nil {
		return err
	}
	if r.ID != "" {
		if err := ValidateName("reservation id", r.ID); err != nil {
			return err
		}
	}
	return nil
}

// Notification kinds a person may subscribe to (arbiter notify add).
const (
	NotifyReady       = "allocation.ready"      // my allocation is ready
	NotifyIdle        = "allocation.idle"       // my allocation's GPUs are idle
	NotifyTimeLimit   = "allocation.time_limit" // my allocation's time limit is near
	NotifyPreempting  = "allocation.preempting" // my allocation is being preempted
	NotifyReservation = "reservation.started"   // a reservation of my group started
	NotifyTaskDone    = "task.completed"        // a task finished
	NotifyTaskFailed  = "task.failed"           // a task failed for good
	NotifyGPUFree     = "gpu.free"              // a GPU matching my request is free
	WebhookSlack      = "slack"                 // the format of Slack-compatible receivers: {"text": …}
	notifyPrefix      = "notify/"               // subject prefix of EventNotification
	maxNotifyText     = 1000                    // bytes of Notification.Text
	notifyAllKinds    = "allocation.ready allocation.idle allocation.time_limit allocation.preempting reservation.started task.completed task.failed gpu.free"
	notifySubjectSize = 64
)

// NotifyKinds are the notification kinds, in the order the docs list them.
func NotifyKinds() []string { return strings.Fields(notifyAllKinds) }

// IsNotifyKind reports whether k is a notification kind.
func IsNotifyKind(k string) bool {
	for _, n := range NotifyKinds() {
		if n == k {
			return true
		}
	}
	return false
}

// NotifySubject is the subject of a notification event for subscription id.
func NotifySubject(id string) string { return notifyPrefix + id }

// Notification is the data of an EventNotification: what happened, said
// to one person.
type Notification struct {
	Subscription string `json:"subscription"`
	Principal    string `json:"principal"`
	Kind         string `json:"kind"`
	// Text is one line for a person ("allocation 12 (2 GPUs on gpu1) is
	// ready"); the Slack-compatible format sends it alone.
	Text string `json:"text"`
	// Subject and Data are those of the event it is about.
	Subject string `json:"subject"`
	Data    any    `json:"data,omitempty"`
}

// NotifyMatch narrows a personal subscription: gpu.free fires when GPUs
// matching the request (GPUs, Model, Tags, Machine, MinVRAMGiB) are free;
// task kinds fire for tasks whose name matches Task (a shell pattern,
// default all).
type NotifyMatch struct {
	GPUs       int      `json:"gpus,omitempty"`
	Model      string   `json:"model,omitempty"`
	Tags       []string `json:"tags,omitempty"`
	Machine    string   `json:"machine,omitempty"`
	MinVRAMGiB float64  `json:"min_vram_gib,omitempty"`
	Task       string   `json:"task,omitempty"`
}

// Request is the request gpu.free watches for (at least one GPU).
func (m *NotifyMatch) Request(owner string) Request {
	n := m.GPUs
	if n < 1 {
		n = 1
	}
	return Request{Owner: owner, GPUs: n, Model: m.Model, Tags: m.Tags, Machine: m.Machine, MinVRAMGiB: m.MinVRAMGiB}
}

// validateNotify checks a personal subscription's own fields.
func (w *Webhook) validateNotify() error {
	if err := ValidateText("principal", w.Principal, 128); err != nil {
		return err
	}
	for _, k := range w.Kinds {
		if !IsNotifyKind(k) {
			return Errorf(EInvalid, "kind %q is not a notification kind; want some of %s", Clip(k, 60), strings.Join(NotifyKinds(), ", "))
		}
	}
	if m := w.Match; m != nil {
		switch {
		case m.GPUs < 0 || m.GPUs > MaxGPUsPerMachine:
			return Errorf(EInvalid, "match.gpus must be 0 to %d", MaxGPUsPerMachine)
		case !finite(m.MinVRAMGiB) || m.MinVRAMGiB < 0:
			return Errorf(EInvalid, "match.min_vram_gib must be a number of GiB, at least 0")
		case len(m.Tags) > 32:
			return Errorf(EInvalid, "match.tags has more than 32 tags")
		}
		for _, p := range []string{m.Model, m.Task} {
			if _, err := path.Match(p, ""); err != nil || len(p) > 256 {
				return Errorf(EInvalid, "match pattern %q is malformed", Clip(p, 60))
			}
		}
		if m.Machine != "" {
			if err := ValidateName("match.machine", m.Machine); err != nil {
				return err
			}
		}
	}
	return nil
}

// WantsEvent reports whether the subscription takes an event: a personal
// one (Principal set) only the notifications made for it; any other the
// kinds it names, never notifications unless it names "notification".
func (w *Webhook) WantsEvent(kind, subject string) bool {
	if w.Principal != "" {
		return kind == EventNotification && subject == NotifySubject(w.ID)
	}
	if kind == EventNotification {
		for _, k := range w.Kinds {
			if k == kind {
				return true
			}
		}
		return false
	}
	return w.Wants(kind)
}

// CreateNotify adds a personal subscription for Caller (or, for an admin
// or on a server without tokens, for Webhook.Principal): Webhook's URL,
// Format (standard or slack), Secret (drawn by the transport when empty),
// Kinds (notification kinds) and Match. Result: Webhook with its secret
// (shown once). Errors: invalid; forbidden for a principal that is not the
// caller's.
type CreateNotify struct {
	Caller         Caller
	Webhook        Webhook
	AllowLinkLocal bool
}

// DeleteNotify removes a personal subscription. Result: Webhook (public).
// Errors: not_found; forbidden when it is another person's and the caller
// is no admin.
type DeleteNotify struct {
	Caller Caller
	ID     string
}

// SetFairShare sets the fair-share policy (the configuration's groups,
// quotas, [fairshare] and [preemption]): groups of live allocations are
// worked out again, and quotas set through the API stay. Result: None.
// Errors: invalid.
type SetFairShare struct {
	Policy FairSharePolicy
}

// SetQuota adds or replaces a quota (admin), kept over the configuration's
// of the same key until deleted. Result: QuotaStatus. Errors: invalid.
type SetQuota struct {
	Caller Caller
	Quota  Quota
}

// DeleteQuota removes a quota set through the API (the configured one of
// the same key, if any, applies again). Result: QuotaStatus (as it was).
// Errors: not_found; conflict for a quota that comes from the
// configuration only (change the file).
type DeleteQuota struct {
	Caller Caller
	Key    string
}

// CreateReservation makes a reservation for a group (admin). The engine
// chooses the devices and gives an id when Reservation.ID is "". Result:
// Reservation. Errors: invalid (a bad field, an unknown group or machine,
// a cron the server cannot read, a start in the past); conflict when not
// enough GPUs are free of other reservations in its windows.
type CreateReservation struct {
	Caller      Caller
	Reservation Reservation
}

// DeleteReservation removes a reservation (admin); allocations inside an
// open window keep their time limits. Result: Reservation (as it was).
// Errors: not_found.
type DeleteReservation struct {
	Caller Caller
	ID     string
}

// ExtendAllocation moves a ready allocation's time limit ByS seconds
// later. Allowed to its principal or an admin while no queued request
// could use its GPUs, within its quotas and before any reservation of its
// GPUs. Result: Allocation. Errors: not_found; forbidden; conflict with the
// reason it is refused (someone waits, a quota, a reservation, no time
// limit); invalid for ByS out of range.
type ExtendAllocation struct {
	Caller Caller
	ID     int64
	ByS    float64
}

func (SetFairShare) isCommand()               {}
func (SetFairShare) result() None             { return None{} }
func (SetQuota) isCommand()                   {}
func (SetQuota) result() QuotaStatus          { return QuotaStatus{} }
func (DeleteQuota) isCommand()                {}
func (DeleteQuota) result() QuotaStatus       { return QuotaStatus{} }
func (CreateReservation) isCommand()          {}
func (CreateReservation) result() Reservation { return Reservation{} }
func (DeleteReservation) isCommand()          {}
func (DeleteReservation) result() Reservation { return Reservation{} }
func (ExtendAllocation) isCommand()           {}
func (ExtendAllocation) result() Allocation   { return Allocation{} }
func (CreateNotify) isCommand()               {}
func (CreateNotify) result() Webhook          { return Webhook{} }
func (DeleteNotify) isCommand()               {}
func (DeleteNotify) result() Webhook          { return Webhook{} }

// validateFairShare checks the request fields of fair share.
func (r *Request) validateFairShare() error {
	if t := r.TimeLimitS; t != nil && (!finite(*t) || *t < 1 || *t > MaxTimeLimitS) {
		return Errorf(EInvalid, "time_limit_s must be 1 to %d seconds", MaxTimeLimitS)
	}
	if r.Reservation != "" {
		if err := ValidateName("reservation", r.Reservation); err != nil {
			return err
		}
	}
	return nil
}

// SortReservations orders reservations by their window's start (those
// without a window last), then id.
func SortReservations(rs []Reservation) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i].WindowStart, rs[j].WindowStart
		if (a == nil) != (b == nil) {
			return a != nil
		}
		if a != nil && !a.Equal(*b) {
			return a.Before(*b)
		}
		return rs[i].ID < rs[j].ID
	})
}

// SortQuotaStatuses orders statuses by key.
func SortQuotaStatuses(qs []QuotaStatus) {
	sort.Slice(qs, func(i, j int) bool { return qs[i].Key < qs[j].Key })
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// FormatShare writes a fair-share factor for people: "0.62", or "<0.01".
func FormatShare(f float64) string {
	if f > 0 && f < 0.01 {
		return "<0.01"
	}
	return fmt.Sprintf("%.2f", f)
}

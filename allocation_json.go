package arbiter

import (
	"math"
	"strconv"
	"time"
)

// An allocation is written as JSON several times per change — the event
// that announces it, the stored row, the answer to its caller — and
// reflection made that a tenth of a busy server's CPU. AppendJSON writes
// the same bytes as encoding/json would from the struct tags, without
// reflection; allocation_json_test.go holds the two to each other for
// every field. A field added to Allocation, Request, DeviceRef or
// GridRequest must be added here too (the test fails until it is).

// MarshalJSON writes a as JSON.
func (a Allocation) MarshalJSON() ([]byte, error) {
	return a.AppendJSON(make([]byte, 0, 512)), nil
}

// AppendJSON appends a's JSON to b. Times outside the years 0–9999 and
// non-finite numbers, which encoding/json refuses, never reach an
// allocation (requests are validated); they are written as null.
func (a *Allocation) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, a.ID, 10)
	b = append(b, `,"owner":`...)
	b = taskAppendString(b, a.Owner)
	if a.Label != "" {
		b = append(b, `,"label":`...)
		b = taskAppendString(b, a.Label)
	}
	b = append(b, `,"state":`...)
	b = taskAppendString(b, a.State)
	b = append(b, `,"reason":`...)
	b = appendStrPtr(b, a.Reason)
	b = append(b, `,"machine":`...)
	b = appendStrPtr(b, a.Machine)
	b = append(b, `,"devices":`...)
	if a.Devices == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range a.Devices {
			if i > 0 {
				b = append(b, ',')
			}
			b = a.Devices[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	b = append(b, `,"request":`...)
	b = a.Request.appendJSON(b)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(a.Priority), 10)
	b = append(b, `,"keepalive_s":`...)
	b = appendFloatPtr(b, a.KeepaliveS)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, a.CreatedAt)
	b = append(b, `,"ready_at":`...)
	b = appendTimePtr(b, a.ReadyAt)
	b = append(b, `,"destroyed_at":`...)
	b = appendTimePtr(b, a.DestroyedAt)
	b = append(b, `,"expires_at":`...)
	b = appendTimePtr(b, a.ExpiresAt)
	b = append(b, `,"why_queued":`...)
	b = appendStrPtr(b, a.WhyQueued)
	if a.Principal != "" {
		b = append(b, `,"principal":`...)
		b = taskAppendString(b, a.Principal)
	}
	if a.Pool != "" {
		b = append(b, `,"pool":`...)
		b = taskAppendString(b, a.Pool)
	}
	if a.Backing != nil {
		b = append(b, `,"backing":`...)
		b = strconv.AppendInt(b, *a.Backing, 10)
	}
	if a.Slot != nil {
		b = append(b, `,"slot":`...)
		b = strconv.AppendInt(b, int64(*a.Slot), 10)
	}
	if len(a.Boards) > 0 {
		b = append(b, `,"boards":[`...)
		for i, bd := range a.Boards {
			if i > 0 {
				b = append(b, ',')
			}
			b = bd.appendJSON(b)
		}
		b = append(b, ']')
	}
	if a.Power != nil {
		b = append(b, `,"power":`...)
		b = strconv.AppendBool(b, *a.Power)
	}
	b = append(b, `,"usage":`...)
	if u := a.Usage; u == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"gpu_s":`...)
		b = appendFloat(b, u.GPUS)
		b = append(b, `,"busy_gpu_s":`...)
		b = appendFloat(b, u.BusyGPUS)
		b = append(b, `,"idle_gpu_s":`...)
		b = appendFloat(b, u.IdleGPUS)
		b = append(b, `,"peak_mem_mib":`...)
		b = strconv.AppendInt(b, u.PeakMemMiB, 10)
		b = append(b, `,"wait_s":`...)
		b = appendFloat(b, u.WaitS)
		b = append(b, `,"accounted_at":`...)
		b = appendTime(b, u.AccountedAt)
		b = append(b, '}')
	}
	b = append(b, `,"idle_since":`...)
	b = appendTimePtr(b, a.IdleSince)
	if a.Group != "" {
		b = append(b, `,"group":`...)
		b = taskAppendString(b, a.Group)
	}
	b = append(b, `,"ends_at":`...)
	b = appendTimePtr(b, a.EndsAt)
	if a.EndReason != "" {
		b = append(b, `,"end_reason":`...)
		b = taskAppendString(b, a.EndReason)
	}
	b = append(b, `,"position":`...)
	if a.Position == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*a.Position), 10)
	}
	b = append(b, `,"eta":`...)
	b = appendTimePtr(b, a.ETA)
	if a.Preemptible {
		b = append(b, `,"preemptible":true`...)
	}
	if p := a.Preempting; p != nil {
		b = append(b, `,"preempting":{"by":`...)
		b = taskAppendString(b, p.By)
		b = append(b, `,"since":`...)
		b = appendTime(b, p.Since)
		if p.For != 0 {
			b = append(b, `,"for":`...)
			b = strconv.AppendInt(b, p.For, 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func (d *DeviceRef) appendJSON(b []byte) []byte {
	b = append(b, `{"machine":`...)
	b = taskAppendString(b, d.Machine)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(d.Index), 10)
	b = append(b, `,"uuid":`...)
	b = taskAppendString(b, d.UUID)
	b = append(b, `,"model":`...)
	b = taskAppendString(b, d.Model)
	b = append(b, `,"vram_gib":`...)
	b = appendFloat(b, d.VRAMGiB)
	return append(b, '}')
}

func (bd Board) appendJSON(b []byte) []byte {
	b = append(b, `{"x":`...)
	b = strconv.AppendInt(b, int64(bd.X), 10)
	b = append(b, `,"y":`...)
	b = strconv.AppendInt(b, int64(bd.Y), 10)
	b = append(b, `,"z":`...)
	b = strconv.AppendInt(b, int64(bd.Z), 10)
	return append(b, '}')
}

func (r *Request) appendJSON(b []byte) []byte {
	b = append(b, `{"owner":`...)
	b = taskAppendString(b, r.Owner)
	if r.Label != "" {
		b = append(b, `,"label":`...)
		b = taskAppendString(b, r.Label)
	}
	b = append(b, `,"gpus":`...)
	b = strconv.AppendInt(b, int64(r.GPUs), 10)
	if r.MinVRAMGiB != 0 {
		b = append(b, `,"min_vram_gib":`...)
		b = appendFloat(b, r.MinVRAMGiB)
	}
	if r.RequireCUDA {
		b = append(b, `,"require_cuda":true`...)
	}
	if r.MinCompute != "" {
		b = append(b, `,"min_compute":`...)
		b = taskAppendString(b, r.MinCompute)
	}
	if r.Model != "" {
		b = append(b, `,"model":`...)
		b = taskAppendString(b, r.Model)
	}
	if len(r.Tags) > 0 {
		b = append(b, `,"tags":`...)
		b = appendStrings(b, r.Tags)
	}
	if r.Machine != "" {
		b = append(b, `,"machine":`...)
		b = taskAppendString(b, r.Machine)
	}
	if r.Priority != 0 {
		b = append(b, `,"priority":`...)
		b = strconv.AppendInt(b, int64(r.Priority), 10)
	}
	if r.IdleExempt {
		b = append(b, `,"idle_exempt":true`...)
	}
	if r.Pool != "" {
		b = append(b, `,"pool":`...)
		b = taskAppendString(b, r.Pool)
	}
	if r.Grid != nil {
		b = append(b, `,"grid":`...)
		b = r.Grid.appendJSON(b)
	}
	b = append(b, `,"keepalive_s":`...)
	b = appendFloatPtr(b, r.KeepaliveS)
	if r.TimeLimitS != nil {
		b = append(b, `,"time_limit_s":`...)
		b = appendFloat(b, *r.TimeLimitS)
	}
	if r.Preemptible {
		b = append(b, `,"preemptible":true`...)
	}
	if r.Reservation != "" {
		b = append(b, `,"reservation":`...)
		b = taskAppendString(b, r.Reservation)
	}
	return append(b, '}')
}

// appendJSON writes the request as its MarshalJSON does: the form as
// "args".
func (r *GridRequest) appendJSON(b []byte) []byte {
	b = append(b, `{"args":`...)
	b = appendInts(b, r.EchoArgs())
	if r.MinRatio != 0 {
		b = append(b, `,"min_ratio":`...)
		b = appendFloat(b, r.MinRatio)
	}
	if r.MaxDeadBoards != nil {
		b = append(b, `,"max_dead_boards":`...)
		b = strconv.AppendInt(b, int64(*r.MaxDeadBoards), 10)
	}
	if r.MaxDeadLinks != nil {
		b = append(b, `,"max_dead_links":`...)
		b = strconv.AppendInt(b, int64(*r.MaxDeadLinks), 10)
	}
	if r.RequireTorus {
		b = append(b, `,"require_torus":true`...)
	}
	if len(r.Kwargs) > 0 {
		b = append(b, `,"kwargs":`...)
		b = appendRawJSON(b, r.Kwargs) // not JSON (null): never stored so, decoding checks it
	}
	if r.KeepaliveHost != "" {
		b = append(b, `,"keepalivehost":`...)
		b = taskAppendString(b, r.KeepaliveHost)
	}
	return append(b, '}')
}

func appendStrPtr(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return taskAppendString(b, *s)
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = taskAppendString(b, s)
	}
	return append(b, ']')
}

// appendFloat writes f as encoding/json does.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 → e-9, as encoding/json writes it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

func appendFloatPtr(b []byte, f *float64) []byte {
	if f == nil {
		return append(b, "null"...)
	}
	return appendFloat(b, *f)
}

// appendTime writes t as time.Time.MarshalJSON does.
func appendTime(b []byte, t time.Time) []byte {
	if y := t.Year(); y < 0 || y > 9999 {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendTimePtr(b []byte, t *time.Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	return appendTime(b, *t)
}

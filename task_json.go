package arbiter

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// A task is written as JSON on every change — its stored record, and the
// answer to the worker that claims it (the spec) — and reflection made
// that ~5 % of the server's CPU under a busy work queue. As for
// allocations (allocation_json.go), AppendJSON writes the bytes
// encoding/json would write from the struct tags, and task_json_test.go
// holds the two to each other for every field: a field added to Task or
// TaskSpec must be added here too (the test fails until it is).

// MarshalJSON writes t as JSON.
func (t Task) MarshalJSON() ([]byte, error) {
	return t.AppendJSON(make([]byte, 0, 1024)), nil
}

// AppendJSON appends t's JSON to b. Times outside the years 0–9999, which
// encoding/json refuses, never reach a task; they are written as null.
func (t *Task) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = taskAppendString(b, t.ID)
	b = append(b, `,"name":`...)
	b = taskAppendString(b, t.Name)
	b = append(b, `,"spec":`...)
	if t.Spec == nil {
		b = append(b, "null"...)
	} else {
		b = t.Spec.AppendJSON(b)
	}
	b = append(b, `,"status":`...)
	b = taskAppendString(b, t.Status)
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(t.Attempts), 10)
	b = append(b, `,"claim":`...)
	b = strconv.AppendInt(b, t.Claim, 10)
	b = append(b, `,"claimed_by":`...)
	b = taskAppendString(b, t.ClaimedBy)
	b = append(b, `,"claimed_at":`...)
	b = appendTimePtr(b, t.ClaimedAt)
	b = append(b, `,"heartbeat_at":`...)
	b = appendTimePtr(b, t.HeartbeatAt)
	b = append(b, `,"completed_at":`...)
	b = appendTimePtr(b, t.CompletedAt)
	b = append(b, `,"last_error":`...)
	b = taskAppendString(b, t.LastError)
	b = append(b, `,"artifact_id":`...)
	b = taskAppendString(b, t.ArtifactID)
	b = append(b, `,"allocation_id":`...)
	b = strconv.AppendInt(b, t.AllocationID, 10)
	b = append(b, `,"machine":`...)
	b = taskAppendString(b, t.Machine)
	b = append(b, `,"gpus":`...)
	b = appendInts(b, t.GPUs)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, t.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendTime(b, t.UpdatedAt)
	b = append(b, `,"seq":`...)
	b = strconv.AppendInt(b, t.Seq, 10)
	b = append(b, `,"in_manifest":`...)
	b = strconv.AppendBool(b, t.InManifest)
	return append(b, '}')
}

// MarshalJSON writes s as JSON.
func (s TaskSpec) MarshalJSON() ([]byte, error) {
	return s.AppendJSON(make([]byte, 0, 512)), nil
}

// AppendJSON appends s's JSON to b. Hyper that is not JSON (never stored
// so: manifests are validated) is written as null.
func (s *TaskSpec) AppendJSON(b []byte) []byte {
	b = append(b, `{"model":`...)
	b = taskAppendString(b, s.Model)
	b = append(b, `,"mode":`...)
	b = taskAppendString(b, s.Mode)
	b = append(b, `,"hyper":`...)
	b = appendRawJSON(b, s.Hyper)
	b = append(b, `,"split_recipe":`...)
	b = taskAppendString(b, s.SplitRecipe)
	b = append(b, `,"train_hosts":`...)
	b = appendStringsOrNull(b, s.TrainHosts)
	b = append(b, `,"seed":`...)
	b = strconv.AppendInt(b, s.Seed, 10)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(s.Priority), 10)
	b = append(b, `,"require_cuda":`...)
	b = strconv.AppendBool(b, s.RequireCUDA)
	b = append(b, `,"prefer_cuda":`...)
	b = strconv.AppendBool(b, s.PreferCUDA)
	b = append(b, `,"min_vram_gib":`...)
	b = appendFloat(b, s.MinVRAMGiB)
	b = append(b, `,"min_ram_gib":`...)
	b = appendFloat(b, s.MinRAMGiB)
	b = append(b, `,"gpus":`...)
	b = strconv.AppendInt(b, int64(s.GPUs), 10)
	b = append(b, `,"allowed_hosts":`...)
	b = appendStringsOrNull(b, s.AllowedHosts)
	b = append(b, `,"command":`...)
	b = appendStringsOrNull(b, s.Command)
	b = append(b, `,"max_attempts":`...)
	b = strconv.AppendInt(b, int64(s.MaxAttempts), 10)
	b = append(b, `,"stale_after_s":`...)
	b = appendFloat(b, s.StaleAfterS)
	return append(b, '}')
}

// appendStringsOrNull writes ss as encoding/json does: nil is null.
func appendStringsOrNull(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	return appendStrings(b, ss)
}

// appendInts writes ns as encoding/json does: nil is null.
func appendInts(b []byte, ns []int) []byte {
	if ns == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, n := range ns {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return append(b, ']')
}

// appendRawJSON writes raw as encoding/json writes a json.RawMessage:
// compacted, with <, >, & and U+2028/U+2029 escaped; nil (and, where
// encoding/json would fail, empty or malformed) as null.
func appendRawJSON(b []byte, raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return append(b, "null"...)
	}
	if plainJSON(raw) && json.Valid(raw) {
		return append(b, raw...) // the usual case: stored compact
	}
	var compact bytes.Buffer
	if json.Compact(&compact, raw) != nil {
		return append(b, "null"...)
	}
	out := bytes.NewBuffer(b)
	json.HTMLEscape(out, compact.Bytes())
	return out.Bytes()
}

// plainJSON reports whether raw has nothing that compacting or escaping
// would change: no white space, none of <>& and no byte that may start
// U+2028 or U+2029.
func plainJSON(raw []byte) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xe2:
			return false
		}
	}
	return true
}

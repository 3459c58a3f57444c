package httpapi

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// TestCoordCompatContract checks the exact answers of the compatible
// endpoints (docs/reference/coordination.md §5) that schedulers and dashboard
// scripts written against seed 000 read: status codes, the fields of the
// lock with and without its token, the refusals, force release, dry runs
// and validation.
func TestCoordCompatContract(t *testing.T) {
	e := newCoordEnv(t)
	const public = "acquired_at,expires_at,fence,held,holder,note,seconds_remaining"

	// 200: the lock with its token, no name (the original has one lock).
	a := e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron", "ttl_seconds": 600})
	var g arbiter.LockGrant
	e.ok(a, 200, &g)
	if got := jsonKeys(t, a.body); got != public+",token" {
		t.Fatalf("acquire answer keys %q", got)
	}
	if *g.Note != "" || g.Fence < 1 {
		t.Fatalf("acquire: %s", a.body)
	}
	compatTimes(t, a, "acquired_at", "expires_at")
	// GET: the public state, never the token.
	a = e.call("GET", "/api/swap/lock", testAgent, nil)
	e.ok(a, 200, nil)
	if got := jsonKeys(t, a.body); got != public || strings.Contains(string(a.body), g.Token) {
		t.Fatalf("public state keys %q: %s", got, a.body)
	}
	// 409: the same holder name without the token; the public state as lock.
	a = e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron"})
	e.ok(a, 409, nil)
	var ref struct {
		Detail string         `json:"detail"`
		Lock   map[string]any `json:"lock"`
	}
	a.decode(t, &ref)
	if got := jsonKeys(t, a.body); got != "detail,error,lock" || ref.Lock["holder"] != "cron" || ref.Lock["token"] != nil || ref.Lock["name"] != nil || strings.Contains(string(a.body), g.Token) {
		t.Fatalf("409 answer: %s", a.body)
	}

	// A dry run is not guarded by the lock: 202, complete at once.
	var job struct {
		JobID string `json:"job_id"`
	}
	a = e.call("POST", "/api/swap", testUser, map[string]any{"model_key": "gemma", "dry_run": true})
	e.ok(a, 202, &job)
	if got := jsonKeys(t, a.body); got != "job_id" {
		t.Fatalf("202 answer keys %q", got)
	}
	var dry compatSwap
	a = e.call("GET", "/api/swap/"+job.JobID, testUser, nil)
	e.ok(a, 200, &dry)
	compatTimes(t, a, "created_at", "started_at", "finished_at")
	if !dry.DryRun || dry.State != arbiter.SwapComplete || dry.ReturnCode == nil || *dry.ReturnCode != 0 || len(dry.Log) != 1 || !strings.Contains(dry.Log[0], "/opt/vllm/launch.sh google/gemma-3-27b-it") {
		t.Fatalf("dry run: %s", mustJSON(dry))
	}
	// The holder swaps with its token; while that swap runs, a swap
	// without the token still meets the lock first: 423 with its state.
	e.ok(e.call("POST", "/api/swap", testUser, map[string]any{"model_key": "gemma"}, "X-Swap-Lock-Token: "+g.Token), 202, &job)
	a = e.call("POST", "/api/swap", testAdmin, map[string]any{"model_key": "ten31"})
	var ce compatErrorBody
	e.ok(a, 423, &ce)
	if ce.Lock == nil || ce.Lock.Holder != "cron" || ce.Error.Code != arbiter.ELocked || strings.Contains(string(a.body), g.Token) {
		t.Fatalf("423 while the holder's swap runs: %s", a.body)
	}
	e.ok(e.call("POST", "/api/swap", testUser, map[string]any{"model_key": "ten31"}, "X-Swap-Lock-Token: "+g.Token), 409, nil)
	e.ok(e.call("GET", "/api/swap/999", testUser, nil), 404, nil)

	// Validation: the result, with the argv it would run.
	var v arbiter.SwapValidation
	e.ok(e.call("POST", "/api/swap/ten31/validate", testUser, nil), 200, &v)
	if !v.OK || len(v.Errors) != 0 || strings.Join(v.Command, " ") != "/opt/vllm/launch.sh /models/ten31" || v.ModelKey != "ten31" {
		t.Fatalf("validate: %s", mustJSON(v))
	}

	// Release: no token 403, a user's force 403, an admin's force frees it.
	e.ok(e.call("DELETE", "/api/swap/lock", testUser, nil), 403, nil)
	e.ok(e.call("DELETE", "/api/swap/lock?force=true", testUser, nil), 403, nil)
	var rel struct {
		Released bool `json:"released"`
	}
	a = e.call("DELETE", "/api/swap/lock?force=true", testAdmin, nil)
	e.ok(a, 200, &rel)
	if !rel.Released || jsonKeys(t, a.body) != "released" {
		t.Fatalf("force release: %s", a.body)
	}
	// The next acquisition has a new token and a larger fence.
	var g2 arbiter.LockGrant
	e.ok(e.call("POST", "/api/swap/lock", testUser, map[string]any{"holder": "cron", "token": g.Token}), 200, &g2)
	if g2.Token == g.Token || g2.Fence <= g.Fence || *g2.SecondsRemaining != 900 {
		t.Fatalf("reacquire: %s after %s", mustJSON(g2), mustJSON(g))
	}
}

// TestCoordCompatScheduleDescription: a scheduler of seed 000 may describe
// its job on several lines; registering it must not be refused.
func TestCoordCompatScheduleDescription(t *testing.T) {
	e := newCoordEnv(t)
	desc := "Daily volume report.\nOwner: data team"
	var s arbiter.Schedule
	e.ok(e.call("POST", "/api/schedule", testUser, map[string]any{"id": "daily-vol", "name": "Daily Vol", "cron": "0 6 * * *", "description": desc}), 200, &s)
	if s.Description != desc || s.ID != "daily-vol" {
		t.Fatalf("register: %+v", s)
	}
	a := e.call("GET", "/api/schedule", testAgent, nil)
	var list struct{ Schedules []map[string]any }
	e.ok(a, 200, &list)
	if len(list.Schedules) != 1 {
		t.Fatalf("list: %s", a.body)
	}
	for _, k := range []string{"registered_at", "updated_at", "next_run"} {
		if v, _ := list.Schedules[0][k].(string); !compatTimeRE.MatchString(v) {
			t.Errorf("%s %q is not in the form of Python's isoformat()", k, v)
		}
	}
}

// compatTimeRE is a UTC time as Python's isoformat() writes it, the form
// of seed 000 (datetime.fromisoformat before 3.11 reads no other).
var compatTimeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00$`)

// compatTimes checks that the fields of a JSON object answer are times in
// the original's form.
func compatTimes(t *testing.T, a answer, fields ...string) {
	t.Helper()
	var m map[string]any
	a.decode(t, &m)
	for _, f := range fields {
		if v, _ := m[f].(string); !compatTimeRE.MatchString(v) {
			t.Errorf("%s %q is not in the form of Python's isoformat(): %s", f, v, a.body)
		}
	}
}

func TestCompatTime(t *testing.T) {
	for _, c := range []struct {
		t    time.Time
		want string
	}{
		{time.Date(2026, 6, 18, 7, 0, 0, 0, time.UTC), `"2026-06-18T07:00:00+00:00"`},
		{time.Date(2026, 6, 18, 9, 0, 0, 123456789, time.FixedZone("CEST", 2*3600)), `"2026-06-18T07:00:00.123456+00:00"`},
		{time.Date(2026, 6, 18, 7, 0, 0, 999, time.UTC), `"2026-06-18T07:00:00+00:00"`},
	} {
		b, _ := json.Marshal(compatTime(c.t))
		if string(b) != c.want {
			t.Errorf("%v: got %s, want %s", c.t, b, c.want)
		}
		var back time.Time
		if err := json.Unmarshal(b, &back); err != nil || !back.Equal(c.t.Truncate(time.Microsecond)) {
			t.Errorf("%s does not read back as RFC 3339: %v %v", b, back, err)
		}
	}
}

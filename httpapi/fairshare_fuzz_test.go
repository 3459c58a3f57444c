package httpapi

import (
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// fuzzInvalid fails unless err is nil or an invalid error with a message.
func fuzzInvalid(t *testing.T, err error) bool {
	t.Helper()
	if err == nil {
		return false
	}
	if code := arbiter.ErrorCode(err); code != arbiter.EInvalid {
		t.Fatalf("got error code %q (%v), want invalid", code, err)
	}
	if arbiter.ErrorMessage(err) == "" {
		t.Fatalf("got an empty error message")
	}
	return true
}

// FuzzDecodeFairShareBodies feeds the fair-share body decoders (quotas,
// reservations, extend, notifications) arbitrary bytes: they must never
// panic, every error must be invalid, and what they accept must validate.
func FuzzDecodeFairShareBodies(f *testing.F) {
	for _, seed := range []string{
		`{"group":"ml","max_gpus":8}`,
		`{"principal":"alice","max_gpu_hours":100,"window_s":86400}`,
		`{"group":"ml","max_gpus":2,"model":"*H100*"}`,
		`{"gpus":8,"machine":"gpu1","start":"2026-11-25T18:00:00Z","duration_s":21600,"group":"ml"}`,
		`{"gpus":4,"tags":["a100"],"cron":"0 2 * * 0","duration_s":14400,"group":"ops"}`,
		`{"gpus":4,"tags":["a100"],"cron":"0 2 * *","duration_s":14400,"group":"ops"}`,
		`{"by_s":7200}`, `{"by_s":-1}`, `{"by_s":"1h"}`,
		`{"url":"https://hooks.slack.com/x","format":"slack","kinds":["allocation.ready"]}`,
		`{"url":"http://x","kinds":["gpu.free"],"match":{"gpus":2,"model":"*H100*"}}`,
		`{"url":"http://x","kinds":["nope"]}`,
		`[]`, `null`, ``, `{`, `{"max_gpus":1e400}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if q, err := decodeQuota(data); !fuzzInvalid(t, err) {
			if err := q.Validate(); err != nil {
				t.Fatalf("accepted a quota that does not validate: %v", err)
			}
		}
		if rv, err := decodeReservation(data); !fuzzInvalid(t, err) {
			if err := rv.Validate(); err != nil {
				t.Fatalf("accepted a reservation that does not validate: %v", err)
			}
		}
		if by, err := decodeExtend(data); !fuzzInvalid(t, err) && (by < 1 || by > arbiter.MaxTimeLimitS) {
			t.Fatalf("accepted by_s %v", by)
		}
		if wh, err := decodeNotify(data); !fuzzInvalid(t, err) && wh.Format != arbiter.WebhookStandard && wh.Format != arbiter.WebhookSlack {
			t.Fatalf("accepted format %q", wh.Format)
		}
	})
}

// The fair-share routes with hostile bodies through the whole server
// (fuzzBody: never a 5xx, always JSON, nothing emitted on a refusal).

func FuzzBodyExtend(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/allocations/1/extend", testUser, `{"by_s": 3600}`, `{"by_s": 1e400}`, `{"by_s": "2h"}`)
}

func FuzzBodyQuota(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/quotas", testAdmin, `{"group": "ml", "max_gpus": 8}`, `{"principal": "alice", "max_gpu_hours": 10, "window_s": 3600}`,
		`{"group": "ml", "max_gpus": 2, "model": "[bad"}`)
}

func FuzzBodyReservation(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/reservations", testAdmin, `{"gpus": 1, "machine": "gpubox", "start": "2030-01-01T00:00:00Z", "duration_s": 3600, "group": "ml"}`,
		`{"gpus": 1, "tags": ["a"], "cron": "0 2 * * 0", "duration_s": 600, "group": "ml"}`, `{"gpus": 1, "machine": "gpubox", "cron": "*/0 * * * *", "duration_s": 60, "group": "ml"}`)
}

func FuzzBodyNotify(f *testing.F) {
	fuzzBody(f, "POST", "/api/v1/notifications", testUser, `{"url": "https://example.com/n", "kinds": ["allocation.ready"]}`,
		`{"url": "https://hooks.example.com/s", "format": "slack", "match": {"gpus": 2, "model": "*H100*"}}`, `{"url": "http://169.254.169.254/"}`)
}

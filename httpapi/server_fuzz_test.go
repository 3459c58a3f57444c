package httpapi

import (
	"testing"

	"github.com/arbiter-hq/arbiter"
)

// FuzzDecodeAllocate feeds the allocation body decoder arbitrary bytes: it
// must never panic, every error must be invalid, and every request it
// accepts must validate and carry the defaults.
func FuzzDecodeAllocate(f *testing.F) {
	for _, seed := range []string{
		`{"gpus":1}`,
		`{"owner":"bob","gpus":2,"min_vram_gib":40,"require_cuda":true,"min_compute":"8.0","model":"*H100*","tags":["a"],"machine":"gpu1","priority":5,"keepalive_s":120}`,
		`{"gpus":1,"keepalive_s":null}`,
		`{"gpus":1,"min_vram_gib":"lots"}`,
		`{"gpus":-1}`,
		`{"gpus":1}{}`,
		`{"gpus":1,"model":"[x"}`,
		`{"gpus":1,"keepalive_s":1e400}`,
		`{"gpus":1,"owner":"\u0000\"\\"}`,
		`[]`, `null`, ``, `{`,
	} {
		f.Add([]byte(seed))
	}
	caller := arbiter.Caller{Name: "alice", Role: arbiter.RoleUser}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeAllocate(data, caller, 60)
		if err != nil {
			if code := arbiter.ErrorCode(err); code != arbiter.EInvalid {
				t.Fatalf("got error code %q (%v), want invalid", code, err)
			}
			if arbiter.ErrorMessage(err) == "" {
				t.Fatalf("got an empty error message")
			}
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("accepted a request that does not validate: %v", err)
		}
		if req.Owner == "" {
			t.Fatalf("accepted a request without owner")
		}
	})
}

package cli

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
)

// FuzzFlagValues fuzzes the CLI's readers of flag and argument values
// (--keepalive, the duration flags, allocation ids): a refused value is a
// usage error that quotes the flag; an accepted one is in range, and
// written back the canonical way it reads the same.
func FuzzFlagValues(f *testing.F) {
	for _, s := range []string{"", "never", "60", "5m", "1h30m", "-1", "0", "NaN", "Inf", "-Inf", "+Inf", "1e400", "0x10", "1_000",
		"1e-400", "9223372036854775807", " 17 ", "+5", "007", "-0", "0.000000001ns", "2562047h47m16.854775807s", "2562048h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		usage := func(what string, err error) {
			var ue UsageError
			if !errors.As(err, &ue) || ue.Error() == "" {
				t.Fatalf("%s %q: %v is not a usage error", what, s, err)
			}
		}
		// --keepalive
		if v, err := parseKeepalive(s); err != nil {
			usage("--keepalive", err)
			if !strings.Contains(err.Error(), "--keepalive") {
				t.Fatalf("--keepalive %q: error %q does not name the flag", s, err)
			}
		} else if v != nil {
			// What the flag lets through out of range, the request's check
			// refuses with a clear message before anything is sent (cmdAlloc).
			r := arbiter.Request{Owner: "a", GPUs: 1, KeepaliveS: v}
			if math.IsNaN(*v) || math.IsInf(*v, 0) || *v < arbiter.MinKeepaliveS || *v > arbiter.MaxKeepaliveS {
				if err := r.Validate(); err == nil {
					t.Fatalf("--keepalive %q = %v passes the request's check", s, *v)
				}
			} else if back, err := parseKeepalive(strconv.FormatFloat(*v, 'g', -1, 64)); err != nil || back == nil || *back != *v {
				t.Fatalf("--keepalive %q = %v does not read back (%v, %v)", s, *v, back, err)
			}
		}
		// --duration, --time-limit, --ttl …
		if secs, err := coordParseSeconds("--duration", s); err != nil {
			usage("--duration", err)
			if !strings.Contains(err.Error(), "--duration") {
				t.Fatalf("--duration %q: error %q does not name the flag", s, err)
			}
		} else if s != "" {
			if !(secs > 0) || math.IsInf(secs, 0) {
				t.Fatalf("--duration %q accepted as %v", s, secs)
			}
			back, err := coordParseSeconds("--duration", strconv.FormatFloat(secs, 'g', -1, 64))
			if err != nil || back != secs {
				t.Fatalf("--duration %q = %v does not read back (%v, %v)", s, secs, back, err)
			}
		}
		// --timeout, --heartbeat … (durationVar)
		var d time.Duration
		if err := (durationValue{&d}).Set(s); err == nil {
			if d < 0 {
				t.Fatalf("duration %q accepted as %v", s, d)
			}
			var back time.Duration
			if err := (durationValue{&back}).Set(d.String()); err != nil || back != d {
				t.Fatalf("duration %q = %v does not read back (%v, %v)", s, d, back, err)
			}
		}
		// allocation ids
		if id, err := parseID(s); err != nil {
			usage("id", err)
		} else {
			if id <= 0 {
				t.Fatalf("id %q accepted as %d", s, id)
			}
			if back, err := parseID(strconv.FormatInt(id, 10)); err != nil || back != id {
				t.Fatalf("id %q = %d does not read back", s, id)
			}
		}
	})
}

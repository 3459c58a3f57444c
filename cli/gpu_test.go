package cli

import (
	"strings"
	"testing"

	"github.com/arbiter-hq/arbiter"
)

func TestParseGPURef(t *testing.T) {
	if m, i, err := parseGPURef("gpu1:3"); err != nil || m != "gpu1" || i != 3 {
		t.Fatalf("got %q %d %v", m, i, err)
	}
	for _, bad := range []string{"gpu1", ":3", "gpu1:", "gpu1:x", "gpu1:-1", "bad name:1"} {
		if _, _, err := parseGPURef(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseGPURef(f *testing.F) {
	f.Add("gpu1:3")
	f.Add("a:b:c")
	f.Fuzz(func(t *testing.T, s string) {
		m, i, err := parseGPURef(s)
		if err == nil && (arbiter.ValidateName("machine", m) != nil || i < 0 || !strings.Contains(s, ":")) {
			t.Fatalf("%q: %q %d", s, m, i)
		}
	})
}

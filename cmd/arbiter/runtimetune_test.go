package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// defaultProcs is the runtime's default GOMAXPROCS; the setting in force
// stays.
func defaultProcs() int {
	old := runtime.GOMAXPROCS(0)
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(old)
	return def
}

func TestTuneProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	def := defaultProcs()
	noEnv := func(string) string { return "" }

	runtime.GOMAXPROCS(1)
	for range 2 { // a second call sets the same, not one more
		tuneProcs(noEnv)
		if got := runtime.GOMAXPROCS(0); got != def+extraProcs {
			t.Fatalf("GOMAXPROCS = %d, want the default %d + %d", got, def, extraProcs)
		}
	}

	runtime.GOMAXPROCS(1)
	tuneProcs(func(k string) string {
		if k == "GOMAXPROCS" {
			return "1"
		}
		return ""
	})
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS = %d with GOMAXPROCS=1 in the environment, want 1", got)
	}
}

// TestServerProcessRunsExtraProcs checks the setting in the real binary,
// through the metric that shows it.
func TestServerProcessRunsExtraProcs(t *testing.T) {
	bin := buildBinary(t)
	def := defaultProcs()
	for _, c := range []struct {
		env  string
		want int
	}{{"", def + extraProcs}, {"3", 3}} {
		t.Setenv("GOMAXPROCS", c.env) // the runtime takes "" as unset, as tuneProcs does
		port := freePort(t)
		url := "http://127.0.0.1:" + port
		serverProcess(t, bin, url, "--data-dir", t.TempDir(), "--listen", "127.0.0.1:"+port, "--no-local")
		want := fmt.Sprintf("\ngo_sched_gomaxprocs_threads %d\n", c.want)
		if body := httpGet(t, url+"/metrics"); !strings.Contains(body, want) {
			t.Errorf("GOMAXPROCS=%q: /metrics lacks %q", c.env, want[1:len(want)-1])
		}
	}
}

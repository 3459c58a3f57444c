//go:build linux

package postgres

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter/poll"
)

// A process killed but not yet reaped (a zombie, as under a parent that
// does not reap) does not run: a replica restarted after kill -9 takes its
// node id back at once.
func TestZombieIsNotAlive(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !processAlive(pid) {
		t.Fatal("a running process is not alive")
	}
	cmd.Process.Kill()
	poll.Until(t, 10*time.Second, "the process to exit", func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return strings.Contains(string(b), ") Z ")
	})
	if processAlive(pid) {
		t.Fatal("a zombie counts as alive")
	}
	cmd.Wait()
}

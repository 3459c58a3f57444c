// Package procgroup runs a command as the leader of a process group of its
// own and signals the whole group, so that stopping a command stops what
// it started too: a launch script's server, a training wrapper's workers.
// Used for the agent's tasks and swaps and for `arbiter alloc -- CMD`.
// Where there are no process groups (Windows), the command is signalled
// alone and SIGTERM is a kill.
package procgroup

import (
	"os/exec"
	"time"
)

// Stop sends SIGTERM to cmd's group, gives what is left of it until grace
// to go, then SIGKILLs the group. It returns early once the group is gone.
func Stop(cmd *exec.Cmd, grace time.Duration) {
	_ = Signal(cmd, sigTerm)
	KillAfter(cmd, grace)
}

// KillAfter waits up to grace for cmd's group to be gone, then SIGKILLs
// what is left of it.
func KillAfter(cmd *exec.Cmd, grace time.Duration) {
	if cmd.Process == nil {
		return
	}
	for end := time.Now().Add(grace); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if gone(cmd) {
			return
		}
	}
	_ = Signal(cmd, sigKill)
}

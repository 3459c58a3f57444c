// Package procgroup runs a command as the leader of a process group of its
// own and signals the whole group, so that stopping a command stops what
// it started too: a launch script's server, a training wrapper's workers.
// Used for the agent's tasks and swaps and for `arbiter alloc -- CMD`.
// Where there are no process groups (Windows), the command is signalled
// alone and SIGTERM is a kill.
package procgroup

import (
	"os/exec"
	"sync/atomic"
	"time"
)

// StopOnCancel makes cmd, not yet started, the leader of a process group
// of its own, stopped whole when its context ends: SIGTERM to the group,
// and grace later SIGKILL to the command (exec.Cmd.WaitDelay). Call reap
// once Wait returned: when the command was stopped, it gives what is left
// of its group (a child that ignores SIGTERM) the rest of the grace, then
// SIGKILLs it; otherwise it returns at once.
func StopOnCancel(cmd *exec.Cmd, grace time.Duration) (reap func()) {
	Own(cmd)
	var at atomic.Int64 // when the SIGTERM went
	cmd.WaitDelay = grace
	cmd.Cancel = func() error {
		at.Store(time.Now().UnixNano())
		return Signal(cmd, sigTerm)
	}
	return func() {
		if t := at.Load(); t != 0 {
			KillAfter(cmd, max(grace-time.Since(time.Unix(0, t)), 0))
		}
	}
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

// Running reports whether anything of cmd's group (cmd started with Own)
// is left.
func Running(cmd *exec.Cmd) bool { return cmd.Process != nil && !gone(cmd) }

// Stop stops what is left of cmd's group after cmd itself ended (a
// launch script's server left running in the background): SIGTERM to the
// group, then SIGKILL to what is left after grace. It returns once the
// group is gone or was killed, and reports whether anything was left.
func Stop(cmd *exec.Cmd, grace time.Duration) bool {
	if cmd.Process == nil || gone(cmd) {
		return false
	}
	_ = Signal(cmd, sigTerm)
	KillAfter(cmd, grace)
	return true
}

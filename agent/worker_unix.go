//go:build unix

package agent

import (
	"os/exec"
	"syscall"
)

// workerProcessGroup makes a task's process the leader of its own process
// group, so that stopping it stops everything it started.
func workerProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// workerSignalGroup sends SIGTERM (or SIGKILL when kill is set) to the
// task's process group.
func workerSignalGroup(cmd *exec.Cmd, kill bool) {
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}

// workerKillGroup kills what is left of the task's process group after its
// leader exited.
func workerKillGroup(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

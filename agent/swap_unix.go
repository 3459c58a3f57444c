//go:build unix

package agent

import (
	"errors"
	"os/exec"
	"syscall"
	"time"
)

// swapProcessGroup runs cmd in its own process group and makes its
// cancellation signal the whole group (SIGTERM), so that a launch script's
// children stop with it; exec.Cmd.WaitDelay then kills the command itself,
// and swapKillGroup what remains of its group.
func swapProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
}

// swapKillGroup, once a cancelled command has exited, gives what is left
// of its process group (a child that ignores SIGTERM) up to grace to go,
// then kills it.
func swapKillGroup(cmd *exec.Cmd, grace time.Duration) {
	if cmd.Process == nil {
		return
	}
	pgid := cmd.Process.Pid
	for end := time.Now().Add(grace); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
			return
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

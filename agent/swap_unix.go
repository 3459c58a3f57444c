//go:build unix

package agent

import (
	"os/exec"
	"syscall"
)

// swapProcessGroup runs cmd in its own process group and makes its
// cancellation signal the whole group (SIGTERM), so that a launch script's
// children stop with it; exec.Cmd.WaitDelay then kills what remains.
func swapProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
}

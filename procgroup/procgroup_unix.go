//go:build unix

package procgroup

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

var sigTerm, sigKill os.Signal = syscall.SIGTERM, syscall.SIGKILL

// Own makes cmd, once started, the leader of a process group of its own.
func Own(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// Signal sends sig to cmd's whole process group (cmd started with Own).
func Signal(cmd *exec.Cmd, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok || cmd.Process == nil {
		return errors.New("procgroup: not a signal of this system, or not started")
	}
	return syscall.Kill(-cmd.Process.Pid, s)
}

// gone reports whether no process of cmd's group is left.
func gone(cmd *exec.Cmd) bool {
	return errors.Is(syscall.Kill(-cmd.Process.Pid, 0), syscall.ESRCH)
}

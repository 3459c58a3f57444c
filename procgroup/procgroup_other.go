//go:build !unix

package procgroup

import (
	"os"
	"os/exec"
)

var sigTerm, sigKill os.Signal = os.Kill, os.Kill

// Own does nothing: there are no process groups here.
func Own(*exec.Cmd) {}

// Signal kills cmd alone: the only signal there is here.
func Signal(cmd *exec.Cmd, _ os.Signal) error {
	if cmd.Process == nil {
		return os.ErrProcessDone
	}
	return cmd.Process.Kill()
}

func gone(cmd *exec.Cmd) bool { return cmd.ProcessState != nil }

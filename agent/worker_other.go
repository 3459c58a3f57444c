//go:build !unix

package agent

import "os/exec"

// Without process groups, a task's process is signalled alone.

func workerProcessGroup(*exec.Cmd) {}

func workerSignalGroup(cmd *exec.Cmd, _ bool) { _ = cmd.Process.Kill() }

func workerKillGroup(*exec.Cmd) {}

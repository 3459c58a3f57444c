//go:build !unix

package agent

import (
	"os/exec"
	"time"
)

// swapProcessGroup leaves cmd as it is: without process groups,
// cancellation kills the command alone.
func swapProcessGroup(*exec.Cmd) {}

// swapKillGroup has no group to kill here.
func swapKillGroup(*exec.Cmd, time.Duration) {}

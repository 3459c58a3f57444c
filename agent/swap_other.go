//go:build !unix

package agent

import "os/exec"

// swapProcessGroup leaves cmd as it is: without process groups,
// cancellation kills the command alone.
func swapProcessGroup(*exec.Cmd) {}

//go:build !unix

package agent

import (
	"errors"
	"os"
)

func signalProcess(pid int, kill bool) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if !kill {
		return errors.New("only Unix can ask a process to stop; killing it after the grace")
	}
	return p.Kill()
}

func processGone(int) bool { return false }

//go:build !unix

package agent

import (
	"errors"
	"os"
)

func signalProcess(p *os.Process, kill bool) error {
	if !kill {
		return errors.New("only Unix can ask a process to stop; killing it after the grace")
	}
	return p.Kill()
}

func processGone(int) bool { return false }

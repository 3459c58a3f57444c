package agent

import (
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-hq/arbiter"
	"github.com/arbiter-hq/arbiter/gpu"
)

// TestStopNeverReachesALaterProcessWithThePid: the enforcer signals through
// a handle taken before its checks, so even a process that passed them by
// having the pid and the start time of the one checked — here, handed
// them on purpose — is not hit once the one checked has gone. Needs pidfds
// and a writable /proc/sys/kernel/ns_last_pid (root) to hand a pid out.
func TestStopNeverReachesALaterProcessWithThePid(t *testing.T) {
	a, aExited := startSleep(t)
	pid := a.Process.Pid
	p, err := openProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	// pidfd_open(2) is 434 on every architecture.
	if fd, _, errno := syscall.Syscall(434, uintptr(pid), 0, 0); errno != 0 {
		t.Skipf("no pidfds here: %v", errno)
	} else {
		syscall.Close(int(fd))
	}
	a.Process.Kill()
	<-aExited // reaped: pid is free
	var b *exec.Cmd
	for range 20 {
		if os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0) != nil {
			t.Skip("cannot choose the next pid (needs root)")
		}
		c := exec.Command("sleep", "30")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if c.Process.Pid == pid {
			b = c
			break
		}
		c.Process.Kill()
		c.Wait()
	}
	if b == nil {
		t.Skip("another process kept taking the pid")
	}
	bExited := make(chan struct{})
	go func() { b.Wait(); close(bExited) }()
	defer func() { b.Process.Kill(); <-bExited }()

	e := newEnforcer(gpu.NewProcReader(""), slog.New(slog.DiscardHandler), nil)
	defer e.stop()
	e.stopProcess(p, arbiter.GPUKill{PID: pid, GraceS: 0.1, Reason: "unmanaged"}, gpu.NewProcReader("").StartOf(pid), nil)
	select {
	case <-bExited:
		t.Fatal("a stop reached the later process given the pid")
	case <-time.After(300 * time.Millisecond):
	}
}

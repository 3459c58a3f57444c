package main

import (
	"context"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// keepMonitorBackedOff runs the monitor keeper (monitorkeep.go) until ctx
// ends, where there are Ps to spare.
func keepMonitorBackedOff(ctx context.Context) {
	if runtime.GOMAXPROCS(0) < keepMinProcs {
		return
	}
	k := monitorKeeper{cpu: processCPU, nap: napInSyscall, wait: sleepCtx, now: time.Now}
	go k.run(ctx)
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0 // never busy: the keeper stays idle
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// napInSyscall sleeps keepNap in nanosleep through syscall.Syscall, which
// tells the runtime it is in a system call (time.Sleep would give the P
// up).
func napInSyscall() {
	ts := syscall.NsecToTimespec(int64(keepNap))
	syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

package main

import (
	"flag"
	"time"

	"github.com/arbiter-hq/arbiter/agent"
	"github.com/arbiter-hq/arbiter/cli"
)

// agentTaskFlags registers the task worker's flags of `arbiter agent` and
// returns a function that checks them after parsing and gives the worker's
// configuration (nil with --no-tasks).
func agentTaskFlags(fs *flag.FlagSet) func() (*agent.WorkerConfig, error) {
	var (
		noTasks               bool
		dir                   string
		maxTasks, cpuTasks    int
		beat, poll, killGrace time.Duration
	)
	fs.BoolVar(&noTasks, "no-tasks", false, "do not claim and run tasks (only register and heartbeat)")
	fs.StringVar(&dir, "work-dir", "arbiter-work", "directory for the tasks' working directories and logs")
	fs.IntVar(&maxTasks, "max-tasks", 0, "tasks run at once (0: one per GPU plus --cpu-tasks)")
	fs.IntVar(&cpuTasks, "cpu-tasks", 1, "tasks that need no GPU run at once (0: none)")
	fs.DurationVar(&beat, "task-heartbeat", agent.DefaultTaskHeartbeat, "time between a running task's heartbeats")
	fs.DurationVar(&poll, "task-poll", agent.DefaultTaskPoll, "time between claims when nothing fits")
	fs.DurationVar(&killGrace, "kill-grace", agent.DefaultKillGrace, "time a stopped task has between SIGTERM and SIGKILL")
	return func() (*agent.WorkerConfig, error) {
		switch {
		case noTasks:
			return nil, nil
		case maxTasks < 0 || maxTasks > 1024:
			return nil, cli.Usagef("--max-tasks %d: want 0 (automatic) to 1024", maxTasks)
		case cpuTasks < 0 || cpuTasks > 1024:
			return nil, cli.Usagef("--cpu-tasks %d: want 0 to 1024", cpuTasks)
		case beat <= 0 || poll <= 0 || killGrace <= 0:
			return nil, cli.Usagef("--task-heartbeat, --task-poll and --kill-grace must be positive, like 30s")
		case dir == "":
			return nil, cli.Usagef("--work-dir must not be empty")
		}
		wc := &agent.WorkerConfig{Dir: dir, MaxTasks: maxTasks, CPUTasks: cpuTasks, Heartbeat: beat, Poll: poll,
			KillGrace: killGrace, Version: version}
		if cpuTasks == 0 {
			wc.CPUTasks = -1
		}
		return wc, nil
	}
}

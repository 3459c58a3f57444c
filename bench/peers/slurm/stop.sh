#!/bin/bash
# Stop what start.sh started: slurmd, slurmctld, munged.
#
#   stop.sh [DIR]     the DIR given to start.sh (default /tmp/slurm)
D=${1:-/tmp/slurm}
stop() { # pidfile command
  local p
  p=$(cat "$1" 2>/dev/null) || return 0
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] || return 0
  kill "$p"
  for _ in $(seq 100); do [ -d "/proc/$p" ] || return 0; sleep 0.1; done
  kill -9 "$p"
}
stop "$D/slurmd.pid" slurmd
stop "$D/slurmctld.pid" slurmctld
stop /run/munge/munged.pid munged

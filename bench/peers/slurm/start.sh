#!/bin/bash
# Start a single-node Slurm (munged, slurmctld, slurmd) with eight GPUs in
# gres, for timing salloc against arbiter's CLI, and wait until the node is
# idle. Run as root; safe to run again. Needs Debian's slurm-wlm (22.05).
#
#   start.sh [DIR]    state, logs and fake GPU device nodes go in DIR
#                     (default /tmp/slurm); /etc/slurm is overwritten.
set -eu
D=${1:-/tmp/slurm}
host=$(hostname -s)
mkdir -p "$D/state" "$D/spool" "$D/dev" /etc/slurm /run/munge
chown munge:munge /run/munge

# Slurm 22.05 drops a GPU without a device file; these stand in for
# /dev/nvidia0-7 (the same device as /dev/null).
for i in 0 1 2 3 4 5 6 7; do
  [ -e "$D/dev/nvidia$i" ] || mknod "$D/dev/nvidia$i" c 1 3
done
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Without these a finished job holds the next one back for seconds.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
GresTypes=gpu
NodeName=$host CPUs=$(nproc) RealMemory=$mem Gres=gpu:8 State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
echo "NodeName=$host Name=gpu File=$D/dev/nvidia[0-7]" > /etc/slurm/gres.conf

running() { # pidfile command
  local p
  p=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}
if ! running /run/munge/munged.pid munged; then
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
fi
cd "$D"
running "$D/slurmctld.pid" slurmctld || slurmctld
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
running "$D/slurmd.pid" slurmd || slurmd

st=unknown
for i in $(seq 300); do
  st=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  case "$st" in
    idle | mixed | allocated) echo "slurm: node $host $st"; exit 0 ;;
    *drain* | down* | inval* | *fail*) [ $((i % 10)) = 1 ] && scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.2
done
echo "slurm: node $host not idle ($st); see $D/slurmctld.log and $D/slurmd.log" >&2
exit 1

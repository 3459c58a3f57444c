#!/bin/sh
# Run the reference spalloc_server in the foreground until killed (SIGTERM).
#
#   run.sh SPALLOC_SERVER_DIR SPINNMACHINE_DIR PORT [server flags, e.g. -q]
#
# SPALLOC_SERVER_DIR: a checkout of github.com/SpiNNakerManchester/spalloc_server
# at f24e76d9 (7.1.0; the next commit empties the repository).
# SPINNMACHINE_DIR: a checkout of github.com/SpiNNakerManchester/SpiNNMachine
# (tag 7.1.0); only its pure-Python triad geometry is used.
# WORK: the server's working directory (default /tmp/spalloc_server.PORT).
# Needs Debian's python3 and python3-tz. See ../README.md.
set -eu
src=$1 machine=$2 port=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
# The server writes spalloc_jobs.log (a line a job, unsynced) and, on a
# clean stop, its state file in its working directory.
work=${WORK:-/tmp/spalloc_server.$port}
mkdir -p "$work/spinn_machine"
cp "$machine/spinn_machine/spinnaker_triad_geometry.py" "$work/spinn_machine/"
echo 'from .spinnaker_triad_geometry import SpiNNakerTriadGeometry' > "$work/spinn_machine/__init__.py"
cd "$work"
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$src:$here/shims:$work" exec /usr/bin/python3 "$here/launch.py" --cold-start --port "$port" "$@" "$here/config.py"

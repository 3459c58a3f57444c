#!/usr/bin/env python3
"""Time allocate-and-release cycles of real client processes, one GPU each.

  cycles.py salloc [N]          salloc -Q --gres=gpu:1 -n1 true
  cycles.py arbiter BIN [N]     BIN alloc --gpus 1 --no-wait -o json, then
                                BIN release ID; and BIN alloc --gpus 1 -- true

The arbiter cycles use ARBITER_URL (and ARBITER_TOKEN) from the environment.
Prints p50 and p90 in milliseconds of N cycles (default 200) each.
"""
import json
import statistics
import subprocess
import sys
import time


def timed(n, cycle):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        cycle()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True).stdout


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "salloc":
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
        rows = [("salloc -Q --gres=gpu:1 -n1 true",
                 timed(n, lambda: run("salloc", "-Q", "--gres=gpu:1", "-n1", "true")))]
    elif what == "arbiter" and len(sys.argv) > 2:
        binary = sys.argv[2]
        n = int(sys.argv[3]) if len(sys.argv) > 3 else 200

        def two():
            a = json.loads(run(binary, "alloc", "--gpus", "1", "--no-wait", "-o", "json"))
            run(binary, "release", str(a["id"]))

        rows = [("arbiter alloc --no-wait -o json + arbiter release", timed(n, two)),
                ("arbiter alloc --gpus 1 -- true", timed(n, lambda: run(binary, "alloc", "--gpus", "1", "--", "true")))]
    else:
        sys.exit(__doc__)
    for name, (p50, p90) in rows:
        print(f"{name}: p50 {p50:.1f} ms, p90 {p90:.1f} ms ({n} cycles)")


if __name__ == "__main__":
    main()

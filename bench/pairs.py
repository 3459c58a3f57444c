#!/usr/bin/env python3
"""Compare server builds (or settings) under the same load, interleaved.

  bench/pairs.py WORKLOAD ROUNDS NAME=BINARY[:VAR=VALUE,...][@CEILING] ...

WORKLOAD is spalloc:CONNS (create -> state -> destroy cycles), alloc:CLIENTS
(HTTP allocate + release) or tasks[:TASKS] (the work queue, 64 workers).
Each round runs every NAME once, in the order given: a fresh server (its
own data directory and configuration, written here) with VAR=VALUE added
to its environment, the load, then SIGTERM. The load tool is the first
BINARY for every run, so only the server differs. @ceiling or
@durable-ceiling runs BINARY's do-nothing server instead (`arbiter bench
ceiling`, its durable log in the run's directory), in a process of its
own as a server is.

Prints each run, then per NAME the median rate and p99; with two NAMEs,
the median of the rounds' ratios (second / first), which is the number to
quote: this machine drifts by tens of per cent within minutes, so only
runs next to each other compare.

DURATION (default 5s) and WARMUP (2s) in the environment set the bench's
flags. Example, the binary before and after a change:

  bench/pairs.py spalloc:16 6 old=/tmp/arbiter-old new=/tmp/arbiter-new
  bench/pairs.py alloc:1 6 default=./arbiter gogc400=./arbiter:GOGC=400
  bench/pairs.py spalloc:1 6 bound=./arbiter@durable-ceiling server=./arbiter
"""
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

MACHINES = "".join(f"""
[[machines]]
name = "m{i}"
tags = ["default"]
gpus = [{{model = "NVIDIA H100 80GB HBM3", vram_gib = 80, compute = "9.0", count = 8}}]
""" for i in range(1, 5))

GRID = """
[spalloc]
seconds_before_free = 0
[[grid_machines]]
name = "m"
width = 6
height = 4
locations = "identity"
base_ip = "10.11.0.0"
power_delay_s = 0
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CEILINGS = ("ceiling", "durable-ceiling")


def parse_config(arg):
    name, rest = arg.split("=", 1)
    rest, _, ceiling = rest.partition("@")
    if ceiling and ceiling not in CEILINGS:
        sys.exit(f"{arg}: @{ceiling}: want @ceiling or @durable-ceiling")
    binary, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return name, os.path.abspath(binary), env, ceiling


def one_run(kind, n, load, binary, env, ceiling):
    d = tempfile.mkdtemp(prefix="pairs-")
    try:
        http = free_port()
        url = f"http://127.0.0.1:{http}"
        conf = f'[server]\nlocal = false\nlisten = "127.0.0.1:{http}"\ndata_dir = "{d}/data"\n'
        serve = [binary, "server", "--config", f"{d}/server.toml"]
        sp = ""
        if kind == "spalloc":
            sp = f"127.0.0.1:{free_port()}"
            conf += f'spalloc_listen = "{sp}"\n' + GRID
            cmd = [load, "bench", "spalloc", "--addr", sp, "--conns", str(n)]
        elif kind == "alloc":
            conf += MACHINES
            cmd = [load, "bench", "alloc", "--url", url, "--clients", str(n)]
        else:
            conf += f'[tasks]\nmanifest = "{d}/tasks.toml"\n'
            open(f"{d}/tasks.toml", "w").close()
            cmd = [load, "bench", "tasks", "--url", url, "--manifest", f"{d}/tasks.toml", "--tasks", str(n)]
        if ceiling:
            serve = [binary, "bench", "ceiling", "--listen", f"127.0.0.1:{http}", "--spalloc-listen", sp,
                     "--tasks", str(n)]
            if ceiling == "durable-ceiling":
                serve += ["--durable", "--durable-dir", d]
        if kind != "tasks":
            cmd += ["--duration", os.environ.get("DURATION", "5s"), "--warmup", os.environ.get("WARMUP", "2s")]
        with open(f"{d}/server.toml", "w") as f:
            f.write(conf)
        log = open(f"{d}/server.log", "w")
        server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url + "/api/v1/health", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        sys.exit(f"{' '.join(serve)} did not start: see {d}/server.log")
                    time.sleep(0.05)
            out = subprocess.run(cmd + ["-o", "json"], capture_output=True, text=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait()
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
        r = json.loads(out.stdout)
    except BaseException:
        print(f"(kept {d})", file=sys.stderr)
        raise
    shutil.rmtree(d)
    rate = r.get("cycles_per_s") or r.get("tasks_per_s") or 0
    lat = r.get("latency", {})
    p99 = (lat.get("cycle") or lat.get("task") or {}).get("p99_ms", 0)
    return rate, p99


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    kind, _, n = sys.argv[1].partition(":")
    if kind not in ("spalloc", "alloc", "tasks"):
        sys.exit(__doc__)
    n = int(n or (10000 if kind == "tasks" else 1))
    rounds = int(sys.argv[2])
    configs = [parse_config(a) for a in sys.argv[3:]]
    load = configs[0][1]
    results = {name: [] for name, _, _, _ in configs}
    for r in range(rounds):
        for name, binary, env, ceiling in configs:
            rate, p99 = one_run(kind, n, load, binary, env, ceiling)
            results[name].append((rate, p99))
            print(f"round {r + 1} {name:>10} {rate:9.0f}/s  p99 {p99:.2f} ms", flush=True)
    for name, runs in results.items():
        rates = [x[0] for x in runs]
        print(f"{name:>10}: median {statistics.median(rates):.0f}/s ({min(rates):.0f}-{max(rates):.0f}),"
              f" p99 median {statistics.median(x[1] for x in runs):.2f} ms")
    if len(configs) == 2:
        a, b = (results[c[0]] for c in configs)
        ratios = sorted(y[0] / x[0] for x, y in zip(a, b) if x[0])
        print(f"{configs[1][0]} / {configs[0][0]}: median {statistics.median(ratios):.2f} of the rounds' ratios"
              f" ({', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()

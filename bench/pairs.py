#!/usr/bin/env python3
"""Compare server builds (or settings) under the same load, interleaved.

  bench/pairs.py WORKLOAD ROUNDS NAME=BINARY[:VAR=VALUE,...][@CEILING] ...
  bench/pairs.py WORKLOAD ROUNDS ... NAME=running:ADDRESS ...

WORKLOAD is spalloc:CONNS (create -> state -> destroy cycles), alloc:CLIENTS
(HTTP allocate + release) or tasks[:TASKS] (the work queue, 64 workers).
Each round runs every NAME once, in the order given: a fresh server (its
own data directory and configuration, written here) with VAR=VALUE added
to its environment, the load, then SIGTERM. The load tool is the first
BINARY for every run, so only the server differs. @ceiling or
@durable-ceiling runs BINARY's do-nothing server instead (`arbiter bench
ceiling`, its durable log in the run's directory), in a process of its
own as a server is. running:ADDRESS loads a server already running there
(a spalloc host:port, or an HTTP URL for alloc), such as the reference
spalloc server, and starts nothing.

Prints each run, then per NAME the median rate and p99, then for each
NAME after the first the median of the rounds' ratios to the first,
which is the number to quote: this machine drifts by tens of per cent
within minutes, so only runs next to each other compare.

DURATION (default 5s) and WARMUP (2s) in the environment set the bench's
flags. Example, the binary before and after a change:

  bench/pairs.py spalloc:16 6 old=/tmp/arbiter-old new=/tmp/arbiter-new
  bench/pairs.py alloc:1 6 default=./arbiter gogc400=./arbiter:GOGC=400
  bench/pairs.py spalloc:1 6 server=./arbiter bound=./arbiter@durable-ceiling ref=running:127.0.0.1:22245
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


def parse_config(arg, kind):
    """NAME=... as (name, binary, env, mode, address); mode is "server",
    a ceiling, or "running" (address set, binary None)."""
    name, sep, rest = arg.partition("=")
    if not sep or not name or not rest:
        sys.exit(f"{arg}: want NAME=BINARY[:VAR=VALUE,...][@CEILING] or NAME=running:ADDRESS")
    if rest.startswith("running:"):
        if kind == "tasks":
            sys.exit(f"{arg}: the tasks workload needs a server this script starts (it writes its manifest)")
        return name, None, {}, "running", rest[len("running:"):]
    rest, _, ceiling = rest.partition("@")
    if ceiling and ceiling not in CEILINGS:
        sys.exit(f"{arg}: @{ceiling}: want @ceiling or @durable-ceiling")
    binary, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return name, os.path.abspath(binary), env, ceiling or "server", None


def load_cmd(kind, n, load, target):
    """The load tool's command against target (a spalloc address or a URL)."""
    if kind == "spalloc":
        cmd = [load, "bench", "spalloc", "--addr", target, "--conns", str(n)]
    else:
        cmd = [load, "bench", "alloc", "--url", target, "--clients", str(n)]
    return cmd + ["--duration", os.environ.get("DURATION", "5s"), "--warmup", os.environ.get("WARMUP", "2s")]


def result(cmd):
    out = subprocess.run(cmd + ["-o", "json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {out.stderr.strip()}")
    r = json.loads(out.stdout)
    rate = r.get("cycles_per_s") or r.get("tasks_per_s") or 0
    lat = r.get("latency", {})
    p99 = (lat.get("cycle") or lat.get("task") or {}).get("p99_ms", 0)
    return rate, p99


def one_run(kind, n, load, binary, env, mode, address):
    if mode == "running":
        return result(load_cmd(kind, n, load, address))
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
            cmd = load_cmd(kind, n, load, sp)
        elif kind == "alloc":
            conf += MACHINES
            cmd = load_cmd(kind, n, load, url)
        else:
            conf += f'[tasks]\nmanifest = "{d}/tasks.toml"\n'
            open(f"{d}/tasks.toml", "w").close()
            cmd = [load, "bench", "tasks", "--url", url, "--manifest", f"{d}/tasks.toml", "--tasks", str(n)]
        if mode != "server":
            serve = [binary, "bench", "ceiling", "--listen", f"127.0.0.1:{http}", "--spalloc-listen", sp,
                     "--tasks", str(n)]
            if mode == "durable-ceiling":
                serve += ["--durable", "--durable-dir", d]
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
            rate, p99 = result(cmd)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait()
    except BaseException:
        print(f"(kept {d})", file=sys.stderr)
        raise
    shutil.rmtree(d)
    return rate, p99


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    kind, _, n = sys.argv[1].partition(":")
    if kind not in ("spalloc", "alloc", "tasks"):
        sys.exit(__doc__)
    n = int(n or (10000 if kind == "tasks" else 1))
    rounds = int(sys.argv[2])
    configs = [parse_config(a, kind) for a in sys.argv[3:]]
    binaries = [c[1] for c in configs if c[1]]
    if not binaries:
        sys.exit("want at least one NAME=BINARY: its bench is the load tool")
    load = binaries[0]
    results = {c[0]: [] for c in configs}
    if len(results) != len(configs):
        sys.exit("each NAME once")
    for r in range(rounds):
        for name, binary, env, mode, address in configs:
            rate, p99 = one_run(kind, n, load, binary, env, mode, address)
            results[name].append((rate, p99))
            print(f"round {r + 1} {name:>10} {rate:9.0f}/s  p99 {p99:.2f} ms", flush=True)
    for name, runs in results.items():
        rates = [x[0] for x in runs]
        print(f"{name:>10}: median {statistics.median(rates):.0f}/s ({min(rates):.0f}-{max(rates):.0f}),"
              f" p99 median {statistics.median(x[1] for x in runs):.2f} ms")
    first = configs[0][0]
    for name, _, _, _, _ in configs[1:]:
        ratios = sorted(y[0] / x[0] for x, y in zip(results[first], results[name]) if x[0])
        if ratios:
            print(f"{name} / {first}: median {statistics.median(ratios):.2f} of the rounds' ratios"
                  f" ({', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()

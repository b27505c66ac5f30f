"""How long an ``ordq`` command takes to answer (issue 42: commands that answer at once).

    .venv/bin/python -m bench.bench_cli [--runs 15] [--zk HOST:PORT --root /ordq] [--dir DIR]
        [--only help,list,produce,status,topic,group,top,local]

Wall time and CPU time (user + system of the child) of separate ``ordq`` processes, as a user
runs them: ``--help`` always; with ``--zk`` (a cluster ``ordq up`` started and registered),
also ``queue list``, a one-message ``produce`` to the queue ``bench-cli`` (created if
missing), ``status`` (the elected coordinator asks each process), ``topic list``, ``group list``
and ``top --once --interval 0.1`` (it samples twice, the interval apart); with ``--dir`` (that
cluster's folder), ``status --dir DIR``, the local view (``local``). p50 and p90 of ``--runs``
runs each; ``--only`` measures only the commands it names (``list``: ``queue list``, ``topic``:
``topic list``, ``group``: ``group list``). Note
the load average beside every figure: wall time on a busy box grows with the load, CPU time much
less.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

COMMANDS = ("help", "list", "produce", "status", "topic", "group", "top", "local")


def run_once(argv: Sequence[str], stdin: bytes | None = None) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the child, exit code) of one ``ordq`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ordq.cli", *argv], input=stdin, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"ordq {' '.join(argv)} failed ({done.returncode}): {done.stderr.decode().strip()}")
    return wall, cpu, done.returncode


def measure(name: str, argv: Sequence[str], runs: int, stdin: bytes | None = None) -> dict[str, Any]:
    run_once(argv, stdin)  # warm the page cache and the .pyc files
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu, _code = run_once(argv, stdin)
        walls.append(wall)
        cpus.append(cpu)
    q = statistics.quantiles(walls, n=10) if len(walls) >= 2 else walls * 9
    return {"command": name, "runs": runs, "wall_p50_s": round(statistics.median(walls), 3),
            "wall_p90_s": round(q[8], 3), "cpu_p50_s": round(statistics.median(cpus), 3),
            "load_1m": round(os.getloadavg()[0], 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_cli", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--zk", default=None, help="a running cluster's ZooKeeper (registered by ordq up)")
    parser.add_argument("--root", default="/ordq")
    parser.add_argument("--dir", default=None, help="the folder of that cluster (ordq up --dir): status --dir")
    parser.add_argument("--only", default=",".join(COMMANDS), metavar="NAME[,NAME...]",
                        help=f"the commands to measure, of {', '.join(COMMANDS)} (default: all)")
    args = parser.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if not only or set(only) - set(COMMANDS):
        parser.error(f"--only names commands of {', '.join(COMMANDS)}")
    rows = [measure("ordq --help", ["--help"], args.runs)] if "help" in only else []
    if args.zk:
        cluster = ["--zk", args.zk, "--root", args.root]
        subprocess.run([sys.executable, "-m", "ordq.cli", *cluster, "queue", "create", "bench-cli"],
                       capture_output=True, check=False)
        if "list" in only:
            rows.append(measure("ordq queue list", [*cluster, "queue", "list"], args.runs))
        if "produce" in only:
            rows.append(measure("ordq produce (1 message)", [*cluster, "produce", "bench-cli"], args.runs,
                                stdin=b"m\n"))
        if "status" in only:
            rows.append(measure("ordq status (any cluster)", [*cluster, "status"], args.runs))
        if "topic" in only:
            rows.append(measure("ordq topic list", [*cluster, "topic", "list"], args.runs))
        if "group" in only:
            rows.append(measure("ordq group list", [*cluster, "group", "list"], args.runs))
        if "top" in only:
            # two samples --interval apart (its rates): 0.1 s, so that the figure is the command's
            rows.append(measure("ordq top --once --interval 0.1", [*cluster, "top", "--once", "--interval", "0.1"],
                                args.runs))
    if args.dir and "local" in only:
        rows.append(measure("ordq status --dir (local)", ["status", "--dir", args.dir], args.runs))
    print(f"{'command':<32} {'runs':>4} {'wall p50':>9} {'wall p90':>9} {'cpu p50':>8} {'load':>6}")
    for r in rows:
        print(f"{r['command']:<32} {r['runs']:>4} {r['wall_p50_s']:>8.3f}s {r['wall_p90_s']:>8.3f}s "
              f"{r['cpu_p50_s']:>7.3f}s {r['load_1m']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

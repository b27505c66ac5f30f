"""The verifier on a Spark standalone cluster in the lab of hosts against ``local[2]`` on the
same machine, the same audits (issue 44).

Usage (root: the lab needs network namespaces):

    .venv/bin/python -m bench.bench_verify_cluster [--messages 10000000] [--dir DIR] [--only cluster|local] [--json]

The audits are bench/bench_verify.py's (one queue, one subscription, ``--messages`` seqs, no
anomaly: the verdict must be clean), generated once under ``--dir`` and reused. It makes a lab
of 4 hosts, starts a master on h1 and workers on h2 and h3 (``--worker-cores`` 1 and
``--worker-memory`` 1g each: ``ordq.lab.spark``), and runs the driver on h4 with
``--master spark://<h1>:7077``; then the same driver in this machine's own namespace on
``local[2]``. For each it reports:

- wall: ``verify()`` alone, the session already up (executors registered);
- CPU s: the driver (its Python side and JVM: process CPU) plus every task's executor CPU
  (Spark's ``executorCpuTime``, from the driver's status REST API), and the tasks' run time;
- the split between the verifier's phases (its jobs are described ``1 read, partition,
  statistics``, ``2 acks against deliveries, order``, ``3 findings, counts``, ``4 examples``):
  wall seconds from the first task's launch to the last task's end, executor CPU seconds.

The load average is printed beside every figure: on a shared 2-core machine the lab's hosts
share the same two cores, so the cluster cannot be faster here; what it shows is the cost of
going distributed (serialisation, network shuffle, three more JVMs), and the per-phase CPU a
10-worker cluster would divide.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

PHASES = ("1 read, partition, statistics", "2 acks against deliveries, order", "3 findings, counts", "4 examples")


def drive(master: str, directory: Path, driver_memory: str) -> dict[str, Any]:
    """Run one verification as the driver; its figures (run inside a lab host for a cluster)."""
    from bench.bench_verify import _spark_cpu_s
    from ordq.spark_order_check import verify
    from ordq.spark_order_check._session import make_session

    spark = make_session(master, driver_memory=driver_memory, app_name="ordq-bench-verify-cluster",
                         conf={"spark.ui.enabled": "true", "spark.ui.port": "4050",
                               "spark.executor.memory": "900m"})
    try:
        spark.range(1000).count()  # executors registered, before the clock starts
        stages_before = {s["stageId"] for s in _stages(spark)}
        cpu0 = _spark_cpu_s(spark)
        t0 = time.perf_counter()
        report = verify(acks=directory / "acks", deliveries=directory / "deliveries", spark=spark,
                        progress=sys.stderr)
        wall = time.perf_counter() - t0
        driver_cpu = _spark_cpu_s(spark) - cpu0
        stages = [s for s in _stages(spark) if s["stageId"] not in stages_before]
    finally:
        spark.stop()
    phases: dict[str, dict[str, float]] = defaultdict(lambda: {"wall_s": 0.0, "executor_cpu_s": 0.0, "tasks": 0})
    spans: dict[str, list[float]] = defaultdict(list)
    for s in stages:
        key = str(s.get("description")) if s.get("description") in PHASES else "other"
        one = phases[key]
        one["executor_cpu_s"] += s.get("executorCpuTime", 0) / 1e9
        one["tasks"] += s.get("numCompleteTasks", 0)
        for field in ("firstTaskLaunchedTime", "completionTime"):
            if s.get(field):
                spans[key].append(datetime.strptime(s[field].replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
                                  .timestamp())
    for key, times in spans.items():
        phases[key]["wall_s"] = max(times) - min(times)
    executor_cpu = sum(s.get("executorCpuTime", 0) for s in stages) / 1e9
    return {
        "master": master, "ok": report.ok, "rows": report.inputs.ack_rows + report.inputs.delivery_rows,
        "wall_s": round(wall, 1), "driver_cpu_s": round(driver_cpu, 1), "executor_cpu_s": round(executor_cpu, 1),
        "cpu_s": round(driver_cpu + executor_cpu, 1) if not master.startswith("local") else round(driver_cpu, 1),
        "task_run_s": round(sum(s.get("executorRunTime", 0) for s in stages) / 1e3, 1),
        "stages": len(stages), "failed_tasks": sum(s.get("numFailedTasks", 0) for s in stages),
        "phases": {k: {f: round(v, 1) for f, v in one.items()} for k, one in sorted(phases.items())},
        "load": [round(x, 1) for x in os.getloadavg()],
    }


def _stages(spark: Any) -> list[dict[str, Any]]:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages?status=complete"
    with urllib.request.urlopen(url, timeout=60) as answer:
        stages: list[dict[str, Any]] = json.load(answer)
    return stages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ordq-bench")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--worker-memory", default="1g")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", choices=("cluster", "local"), default=None,
                    help="run only the lab cluster or only local[2] (each alone fits a short window)")
    ap.add_argument("--drive", default=None, metavar="MASTER", help=argparse.SUPPRESS)  # the driver, in a lab host
    args = ap.parse_args(argv)
    from bench.bench_verify import _data, _size

    directory, gen_s = _data(args.dir.resolve(), args.messages)
    if args.drive:
        print("RESULT " + json.dumps(drive(args.drive, directory, args.driver_memory)))
        return 0
    from ordq.lab import Lab
    from ordq.lab.netns import in_namespace
    from ordq.lab.spark import LabSpark, SparkLayout

    n_files, n_bytes = _size(directory)

    def say(line: str) -> None:  # with --json: to stderr, beside the driver's progress
        print(line, flush=True, file=sys.stderr if args.json else sys.stdout)

    say(f"data: {directory} ({n_files} files, {n_bytes / 1e6:,.0f} MB"
        + (f", generated in {gen_s:.0f} s)" if gen_s else ", reused)"))
    results: list[dict[str, Any]] = []

    def run(label: str, prefix: list[str], master: str) -> bool:
        argv = [*prefix, sys.executable, "-m", "bench.bench_verify_cluster", "--messages", str(args.messages),
                "--dir", str(args.dir.resolve()), "--driver-memory", args.driver_memory, "--drive", master]
        # the driver's progress (one line per stage) and errors go straight to our stderr
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if done.returncode != 0 or line is None:
            print(f"{label}: the driver exited {done.returncode} without a result", file=sys.stderr)
            return False
        result = json.loads(line.removeprefix("RESULT "))
        result["label"] = label
        results.append(result)
        say(f"{label}: wall {result['wall_s']} s, CPU {result['cpu_s']} s (driver {result['driver_cpu_s']}, "
            f"executor tasks {result['executor_cpu_s']}), {result['stages']} stages, "
            f"{result['failed_tasks']} failed tasks; load {result['load']}")
        for name, one in result["phases"].items():
            say(f"    {name}: wall {one['wall_s']} s, executor CPU {one['executor_cpu_s']} s, "
                f"{int(one['tasks'])} tasks")
        if not result["ok"]:
            print("verify found violations on clean data: void", file=sys.stderr)
            return False
        return True

    if args.only != "local":  # local[2] alone needs no lab (nor its idle JVMs beside it)
        with tempfile.TemporaryDirectory(prefix="ordq-bench-lab-") as folder, \
                Lab.create(Path(folder), hosts=4) as lab:
            t0 = time.monotonic()
            spark = LabSpark.start(lab, SparkLayout(memory=args.worker_memory))
            say(f"lab cluster {spark.master_url} up in {time.monotonic() - t0:.0f} s; "
                f"load {os.getloadavg()[0]:.1f}")
            if not run("lab cluster (2 workers x 1 core)", in_namespace(lab.namespace("h4"), []), spark.master_url):
                return 1
            spark.stop()
    if args.only != "cluster" and not run("local[2]", [], "local[2]"):
        return 1
    if args.json:
        print(json.dumps({"messages": args.messages, "mb": round(n_bytes / 1e6), "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

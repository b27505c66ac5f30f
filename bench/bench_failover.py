"""Failover time: kill -9 of the head master → first ack on the new group, over many kills.
Not a test: prints numbers for docs/BENCHMARKS.md ("Failover time").

    .venv/bin/python -m bench.bench_failover [--kills 20] [--messages 6000] [--rate 3000] [--no-verify]

Each kill is one run of the kill-head-master drill (``ordq.drills.catalog``) on one local cluster
(ZooKeeper, 3 groups, 2 coordinators; ``ordq.local_cluster``): a producer process sends a
steady stream to a fresh queue, a consumer process reads it, the head master is killed at a
random moment (seeded) and restarted once the producer is acked on the next group. Failover
time = the kill signal (taken just before it) → the first ack the producer got on a later
segment, both from this machine's clock (the producer's audit ``ack_us``). At the end one
spark_order_check job verifies every run (nothing lost or reordered across all the kills).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ordq.cluster_config import ClusterConfig
from ordq.drills.catalog import DRILLS
from ordq.drills.judge import failover_seconds, judge_all
from ordq.drills.runner import LoadConfig, execute_drill
from ordq.drills.verdict import Verifier
from ordq.local_cluster import LocalCluster


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), at least 1
    return ordered[int(rank) - 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--messages", type=int, default=6_000, help="messages per run")
    ap.add_argument("--rate", type=float, default=3_000.0, help="messages per second")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-verify", action="store_true", help="skip the Spark verification at the end")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    load = LoadConfig(messages=args.messages, rate=args.rate)
    folder = Path(tempfile.mkdtemp(prefix="ordq-bench-failover-"))
    cluster = LocalCluster(folder / "c", ClusterConfig(groups=3, zk_nodes=1, coordinators=2))
    started = time.monotonic()
    runs = []
    samples: list[float] = []
    try:
        cluster.start()
        for i in range(1, args.kills + 1):
            run = execute_drill(cluster, DRILLS["kill-head-master"], round_=i, seed=args.seed, load=load)
            fo = failover_seconds(run) if run.error is None else None
            runs.append(run)
            if fo is not None:
                samples.append(fo)
            what = f"failover {fo * 1000:7.1f} ms" if fo is not None else f"no sample ({run.error})"
            print(f"kill {i:3d}: {what}", file=sys.stderr, flush=True)
        verdict = "not verified"
        if not args.no_verify:
            with Verifier(log_path=folder / "spark.log") as verifier:
                results = judge_all(runs, verifier, keep=True)
            bad = [r for r in results if not r.ok]
            verdict = "all PASS" if not bad else f"{len(bad)} FAIL: " + "; ".join(r.verdict for r in bad[:3])
    finally:
        cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)  # its own folder too (25 empty ones were left in /tmp)
    if not samples:
        print("no failover measured", file=sys.stderr)
        return 1
    ms = [s * 1000 for s in samples]
    doc = {
        "kills": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p90_ms": round(percentile(ms, 90), 1),
        "p99_ms": round(percentile(ms, 99), 1), "max_ms": round(max(ms), 1), "min_ms": round(min(ms), 1),
        "mean_ms": round(statistics.mean(ms), 1), "verdict": verdict, "seconds": round(time.monotonic() - started),
        "messages_per_run": args.messages, "rate": args.rate,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"failover time over {doc['kills']} head-master kills: p50 {doc['p50_ms']} ms, p90 {doc['p90_ms']} ms, "
              f"p99 {doc['p99_ms']} ms, max {doc['max_ms']} ms (min {doc['min_ms']}, mean {doc['mean_ms']}); "
              f"verification: {verdict}; {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

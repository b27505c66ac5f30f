"""Benchmark of the Spark ordering verifier against a bare Spark scan of the same files.

Usage: .venv/bin/python -m bench.bench_verify [--messages 10000000] [--master local[2]]
                                              [--dir DIR] [--repeat 1] [--json]

Writes (once; reused while the scenario is unchanged) synthetic audit files of one queue and
one subscription with ``--messages`` distinct seqs, each acked and delivered, as the SDK's
audit hook writes them (1,000,000 rows per file): a producer takeover with in-flight seqs and
resends, and a consumer takeover whose standby redelivers 10% of the stream, so deliveries
are 1.1 x messages rows. No anomaly is injected: the report must come out clean, and the run
fails if it does not.

In one Spark session on ``--master``, it then times:

- ``bare scan``: ``spark.read.text(every file).count()``, the least any verification must
  do (read every byte once); the best of ``--repeat`` runs;
- ``verify``: ``spark_order_check.verify`` on the same session, every check (the best of
  ``--repeat`` runs).

The ratio verify / bare scan is the figure of merit (issue goal: <= 2 on local[2]).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from spark_order_check import verify
from spark_order_check._session import make_session
from spark_order_check.generate import Scenario, generate

ROWS_PER_FILE = 1_000_000  # the SDK audit hook's default (sdk/audit.py)


def _data(root: Path, messages: int) -> tuple[Path, float]:
    """The audit data for ``messages`` seqs under ``root`` (generated unless already there)."""
    scenario = Scenario(queues=("orders",), subscriptions=("s1",), messages=messages, rows_per_file=ROWS_PER_FILE)
    directory = root / f"verify-{messages}"
    marker = directory / "COMPLETE"
    if marker.exists() and marker.read_text() == repr(scenario):
        return directory, 0.0
    t0 = time.perf_counter()
    generate(directory, scenario, latency=False)
    marker.write_text(repr(scenario))
    return directory, time.perf_counter() - t0


def _size(directory: Path) -> tuple[int, int]:
    files = [p for p in directory.rglob("*.tsv*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000, help="distinct seqs (default 10,000,000)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--driver-memory", default="2g", help="Spark driver memory (default 2g)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ordq-bench",
                    help="where the generated audit files are kept (default: TMPDIR/ordq-bench)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each, best kept (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    directory, gen_s = _data(args.dir, args.messages)
    n_files, n_bytes = _size(directory)
    if not args.json:
        print(f"data: {directory} ({n_files} files, {n_bytes / 1e6:,.0f} MB"
              + (f", generated in {gen_s:.0f} s)" if gen_s else ", reused)"), flush=True)

    spark = make_session(args.master, driver_memory=args.driver_memory, app_name="ordq-bench-verify")
    try:
        spark.range(1000).count()  # start the executors before timing anything
        paths = [str(p) for p in sorted(directory.rglob("*.tsv*"))]
        scans, runs, report = [], [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rows = spark.read.text(paths).count()
            scans.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = verify(acks=directory / "acks", deliveries=directory / "deliveries", spark=spark)
            runs.append(time.perf_counter() - t0)
            if not args.json:
                print(f"bare scan {scans[-1]:.1f} s ({rows:,} lines), verify {runs[-1]:.1f} s", flush=True)
    finally:
        spark.stop()
    assert report is not None
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        print("verify reported violations on clean data: the benchmark is void", file=sys.stderr)
        return 1
    scan_s, verify_s = min(scans), min(runs)
    result = {
        "messages": args.messages,
        "ack_rows": report.inputs.ack_rows,
        "delivery_rows": report.inputs.delivery_rows,
        "files": n_files,
        "mb": round(n_bytes / 1e6, 1),
        "master": args.master,
        "bare_scan_s": round(scan_s, 2),
        "verify_s": round(verify_s, 2),
        "ratio": round(verify_s / scan_s, 2),
        "verify_rows_per_s": round((report.inputs.ack_rows + report.inputs.delivery_rows) / verify_s),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"verify: {verify_s:.1f} s for {result['ack_rows']:,} ack + {result['delivery_rows']:,} delivery rows "
              f"({result['verify_rows_per_s']:,} rows/s); bare scan {scan_s:.1f} s; ratio {result['ratio']:.2f}x "
              f"(goal <= 2); load average {result['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

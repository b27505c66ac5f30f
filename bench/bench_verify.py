"""Benchmark of the Spark ordering verifier against a bare Spark scan of the same files.

Usage: .venv/bin/python -m bench.bench_verify [--messages 10000000] [--master local[2]]
                                              [--dir DIR] [--repeat 1] [--json] [--no-baselines]

Writes (once; reused while the scenario is unchanged) synthetic audit files of one queue and
one subscription with ``--messages`` distinct seqs, each acked and delivered, as the SDK's
audit hook writes them (1,000,000 rows per file): a producer takeover with in-flight seqs and
resends, and a consumer takeover whose standby redelivers 10% of the stream, so deliveries
are 1.1 x messages rows. No anomaly is injected: the report must come out clean, and the run
fails if it does not.

In one Spark session on ``--master``, it then times:

- ``bare scan``: ``spark.read.text(every file).count()``, the least any verification must
  do (read every byte once); timed before and after the others, the best kept (on a shared
  VM it varies 2x within minutes; the best is the strictest baseline);
- ``csv count``: ``spark.read.csv(every file, sep TAB, header).count()``: Spark's CSV
  reader when no column is needed;
- ``csv parse``: the same reader with the audit schema, every numeric column parsed and
  folded (``bit_xor``): what parsing every field costs Spark's CSV reader;
- ``verifier parse``: the verifier's own scan (``scan_acks`` + ``scan_deliveries``: split,
  numbers, row positions, kinds), every column the checks use folded; no shuffle. The floor
  of any verification that reads the columns the way the verifier does;
- ``verify``: ``spark_order_check.verify`` on the same session, every check (the best of
  ``--repeat`` runs);
- ``reference`` (before Spark starts): ``ordq.spark_order_check.reference.check``, the same
  audit-file rules as a plain single-process Python checker, on one core: the simplest honest
  alternative. Both are reported as rows/s per core (Spark: divided by the master's cores).

The ratio verify / bare scan is the figure of merit (issue goal: <= 2 on local[2]); the
ratios to the other baselines are printed alongside.
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
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS
from ordq.spark_order_check import reference, verify
from ordq.spark_order_check._files import list_local
from ordq.spark_order_check._scan import scan_acks, scan_deliveries
from ordq.spark_order_check._session import make_session, scan_settings
from ordq.spark_order_check.generate import Scenario, generate
from ordq.spark_order_check.report import CLASS_BY_NAME

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


_NUMBERS = {"epoch", "seq", "seg", "offset", "crc32", "send_us", "ack_us", "msg_us", "deliver_us"}


def _csv_count(spark: SparkSession, paths: list[str]) -> int:
    return spark.read.options(sep="\t", header="true").csv(paths).count()


def _csv_parse(spark: SparkSession, paths: list[str]) -> int:
    """Every numeric column of every file parsed by the CSV reader, acks and deliveries each
    with their own schema (docs/AUDIT_FORMAT.md)."""
    total = 0
    for columns, sub in ((ACK_COLUMNS, "/acks/"), (DELIVERY_COLUMNS, "/deliveries/")):
        schema = T.StructType([T.StructField(c, T.LongType() if c in _NUMBERS else T.StringType()) for c in columns])
        df = spark.read.schema(schema).options(sep="\t", header="true", quote="").csv([p for p in paths if sub in p])
        row = df.select(F.count(F.lit(1)).alias("n"), *[F.bit_xor(c) for c in columns if c in _NUMBERS]).first()
        assert row is not None  # an aggregate has one row
        total += int(row["n"])
    return total


def _verifier_parse(spark: SparkSession, directory: Path) -> int:
    fa, fd = list_local([str(directory / "acks")], "acks"), list_local([str(directory / "deliveries")], "deliveries")
    with scan_settings(spark, partitions=2):
        e = scan_acks(spark, fa, 0).unionByName(scan_deliveries(spark, fd, len(fa), ()))
        row = e.select(F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64("q", "s", "c")), F.bit_xor("seq"),
                       F.bit_xor("crc"), F.bit_xor("pos"), F.bit_xor("seg"), F.bit_xor("lat"), F.sum("kind")).first()
    assert row is not None  # an aggregate has one row
    return int(row["n"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000, help="distinct seqs (default 10,000,000)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--driver-memory", default="2g", help="Spark driver memory (default 2g)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ordq-bench",
                    help="where the generated audit files are kept (default: TMPDIR/ordq-bench)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of each, best kept (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    ap.add_argument("--no-baselines", action="store_true", help="time only the bare scan and verify")
    ap.add_argument("--no-reference", action="store_true", help="skip the single-process Python checker")
    args = ap.parse_args(argv)

    directory, gen_s = _data(args.dir, args.messages)
    n_files, n_bytes = _size(directory)
    if not args.json:
        print(f"data: {directory} ({n_files} files, {n_bytes / 1e6:,.0f} MB"
              + (f", generated in {gen_s:.0f} s)" if gen_s else ", reused)"), flush=True)

    reference_s = reference_cpu_s = None
    if not args.no_reference:
        cpu0 = time.process_time()
        ref = reference.check(directory / "acks", directory / "deliveries")
        reference_cpu_s = time.process_time() - cpu0
        bad = {k: v for k, v in ref.counts.items() if v and CLASS_BY_NAME[k].violation}
        if bad:
            print(f"the reference checker found violations on clean data: {bad}", file=sys.stderr)
            return 1
        reference_s = ref.seconds
        if not args.json:
            print(f"  reference (one process): {reference_s:.1f} s, {ref.rows / reference_s:,.0f} rows/s, "
                  f"CPU {reference_cpu_s:.1f} s; load average {[round(x, 1) for x in os.getloadavg()]}", flush=True)

    spark = make_session(args.master, driver_memory=args.driver_memory, app_name="ordq-bench-verify")
    try:
        spark.range(1000).count()  # start the executors before timing anything
        paths = [str(p) for p in sorted(directory.rglob("*.tsv*"))]
        timed: dict[str, list[float]] = {k: [] for k in ("bare_scan", "csv_count", "csv_parse", "verifier_parse",
                                                           "verify")}
        report = None
        verify_cpu: list[float] = []

        def run(name: str, fn: Any) -> Any:
            t0 = time.perf_counter()
            out = fn()
            timed[name].append(time.perf_counter() - t0)
            if not args.json:
                print(f"  {name}: {timed[name][-1]:.1f} s", flush=True)
            return out

        for _ in range(args.repeat):
            run("bare_scan", lambda: spark.read.text(paths).count())
            if not args.no_baselines:
                run("csv_count", lambda: _csv_count(spark, paths))
                run("csv_parse", lambda: _csv_parse(spark, paths))
                run("verifier_parse", lambda: _verifier_parse(spark, directory))
            cpu0 = _spark_cpu_s(spark)
            report = run("verify", lambda: verify(acks=directory / "acks", deliveries=directory / "deliveries",
                                                  spark=spark))
            verify_cpu.append(_spark_cpu_s(spark) - cpu0)
            if not args.json:
                print(f"  verify CPU (driver + JVM): {verify_cpu[-1]:.1f} s; load average "
                      f"{[round(x, 1) for x in os.getloadavg()]}", flush=True)
            run("bare_scan", lambda: spark.read.text(paths).count())  # again: the best of both is kept
    finally:
        spark.stop()
    assert report is not None
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        print("verify reported violations on clean data: the benchmark is void", file=sys.stderr)
        return 1
    best = {k: min(v) for k, v in timed.items() if v}
    scan_s, verify_s = best["bare_scan"], best["verify"]
    result = {
        "messages": args.messages,
        "ack_rows": report.inputs.ack_rows,
        "delivery_rows": report.inputs.delivery_rows,
        "files": n_files,
        "mb": round(n_bytes / 1e6, 1),
        "master": args.master,
        **{f"{k}_s": round(v, 2) for k, v in best.items()},
        "ratio": round(verify_s / scan_s, 2),
        **{f"ratio_to_{k}": round(verify_s / v, 2) for k, v in best.items() if k not in ("bare_scan", "verify")},
        "verify_rows_per_s": round((report.inputs.ack_rows + report.inputs.delivery_rows) / verify_s),
        "verify_rows_per_s_per_core": round((report.inputs.ack_rows + report.inputs.delivery_rows) / verify_s
                                            / _cores(args.master)),
        "reference_s": round(reference_s, 2) if reference_s else None,
        "reference_rows_per_s_per_core": round((report.inputs.ack_rows + report.inputs.delivery_rows) / reference_s)
        if reference_s else None,
        "verify_cpu_s": round(min(verify_cpu), 2),
        "reference_cpu_s": round(reference_cpu_s, 2) if reference_cpu_s else None,
        "verify_rows_per_cpu_s": round((report.inputs.ack_rows + report.inputs.delivery_rows) / min(verify_cpu)),
        "reference_rows_per_cpu_s": round((report.inputs.ack_rows + report.inputs.delivery_rows) / reference_cpu_s)
        if reference_cpu_s else None,
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
        for k, v in best.items():
            if k not in ("bare_scan", "verify"):
                print(f"  vs {k}: {v:.1f} s, ratio {verify_s / v:.2f}x")
        if reference_s:
            print(f"per core: Spark {result['verify_rows_per_s_per_core']:,} rows/s on {args.master}, plain Python "
                  f"{result['reference_rows_per_s_per_core']:,} rows/s (goal: Spark >= Python)")
            print(f"per CPU second: Spark {result['verify_rows_per_cpu_s']:,} rows, plain Python "
                  f"{result['reference_rows_per_cpu_s']:,} rows")
    return 0


def _tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _spark_cpu_s(spark: SparkSession) -> float:
    """CPU of this process (the driver's Python side) and of the JVM it launched."""
    proc = getattr(spark.sparkContext._gateway, "proc", None)
    return time.process_time() + (_tree_cpu_s(proc.pid) if proc is not None else 0.0)


def _cores(master: str) -> int:
    """The cores a local master uses (local[N], local[*]); other masters: this machine's."""
    inner = master.removeprefix("local[").removesuffix("]") if master.startswith("local[") else "*"
    return (os.cpu_count() or 1) if inner == "*" else int(inner)


if __name__ == "__main__":
    sys.exit(main())

"""``verify()``: list inputs, run the checks in Spark, collect a bounded report.

Guarantee: ``Report.ok`` is True only when every violation class counts zero; counts are
exact (latency percentiles are approximate beyond 10,000 rows per group, and say so).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.errors import ConfigError, OrdqError
from spark_order_check import _checks as C
from spark_order_check._files import ROW_BITS, AuditFile, list_local, list_remote, partition_paths
from spark_order_check._scan import ACK, BUCKET_BITS, DELIVERY, MALFORMED, TORN, local_table, scan_acks, scan_deliveries
from spark_order_check._session import default_partitions, make_session, scan_settings
from spark_order_check.report import (
    CLASSES,
    EXAMPLES,
    ClassResult,
    Inputs,
    InstanceStats,
    Latency,
    QueueStats,
    Report,
    SubscriptionStats,
)

log = logging.getLogger("spark_order_check")
SUBS = T.StructType([
    T.StructField("q", T.StringType()), T.StructField("s", T.StringType()), T.StructField("first", T.BooleanType()),
])
BROADCAST_KEYS_MAX = 200_000
LATENCY_METHOD = (
    f"percentiles by percentile_approx (accuracy {C.PERCENTILE_ACCURACY}: exact up to {C.PERCENTILE_ACCURACY:,} "
    f"rows per group, beyond that the rank is within 1/{C.PERCENTILE_ACCURACY:,} of the rows); min and max exact")


class LineOrderUnavailable(OrdqError):
    """Spark did not read each audit file whole in one task, so line order cannot be trusted."""


def _paths(value: str | Path | Iterable[str | Path] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [str(value)]
    return [str(v) for v in value]


def _list(spark: SparkSession | None, paths: Sequence[str], kind: str) -> list[AuditFile]:
    local, remote = partition_paths(paths)
    files = list_local(local, kind) if local else []
    if remote:
        if spark is None:
            raise ConfigError("remote paths need a Spark session")
        files += list_remote(spark, remote, kind)
    return sorted(files, key=lambda f: (f.writer, f.n, f.name))


def verify(
    *,
    acks: str | Path | Iterable[str | Path],
    deliveries: str | Path | Iterable[str | Path],
    segments: str | Path | Iterable[str | Path] | None = None,
    keyed: Iterable[str] = (),
    master: str | None = None,
    spark: SparkSession | None = None,
    conf: dict[str, str] | None = None,
    driver_memory: str | None = None,
    report_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    partitions: int | None = None,
    bucket_bits: int = BUCKET_BITS,
) -> Report:
    """Verify an ordq run from its audit files (docs/VERIFIER.md).

    Args:
        acks, deliveries: directories, files or glob patterns of ``*.tsv`` / ``*.tsv.part``
            audit files (docs/AUDIT_FORMAT.md); local paths or Hadoop URIs.
        segments: broker data directories (``<data>/<queue>/<seg:012d>/segment.log``) to
            check the stored order, replica agreement and that every acked seq is stored.
        keyed: subscriptions consumed with per-key ordering (``SUB`` or ``QUEUE/SUB``): their
            global order is not checked, their per-key order is.
        master: Spark master when this call creates the session (default ``local[*]``, or the
            one spark-submit set). Ignored when a session is given or already active.
        spark: an existing session to reuse (default: the active one, if any); a session this
            call did not create is left running.
        report_path, plot_path: also write the JSON report / a latency histogram PNG.
        partitions: shuffle partitions (default: one per ~64 MiB of audit input, at least one
            per core).
        bucket_bits: seqs are windowed in buckets of 2**bucket_bits (docs/VERIFIER.md,
            "Scaling"); results do not depend on it.

    Raises:
        ConfigError: a path does not exist or holds no audit files, or a file name repeats.
        LineOrderUnavailable: Spark did not read each file whole (a broken assumption).
    """
    t0 = time.monotonic()
    ack_paths, del_paths, seg_paths = _paths(acks), _paths(deliveries), _paths(segments)
    if not ack_paths or not del_paths:
        raise ConfigError("give both acks and deliveries audit paths")
    keyed = tuple(keyed)
    local_only = not any(partition_paths(p)[1] for p in (ack_paths, del_paths, seg_paths))
    if local_only:  # report a bad path before paying for a Spark start
        fa, fd = _list(None, ack_paths, "acks"), _list(None, del_paths, "deliveries")
        seg_files = _list_segments_local(seg_paths) if seg_paths else None
    if not 1 <= bucket_bits <= 40:
        raise ConfigError("bucket_bits must be between 1 and 40")
    session = spark or SparkSession.getActiveSession()
    own = session is None  # a session this call creates, it also stops
    if session is None:
        session = make_session(master, conf=conf, driver_memory=driver_memory)
    try:
        if not local_only:
            fa, fd = _list(session, ack_paths, "acks"), _list(session, del_paths, "deliveries")
            seg_files = _list_segments(session, seg_paths) if seg_paths else None
        input_bytes = sum(f.size for f in fa + fd)
        with scan_settings(session, partitions=partitions or default_partitions(session, input_bytes)):
            report, hist = _run(session, fa, fd, seg_files, keyed, bucket_bits, t0)
    finally:
        if own:
            session.stop()
    if report_path is not None:
        Path(report_path).write_text(report.to_json() + "\n")
    if plot_path is not None:
        from spark_order_check.plot import latency_histogram_png

        latency_histogram_png(hist, Path(plot_path), report)
    return report


def _list_segments_local(paths: Sequence[str]) -> list[Any]:
    from spark_order_check.segments import list_segment_files

    return list_segment_files(None, paths)


def _list_segments(spark: SparkSession, paths: Sequence[str]) -> list[Any]:
    from spark_order_check.segments import list_segment_files

    return list_segment_files(spark, paths)


def _run(spark: SparkSession, fa: list[AuditFile], fd: list[AuditFile], seg_files: list[Any] | None,
         keyed: tuple[str, ...], bucket_bits: int, t0: float) -> tuple[Report, list[tuple[str, str, int, int]]]:
    files = fa + fd
    mark = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        log.info("%s: %.2f s", name, now - mark[0])
        mark[0] = now

    e = scan_acks(spark, fa, 0, bucket_bits).unionByName(scan_deliveries(spark, fd, len(fa), keyed, bucket_bits))
    e = C.persist(e.repartition("q", "b"))
    kept: list[DataFrame] = [e]
    try:
        # 1. Small statistics (and the first pass over the input, which fills the cache).
        istats = C.input_stats(e).collect()
        phase("scan, partition by (queue, bucket), persist; input statistics")
        _check_row_numbering(istats, files)
        lat = {(r.q, r.s): _latency(r) for r in C.latency_stats(e).collect()}
        phase("latency percentiles")
        subs = sorted({(r.q, r.s) for r in istats if r.kind == DELIVERY})
        queues_with_acks = sorted({r.q for r in istats if r.kind == ACK})
        sub_rows = [(q, s, i == 0 or subs[i - 1][0] != q) for i, (q, s) in enumerate(subs)]
        sdf = local_table(spark, sub_rows, SUBS)

        # 2. Raw findings: per consumer instance (and key) windows, acks against deliveries.
        d = e.filter(F.col("kind") == DELIVERY)
        raw = C.instance_findings(d).unionByName(C.seq_findings(e, sdf))
        if keyed:
            raw = raw.unionByName(C.key_findings(d))
        raw = C.checkpoint(raw)
        kept.append(raw)
        raw_counts = {r.cls: r.n for r in raw.groupBy("cls").agg(F.count(F.lit(1)).alias("n")).collect()}
        phase("windows per consumer instance, acks against deliveries")

        # 3. Findings: ranges, boundary pairs, in-flight classification, unreadable rows.
        parts = [raw.filter(~F.col("cls").startswith("_")), C.unreadable_findings(e)]
        if raw_counts.get("_bnd") or raw_counts.get("_kbnd"):
            parts.append(C.stitch_boundaries(raw.filter(F.col("cls").isin("_bnd", "_kbnd"))))
        if raw_counts.get("_lost") or raw_counts.get("_unacked"):
            rng = C.ranges(raw.filter(F.col("cls").isin("_lost", "_unacked")))
            parts.append(rng.filter(F.col("cls") == "_lost").select(
                C.finding("lost", q=F.col("q"), s=F.col("s"), seq=F.col("seq"), seq2=F.col("seq2"),
                          n=F.col("n")).alias("f")).select("f.*"))
            if raw_counts.get("_unacked"):
                parts.append(C.classify_unacked(
                    e, rng.filter(F.col("cls") == "_unacked"), queues_with_acks,
                    broadcast_keys=raw_counts["_unacked"] <= BROADCAST_KEYS_MAX))
        segment_stats = None
        if seg_files is not None:
            from spark_order_check.segments import segment_findings

            seg_df, segment_stats = segment_findings(spark, seg_files, e, bucket_bits, kept)
            parts.append(seg_df)
        allf = parts[0]
        for p in parts[1:]:
            allf = allf.unionByName(p)
        allf = C.checkpoint(allf)
        kept.append(allf)
        counts = allf.groupBy("cls", "q", "s").agg(F.sum("n").alias("n"), F.count(F.lit(1)).alias("rows")).collect()
        phase("findings, counts")
        order = [F.col(c).asc_nulls_first() for c in ("q", "s", "seq", "c", "key", "pos", "seq2")]
        rn = F.row_number().over(Window.partitionBy("cls").orderBy(*order))
        examples = allf.withColumn("rn", rn).filter(F.col("rn") <= EXAMPLES).collect()
        phase("examples")
    finally:
        for df in kept:
            C.release(df)

    by_cls: dict[str, list[Any]] = defaultdict(list)
    for r in counts:
        by_cls[r.cls].append(r)
    ex_cls: dict[str, list[Any]] = defaultdict(list)
    for r in sorted(examples, key=lambda r: r.rn):
        ex_cls[r.cls].append(r)
    unknown = set(by_cls) - {c.name for c in CLASSES}
    if unknown:
        raise AssertionError(f"findings of unknown classes {sorted(unknown)}")  # a bug in the checks
    results = []
    for meta in CLASSES:
        rows = sorted(by_cls.get(meta.name, []), key=lambda r: (r.q or "", r.s or ""))
        results.append(ClassResult(
            name=meta.name,
            violation=meta.violation,
            count=int(sum(r.n for r in rows)),
            findings=int(sum(r.rows for r in rows)),
            by_subscription=tuple((r.q, r.s, int(r.n)) for r in rows),
            examples=tuple(_example(meta.name, r, files) for r in ex_cls.get(meta.name, [])),
        ))
    queues, subscriptions, instances, inputs = _stats(istats, fa, fd, lat)
    notes = []
    if segment_stats is not None:
        inputs = attrs.evolve(inputs, segment_files=segment_stats[0], stored_messages=segment_stats[1])
        if segment_stats[2]:
            notes.append(f"{segment_stats[2]} acked seqs were placed in segments below the lowest stored one "
                         "(popped): not checked against the segments")
    hist: dict[tuple[str, str, int], int] = defaultdict(int)
    for r in istats:
        if r.kind == DELIVERY:
            hist[(r.q, r.s, int(r.bin))] += int(r.rows)
    ok = not any(r.violation and r.count for r in results)
    if not any(q.ack_rows for q in queues):
        notes.append("no ack rows: every delivered seq counts as unacked")
    report = Report(
        ok=ok, classes=tuple(results), inputs=inputs, queues=queues, subscriptions=subscriptions,
        instances=instances, latency_method=LATENCY_METHOD, seconds=time.monotonic() - t0, keyed=keyed,
        notes=tuple(notes), histogram=tuple((q, s, b, n) for (q, s, b), n in sorted(hist.items())),
    )
    return report, list(report.histogram)


def _check_row_numbering(istats: list[Any], files: list[AuditFile]) -> None:
    per_file: dict[int, list[int]] = defaultdict(lambda: [0, 1 << 62, -1])
    for r in istats:
        agg = per_file[int(r.fid)]
        agg[0] += int(r.rows)
        agg[1] = min(agg[1], int(r.min_row))
        agg[2] = max(agg[2], int(r.max_row))
    for fid, (rows, lo, hi) in per_file.items():
        if lo != 0 or hi != rows - 1:
            raise LineOrderUnavailable(
                f"Spark did not read {files[fid].path} whole in one task (rows {rows}, numbered {lo}..{hi}); "
                "line order cannot be established")


def _latency(r: Any) -> Latency:
    pct = r.pct or [None, None, None]
    return Latency(count=int(r.rows), p50_us=pct[0], p95_us=pct[1], p99_us=pct[2], max_us=r.max, min_us=r.min,
                   negative=int(r.negative or 0))


def _stats(istats: list[Any], fa: list[AuditFile], fd: list[AuditFile],
           lat: dict[tuple[str, str], Latency]) -> tuple[Any, Any, Any, Inputs]:
    queues: dict[str, dict[str, Any]] = {}
    inst: dict[tuple[str, str, str], dict[str, Any]] = {}
    rows_by_kind: dict[int, int] = defaultdict(int)
    files_of: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for r in istats:
        rows_by_kind[int(r.kind)] += int(r.rows)
        if r.kind == ACK:
            q = queues.setdefault(r.q, {"rows": 0, "producers": set(), "lo": None, "hi": None})
            q["rows"] += r.rows
            q["producers"].add(r.c)
            q["lo"] = r.min_seq if q["lo"] is None else min(q["lo"], r.min_seq)
            q["hi"] = r.max_seq if q["hi"] is None else max(q["hi"], r.max_seq)
        elif r.kind == DELIVERY:
            i = inst.setdefault((r.q, r.s, r.c), {"rows": 0, "files": 0, "lo": None, "hi": None})
            i["rows"] += r.rows
            files_of[(r.q, r.s, r.c)].add(int(r.fid))
            i["files"] = len(files_of[(r.q, r.s, r.c)])
            i["lo"] = r.min_seq if i["lo"] is None else min(i["lo"], r.min_seq)
            i["hi"] = r.max_seq if i["hi"] is None else max(i["hi"], r.max_seq)
    for queue, _s, _c in inst:
        queues.setdefault(queue, {"rows": 0, "producers": set(), "lo": None, "hi": None})
    queue_stats = tuple(QueueStats(q, int(v["rows"]), tuple(sorted(v["producers"])), v["lo"], v["hi"])
                        for q, v in sorted(queues.items()))
    instances = tuple(InstanceStats(q, s, c, int(v["rows"]), v["files"], v["lo"], v["hi"])
                      for (q, s, c), v in sorted(inst.items()))
    subs: dict[tuple[str, str], list[InstanceStats]] = defaultdict(list)
    for one in instances:
        subs[(one.queue, one.subscription)].append(one)
    empty = Latency(0, None, None, None, None, None, 0)
    sub_stats = tuple(
        SubscriptionStats(q, s, sum(i.deliveries for i in v), tuple(i.consumer for i in v),
                          min(i.min_seq for i in v if i.min_seq is not None),
                          max(i.max_seq for i in v if i.max_seq is not None), lat.get((q, s), empty))
        for (q, s), v in sorted(subs.items()))
    inputs = Inputs(ack_files=len(fa), delivery_files=len(fd), ack_rows=rows_by_kind[ACK],
                    delivery_rows=rows_by_kind[DELIVERY], unreadable_rows=rows_by_kind[MALFORMED] + rows_by_kind[TORN])
    return queue_stats, sub_stats, instances, inputs


def _at(pos: int | None, files: list[AuditFile]) -> str | None:
    if pos is None:
        return None
    fid, row = pos >> ROW_BITS, pos & ((1 << ROW_BITS) - 1)
    return f"{files[fid].name}:{row + 2}"


def _example(cls: str, r: Any, files: list[AuditFile]) -> dict[str, Any]:
    at = _at
    if cls == "lost":
        return {"queue": r.q, "subscription": r.s, "first_seq": r.seq, "last_seq": r.seq2, "count": r.n}
    if cls in ("unacked", "unacked_in_flight"):
        return {"queue": r.q, "subscription": r.s, "first_seq": r.seq, "last_seq": r.seq2, "count": r.n,
                "acked_before_by": r.c, "acked_after_by": r.c2}
    if cls == "duplicate":
        return {"queue": r.q, "subscription": r.s, "consumer": r.c, "seq": r.seq, "at": at(r.pos, files),
                "first_at": at(r.pos2, files)}
    if cls == "gap":
        return {"queue": r.q, "subscription": r.s, "consumer": r.c, "first_missing": r.seq, "last_missing": r.seq2,
                "count": r.n, "before_at": at(r.pos, files), "after_at": at(r.pos2, files)}
    if cls in ("out_of_order", "key_order"):
        ex = {"queue": r.q, "subscription": r.s, "consumer": r.c, "seq": r.seq, "seq_at": at(r.pos, files),
              "higher_seq": r.seq2, "higher_seq_at": at(r.pos2, files)}
        if cls == "key_order":
            ex["key"] = r.key
        return ex
    if cls == "redelivered_after_takeover":
        return {"queue": r.q, "subscription": r.s, "seq": r.seq, "instances": r.n + 1,
                "first_consumer": r.c, "last_consumer": r.c2}
    if cls == "crc_conflict_acks":
        return {"queue": r.q, "seq": r.seq, "crc32": r.crc, "at": at(r.pos, files), "other_crc32": r.crc2,
                "other_at": at(r.pos2, files)}
    if cls == "crc_mismatch_delivery":
        return {"queue": r.q, "subscription": r.s, "seq": r.seq, "consumer": r.c, "expected_crc32": r.crc,
                "acked": r.pos is not None, "delivered_crc32": r.crc2, "at": at(r.pos2, files),
                "ack_at": at(r.pos, files)}
    if cls in ("malformed_row", "torn_row"):
        return {"at": at(r.pos, files), "text": r.text}
    from spark_order_check.segments import segment_example

    return segment_example(cls, r)

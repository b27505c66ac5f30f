"""``verify()``: list inputs, run the checks in Spark, collect a bounded report.

Guarantee: ``Report.ok`` is True only when every violation class counts zero; counts are
exact (latency percentiles are approximate beyond 10,000 rows per group, and say so).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TextIO

import attrs
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.common.errors import ConfigError, OrdqError
from ordq.coordinator.topics import topic_of
from ordq.spark_order_check import _checks as C
from ordq.spark_order_check._files import ROW_BITS, AuditFile, list_local, list_remote, partition_paths
from ordq.spark_order_check._scan import (
    ACK,
    BUCKET_BITS,
    DELIVERY,
    MALFORMED,
    TORN,
    local_table,
    scan_acks,
    scan_deliveries,
    scan_skips,
    scan_starts,
)
from ordq.spark_order_check._session import (
    PARTITION_INPUT_BYTES,
    default_partitions,
    make_session,
    running_session,
    scan_settings,
)
from ordq.spark_order_check._ship import StageProgress
from ordq.spark_order_check.report import (
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
LATENCY_METHOD = "exact: nearest rank over the count of every distinct latency value (µs)"


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
    skips: str | Path | Iterable[str | Path] | None = None,
    starts: str | Path | Iterable[str | Path] | None = None,
    keyed: Iterable[str] = (),
    topics: Iterable[str] = (),
    master: str | None = None,
    spark: SparkSession | None = None,
    conf: dict[str, str] | None = None,
    driver_memory: str | None = None,
    report_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    partitions: int | None = None,
    bucket_bits: int = BUCKET_BITS,
    progress: TextIO | None = None,
) -> Report:
    """Verify an ordq run from its audit files (docs/VERIFIER.md).

    Args:
        acks, deliveries: directories, files or glob patterns of ``*.tsv`` / ``*.tsv.part``
            audit files (docs/AUDIT_FORMAT.md); local paths or Hadoop URIs.
        skips: skip records (docs/AUDIT_FORMAT.md, "skips"): a seq a consumer parked with
            its record is ``skipped`` (allowed, reported apart), not ``lost``.
        starts: start records (docs/AUDIT_FORMAT.md, "starts"): a subscription is judged from
            where its first audited consumer instance began; an acked seq at or before that is
            ``before_subscribed`` (allowed, reported apart), not ``lost``.
        segments: broker data directories (``<data>/<queue>/<seg:012d>/segment.log``) to
            check the stored order, replica agreement and that every acked seq is stored.
        keyed: subscriptions consumed with per-key ordering (``SUB`` or ``QUEUE/SUB``): their
            global order is not checked, their per-key order is.
        topics: keyed topics (coordinator/topics.py) whose partitions ``T.p<N>`` are in the
            run: every subscription of a partition is checked as keyed (per-key order), and no
            key may be in two partitions of its topic (``key_partitions``). Lost messages and
            two consumers of one partition at once are checked per partition as for any queue.
        master: Spark master when this call creates the session (default ``local[*]``, or the
            one spark-submit set). Ignored when a session is given or already active.
        spark: an existing session to reuse (default: the active one, if any); a session this
            call did not create is left running.
        report_path, plot_path: also write the JSON report / a latency histogram PNG.
        partitions: shuffle partitions (default: one per ~256 MiB of audit input, a multiple
            of the cores).
        bucket_bits: seqs are windowed in buckets of 2**bucket_bits (docs/VERIFIER.md,
            "Scaling"); results do not depend on it.
        progress: print one line per finished Spark stage here (``_ship.StageProgress``).

    Raises:
        ConfigError: a path does not exist or holds no audit files, or a file name repeats.
        LineOrderUnavailable: Spark did not read each file whole (a broken assumption).
    """
    t0 = time.monotonic()
    ack_paths, del_paths, seg_paths = _paths(acks), _paths(deliveries), _paths(segments)
    skip_paths, start_paths = _paths(skips), _paths(starts)
    if not ack_paths or not del_paths:
        raise ConfigError("give both acks and deliveries audit paths")
    keyed, topics = tuple(keyed), tuple(topics)
    local_only = not any(partition_paths(p)[1] for p in (ack_paths, del_paths, seg_paths, skip_paths, start_paths))
    if local_only:  # report a bad path before paying for a Spark start
        fa, fd = _list(None, ack_paths, "acks"), _list(None, del_paths, "deliveries")
        fs = _list(None, skip_paths, "skips") if skip_paths else []
        fst = _list(None, start_paths, "starts") if start_paths else []
        seg_files = _list_segments_local(seg_paths) if seg_paths else None
    if not 1 <= bucket_bits <= 40:
        raise ConfigError("bucket_bits must be between 1 and 40")
    session = spark or running_session()
    own = session is None  # a session this call creates, it also stops
    if session is None:
        small = local_only and sum(f.size for f in fa + fd) < PARTITION_INPUT_BYTES
        session = make_session(master, conf=conf, driver_memory=driver_memory, small_input=small)
    try:
        if not local_only:
            fa, fd = _list(session, ack_paths, "acks"), _list(session, del_paths, "deliveries")
            fs = _list(session, skip_paths, "skips") if skip_paths else []
            fst = _list(session, start_paths, "starts") if start_paths else []
            seg_files = _list_segments(session, seg_paths) if seg_paths else None
        input_bytes = sum(f.size for f in fa + fd)
        watch = StageProgress(session, progress) if progress is not None else None
        with scan_settings(session, partitions=partitions or default_partitions(session, input_bytes)), \
                watch or nullcontext():
            report, hist = _run(session, fa, fd, fs, fst, seg_files, keyed, bucket_bits, t0, topics, watch)
    finally:
        if own:
            session.stop()
    if report_path is not None:
        Path(report_path).write_text(report.to_json() + "\n")
    if plot_path is not None:
        from ordq.spark_order_check.plot import latency_histogram_png

        latency_histogram_png(hist, Path(plot_path), report)
    return report


def _list_segments_local(paths: Sequence[str]) -> list[Any]:
    from ordq.spark_order_check.segments import list_segment_files

    return list_segment_files(None, paths)


def _list_segments(spark: SparkSession, paths: Sequence[str]) -> list[Any]:
    from ordq.spark_order_check.segments import list_segment_files

    return list_segment_files(spark, paths)


def _run(spark: SparkSession, fa: list[AuditFile], fd: list[AuditFile], fs: list[AuditFile],
         fst: list[AuditFile], seg_files: list[Any] | None, keyed: tuple[str, ...], bucket_bits: int,
         t0: float, topics: tuple[str, ...] = (), watch: StageProgress | None = None,
         ) -> tuple[Report, list[tuple[str, str, int, int]]]:
    files = fa + fd + fs + fst
    mark = [time.monotonic()]

    sc = spark.sparkContext

    def label(name: str | None) -> None:
        # The description of the jobs that follow (Spark's UI and status API); the stage lines.
        sc.setJobDescription(name)  # type: ignore[arg-type]
        if watch is not None:
            watch.phase = name

    def phase(name: str) -> None:
        now = time.monotonic()
        log.info("%s: %.2f s", name, now - mark[0])
        mark[0] = now

    label("1 read, partition, statistics")
    e = scan_acks(spark, fa, 0, bucket_bits, topics).unionByName(
        scan_deliveries(spark, fd, len(fa), keyed, bucket_bits, topics))
    e = C.reuse_shuffle(e.repartition("q", "b"))
    kept: list[DataFrame] = [e]
    try:
        # 1. Statistics, in the first pass over the input (which also keeps it).
        # The statistics are small (files x distinct latencies): one shuffle partition per core
        # instead of one per 64 MiB of input saves a task launch per partition in each of
        # their stages (planned, so the setting is read, inside this block).
        with _shuffle_partitions(spark, int(spark.sparkContext.defaultParallelism)):
            inter = C.checkpoint(C.input_counts(e))
            kept.append(inter)
            stats = C.input_stats(inter).collect()
        phase("read, partition by (queue, bucket), keep; statistics")
        label("2 acks against deliveries, order")
        fstats = [_FileStats.of(r) for r in stats if r.t == "file"]
        _check_row_numbering(fstats, files)
        lat = {(r.q, r.s): Latency(count=int(r.a0), p50_us=r.a1, p95_us=r.a2, p99_us=r.a3, max_us=r.a5, min_us=r.a4,
                                   negative=int(r.a6)) for r in stats if r.t == "lat"}
        hist = sorted((r.q, r.s, int(r.a0), int(r.a1)) for r in stats if r.t == "hist")
        subs = sorted({(r.q, r.s) for r in fstats if r.kind == DELIVERY})
        queues_with_acks = sorted({r.q for r in fstats if r.kind == ACK})
        sub_rows = [(q, s, i == 0 or subs[i - 1][0] != q) for i, (q, s) in enumerate(subs)]
        windowed = _instances_to_window(fstats, keyed, topics)

        # 2. Raw findings: acks against deliveries for every seq; order windows only for the
        #    consumer instances whose files are not one run of consecutive seqs.
        parts = [C.seq_findings(e, local_table(spark, sub_rows, SUBS))]
        multi = _subscriptions_with_overlap(fstats)
        if multi:
            parts.append(C.concurrent_consumer_findings(e.filter(F.col("kind") == DELIVERY).join(
                F.broadcast(local_table(spark, [(q, s, True) for q, s in multi], SUBS)).select("q", "s"),
                ["q", "s"], "left_semi")))
        if windowed:
            d = e.filter(F.col("kind") == DELIVERY).join(
                F.broadcast(local_table(spark, windowed, INSTANCES)), ["q", "s", "c"], "left_semi")
            parts.append(C.instance_findings(d))
            if keyed or topics:
                parts.append(C.key_findings(d))
        if topics:
            parts.append(C.key_partition_findings(e, topics))
        if any(r.early for r in fstats):
            parts.append(C.early_findings(e))
        if any(r.kind in (MALFORMED, TORN) for r in fstats):
            parts.append(C.unreadable_findings(e))
        raw = C.checkpoint(_union(parts))
        kept.append(raw)
        raw_counts = {r.cls: r.n for r in raw.groupBy("cls").agg(F.count(F.lit(1)).alias("n")).collect()}
        phase(f"acks against deliveries; order windows over {len(windowed)} consumer instances")
        label("3 findings, counts")

        # 3. Findings: ranges, boundary pairs, in-flight classification, segments.
        parts = [raw.filter(~F.col("cls").startswith("_"))]
        if raw_counts.get("_extra"):
            parts.append(C.redeliveries(raw, duplicates=bool(raw_counts.get("duplicate"))))
        if raw_counts.get("_bnd") or raw_counts.get("_kbnd"):
            parts.append(C.stitch_boundaries(raw.filter(F.col("cls").isin("_bnd", "_kbnd"))))
        lost_unacked = raw.filter(F.col("cls").isin("_lost", "_unacked"))
        if fs:  # a seq parked with its skip record is skipped, not lost
            parked, skip_rows = C.skip_findings(scan_skips(spark, fs, len(fa) + len(fd), bucket_bits))
            parts.append(skip_rows)
            lost_unacked = lost_unacked.join(parked.withColumn("cls", F.lit("_lost")), ["cls", "q", "s", "seq"],
                                             "left_anti")
        if fst:  # at or before where the subscription's first audited consumer began: not its to deliver here
            begun, start_rows = C.start_findings(scan_starts(spark, fst, len(fa) + len(fd) + len(fs)))
            parts.append(start_rows)
            before = (F.col("cls") == "_lost") & (F.col("seq") <= F.col("after_seq"))
            lost_unacked = lost_unacked.join(F.broadcast(begun), ["q", "s"], "left").withColumn(
                "cls", F.when(before, F.lit("_before")).otherwise(F.col("cls"))).drop("after_seq")
        if raw_counts.get("_lost") or raw_counts.get("_unacked"):
            # Kept: the in-flight classification reads the ranges twice (a count, then the join).
            rng = C.checkpoint(C.ranges(lost_unacked))
            kept.append(rng)
            for cls, name in (("_lost", "lost"), ("_before", "before_subscribed")):
                parts.append(rng.filter(F.col("cls") == cls).select(
                    C.finding(name, q=F.col("q"), s=F.col("s"), seq=F.col("seq"), seq2=F.col("seq2"),
                              n=F.col("n")).alias("f")).select("f.*"))
            if raw_counts.get("_unacked"):
                parts.append(C.classify_unacked(
                    e, inter, rng.filter(F.col("cls") == "_unacked"), queues_with_acks,
                    broadcast_keys=raw_counts["_unacked"] <= BROADCAST_KEYS_MAX, bucket_bits=bucket_bits))
        segment_stats = None
        if seg_files is not None:
            from ordq.spark_order_check.segments import segment_findings

            seg_df, segment_stats = segment_findings(spark, seg_files, e, bucket_bits, kept)
            parts.append(seg_df)
        allf = C.checkpoint(_union(parts))
        kept.append(allf)
        counts_df = allf.groupBy("cls", "q", "s").agg(F.sum("n").alias("n"), F.count(F.lit(1)).alias("rows"))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("plan of the counts:\n%s", counts_df._jdf.queryExecution().executedPlan().toString())
        counts = counts_df.collect()
        phase("findings, counts")
        label("4 examples")
        order = [F.col(c).asc_nulls_first() for c in ("q", "s", "seq", "c", "key", "pos", "seq2")]
        rn = F.row_number().over(Window.partitionBy("cls").orderBy(*order))
        examples = allf.withColumn("rn", rn).filter(F.col("rn") <= EXAMPLES).collect()
        details = _details(spark, e, examples, bucket_bits)
        names_by_hash = _consumer_hashes(spark, sorted({r.c for r in fstats if r.kind == DELIVERY and r.c}))
        phase("examples")
    finally:
        label(None)
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
            examples=tuple(_example(meta.name, r, files, details, names_by_hash) for r in ex_cls.get(meta.name, [])),
        ))
    queues, subscriptions, instances, inputs = _stats(fstats, fa, fd, lat)
    notes = []
    if segment_stats is not None:
        inputs = attrs.evolve(inputs, segment_files=segment_stats[0], stored_messages=segment_stats[1])
        if segment_stats[2]:
            notes.append(f"{segment_stats[2]} acked seqs were placed in segments below the lowest stored one "
                         "(popped): not checked against the segments")
    ok = not any(r.violation and r.count for r in results)
    if not any(q.ack_rows for q in queues):
        notes.append("no ack rows: every delivered seq counts as unacked")
    report = Report(
        ok=ok, classes=tuple(results), inputs=inputs, queues=queues, subscriptions=subscriptions,
        instances=instances, latency_method=LATENCY_METHOD, seconds=time.monotonic() - t0, keyed=keyed, topics=topics,
        notes=tuple(notes), histogram=tuple(hist),
    )
    return report, list(report.histogram)


@contextmanager
def _shuffle_partitions(spark: SparkSession, n: int) -> Iterator[None]:
    key = "spark.sql.shuffle.partitions"
    saved = spark.conf.get(key, None)
    spark.conf.set(key, str(n))
    try:
        yield
    finally:
        if saved is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, saved)


def _union(parts: list[DataFrame]) -> DataFrame:
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


@attrs.frozen
class _FileStats:
    fid: int
    kind: int
    q: Any  # str, but None on unreadable rows
    s: Any
    c: Any
    rows: int
    min_row: int
    max_row: int
    min_seq: int | None
    max_seq: int | None
    min_d: int | None
    max_d: int | None
    min_t: int | None  # deliver_us, deliveries only
    max_t: int | None
    early: int = 0  # deliveries handed out before their due time

    @classmethod
    def of(cls, r: Any) -> _FileStats:
        return cls(int(r.fid), int(r.kind), r.q, r.s, r.c, int(r.a0), int(r.a1), int(r.a2), r.a3, r.a4, r.a5, r.a6,
                   r.a7, r.a8, int(r.a9 or 0))

    @property
    def one_run(self) -> bool:
        """Rows numbered without holes whose seqs go up by one per row."""
        return self.min_d == self.max_d and self.max_row - self.min_row + 1 == self.rows


def _subscriptions_with_overlap(fstats: list[_FileStats]) -> list[tuple[str, str]]:
    """(queue, subscription) where two consumer instances may have been active at once: an
    instance A delivered after another instance B's first delivery while B started no earlier
    than A (first_A <= first_B < last_A, from each instance's first and last ``deliver_us``).

    Only there can ``concurrent_consumers`` find anything: instances ordered by their first
    delivery, a finding is a delivery of A later than the next instance's first one. Ties on
    the first time are ordered by position in that check; this test takes both orders. On a
    clean run no subscription qualifies and the deliveries are not read again."""
    span: dict[tuple[str, str, str], list[int]] = {}
    for r in fstats:
        if r.kind == DELIVERY and r.c and r.min_t is not None and r.max_t is not None:
            one = span.setdefault((r.q, r.s, r.c), [r.min_t, r.max_t])
            one[0], one[1] = min(one[0], r.min_t), max(one[1], r.max_t)
    by_sub: dict[tuple[str, str], list[list[int]]] = defaultdict(list)
    for (q, s, _c), one in span.items():
        by_sub[(q, s)].append(one)
    out = []
    for key, spans in sorted(by_sub.items()):
        if any(a is not b and a[0] <= b[0] < a[1] for a in spans for b in spans):
            out.append(key)
    return out


def is_keyed(keyed: Sequence[str], q: str | None, s: str | None, topics: Sequence[str] = ()) -> bool:
    return s in keyed or f"{q}/{s}" in keyed or (q is not None and topic_of(q) in topics)


def _instances_to_window(fstats: list[_FileStats], keyed: Sequence[str],
                         topics: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """Consumer instances whose order must be checked row by row: every instance of a keyed
    subscription, and every other one whose files, in order, are not one run of consecutive
    seqs (each file one run, each file starting right after the previous one ended). The
    others cannot hold a duplicate, a gap or an out-of-order delivery."""
    by_inst: dict[tuple[str, str, str], list[_FileStats]] = defaultdict(list)
    for f in fstats:
        if f.kind == DELIVERY and f.q is not None and f.s is not None and f.c is not None:
            by_inst[(f.q, f.s, f.c)].append(f)
    out = []
    for (q, s, c), fs in sorted(by_inst.items()):
        fs.sort(key=lambda f: f.fid)
        chained = all(b.min_seq == a.max_seq + 1 for a, b in zip(fs, fs[1:], strict=False)  # type: ignore[operator]
                      ) and len({f.fid for f in fs}) == len(fs)
        if is_keyed(keyed, q, s, topics) or not chained or not all(f.one_run for f in fs):
            out.append((q, s, c))
    return out


INSTANCES = T.StructType([
    T.StructField("q", T.StringType()), T.StructField("s", T.StringType()), T.StructField("c", T.StringType()),
])
_DETAILED = ("crc_conflict_acks", "crc_mismatch_delivery")


def _details(spark: SparkSession, e: DataFrame, examples: list[Any],
             bucket_bits: int) -> dict[tuple[str, int], list[Any]]:
    """Ack and delivery rows of the seqs of examples that show positions or consumers."""
    keys = sorted({(r.q, r.seq) for r in examples if r.cls in _DETAILED})
    if not keys:
        return {}
    table = local_table(spark, [(q, seq >> bucket_bits, seq) for q, seq in keys], KEYS)
    out: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for r in C.example_rows(e, table).collect():
        out[(r.q, r.seq)].append(r)
    return out


def _consumer_hashes(spark: SparkSession, names: list[str]) -> dict[int, str]:
    """Spark's xxhash64 of each consumer name (the per-seq aggregation keeps hashes)."""
    if not names:
        return {}
    table = local_table(spark, [(n,) for n in names], T.StructType([T.StructField("c", T.StringType())]))
    return {int(r.h): r.c for r in table.select("c", F.xxhash64("c").alias("h")).collect()}


KEYS = T.StructType([
    T.StructField("q", T.StringType()), T.StructField("b", T.LongType()), T.StructField("seq", T.LongType()),
])


def _check_row_numbering(fstats: list[Any], files: list[AuditFile]) -> None:
    per_file: dict[int, list[int]] = defaultdict(lambda: [0, 1 << 62, -1])
    for r in fstats:
        agg = per_file[int(r.fid)]
        agg[0] += int(r.rows)
        agg[1] = min(agg[1], int(r.min_row))
        agg[2] = max(agg[2], int(r.max_row))
    for fid, (rows, lo, hi) in per_file.items():
        if lo != 0 or hi != rows - 1:
            raise LineOrderUnavailable(
                f"Spark did not read {files[fid].path} whole in one task (rows {rows}, numbered {lo}..{hi}); "
                "line order cannot be established")


def _stats(fstats: list[_FileStats], fa: list[AuditFile], fd: list[AuditFile],
           lat: dict[tuple[str, str], Latency]) -> tuple[Any, Any, Any, Inputs]:
    queues: dict[str, dict[str, Any]] = {}
    inst: dict[tuple[str, str, str], dict[str, Any]] = {}
    rows_by_kind: dict[int, int] = defaultdict(int)
    files_of: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for r in fstats:
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


def _example(cls: str, r: Any, files: list[AuditFile], details: dict[tuple[str, int], list[Any]],
             names_by_hash: dict[int, str]) -> dict[str, Any]:
    at = _at
    if cls in ("lost", "before_subscribed"):
        return {"queue": r.q, "subscription": r.s, "first_seq": r.seq, "last_seq": r.seq2, "count": r.n}
    if cls == "skipped":
        return {"queue": r.q, "subscription": r.s, "seq": r.seq}
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
    if cls in _DETAILED:
        return _detailed_example(cls, r, files, details.get((r.q, r.seq), []))
    if cls == "redelivered_after_takeover":
        names = sorted({names_by_hash.get(h, f"#{h}") for h in (r.pos, r.pos2)})
        return {"queue": r.q, "subscription": r.s, "seq": r.seq, "instances": r.n + 1, "consumers": names}
    if cls == "concurrent_consumers":
        return {"queue": r.q, "subscription": r.s, "consumer": r.c, "deliveries_after": r.n,
                "first_seq_after": r.seq, "at": at(r.pos, files), "successor": r.c2, "successor_first_seq": r.seq2,
                "successor_first_at": at(r.pos2, files), "overlap_us": r.crc}
    if cls == "key_partitions":
        return {"topic": r.text, "key": r.key, "partition": r.q, "seq": r.seq, "at": at(r.pos, files),
                "other_partition": r.c2, "other_seq": r.seq2, "other_at": at(r.pos2, files)}
    if cls in ("malformed_row", "torn_row"):
        return {"at": at(r.pos, files), "text": r.text}
    if cls == "delivered_early":
        return {"queue": r.q, "subscription": r.s, "consumer": r.c, "seq": r.seq, "at": at(r.pos, files),
                "early_us": r.crc}
    from ordq.spark_order_check.segments import segment_example

    return segment_example(cls, r)


def _detailed_example(cls: str, r: Any, files: list[AuditFile], rows: list[Any]) -> dict[str, Any]:
    """Positions and consumers of an example, from the rows of its seq (first position wins)."""
    acks = sorted((x for x in rows if x.kind == ACK), key=lambda x: x.pos)
    dels = sorted((x for x in rows if x.kind == DELIVERY and x.s == r.s), key=lambda x: (x.c, x.pos))
    if cls == "crc_conflict_acks":
        lo = min(acks, key=lambda x: (x.crc, x.pos))
        hi = min(acks, key=lambda x: (-x.crc, x.pos))
        return {"queue": r.q, "seq": r.seq, "crc32": lo.crc, "at": _at(lo.pos, files), "other_crc32": hi.crc,
                "other_at": _at(hi.pos, files)}
    if cls == "crc_mismatch_delivery":
        bad = [x for x in dels if x.crc != r.crc]
        ack = next((x for x in acks if x.crc == r.crc), None) if r.flag else None
        first = bad[0] if bad else None
        return {"queue": r.q, "subscription": r.s, "seq": r.seq, "consumer": first.c if first else None,
                "expected_crc32": r.crc, "acked": bool(r.flag), "delivered_crc32": r.crc2,
                "at": _at(first.pos if first else None, files), "ack_at": _at(ack.pos if ack else None, files)}
    raise AssertionError(cls)

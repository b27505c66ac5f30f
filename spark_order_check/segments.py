"""Checks over broker segment files: stored order, replica agreement, every acked seq stored.

Segment files (``<data>/<queue>/<seg:012d>/segment.log``, one data directory per broker
process) are parsed inside Spark tasks, one task per file, with ``ordq.broker_group.log``'s own
reader (``iter_file_batches``: streaming, CRC-checked, stops at a torn tail, raises
``CorruptLog`` on a bad batch before the tail). There is one parser of the log format in the
project; this module only turns its output into rows.

Rules (docs/VERIFIER.md, "Segments"):

- ``stored_order``: inside one copy of a segment, each batch's first seq continues the
  previous batch (seqs are consecutive by offset). Checked while the file is read.
- ``stored_gap``: over a queue's segments in seg order (all replicas together), a segment's
  lowest seq is at most one above the highest seq stored in the segments before it (resent
  seqs, at or below that highest seq, are dropped); the first stored segment is not judged
  (older ones may have been popped).
- ``crc_conflict_replicas``: all stored copies of one seq (the two replicas of a segment, and
  a resend in a later segment) carry one payload CRC.
- ``crc_mismatch_stored``: the stored CRC equals the acked CRC (when each side agrees).
- ``acked_not_stored``: every acked seq is in some stored segment, unless the ack placed it in
  a segment below the queue's lowest stored segment (popped: reported in the notes).
- ``unreadable_segment``: a file that cannot be read or has a bad batch before its tail.

The files must be readable at the same path by every Spark task (local mode, or a file system
shared by the cluster) and ``broker_group`` must be importable on the workers.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from ordq.common.errors import ConfigError
from ordq.spark_order_check._files import is_remote

SEGMENT_FILE = "segment.log"


@attrs.frozen
class SegmentFile:
    replica: str  # the broker data directory
    queue: str
    seg: int
    path: str


def list_segment_files(spark: Any, paths: Sequence[str]) -> list[SegmentFile]:
    """Every ``<data>/<queue>/<seg:012d>/segment.log`` under the given directories (any depth)."""
    del spark  # local and shared file systems only, see the module docstring
    found: dict[str, SegmentFile] = {}
    for given in paths:
        if is_remote(given):
            raise ConfigError(f"--segments wants a directory every Spark worker can read, not {given}")
        root = given[len("file:"):] if given.startswith("file:") else given
        if not os.path.isdir(root):
            raise ConfigError(f"segments directory does not exist: {given}")
        before = len(found)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            name = os.path.basename(dirpath)
            if SEGMENT_FILE in filenames and len(name) == 12 and name.isdigit():
                queue_dir = os.path.dirname(dirpath)
                full = os.path.abspath(os.path.join(dirpath, SEGMENT_FILE))
                found[full] = SegmentFile(os.path.abspath(os.path.dirname(queue_dir)),
                                          os.path.basename(queue_dir), int(name), full)
        if len(found) == before:
            raise ConfigError(f"no segment files (<queue>/<seg:012d>/segment.log) under {given}")
    return sorted(found.values(), key=lambda f: (f.queue, f.seg, f.replica))


def parse_segment(item: tuple[str, str]) -> Iterator[tuple[Any, ...]]:
    """Rows of one segment file (runs in a Spark task): ("msg", replica, queue, seg, offset,
    seq, crc32, None) per message; ("order", ..., offset, seq, expected_seq, None) where a
    batch does not continue the previous one; ("unreadable", ..., text) if it cannot be read."""
    from ordq.broker_group.log import parse_segment_path
    from ordq.broker_group.segment_scan import iter_file_batches
    from ordq.common.errors import CorruptLog

    replica, path = item
    queue, seg = parse_segment_path(path)
    expected: int | None = None
    try:
        for header, messages in iter_file_batches(path):
            if expected is not None and header.first_seq != expected:
                yield ("order", replica, queue, seg, header.first_offset, header.first_seq, expected, None)
            for i, m in enumerate(messages):
                yield ("msg", replica, queue, seg, header.first_offset + i, header.first_seq + i,
                       zlib.crc32(m.payload), None)
            expected = header.first_seq + header.count
    except (CorruptLog, OSError) as exc:
        yield ("unreadable", replica, queue, seg, None, None, None, str(exc)[:300])


def segment_findings(spark: Any, files: Sequence[SegmentFile], e: Any, bucket_bits: int,
                     kept: list[Any]) -> tuple[Any, tuple[int, int, int]]:
    """Findings over the stored segments (FINDINGS layout) and (segment files, stored
    messages, acked seqs not checkable because their segment was popped)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ordq.spark_order_check import _checks as C
    from ordq.spark_order_check._scan import ACK

    schema = T.StructType([
        T.StructField("t", T.StringType()), T.StructField("replica", T.StringType()),
        T.StructField("q", T.StringType()), T.StructField("seg", T.LongType()),
        T.StructField("off", T.LongType()), T.StructField("seq", T.LongType()),
        T.StructField("crc", T.LongType()), T.StructField("text", T.StringType()),
    ])
    rdd = spark.sparkContext.parallelize([(f.replica, f.path) for f in files], max(1, len(files)))
    # e is partitioned by (q, b) into the session's shuffle partitions: match it for the joins.
    raw = spark.createDataFrame(rdd.flatMap(parse_segment), schema)
    raw = C.checkpoint(raw.withColumn("b", F.shiftright(F.col("seq"), bucket_bits)).repartition("q", "b"))
    kept.append(raw)
    msgs = raw.filter(F.col("t") == "msg")
    where = F.concat_ws(":", F.col("replica"), F.col("seg").cast("string"), F.col("off").cast("string"))

    per_seg = msgs.groupBy("q", "seg").agg(F.min("seq").alias("lo"), F.max("seq").alias("hi"))
    w = Window.partitionBy("q").orderBy("seg").rowsBetween(Window.unboundedPreceding, -1)
    gaps = per_seg.withColumn("prev_hi", F.max("hi").over(w)).filter(F.col("lo") > F.col("prev_hi") + 1)
    stored_gap = gaps.select(C.finding("stored_gap", q=F.col("q"), seq=F.col("prev_hi") + 1, seq2=F.col("lo") - 1,
                                       n=F.col("lo") - F.col("prev_hi") - 1, pos=F.col("seg")).alias("f"))

    order = raw.filter(F.col("t") == "order").select(C.finding(
        "stored_order", q=F.col("q"), seq=F.col("seq"), seq2=F.col("crc"), n=1, c=F.col("replica"),
        pos=F.col("seg"), pos2=F.col("off")).alias("f"))
    unreadable = raw.filter(F.col("t") == "unreadable").select(C.finding(
        "unreadable_segment", q=F.col("q"), n=1, c=F.col("replica"), pos=F.col("seg"), text=F.col("text")
    ).alias("f"))

    stored = msgs.groupBy("q", "b", "seq").agg(
        F.min(F.struct(F.col("crc"), where.alias("w"))).alias("lo"),
        F.min(F.struct((-F.col("crc")).alias("ncrc"), where.alias("w"))).alias("hi"),
    ).select("q", "b", "seq", F.col("lo.crc").alias("scrc1"), (-F.col("hi.ncrc")).alias("scrc2"),
             F.col("lo.w").alias("at1"), F.col("hi.w").alias("at2"))
    acks = e.filter(F.col("kind") == ACK).groupBy("q", "b", "seq").agg(
        F.min("crc").alias("acrc1"), F.max("crc").alias("acrc2"), F.max("seg").alias("aseg"),
        F.min("pos").alias("apos"))
    lowest = per_seg.groupBy("q").agg(F.min("seg").alias("lowest_seg"))
    j = acks.join(stored, ["q", "b", "seq"], "full").join(F.broadcast(lowest), "q", "left")
    acked_one = F.col("acrc1").isNotNull() & (F.col("acrc1") == F.col("acrc2"))
    stored_one = F.col("scrc1").isNotNull() & (F.col("scrc1") == F.col("scrc2"))
    checkable = F.col("lowest_seg").isNotNull() & (F.col("aseg") >= F.col("lowest_seg"))
    common = {"q": F.col("q"), "b": F.col("b"), "seq": F.col("seq"), "n": 1}
    per_seq = C.explode_findings(j, [
        C.when_finding(F.col("scrc1") != F.col("scrc2"), "crc_conflict_replicas", **common, crc=F.col("scrc1"),
                       crc2=F.col("scrc2"), c=F.col("at1"), c2=F.col("at2")),
        C.when_finding(acked_one & stored_one & (F.col("acrc1") != F.col("scrc1")), "crc_mismatch_stored",
                       **common, crc=F.col("acrc1"), crc2=F.col("scrc1"), c=F.col("at1"), pos=F.col("apos")),
        C.when_finding(F.col("acrc1").isNotNull() & F.col("scrc1").isNull() & checkable, "_notstored", **common),
        C.when_finding(F.col("acrc1").isNotNull() & F.col("scrc1").isNull() & ~checkable, "_popped", **common),
    ])
    per_seq = C.checkpoint(per_seq)
    kept.append(per_seq)
    kinds = {r.cls: int(r.n) for r in per_seq.groupBy("cls").agg(F.count(F.lit(1)).alias("n")).collect()}
    not_stored = C.ranges(per_seq.filter(F.col("cls") == "_notstored").withColumn("s", F.lit(None).cast("string")))
    not_stored = not_stored.select(C.finding("acked_not_stored", q=F.col("q"), seq=F.col("seq"), seq2=F.col("seq2"),
                                             n=F.col("n")).alias("f")).select("f.*")
    counts = msgs.agg(F.count(F.lit(1)).alias("n")).collect()
    out = (stored_gap.select("f.*").unionByName(order.select("f.*")).unionByName(unreadable.select("f.*"))
           .unionByName(per_seq.filter(~F.col("cls").startswith("_"))).unionByName(not_stored))
    return out, (len(files), int(counts[0].n) if counts else 0, kinds.get("_popped", 0))


def segment_example(cls: str, r: Any) -> dict[str, Any]:
    if cls == "stored_gap":
        return {"queue": r.q, "first_missing": r.seq, "last_missing": r.seq2, "count": r.n, "seg": r.pos}
    if cls == "stored_order":
        return {"queue": r.q, "replica": r.c, "seg": r.pos, "offset": r.pos2, "seq": r.seq, "expected_seq": r.seq2}
    if cls == "crc_conflict_replicas":
        return {"queue": r.q, "seq": r.seq, "crc32": r.crc, "at": r.c, "other_crc32": r.crc2, "other_at": r.c2}
    if cls == "crc_mismatch_stored":
        return {"queue": r.q, "seq": r.seq, "acked_crc32": r.crc, "stored_crc32": r.crc2, "stored_at": r.c}
    if cls == "acked_not_stored":
        return {"queue": r.q, "first_seq": r.seq, "last_seq": r.seq2, "count": r.n}
    if cls == "unreadable_segment":
        return {"queue": r.q, "replica": r.c, "seg": r.pos, "error": r.text}
    raise AssertionError(f"no example layout for {cls}")

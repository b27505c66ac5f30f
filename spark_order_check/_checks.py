"""The checks, as Spark plans over ``E`` (one row per ack / delivery / unreadable line).

Rules: no function here collects more than a bounded summary to the driver (per-class counts
per subscription, at most ``EXAMPLES`` rows per class, per-file and per-writer statistics,
the list of subscriptions). Everything proportional to the data or to the number of anomalies
stays in Spark.

How it scales: ``E`` is hash-partitioned once by (queue, seq bucket), ``bucket = seq >> 16``,
and kept (``persist``). Every seq-ordered window is partitioned by the bucket too, so no window
holds more than one bucket of one stream, however long a consumer instance ran; the first and
last element of each (stream, bucket) are "boundary" rows, and a second, small window over the
boundary rows checks the pairs that straddle two buckets. Joins between acks and deliveries
are on (queue, bucket, subscription, seq) over that same partitioning, so they need no shuffle.
Windows emit all their findings in one pass (an array of optional findings per row, exploded),
so no window is computed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_order_check._files import ROW_BITS
from spark_order_check._scan import ACK, DELIVERY, MALFORMED, TORN
from spark_order_check.report import HIST_BINS_PER_DECADE, NONPOSITIVE_BIN

EXAMPLES = 20
PERCENTILE_ACCURACY = 10_000

# Boundary flags (``flag`` column of ``_bnd`` rows).
FIRST, LAST, KEYED = 1, 2, 4

FINDINGS = T.StructType([
    T.StructField("cls", T.StringType()),
    T.StructField("q", T.StringType()),
    T.StructField("s", T.StringType()),
    T.StructField("c", T.StringType()),
    T.StructField("key", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("seq2", T.LongType()),
    T.StructField("n", T.LongType()),
    T.StructField("pos", T.LongType()),
    T.StructField("pos2", T.LongType()),
    T.StructField("crc", T.LongType()),
    T.StructField("crc2", T.LongType()),
    T.StructField("c2", T.StringType()),
    T.StructField("text", T.StringType()),
    T.StructField("b", T.LongType()),
    T.StructField("flag", T.IntegerType()),
])
_NAMES = [f.name for f in FINDINGS.fields]


def finding(cls: str | Column, **cols: Any) -> Column:
    """A struct in the FINDINGS layout; unnamed fields are null."""
    unknown = set(cols) - set(_NAMES)
    if unknown:
        raise ValueError(f"unknown finding fields {sorted(unknown)}")
    parts = []
    for f in FINDINGS.fields:
        if f.name == "cls":
            value = F.lit(cls) if isinstance(cls, str) else cls
        else:
            raw = cols.get(f.name)
            value = F.lit(None) if raw is None else (raw if isinstance(raw, Column) else F.lit(raw))
        parts.append(value.cast(f.dataType).alias(f.name))
    return F.struct(*parts)


def when_finding(cond: Column, cls: str | Column, **cols: Any) -> Column:
    return F.when(cond, finding(cls, **cols))


def explode_findings(df: DataFrame, candidates: Sequence[Column]) -> DataFrame:
    """One output row per non-null candidate finding of each input row (a single pass)."""
    return df.select(F.explode(F.array_compact(F.array(*candidates))).alias("f")).select("f.*")


# -- per consumer instance: duplicates, gaps, order ----------------------------------------


def _ordered_stream(rows: DataFrame, stream: Sequence[str]) -> DataFrame:
    """Annotate rows of each (stream, bucket), in (seq, pos) order, with:

    dup   -- same seq as the row before (an extra delivery of a seq this stream already had);
    pseq  -- the previous *distinct* seq of the stream in this bucket (null for the first);
    ppos  -- the position of the first delivery of that previous seq;
    fpos  -- the position of the first delivery of this row's seq;
    last  -- this is the last row of the bucket.
    """
    w = Window.partitionBy(*stream, "b").orderBy("seq", "pos")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    x = rows.withColumn("dup", F.coalesce(F.col("seq") == F.lag("seq").over(w), F.lit(False)))
    first = F.when(~F.col("dup"), F.col("seq"))
    first_pos = F.when(~F.col("dup"), F.col("pos"))
    return x.select(
        "*",
        F.last(first, ignorenulls=True).over(before).alias("pseq"),
        F.last(first_pos, ignorenulls=True).over(before).alias("ppos"),
        F.last(first_pos, ignorenulls=True).over(upto).alias("fpos"),
        F.lead("seq").over(w).isNull().alias("last"),
    )


def instance_findings(deliveries: DataFrame) -> DataFrame:
    """duplicate, gap, out_of_order (non-keyed subscriptions) and boundary rows per consumer
    instance (queue, subscription, consumer)."""
    stream = ["q", "s", "c"]
    x = _ordered_stream(deliveries.select("q", "b", "s", "c", "seq", "pos", "key"), stream)
    dup, seq, pos, pseq, ppos = (F.col(n) for n in ("dup", "seq", "pos", "pseq", "ppos"))
    keyed = F.col("key").isNotNull()
    flag = (F.when(~dup & pseq.isNull(), FIRST).otherwise(0) + F.when(F.col("last"), LAST).otherwise(0)
            + F.when(keyed, KEYED).otherwise(0))
    common = {"q": F.col("q"), "s": F.col("s"), "c": F.col("c")}
    return explode_findings(x, [
        when_finding(dup, "duplicate", **common, seq=seq, n=1, pos=pos, pos2=ppos),
        when_finding(~dup & (seq > pseq + 1), "gap", **common, seq=pseq + 1, seq2=seq - 1, n=seq - pseq - 1,
                     pos=ppos, pos2=pos),
        when_finding(~dup & ~keyed & (pos < ppos), "out_of_order", **common, seq=pseq, seq2=seq, n=1, pos=ppos,
                     pos2=pos),
        # Boundary rows carry the first-delivery position of their seq (a trailing duplicate
        # must not stand for its seq when the next bucket's first seq is compared with it).
        when_finding(flag.bitwiseAND(FIRST | LAST) != 0, "_bnd", **common, seq=seq, pos=F.col("fpos"),
                     b=F.col("b"), flag=flag),
    ])


def key_findings(deliveries: DataFrame) -> DataFrame:
    """key_order violations and boundary rows per (consumer instance, key) of keyed subscriptions."""
    rows = deliveries.filter(F.col("key").isNotNull() & (F.col("key") != ""))
    stream = ["q", "s", "c", "key"]
    x = _ordered_stream(rows.select("q", "b", "s", "c", "key", "seq", "pos"), stream)
    dup, seq, pos, pseq, ppos = (F.col(n) for n in ("dup", "seq", "pos", "pseq", "ppos"))
    flag = F.when(~dup & pseq.isNull(), FIRST).otherwise(0) + F.when(F.col("last"), LAST).otherwise(0)
    common = {"q": F.col("q"), "s": F.col("s"), "c": F.col("c"), "key": F.col("key")}
    return explode_findings(x, [
        when_finding(~dup & (pos < ppos), "key_order", **common, seq=pseq, seq2=seq, n=1, pos=ppos, pos2=pos),
        when_finding(flag != 0, "_kbnd", **common, seq=seq, pos=F.col("fpos"), b=F.col("b"), flag=flag),
    ])


def stitch_boundaries(bnd: DataFrame) -> DataFrame:
    """The pairs that straddle two buckets: each bucket's first distinct seq against the last
    one of the nearest earlier bucket of the same stream. ``bnd`` holds ``_bnd``/``_kbnd`` rows."""
    # A bucket whose only seq was delivered twice has a FIRST and a LAST row with the same
    # (seq, pos): FIRST must sort first so that its predecessor is the earlier bucket's LAST.
    w = Window.partitionBy("cls", "q", "s", "c", "key").orderBy("seq", "pos", F.col("flag").bitwiseAND(LAST))
    x = bnd.select("*", F.lag("seq").over(w).alias("pseq"), F.lag("pos").over(w).alias("ppos"))
    seq, pos, pseq, ppos, flag = (F.col(n) for n in ("seq", "pos", "pseq", "ppos", "flag"))
    first = (flag.bitwiseAND(FIRST) != 0) & pseq.isNotNull()
    inst = F.col("cls") == "_bnd"
    common = {"q": F.col("q"), "s": F.col("s"), "c": F.col("c")}
    return explode_findings(x, [
        when_finding(first & inst & (seq > pseq + 1), "gap", **common, seq=pseq + 1, seq2=seq - 1,
                     n=seq - pseq - 1, pos=ppos, pos2=pos),
        when_finding(first & inst & (flag.bitwiseAND(KEYED) == 0) & (pos < ppos), "out_of_order", **common,
                     seq=pseq, seq2=seq, n=1, pos=ppos, pos2=pos),
        when_finding(first & ~inst & (pos < ppos), "key_order", **common, key=F.col("key"), seq=pseq, seq2=seq,
                     n=1, pos=ppos, pos2=pos),
    ])


# -- per seq: acks against deliveries -------------------------------------------------------


def seq_findings(e: DataFrame, subs: DataFrame) -> DataFrame:
    """Per (queue, subscription, seq): ``_lost`` / ``_unacked`` seqs (grouped into ranges later),
    redelivered_after_takeover, crc_conflict_acks, crc_mismatch_delivery.

    ``subs`` is (q, s, first): every subscription seen in deliveries, ``first`` marking one
    per queue (so a queue-level finding is reported once).
    """
    acks = e.filter(F.col("kind") == ACK)
    # Examples point at the first row (lowest position) holding the lowest / highest CRC:
    # min over (crc, pos) and over (-crc, pos) make the choice deterministic under ties.
    ga = acks.groupBy("q", "b", "seq").agg(
        F.count(F.lit(1)).alias("na"),
        F.min(F.struct("crc", "pos")).alias("alo"), F.min(F.struct((-F.col("crc")).alias("ncrc"), "pos")).alias("ahi"),
    ).select("q", "b", "seq", "na", F.col("alo.crc").alias("acrc1"), (-F.col("ahi.ncrc")).alias("acrc2"),
             F.col("alo.pos").alias("apos1"), F.col("ahi.pos").alias("apos2"))
    dels = e.filter(F.col("kind") == DELIVERY)
    per_instance = dels.groupBy("q", "b", "s", "seq", "c").agg(
        F.count(F.lit(1)).alias("n"),
        F.min(F.struct("crc", "c", "pos")).alias("lo"),
        F.min(F.struct((-F.col("crc")).alias("ncrc"), "c", "pos")).alias("hi"),
    )
    gd = per_instance.groupBy("q", "b", "s", "seq").agg(
        F.count(F.lit(1)).alias("ninst"), F.sum("n").alias("nd"),
        F.min("lo").alias("at1"), F.min("hi").alias("at2"),
        F.min("c").alias("c1"), F.max("c").alias("c2"),
    ).withColumn("dcrc1", F.col("at1.crc")).withColumn("dcrc2", -F.col("at2.ncrc"))
    left = ga.join(F.broadcast(subs), "q", "left")
    j = left.join(gd, ["q", "b", "s", "seq"], "full")
    na, nd, seq = F.col("na"), F.col("nd"), F.col("seq")
    acrc1, acrc2, dcrc1, dcrc2 = (F.col(n) for n in ("acrc1", "acrc2", "dcrc1", "dcrc2"))
    acked_one_crc = na.isNotNull() & (acrc1 == acrc2)
    ref = F.when(acked_one_crc, acrc1).otherwise(dcrc1)
    bad_is_low = dcrc1 != ref
    mismatch = nd.isNotNull() & ((acked_one_crc & ((dcrc1 != acrc1) | (dcrc2 != acrc1)))
                                 | (na.isNull() & (dcrc1 != dcrc2)))
    common = {"q": F.col("q"), "s": F.col("s"), "b": F.col("b"), "seq": seq}
    return explode_findings(j, [
        when_finding(na.isNotNull() & nd.isNull(), "_lost", **common, n=1),
        when_finding(na.isNull() & nd.isNotNull(), "_unacked", **common, n=1),
        when_finding(F.col("ninst") > 1, "redelivered_after_takeover", **common, n=F.col("ninst") - 1,
                     c=F.col("c1"), c2=F.col("c2")),
        when_finding(na.isNotNull() & (acrc1 != acrc2) & F.coalesce(F.col("first"), F.lit(True)),
                     "crc_conflict_acks", q=F.col("q"), b=F.col("b"), seq=seq, n=1, crc=acrc1, crc2=acrc2,
                     pos=F.col("apos1"), pos2=F.col("apos2")),
        when_finding(mismatch, "crc_mismatch_delivery", **common, n=1, crc=ref,
                     crc2=F.when(bad_is_low, dcrc1).otherwise(dcrc2),
                     c=F.when(bad_is_low, F.col("at1.c")).otherwise(F.col("at2.c")),
                     pos2=F.when(bad_is_low, F.col("at1.pos")).otherwise(F.col("at2.pos")),
                     pos=F.when(acked_one_crc, F.col("apos1"))),
    ])


def ranges(rows: DataFrame) -> DataFrame:
    """Group single-seq rows (cls, q, s, b, seq) into maximal ranges of consecutive seqs:
    (cls, q, s, seq = first, seq2 = last, n = count). Scales like the data: islands are found
    per bucket first, then the few that touch a bucket edge are merged."""
    w = Window.partitionBy("cls", "q", "s", "b").orderBy("seq")
    per_bucket = (
        rows.withColumn("g", F.col("seq") - F.row_number().over(w))
        .groupBy("cls", "q", "s", "b", "g")
        .agg(F.min("seq").alias("lo"), F.max("seq").alias("hi"), F.count(F.lit(1)).alias("n"))
    )
    w2 = Window.partitionBy("cls", "q", "s").orderBy("lo")
    starts = F.coalesce(F.col("lo") != F.lag("hi").over(w2) + 1, F.lit(True)).cast("long")
    merged = (
        per_bucket.withColumn("grp", F.sum(starts).over(w2.rowsBetween(Window.unboundedPreceding, 0)))
        .groupBy("cls", "q", "s", "grp")
        .agg(F.min("lo").alias("seq"), F.max("hi").alias("seq2"), F.sum("n").alias("n"))
    )
    return merged.select("cls", "q", "s", "seq", "seq2", "n")


def classify_unacked(e: DataFrame, islands: DataFrame, queues_with_acks: Sequence[str],
                     broadcast_keys: bool) -> DataFrame:
    """Split delivered-never-acked ranges [lo, hi] into ``unacked_in_flight`` (allowed) and
    ``unacked`` (a violation): a range is a violation when its queue has acks and the seqs just
    below and just above it were both acked by one same producer — it sits inside one
    producer's continuous acked stream, so it was never in flight at the end of a producer's
    run. ``c`` / ``c2`` name the producers of lo-1 / hi+1."""
    keys = (islands.select("q", (F.col("seq") - 1).alias("seq"))
            .union(islands.select("q", (F.col("seq2") + 1).alias("seq"))).distinct())
    keys = F.broadcast(keys) if broadcast_keys else keys
    acks = e.filter(F.col("kind") == ACK).select("q", "seq", "c")
    prods = acks.join(keys, ["q", "seq"]).groupBy("q", "seq").agg(F.array_sort(F.collect_set("c")).alias("ps"))
    before = prods.select(F.col("q").alias("bq"), F.col("seq").alias("bseq"), F.col("ps").alias("before"))
    after = prods.select(F.col("q").alias("aq"), F.col("seq").alias("aseq"), F.col("ps").alias("after"))
    x = (islands.join(before, (F.col("q") == F.col("bq")) & (F.col("bseq") == F.col("seq") - 1), "left")
         .join(after, (F.col("q") == F.col("aq")) & (F.col("aseq") == F.col("seq2") + 1), "left"))
    has_acks = F.col("q").isin(list(queues_with_acks)) if queues_with_acks else F.lit(False)
    inside = has_acks & F.col("before").isNotNull() & F.col("after").isNotNull() & F.arrays_overlap(
        F.col("before"), F.col("after"))
    violation = inside | ~has_acks
    return x.select(finding(F.when(violation, "unacked").otherwise("unacked_in_flight"), q=F.col("q"),
                            s=F.col("s"), seq=F.col("seq"), seq2=F.col("seq2"), n=F.col("n"),
                            c=F.array_join(F.col("before"), ","), c2=F.array_join(F.col("after"), ",")
                            ).alias("f")).select("f.*")


def unreadable_findings(e: DataFrame) -> DataFrame:
    bad = e.filter(F.col("kind") >= MALFORMED)
    return bad.select(finding(F.when(F.col("kind") == TORN, "torn_row").otherwise("malformed_row"),
                              n=1, pos=F.col("pos"), text=F.col("bad")).alias("f")).select("f.*")


# -- statistics -----------------------------------------------------------------------------


def input_stats(e: DataFrame) -> DataFrame:
    """Per (file id, kind, queue, subscription, writer, latency bin): rows, row-number and seq
    ranges. Its size is files x bins, whatever the row count; every per-file, per-writer,
    per-subscription figure and the latency histogram are sums of it on the driver.
    Bin k covers [10^(k/20), 10^((k+1)/20)) µs; NONPOSITIVE_BIN holds latencies <= 0 (clock
    skew); acks and unreadable rows have bin null."""
    lat = F.col("lat")
    binned = F.when(lat <= 0, F.lit(NONPOSITIVE_BIN)).otherwise(F.floor(F.log10(lat) * HIST_BINS_PER_DECADE))
    row = F.col("pos").bitwiseAND((1 << ROW_BITS) - 1)
    return e.groupBy(F.shiftright("pos", ROW_BITS).alias("fid"), "kind", "q", "s", "c",
                     binned.cast("int").alias("bin")).agg(
        F.count(F.lit(1)).alias("rows"),
        F.min(row).alias("min_row"), F.max(row).alias("max_row"),
        F.min("seq").alias("min_seq"), F.max("seq").alias("max_seq"),
    )


def latency_stats(e: DataFrame) -> DataFrame:
    """Per (queue, subscription): approximate p50/p95/p99 (percentile_approx), exact min/max."""
    d = e.filter(F.col("kind") == DELIVERY)
    return d.groupBy("q", "s").agg(
        F.count(F.lit(1)).alias("rows"),
        F.percentile_approx("lat", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY).alias("pct"),
        F.max("lat").alias("max"), F.min("lat").alias("min"),
        F.sum(F.when(F.col("lat") < 0, 1).otherwise(0)).alias("negative"),
    )


def persist(df: DataFrame) -> DataFrame:
    """Cache ``df`` (columnar, compressed); for the large input table."""
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def checkpoint(df: DataFrame) -> DataFrame:
    """Keep ``df`` once computed (on its first action), cutting its plan: queries over it plan
    in milliseconds, where a cached plan this size costs seconds of cache lookups per query.
    Partitioning is kept. Free it with :func:`release`."""
    return df.localCheckpoint(eager=False, storageLevel=StorageLevel.MEMORY_AND_DISK)


def release(df: DataFrame) -> None:
    """Drop what :func:`persist` or :func:`checkpoint` kept."""
    df.unpersist()
    logical = df._jdf.queryExecution().logical()
    if logical.getClass().getSimpleName() == "LogicalRDD":
        logical.rdd().unpersist(False)

"""The checks, as Spark plans over ``E`` (one row per ack / delivery / unreadable line).

Rules: no function here collects more than a bounded summary to the driver (per-class counts
per subscription, at most ``EXAMPLES`` rows per class, per-file and per-writer statistics,
the list of subscriptions). Everything proportional to the data or to the number of anomalies
stays in Spark.

How it scales: ``E`` is hash-partitioned once by (queue, seq bucket), ``bucket = seq >> 16``,
and kept as that shuffle (:func:`reuse_shuffle`). Every seq-ordered window is partitioned by
the bucket too, so no window holds more than one bucket of one stream, however long a consumer
instance ran; the first and last element of each (stream, bucket) are "boundary" rows, and a
second, small window over the boundary rows checks the pairs that straddle two buckets. Joins
between acks and deliveries are on (queue, bucket, subscription, seq) over that same
partitioning, so they need no shuffle. Windows emit all their findings in one pass (an array of
optional findings per row, exploded), so no window is computed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.spark_order_check._files import ROW_BITS
from ordq.spark_order_check._scan import ACK, DELIVERY, MALFORMED, SKIP, START, TORN, topic_column
from ordq.spark_order_check.report import HIST_BINS_PER_DECADE, NONPOSITIVE_BIN

EXAMPLES = 20

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


def explode_findings(df: DataFrame, candidates: Sequence[Column], where: Column | None = None) -> DataFrame:
    """One output row per non-null candidate finding of each input row (a single pass).

    ``where``, when given, must be true for every row with a finding: the other rows (most of
    them, on a clean run) are dropped before the findings are built."""
    if where is not None:
        df = df.filter(where)
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


def concurrent_consumer_findings(deliveries: DataFrame, tolerance_us: int = 0) -> DataFrame:
    """concurrent_consumers: one subscription must have one active consumer at a time.

    Instances of a subscription are ordered by their first delivery (``deliver_us``). When
    instance B starts delivering, every instance that started before it must be done: a
    delivery by an earlier instance A later than B's first delivery (+ ``tolerance_us``) is a
    violation, whatever its seq (a redelivery after a takeover is allowed, two instances
    delivering at once is not). One finding per (A, B), B the first instance to start after A
    (the one it overlapped first): ``n`` deliveries of A from then on, ``seq`` the first of
    them and ``seq2`` B's first seq, ``pos``/``pos2`` their rows, ``crc`` the overlap in µs
    (A's last delivery - B's first). Reads only deliver_us: no trust in the SDK.

    Cost: one aggregate per instance (small), then one pass over the deliveries of the
    instances that overlap someone (none on a clean run, so nothing is scanned twice)."""
    first = deliveries.groupBy("q", "s", "c").agg(
        F.min(F.struct("t", "pos", "seq")).alias("f"), F.max("t").alias("last"))
    w = Window.partitionBy("q", "s").orderBy(F.col("f.t"), F.col("f.pos"))
    nxt = first.select("q", "s", "c", "last", "f",
                       F.lead("c").over(w).alias("c2"), F.lead("f").over(w).alias("f2"))
    overlapping = nxt.filter(F.col("c2").isNotNull() & (F.col("last") > F.col("f2.t") + tolerance_us))
    late = deliveries.join(F.broadcast(overlapping.select("q", "s", "c", "c2", "last", "f2")), ["q", "s", "c"]) \
        .filter(F.col("t") > F.col("f2.t") + tolerance_us)
    per_pair = late.groupBy("q", "s", "c", "c2").agg(
        F.count(F.lit(1)).alias("n"), F.min(F.struct("t", "pos", "seq")).alias("a"),
        F.first("f2").alias("f2"), F.first("last").alias("last"))
    return per_pair.select(finding(
        "concurrent_consumers", q=F.col("q"), s=F.col("s"), c=F.col("c"), c2=F.col("c2"), n=F.col("n"),
        seq=F.col("a.seq"), seq2=F.col("f2.seq"), pos=F.col("a.pos"), pos2=F.col("f2.pos"),
        crc=F.col("last") - F.col("f2.t")).alias("f")).select("f.*")


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


def key_partition_findings(e: DataFrame, topics: Sequence[str]) -> DataFrame:
    """key_partitions: a key of a topic acked or delivered in two of its partitions (its
    messages then have no one order). One finding per (topic, key): ``q`` and ``c2`` the lowest
    and highest partition it is in, ``seq``/``pos`` and ``seq2``/``pos2`` a row of each, ``text``
    the topic. Rows of keyless messages (key "") are not a key's.

    Cost: one aggregation of the topics' rows by (topic, key), with no string buffer but the
    partition names of the (few) rows kept per key."""
    topic = topic_column(F.col("q"))
    rows = e.filter((F.col("kind") <= DELIVERY) & F.col("key").isNotNull() & (F.col("key") != "")).select(
        topic.alias("topic"), "key", "q", "seq", "pos").filter(F.col("topic").isin(list(topics)))
    per_key = rows.groupBy("topic", "key").agg(F.min(F.struct("q", "pos", "seq")).alias("a"),
                                                F.max(F.struct("q", "pos", "seq")).alias("z"))
    return per_key.filter(F.col("a.q") != F.col("z.q")).select(finding(
        "key_partitions", q=F.col("a.q"), c2=F.col("z.q"), key=F.col("key"), text=F.col("topic"), n=1,
        seq=F.col("a.seq"), pos=F.col("a.pos"), seq2=F.col("z.seq"), pos2=F.col("z.pos")).alias("f")).select("f.*")


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
    ``_extra`` deliveries (``n`` = deliveries - 1; :func:`redeliveries` takes the duplicates
    out), crc_conflict_acks and crc_mismatch_delivery. Example details (positions) are looked
    up afterwards for the few examples shown.

    ``subs`` is (q, s, first): every subscription seen in deliveries, ``first`` marking one
    per queue (so a queue-level finding is reported once).

    One read of ``e`` and one hash aggregation per (queue, bucket, subscription, seq), with
    numeric buffers only (a string or struct buffer makes Spark sort instead): each ack row
    is paired with every subscription of its queue by a broadcast join first.
    """
    kind = F.col("kind")
    x = e.filter(kind <= DELIVERY).alias("x").join(
        F.broadcast(subs.select(F.col("q").alias("sq"), F.col("s").alias("ss"), "first")),
        (F.col("x.q") == F.col("sq")) & ((kind == ACK) | (F.col("x.s") == F.col("ss"))), "left")
    # An ack of a queue nobody consumed keeps s null: every such seq is lost.
    x = x.select("kind", "q", "b", F.col("ss").alias("s"), "seq", "c", "crc",
                 F.coalesce(F.col("first"), F.lit(True)).cast("int").alias("first"))
    is_ack, is_del = F.col("kind") == ACK, F.col("kind") == DELIVERY
    # Two of the consumer instances, as 64-bit hashes of their names: the report maps them back.
    ch = F.xxhash64("c")
    per_seq = x.groupBy("q", "b", "s", "seq").agg(
        F.sum(is_ack.cast("int")).alias("na"),
        F.min(F.when(is_ack, F.col("crc"))).alias("acrc1"), F.max(F.when(is_ack, F.col("crc"))).alias("acrc2"),
        F.max(F.when(is_ack, F.col("first"))).alias("first"),
        F.sum(is_del.cast("int")).alias("nd"),
        F.min(F.when(is_del, F.col("crc"))).alias("dcrc1"), F.max(F.when(is_del, F.col("crc"))).alias("dcrc2"),
        F.min(F.when(is_del, ch)).alias("ch1"), F.max(F.when(is_del, ch)).alias("ch2"),
    )
    na, nd, seq = F.col("na"), F.col("nd"), F.col("seq")
    acrc1, acrc2, dcrc1, dcrc2 = (F.col(n) for n in ("acrc1", "acrc2", "dcrc1", "dcrc2"))
    acked, delivered = na > 0, nd > 0
    acked_one_crc = acked & (acrc1 == acrc2)
    ref = F.when(acked_one_crc, acrc1).otherwise(dcrc1)
    mismatch = delivered & ((acked_one_crc & ((dcrc1 != acrc1) | (dcrc2 != acrc1))) | (~acked & (dcrc1 != dcrc2)))
    common = {"q": F.col("q"), "s": F.col("s"), "b": F.col("b"), "seq": seq}
    conds = {
        "lost": acked & ~delivered,
        "unacked": ~acked & delivered,
        "extra": nd > 1,
        "conflict": acked & (acrc1 != acrc2) & (F.col("first") == 1),
        "mismatch": mismatch,
    }
    # A clean seq (acked, delivered once, one CRC) has none: most groups skip building findings.
    any_finding = conds["lost"] | conds["unacked"] | conds["extra"] | conds["conflict"] | conds["mismatch"]
    return explode_findings(per_seq, [
        when_finding(conds["lost"], "_lost", **common, n=1),
        when_finding(conds["unacked"], "_unacked", **common, n=1),
        when_finding(conds["extra"], "_extra", **common, n=nd - 1, pos=F.col("ch1"), pos2=F.col("ch2")),
        when_finding(conds["conflict"], "crc_conflict_acks",
                     q=F.col("q"), b=F.col("b"), seq=seq, n=1, crc=acrc1, crc2=acrc2),
        when_finding(conds["mismatch"], "crc_mismatch_delivery", **common, n=1, crc=ref,
                     crc2=F.when(dcrc1 != ref, dcrc1).otherwise(dcrc2), flag=acked.cast("int")),
    ], where=F.coalesce(any_finding, F.lit(True)))


def redeliveries(raw: DataFrame, *, duplicates: bool = True) -> DataFrame:
    """redelivered_after_takeover per (queue, subscription, seq): the extra deliveries of a seq
    that are not duplicates within one consumer instance (``duplicate`` rows, one per extra
    delivery inside an instance, come from the order windows).

    ``duplicates=False`` when ``raw`` holds no ``duplicate`` row (its class count is zero):
    then every ``_extra`` row (one per seq, ``n`` >= 1) is a redelivery as it stands, and the
    shuffle and aggregation that net duplicates out are skipped (10^6 rows of them on a run
    whose standby redelivered 10% of 10^7 messages)."""
    cls = F.col("cls")
    if not duplicates:
        per_seq = raw.filter(cls == "_extra").select("q", "s", "b", "seq", "n", F.col("pos").alias("ch1"),
                                                     F.col("pos2").alias("ch2"))
    else:
        parts = raw.filter(cls.isin("_extra", "duplicate")).select(
            "q", "s", "b", "seq", F.when(cls == "_extra", F.col("n")).otherwise(-F.col("n")).alias("n"),
            F.when(cls == "_extra", F.col("pos")).alias("ch1"), F.when(cls == "_extra", F.col("pos2")).alias("ch2"))
        per_seq = parts.groupBy("q", "s", "seq").agg(
            F.sum("n").alias("n"), F.max("b").alias("b"), F.max("ch1").alias("ch1"), F.max("ch2").alias("ch2")
        ).filter(F.col("n") > 0)
    return per_seq.select(finding("redelivered_after_takeover", q=F.col("q"), s=F.col("s"), b=F.col("b"),
                                  seq=F.col("seq"), n=F.col("n"), pos=F.col("ch1"), pos2=F.col("ch2")
                                  ).alias("f")).select("f.*")


def example_rows(e: DataFrame, keys: DataFrame) -> DataFrame:
    """The ack and delivery rows of a few (q, b, seq) keys, to detail examples with."""
    return (e.filter(F.col("kind") <= DELIVERY).join(F.broadcast(keys), ["q", "b", "seq"], "left_semi")
            .select("kind", "q", "s", "c", "seq", "crc", "pos"))


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


def ack_runs(inter: DataFrame, bucket_bits: int) -> tuple[DataFrame, DataFrame]:
    """From :func:`input_counts`: (``exact``, ``unsure``) runs of ack rows (q, c, lo, hi, b),
    one row per seq bucket ``b`` a run spans. An exact run holds every seq of [lo, hi] (its
    rows have one ``seq - row`` and as many rows as seqs); an unsure one holds only some."""
    acks = inter.filter(F.col("kind") == ACK).select(
        "q", "c", F.col("min_seq").alias("lo"), F.col("max_seq").alias("hi"),
        (F.col("rows") == F.col("max_seq") - F.col("min_seq") + 1).alias("exact"))
    per_bucket = acks.select("*", F.explode(F.sequence(F.shiftright("lo", bucket_bits),
                                                       F.shiftright("hi", bucket_bits))).alias("b"))
    cols = ("q", "c", "lo", "hi", "b")
    return per_bucket.filter("exact").select(*cols), per_bucket.filter(~F.col("exact")).select(*cols)


def classify_unacked(e: DataFrame, inter: DataFrame, islands: DataFrame, queues_with_acks: Sequence[str],
                     broadcast_keys: bool, bucket_bits: int) -> DataFrame:
    """Split delivered-never-acked ranges [lo, hi] into ``unacked_in_flight`` (allowed) and
    ``unacked`` (a violation): a range is a violation when its queue has acks and the seqs just
    below and just above it were both acked by one same producer — it sits inside one
    producer's continuous acked stream, so it was never in flight at the end of a producer's
    run. ``c`` / ``c2`` name the producers of lo-1 / hi+1.

    Who acked lo-1 and hi+1 comes from the runs of acks (:func:`ack_runs`, kept from the
    statistics pass) when no unsure run spans one of them; otherwise from one read of ``e``.
    One small job decides (a count)."""
    islands = islands.withColumn("id", F.monotonically_increasing_id())
    keys = (islands.select("id", "q", (F.col("seq") - 1).alias("seq"), F.lit(True).alias("below"))
            .union(islands.select("id", "q", (F.col("seq2") + 1).alias("seq"), F.lit(False).alias("below"))))
    keys = keys.withColumn("b", F.shiftright("seq", bucket_bits))
    keys = F.broadcast(keys) if broadcast_keys else keys
    exact, unsure = ack_runs(inter, bucket_bits)

    def spanning(runs: DataFrame) -> DataFrame:
        k, r = keys.alias("k"), runs.alias("r")
        return k.join(r, (F.col("k.q") == F.col("r.q")) & (F.col("k.b") == F.col("r.b"))
                      & F.col("k.seq").between(F.col("r.lo"), F.col("r.hi"))).select("k.id", "k.below", "r.c")

    if broadcast_keys and spanning(unsure).limit(1).count() == 0:
        acked_by = spanning(exact)
    else:
        acked_by = e.filter(F.col("kind") == ACK).select("q", "seq", "c").join(keys, ["q", "seq"])
    found = acked_by.groupBy("id").agg(
        F.array_sort(F.collect_set(F.when(F.col("below"), F.col("c")))).alias("before"),
        F.array_sort(F.collect_set(F.when(~F.col("below"), F.col("c")))).alias("after"))
    x = islands.join(found, "id", "left")
    has_acks = F.col("q").isin(list(queues_with_acks)) if queues_with_acks else F.lit(False)
    before = F.coalesce(F.col("before"), F.array().cast("array<string>"))
    after = F.coalesce(F.col("after"), F.array().cast("array<string>"))
    inside = has_acks & F.arrays_overlap(before, after)
    violation = inside | ~has_acks
    return x.select(finding(F.when(violation, "unacked").otherwise("unacked_in_flight"), q=F.col("q"),
                            s=F.col("s"), seq=F.col("seq"), seq2=F.col("seq2"), n=F.col("n"),
                            c=F.array_join(before, ","), c2=F.array_join(after, ",")
                            ).alias("f")).select("f.*")


def skip_findings(sk: DataFrame) -> tuple[DataFrame, DataFrame]:
    """From scan_skips rows: (the (q, s, seq) a skip record accounts for, i.e. parked; the
    findings: ``skipped`` per parked seq never replayed, and the unreadable skip rows)."""
    ok = sk.filter(F.col("kind") == SKIP)
    per_seq = ok.groupBy("q", "s", "seq").agg(
        F.max((F.col("action") == "parked").cast("int")).alias("parked"),
        F.max((F.col("action") == "replayed").cast("int")).alias("replayed"), F.max("b").alias("b"))
    parked = per_seq.filter(F.col("parked") == 1).select("q", "s", "seq")
    skipped = per_seq.filter((F.col("parked") == 1) & (F.col("replayed") == 0)).select(
        finding("skipped", q=F.col("q"), s=F.col("s"), b=F.col("b"), seq=F.col("seq"), n=1).alias("f")).select("f.*")
    return parked, skipped.unionByName(side_file_unreadable(sk))


def side_file_unreadable(rows: DataFrame) -> DataFrame:
    """The torn and malformed rows of a side file's scan (skips, starts), as findings."""
    return rows.filter(F.col("kind").isin(MALFORMED, TORN)).select(
        finding(F.when(F.col("kind") == TORN, "torn_row").otherwise("malformed_row"), n=1, pos=F.col("pos"),
                text=F.col("bad")).alias("f")).select("f.*")


def start_findings(st: DataFrame) -> tuple[DataFrame, DataFrame]:
    """From scan_starts rows: (per (q, s), ``after_seq``: the lowest seq its first audited
    consumer instance began after; the unreadable start rows as findings)."""
    begun = st.filter(F.col("kind") == START).groupBy("q", "s").agg(F.min("after_seq").alias("after_seq"))
    return begun, side_file_unreadable(st)


def early_findings(e: DataFrame) -> DataFrame:
    """``delivered_early``: a delivery whose ``deliver_us`` is before its ``due_us`` (delayed
    delivery: timestamp + the subscription's delay, or the message's deliver_at). One finding
    per delivery; ``crc`` carries how early, µs. Run only when the statistics counted one."""
    early = e.filter((F.col("kind") == DELIVERY) & F.col("early").isNotNull())
    return early.select(finding("delivered_early", q=F.col("q"), s=F.col("s"), c=F.col("c"), seq=F.col("seq"),
                                pos=F.col("pos"), n=1, crc=F.col("early")).alias("f")).select("f.*")


def unreadable_findings(e: DataFrame) -> DataFrame:
    bad = e.filter(F.col("kind") >= MALFORMED)
    return bad.select(finding(F.when(F.col("kind") == TORN, "torn_row").otherwise("malformed_row"),
                              n=1, pos=F.col("pos"), text=F.col("bad")).alias("f")).select("f.*")


# -- statistics -----------------------------------------------------------------------------


def input_counts(e: DataFrame) -> DataFrame:
    """Rows per (file, kind, queue, subscription, writer, latency value, ack run), with the
    row-number, seq and ``seq - row`` ranges: the one pass over ``e`` behind :func:`input_stats`
    and :func:`ack_runs`. Its size grows with files, distinct latency values (µs) and runs of
    acks in seq order, not with rows."""
    row = F.col("pos").bitwiseAND((1 << ROW_BITS) - 1)
    # Ack rows are also grouped by ``seq - row`` (``run``): a producer acks in seq order, so a
    # file holds a few such runs, and :func:`ack_runs` answers "who acked seq x" from them.
    run = F.when(F.col("kind") == ACK, F.col("seq") - row).alias("run")
    return e.groupBy(F.shiftright("pos", ROW_BITS).alias("fid"), "kind", "q", "s", "c", "lat", run).agg(
        F.count(F.lit(1)).alias("rows"),
        F.min(row).alias("min_row"), F.max(row).alias("max_row"),
        F.min("seq").alias("min_seq"), F.max("seq").alias("max_seq"),
        F.min(F.col("seq") - row).alias("min_d"), F.max(F.col("seq") - row).alias("max_d"),
        F.min("t").alias("min_t"), F.max("t").alias("max_t"),
        F.count("early").alias("early"),
    )


def input_stats(inter: DataFrame) -> DataFrame:
    """Every statistic, from :func:`input_counts`, as rows of one shape (``t`` says which):

    - ``file``: per (file, kind, queue, subscription, writer): rows, min/max row number,
      min/max seq, min/max of ``seq - row``, min/max ``deliver_us`` and deliveries handed out
      before their due time (``a9``, delayed delivery). A file whose rows are
      numbered without holes and whose ``seq - row`` is constant holds one run of consecutive
      seqs, in order.
    - ``lat``: per (queue, subscription): exact p50/p95/p99 (nearest rank), min, max, negative.
    - ``hist``: per (queue, subscription, bin): deliveries; bin k covers
      [10^(k/20), 10^((k+1)/20)) µs, NONPOSITIVE_BIN holds latencies <= 0 (clock skew).
    """
    files = inter.groupBy("fid", "kind", "q", "s", "c").agg(
        F.sum("rows").alias("a0"), F.min("min_row").alias("a1"), F.max("max_row").alias("a2"),
        F.min("min_seq").alias("a3"), F.max("max_seq").alias("a4"), F.min("min_d").alias("a5"),
        F.max("max_d").alias("a6"), F.min("min_t").alias("a7"), F.max("max_t").alias("a8"),
        F.sum("early").alias("a9"))
    values = inter.filter(F.col("kind") == DELIVERY).groupBy("q", "s", "lat").agg(F.sum("rows").alias("n"))
    w = Window.partitionBy("q", "s")
    cum = F.sum("n").over(w.orderBy("lat").rowsBetween(Window.unboundedPreceding, Window.currentRow))
    ranked = values.select("q", "s", "lat", "n", cum.alias("cum"), F.sum("n").over(w).alias("total"))

    def nearest_rank(p: float) -> Column:
        # the smallest value whose cumulative count reaches ceil(p * total)
        return F.min(F.when(F.col("cum") >= F.ceil(F.col("total") * p), F.col("lat")))

    lat = ranked.groupBy("q", "s").agg(
        F.sum("n").alias("a0"), nearest_rank(0.5).alias("a1"), nearest_rank(0.95).alias("a2"),
        nearest_rank(0.99).alias("a3"), F.min("lat").alias("a4"), F.max("lat").alias("a5"),
        F.sum(F.when(F.col("lat") < 0, F.col("n")).otherwise(0)).alias("a6"))
    lat_col = F.col("lat")
    binned = F.when(lat_col <= 0, F.lit(NONPOSITIVE_BIN)).otherwise(F.floor(F.log10(lat_col) * HIST_BINS_PER_DECADE))
    hist = values.groupBy("q", "s", binned.cast("long").alias("a0")).agg(F.sum("n").alias("a1"))

    def shape(df: DataFrame, t: str) -> DataFrame:
        cols = [F.lit(t).alias("t")]
        for name, typ in (("fid", "long"), ("kind", "int"), ("q", "string"), ("s", "string"), ("c", "string")):
            cols.append((F.col(name) if name in df.columns else F.lit(None)).cast(typ).alias(name))
        for i in range(10):
            cols.append((F.col(f"a{i}") if f"a{i}" in df.columns else F.lit(None)).cast("long").alias(f"a{i}"))
        return df.select(*cols)

    return shape(files, "file").unionByName(shape(lat, "lat")).unionByName(shape(hist, "hist"))


def persist(df: DataFrame) -> DataFrame:
    """Cache ``df`` (columnar, compressed); for the large input table."""
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def checkpoint(df: DataFrame, *, disk_only: bool = False) -> DataFrame:
    """Keep ``df`` once computed (on its first action), cutting its plan: queries over it plan
    in milliseconds, where a cached plan this size costs seconds of cache lookups per query.
    Partitioning is kept. Free it with :func:`release`. ``disk_only`` for large data: with
    memory in the level, Spark copies a whole block from disk into the heap to read it."""
    level = StorageLevel.DISK_ONLY if disk_only else StorageLevel.MEMORY_AND_DISK
    return df.localCheckpoint(eager=False, storageLevel=level)


def reuse_shuffle(df: DataFrame) -> DataFrame:
    """``df`` (ending in a shuffle, e.g. ``repartition``) as a DataFrame over the RDD Spark
    built for it, partitioning kept. Queries over it run that RDD again, and the scheduler
    skips its map stage once the shuffle files exist: the input is read, parsed and shuffled
    once, by the first query, and later queries read the shuffle files (compressed, Spark's
    row serializer). For the large input table this replaced a ``DISK_ONLY`` checkpoint
    (written once, then read back through the Java serializer): 10^7 messages, see
    docs/BENCHMARKS.md. Lost shuffle files are recomputed from the input, like any shuffle.
    """
    spark = df.sparkSession
    jvm = spark._jvm
    assert jvm is not None  # a classic (JVM-backed) session, never Spark Connect here
    rdd = df._jdf.queryExecution().toRdd()
    companion = getattr(getattr(jvm.org.apache.spark.sql.execution, "LogicalRDD$"), "MODULE$")
    logical = companion.fromDataset(rdd, df._jdf, False, False)
    return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, logical), spark)


def release(df: DataFrame) -> None:
    """Drop what :func:`persist` or :func:`checkpoint` kept."""
    df.unpersist()
    logical = df._jdf.queryExecution().logical()
    if logical.getClass().getSimpleName() == "LogicalRDD":
        logical.rdd().unpersist(False)

"""Reading audit files into Spark: one narrow row per ack, delivery or unreadable line.

Rules: nothing here collects data to the driver. Every output row carries ``pos``, its
position in the input: ``fid << 33 | row`` where ``fid`` numbers the files in
(writer id, ``<n>``) order and ``row`` is the 0-based data row in that file (line ``row + 2``;
line 1 is the header). Sorting one writer's rows by ``pos`` is sorting them by
(file ``<n>``, line), the order docs/AUDIT_FORMAT.md defines.

How ``row`` is found without a driver collect or an extra pass: the files are read with the
text source, one line per row, and while verifying ``spark.sql.files.maxPartitionBytes`` and
``spark.sql.files.openCostInBytes`` are raised above any file size, which stops Spark from
splitting a file and from packing two files into one partition. So every partition is exactly
one whole file, read in order, and ``monotonically_increasing_id()`` (partition index << 33 |
row number inside the partition) computed directly on the scan is the line number in the file.
The expression must sit right above the scan: no filter may run before it, and none is pushed
below it because it is nondeterministic. The assumption is checked on every run
(``file_stats``: each file's rows must be numbered 0..rows-1).

Lines are split on TAB in Spark SQL (``split``, ``try_cast``): measured 10^7 rows, this is
several times faster than the CSV source in ``multiLine`` mode (which the first version used
to keep files whole) and gives the same rows: a line with the wrong number of fields, or a
number column that does not parse, is malformed (``bad`` holds the line); an empty field is
a missing value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.sdk.audit import ACK_COLUMNS, DELIVERY_COLUMNS, OPTIONAL_COLUMNS, SKIP_COLUMNS, START_COLUMNS
from ordq.spark_order_check._files import ROW_BITS, AuditFile

ACK, DELIVERY, MALFORMED, TORN = 0, 1, 2, 3
SKIP = 4  # scan_skips rows only, never in E
START = 5  # scan_starts rows only, never in E
BUCKET_BITS = 16  # seqs are grouped in buckets of 65,536 for the seq-ordered windows
ROW_MASK = (1 << ROW_BITS) - 1
_LONGS = {"epoch", "seq", "seg", "offset", "crc32", "send_us", "ack_us", "msg_us", "deliver_us", "due_us", "parked_seq",
          "at_us", "after_seq"}
_BAD = "_bad"
_FIELDS = "_f"

# Columns of the combined table every check reads (``E`` in docs/VERIFIER.md).
E_SCHEMA = T.StructType([
    T.StructField("kind", T.IntegerType()),
    T.StructField("q", T.StringType()),
    T.StructField("s", T.StringType()),  # subscription; null for acks
    T.StructField("c", T.StringType()),  # producer (acks) or consumer (deliveries) writer id
    T.StructField("seq", T.LongType()),
    T.StructField("b", T.LongType()),  # seq >> bucket_bits
    T.StructField("crc", T.LongType()),
    T.StructField("pos", T.LongType()),
    T.StructField("seg", T.LongType()),  # acks only: the segment the ack placed the seq in
    T.StructField("lat", T.LongType()),  # deliver_us - msg_us; null for acks
    T.StructField("t", T.LongType()),  # deliver_us; null for acks
    T.StructField("key", T.StringType()),  # only for keyed subscriptions and topics' partitions
    T.StructField("bad", T.StringType()),  # the raw line of an unreadable row
    # deliveries handed out before their due time (delayed delivery, sdk/delay.py): due_us -
    # deliver_us (> 0); null for the others and for acks
    T.StructField("early", T.LongType()),
])


_FILES = T.StructType([
    T.StructField("_name", T.StringType()), T.StructField("_fid", T.LongType()), T.StructField("_torn", T.LongType()),
])


def local_table(spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: T.StructType) -> DataFrame:
    """A small driver-side table as a DataFrame, built in the JVM from one JSON literal:
    ``createDataFrame`` would ship it through a Python RDD and start Python workers."""
    text = json.dumps([dict(zip(schema.names, r, strict=True)) for r in rows])
    return spark.range(1).select(F.inline(F.from_json(F.lit(text), T.ArrayType(schema))))


def _field(i: int) -> Any:
    # An empty field is a missing value, as the CSV reader had it.
    # get(): null past the end of a short line (``[i]`` fails the job in ANSI mode).
    return F.nullif(F.get(F.col(_FIELDS), i), F.lit(""))


def _read(spark: SparkSession, files: Sequence[AuditFile], columns: Sequence[str], fid0: int,
          optional: int = 0) -> DataFrame:
    """The rows of ``files``, one column each of ``columns``; the last ``optional`` columns
    may be missing (rows written before they were added: null)."""
    lines = spark.read.option("lineSep", "\n").text([f.path for f in files])
    # Directly on the scan (see the module docstring): line number inside the (one-file) partition.
    lines = lines.select("value", F.col("_metadata.file_name").alias("_file"),
                         F.monotonically_increasing_id().bitwiseAND(F.lit(ROW_MASK)).alias("_line"))
    lines = lines.filter(F.col("_line") > 0)  # line 0 is the header
    split = lines.select("value", "_file", (F.col("_line") - 1).alias("_row"), F.split("value", "\t").alias(_FIELDS))
    cols = []
    width = F.size(_FIELDS)
    well_formed = (width <= len(columns)) & (width >= len(columns) - optional)
    for i, c in enumerate(columns):
        if c in _LONGS:
            # try_cast: a field that is not a number is a malformed row (a cast would fail the job).
            v = F.expr(f"try_cast(nullif(get({_FIELDS}, {i}), '') AS BIGINT)")
            well_formed = well_formed & (_field(i).isNull() | v.isNotNull())
        else:
            v = _field(i)
        cols.append(v.alias(c))
    raw = split.select(*cols, F.when(~well_formed, F.col("value")).alias(_BAD), "_file", "_row")
    table = local_table(spark, [(f.name, fid0 + i, -1 if f.torn_row is None else f.torn_row)
                                for i, f in enumerate(files)], _FILES)
    joined = raw.join(F.broadcast(table), raw["_file"] == table["_name"])
    return joined.withColumn("pos", F.shiftleft(F.col("_fid"), ROW_BITS).bitwiseOR(F.col("_row")))


def _kind(base: int, required: Sequence[str]) -> Any:
    ok = F.col(_BAD).isNull()
    for c in required:
        ok = ok & F.col(c).isNotNull()
    return (F.when(F.col("_row") == F.col("_torn"), F.lit(TORN))
            .when(ok, F.lit(base)).otherwise(F.lit(MALFORMED)))


def _bad_text(columns: Sequence[str], optional: int = 0) -> Any:
    # A row with the right number of fields but an empty required one has no _bad text. An
    # optional last column a row lacks is left out (concat_ws skips a null), not shown as "".
    required = len(columns) - optional
    joined = F.concat_ws("\t", *[F.coalesce(F.col(c).cast("string"), F.lit("")) if i < required
                                 else F.col(c).cast("string") for i, c in enumerate(columns)])
    return F.substring(F.coalesce(F.col(_BAD), joined), 1, 300)


def scan_acks(spark: SparkSession, files: Sequence[AuditFile], fid0: int, bucket_bits: int = BUCKET_BITS,
              topics: Sequence[str] = ()) -> DataFrame:
    """Ack rows; those of ``topics``' partitions carry their key (the others null)."""
    df = _read(spark, files, ACK_COLUMNS, fid0)
    kind = _kind(ACK, ("queue", "producer", "seq", "seg", "crc32"))
    df = df.withColumn("kind", kind)
    k = F.col("kind")
    return df.select(
        k.alias("kind"),
        F.col("queue").alias("q"),
        F.lit(None).cast("string").alias("s"),
        F.col("producer").alias("c"),
        F.col("seq").alias("seq"),
        F.shiftright(F.col("seq"), bucket_bits).alias("b"),
        F.col("crc32").alias("crc"),
        F.col("pos"),
        F.col("seg").alias("seg"),
        F.lit(None).cast("long").alias("lat"),
        F.lit(None).cast("long").alias("t"),
        (F.when(keyed_condition((), topics), F.coalesce(F.col("key"), F.lit(""))) if topics else F.lit(None)
         ).cast("string").alias("key"),
        # Fields of unreadable rows are left as parsed (maybe null): every check filters on kind.
        F.when(k > DELIVERY, _bad_text(ACK_COLUMNS)).alias("bad"),
        F.lit(None).cast("long").alias("early"),
    )


# A topic's partition queue, ``T.p<N>`` (coordinator/topics.py): group 1 is the topic.
PARTITION_PATTERN = r"^(.+)\.p(0|[1-9][0-9]*)$"


def topic_column(queue: Any) -> Any:
    """The topic whose partition ``queue`` is, by its name ("" when it is none)."""
    return F.regexp_extract(queue, PARTITION_PATTERN, 1)


def keyed_condition(keyed: Sequence[str], topics: Sequence[str] = ()) -> Any:
    """True for rows of keyed subscriptions: entries are ``SUB`` (any queue) or ``QUEUE/SUB``;
    and for every subscription of a partition of one of ``topics`` (a topic's order is per key)."""
    subs = [k for k in keyed if "/" not in k]
    pairs = [k for k in keyed if "/" in k]
    cond = topic_column(F.col("queue")).isin(list(topics)) if topics else F.lit(False)
    if subs:
        cond = cond | F.col("subscription").isin(subs)
    if pairs:
        cond = cond | F.concat_ws("/", F.col("queue"), F.col("subscription")).isin(pairs)
    return cond


def scan_deliveries(spark: SparkSession, files: Sequence[AuditFile], fid0: int, keyed: Sequence[str],
                    bucket_bits: int = BUCKET_BITS, topics: Sequence[str] = ()) -> DataFrame:
    df = _read(spark, files, DELIVERY_COLUMNS, fid0, optional=len(OPTIONAL_COLUMNS["deliveries"]))
    kind = _kind(DELIVERY, ("queue", "subscription", "consumer", "seq", "crc32", "msg_us", "deliver_us"))
    df = df.withColumn("kind", kind)
    k = F.col("kind")
    # Keyed subscriptions carry the key ("" for a message without one); others carry null.
    key = (F.when(keyed_condition(keyed, topics), F.coalesce(F.col("key"), F.lit(""))) if keyed or topics
           else F.lit(None))
    return df.select(
        k.alias("kind"),
        F.col("queue").alias("q"),
        F.col("subscription").alias("s"),
        F.col("consumer").alias("c"),
        F.col("seq").alias("seq"),
        F.shiftright(F.col("seq"), bucket_bits).alias("b"),
        F.col("crc32").alias("crc"),
        F.col("pos"),
        F.lit(None).cast("long").alias("seg"),
        (F.col("deliver_us") - F.col("msg_us")).alias("lat"),
        F.col("deliver_us").alias("t"),
        key.cast("string").alias("key"),
        F.when(k > DELIVERY, _bad_text(DELIVERY_COLUMNS, len(OPTIONAL_COLUMNS["deliveries"]))).alias("bad"),
        F.when((k == DELIVERY) & (F.col("due_us") > F.col("deliver_us")),
               F.col("due_us") - F.col("deliver_us")).alias("early"),
    )


def scan_skips(spark: SparkSession, files: Sequence[AuditFile], fid0: int, bucket_bits: int = BUCKET_BITS) -> DataFrame:
    """Skip records (docs/AUDIT_FORMAT.md, "skips"): (kind, q, s, seq, b, action, pos, bad). A
    few rows per parked message, so kept apart from ``E``: they only change what counts as lost."""
    df = _read(spark, files, SKIP_COLUMNS, fid0)
    kind = _kind(SKIP, ("queue", "subscription", "seq", "action"))
    return df.select(kind.alias("kind"), F.col("queue").alias("q"), F.col("subscription").alias("s"),
                     F.col("seq"), F.shiftright(F.col("seq"), bucket_bits).alias("b"), F.col("action"),
                     F.col("pos"), F.when(kind != SKIP, _bad_text(SKIP_COLUMNS)).alias("bad"))


def scan_starts(spark: SparkSession, files: Sequence[AuditFile], fid0: int) -> DataFrame:
    """Start records (docs/AUDIT_FORMAT.md, "starts"): (kind, q, s, after_seq, pos, bad). One
    row per consumer instance, so kept apart from ``E``: they only change what counts as lost."""
    df = _read(spark, files, START_COLUMNS, fid0)
    kind = _kind(START, ("queue", "subscription", "after_seq"))
    return df.select(kind.alias("kind"), F.col("queue").alias("q"), F.col("subscription").alias("s"),
                     F.col("after_seq"), F.col("pos"), F.when(kind != START, _bad_text(START_COLUMNS)).alias("bad"))

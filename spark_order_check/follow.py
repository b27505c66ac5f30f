"""``ordq verify --follow``: the ordering checks, run continuously on a live queue.

A Spark streaming query reads the queue with the ordq source (``ordq/spark_source.py``) and
checks every micro-batch with the verifier's own per-instance rules
(``_checks.instance_findings``): the queue read in storage order (segment, offset) is treated
as one consumer instance's delivery stream, so

- ``duplicate``: a seq seen twice (in the batch, or the last seq of the batch before);
- ``gap``: a seq missing between two rows, or between the last row of the batch before and
  the first of this one (seq continuity across micro-batches);
- ``out_of_order``: a seq stored (seg, offset) before a lower seq: storage order and seq
  order disagree, within a batch or across the boundary of two batches.

Key order needs no check of its own here: the stream is the queue's total order, and every
row (keyed or not) is checked for out_of_order, so no reorder means every key is in order.
The source itself refuses a gap it meets while reading (``GapDetected``, e.g. a segment popped
before the query read it): the query fails and that is reported as a ``gap`` too.

Only the last row of a batch is carried to the next (a bounded state: one seq and position).
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import threading
import time
from typing import Any, TextIO

import attrs
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ordq.coordinator.state import Cursor
from ordq.spark_order_check._checks import instance_findings
from ordq.spark_order_check._session import make_session
from ordq.spark_source import Clients, SourceOptions, failure_reason, readable_end, register, ship_credentials

VIOLATIONS = ("duplicate", "gap", "out_of_order")
_STREAM = "follow"  # the subscription / consumer columns of the rule code's stream key
PROG = "ordq verify --follow"
# A query whose Python worker did not connect back in time is started again this many times
# (from its checkpoint: nothing is checked twice or skipped); then it ends with one line.
WORKER_RESTARTS = 3
STOP_WAIT_S = 30.0  # at the end, how long a running micro-batch may finish before the query stops
_WORKER_LATE = ("Python worker failed to connect back", "waiting for the Python worker to connect back")
OFFSET_BITS = 32  # pos = seg << 32 | offset: storage order as one number
_ROWS = T.StructType([
    T.StructField("q", T.StringType()), T.StructField("b", T.LongType()), T.StructField("s", T.StringType()),
    T.StructField("c", T.StringType()), T.StructField("seq", T.LongType()), T.StructField("pos", T.LongType()),
    T.StructField("key", T.StringType()),
])


def where(pos: int | None) -> str | None:
    return None if pos is None else f"{pos >> OFFSET_BITS}:{pos & ((1 << OFFSET_BITS) - 1)}"


@attrs.frozen
class Violation:
    cls: str
    count: int  # findings of this class in the batch
    seq: int | None
    seq2: int | None
    at: str | None  # seg:offset of the row before / after
    at2: str | None
    batch: int
    text: str = ""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def line(self) -> str:
        if self.text:
            return f"{self.cls}: {self.text}"
        return (f"{self.cls} x{self.count} in batch {self.batch}: first at seq {self.seq}..{self.seq2} "
                f"(stored at {self.at} / {self.at2})")


@attrs.define
class FollowState:
    """What the checks saw so far (kept on the driver; the foreachBatch function runs there)."""

    queue: str
    started: float = attrs.field(factory=time.monotonic)
    batches: int = 0
    rows: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    carry: tuple[int, int] | None = None  # (seq, pos) of the last row checked
    lag_s: float | None = None  # now - the producer's timestamp of the last row checked
    lag_messages: int | None = None  # readable now - checked
    violations: list[Violation] = attrs.field(factory=list)
    verdict: str = "running"
    error: str | None = None
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def to_dict(self, event: str) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {"event": event, "queue": self.queue, "batches": self.batches, "rows": self.rows,
                "first_seq": self.first_seq, "last_seq": self.last_seq,
                "rate": round(self.rows / elapsed, 1) if elapsed > 0 else 0.0,
                "seconds": round(elapsed, 3), "lag_s": None if self.lag_s is None else round(self.lag_s, 3),
                "lag_messages": self.lag_messages, "violations": [v.to_dict() for v in self.violations],
                "verdict": self.verdict, "error": self.error}

    def line(self) -> str:
        d = self.to_dict("batch")
        lag = "-" if self.lag_s is None else f"{self.lag_s:.1f} s"
        behind = "-" if self.lag_messages is None else f"{self.lag_messages:,}"
        seqs = "" if self.first_seq is None else f" (seq {self.first_seq}..{self.last_seq})"
        return (f"batch {self.batches}: {self.rows:,} rows checked{seqs}, {d['rate']:,.0f} rows/s, "
                f"lag {lag} / {behind} msgs, violations {len(self.violations)}")


def stream_rows(batch: DataFrame, queue: str) -> DataFrame:
    """A micro-batch of the ordq source as the rule code's delivery rows (one stream, one
    bucket: a micro-batch is bounded by maxRowsPerBatch). ``key`` is null: every row is
    checked for out_of_order (keyed rows are exempt in the rule code, a keyed subscription
    may reorder across keys; the queue may not)."""
    return batch.select(F.lit(queue).alias("q"), F.lit(0).cast("long").alias("b"), F.lit(_STREAM).alias("s"),
                        F.lit(_STREAM).alias("c"), "seq",
                        F.shiftleft(F.col("seg"), OFFSET_BITS).bitwiseOR(F.col("offset")).alias("pos"),
                        F.lit(None).cast("string").alias("key"))


def check_rows(spark: SparkSession, rows: DataFrame, carry: tuple[int, int] | None, queue: str,
               batch: int) -> tuple[list[Violation], tuple[int, int] | None]:
    """The violations in ``rows`` (after the carried last row of the batch before) and the
    new carry. One Spark job, a bounded result: one row per finding class."""
    if carry is not None:
        prev = spark.createDataFrame([(queue, 0, _STREAM, _STREAM, carry[0], carry[1], None)], _ROWS)
        rows = prev.unionByName(rows)
    found = instance_findings(rows).groupBy("cls").agg(
        F.count(F.lit(1)).alias("k"), F.min(F.struct("seq", "seq2", "pos", "pos2")).alias("first"),
        F.max(F.struct("seq", "pos")).alias("last")).collect()
    out, new_carry = [], carry
    for r in found:
        if r.cls == "_bnd":  # the first and last row of the stream: the last one is the next carry
            new_carry = (int(r["last"]["seq"]), int(r["last"]["pos"]))
        elif r.cls in VIOLATIONS:
            f = r["first"]
            out.append(Violation(cls=r.cls, count=int(r.k), seq=f["seq"], seq2=f["seq2"], at=where(f["pos"]),
                                 at2=where(f["pos2"]), batch=batch))
    return sorted(out, key=lambda v: v.cls), new_carry


@attrs.frozen(kw_only=True)
class FollowOptions:
    zk: str
    root: str
    queue: str
    start: str = "earliest"
    until_s: float | None = None
    until_seq: int | None = None
    trigger_s: float = 1.0
    max_rows_per_batch: int = 200_000
    master: str | None = None
    conf: dict[str, str] = attrs.field(factory=dict)
    as_json: bool = False
    # Spark's checkpoint: a later run with the same directory resumes where this one stopped
    # (the source checks seq continuity from there). None: a temporary one.
    checkpoint: str | None = None
    bootstrap: str | None = None  # the coordinators' addresses (else zk/root name a registered cluster)


def follow(o: FollowOptions, *, out: TextIO = sys.stdout) -> FollowState:
    """Check the queue until a violation, ``until_s`` / ``until_seq``, or Ctrl-C; the verdict
    is ``clean``, ``violations`` or ``error`` (the query failed for another reason)."""
    # A missing ZooKeeper or queue: a one-line error before Spark starts.
    # Read as any client reads (issue 37): the coordinators, then the replicas.
    options = SourceOptions(queue=o.queue, bootstrap=o.bootstrap, zk=o.zk, root=o.root)
    clients = Clients.open(options)
    try:
        clients.store.load_state(o.queue)
    finally:
        # Closed before PySpark forks the JVM (a fork with a preexec_fn): a child forked while
        # gRPC's channels poll can die before exec ("Java gateway process exited", seen once
        # beside gRPC's "epoll_wait error: Bad file descriptor"). Opened again after.
        clients.close()
    # Micro-batches are small: a few shuffle partitions, not Spark's default 200.
    spark = make_session(o.master, conf={"spark.sql.shuffle.partitions": "2", **o.conf}, app_name="ordq-verify-follow")
    clients = Clients.open(options)
    store, reader = clients.store, clients.reader
    spark.sparkContext.setLogLevel("ERROR")  # the running summary is the output; a failure ends in the verdict
    _quiet_stream_logs(spark)
    register(spark)
    # The credentials the driver reached the cluster with go to the executors with the job (a
    # cluster's workers have none of their own): the planner and every task read those copies.
    shipped = ship_credentials(spark, bootstrap=clients.bootstrap, root=o.root, credentials=clients.credentials)
    state = FollowState(o.queue)

    def emit(event: str) -> None:
        text = json.dumps(state.to_dict(event), sort_keys=True) if o.as_json else state.line()
        print(text, file=out, flush=True)

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()  # read from the brokers once, for both jobs below
        try:
            stats = batch.agg(F.count(F.lit(1)).alias("n"), F.min("seq").alias("lo"),
                              F.max(F.struct("seq", "seg", "offset")).alias("hi"),
                              F.max("timestamp").alias("ts")).collect()[0]
            if not stats.n:
                return
            found, carry = check_rows(spark, stream_rows(batch, o.queue), state.carry, o.queue, batch_id)
        finally:
            batch.unpersist()
        hi = stats.hi
        st, _ = store.load_state(o.queue)
        end = readable_end(reader, st, Cursor(seg=hi.seg, offset=hi.offset + 1, last_seq=hi.seq))
        with state.lock:
            state.batches += 1
            state.rows += stats.n
            state.first_seq = stats.lo if state.first_seq is None else state.first_seq
            state.last_seq, state.carry = hi.seq, carry
            state.lag_s = max(0.0, time.time() - stats.ts.timestamp())
            state.lag_messages = max(0, end.last_seq - hi.seq)
            state.violations.extend(found)
        emit("batch")

    scratch = None if o.checkpoint else tempfile.TemporaryDirectory(prefix="ordq-follow-")
    checkpoint = o.checkpoint or scratch.name  # type: ignore[union-attr]

    def start() -> Any:
        source = spark.readStream.format("ordq").options(**shipped)
        if o.until_seq is not None:  # no micro-batch reads past it: the query stops there
            source = source.option("untilSeq", str(o.until_seq))
        df = (source.option("queue", o.queue).option("start", o.start)
              .option("maxRowsPerBatch", str(o.max_rows_per_batch)).load())
        return (df.writeStream.foreachBatch(on_batch).option("checkpointLocation", checkpoint)
                .trigger(processingTime=f"{int(o.trigger_s * 1000)} milliseconds").start())

    query = start()
    state.started = time.monotonic()  # rows/s from here: Spark's start-up is not checking time
    if o.as_json:
        emit("started")
    else:
        print(f"following queue {o.queue!r} from {o.start} (at most {o.max_rows_per_batch:,} messages per "
              "micro-batch); Ctrl-C for the verdict", file=out, flush=True)
    deadline = None if o.until_s is None else time.monotonic() + o.until_s
    interrupted = threading.Event()
    # Ctrl-C sets a flag the loop reads: a KeyboardInterrupt inside a py4j call could leave
    # the gateway connection half-read, and the query must still be stopped cleanly.
    old_handler = (signal.signal(signal.SIGINT, lambda *_: interrupted.set())
                   if threading.current_thread() is threading.main_thread() else None)
    restarts = 0
    try:
        while True:
            while not _ended(query) and not interrupted.is_set():
                with state.lock:
                    if state.violations:
                        break
                    if o.until_seq is not None and state.last_seq is not None and state.last_seq >= o.until_seq:
                        break
                if deadline is not None and time.monotonic() >= deadline:
                    break
            _stop_between_batches(query)
            exc = query.exception()
            if (exc is None or not worker_late(exc) or restarts >= WORKER_RESTARTS or interrupted.is_set()
                    or (deadline is not None and time.monotonic() >= deadline)):
                break
            # Spark's streaming source starts a Python interpreter of its own, not from the
            # daemon, and waits a fixed 10 s for it to connect back (no setting changes it in
            # Spark 4): on a busy machine it can be late. The query resumes from its checkpoint.
            restarts += 1
            print(f"{PROG}: Spark's Python worker did not connect back within Spark's fixed 10 s (a busy "
                  f"machine); starting the query again from its checkpoint ({restarts}/{WORKER_RESTARTS})",
                  file=sys.stderr, flush=True)
            query = start()
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        query.stop()
        clients.close()
        if scratch is not None:
            scratch.cleanup()
    exc = query.exception()
    if exc is not None and not state.violations:
        text = late_worker_line(restarts + 1) if worker_late(exc) else _first_line(exc)
        if text.startswith("GapDetected"):  # the source met a missing seq while reading
            state.violations.append(Violation(cls="gap", count=1, seq=None, seq2=None, at=None, at2=None,
                                              batch=state.batches, text=text))
        else:
            state.error = text
    state.verdict = "violations" if state.violations else ("error" if state.error else "clean")
    if o.as_json:
        emit("verdict")
    else:
        for v in state.violations:
            print(f"VIOLATION {v.line()}", file=out)
        print(f"{state.verdict.upper()}: {state.line()}" + (f"; error: {state.error}" if state.error else ""),
              file=out, flush=True)
    return state


def _stop_between_batches(query: Any, wait_s: float = STOP_WAIT_S) -> None:
    """Stop the query once its running micro-batch (if any) is done, waiting at most
    ``wait_s``: stopped mid-batch, Spark interrupts the batch's job and prints a Java trace
    (and py4j a Python one) hundreds of lines long, for a stop that was asked for."""
    deadline = time.monotonic() + wait_s
    while query.isActive and time.monotonic() < deadline:
        try:
            if not query.status.get("isTriggerActive", False):
                break
        except Exception:  # noqa: BLE001 - the query ended meanwhile: nothing to wait for
            break
        time.sleep(0.05)
    query.stop()


def _ended(query: Any) -> bool:
    """Wait a little for the query to end (a failure is read from ``query.exception()``)."""
    try:
        return bool(query.awaitTermination(0.2))
    except StreamingQueryException:
        return True


def worker_late(exc: BaseException) -> bool:
    """Whether a failed query failed because a Python worker Spark started did not connect
    back in time (Spark's PythonWorkerFactory: a fixed 10 s wait)."""
    return any(m in str(exc) for m in _WORKER_LATE)


def late_worker_line(attempts: int) -> str:
    """The one line a query ends with when its Python worker was late ``attempts`` times."""
    return (f"Spark's Python worker did not connect back within Spark's fixed 10 s ({attempts} attempt"
            f"{'s' if attempts > 1 else ''}): the machine is too busy to start a Python interpreter in time "
            "(run again when it is less loaded)")


def _quiet_stream_logs(spark: SparkSession) -> None:
    """Spark's streaming engine logs a failed query's Java trace (25 lines and more) at ERROR:
    the verdict names the cause in one line, so those logs are off while following."""
    try:
        jvm: Any = spark._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming", jvm.org.apache.logging.log4j.Level.OFF)
    except Exception:  # noqa: BLE001 - another logging backend: the trace stays, the verdict is the same
        pass


def _first_line(exc: BaseException) -> str:
    """``GapDetected: message`` (or another ordq error: ``PermissionDenied: ...``) when the ordq
    source raised it (deep in the Java/Python traceback a failed query carries), else the
    failure's first line."""
    return failure_reason(exc)

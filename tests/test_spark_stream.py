"""ordq as a Spark Structured Streaming source (ordq/spark_source.py) on real brokers and
ZooKeeper: a queue written through a head-master kill -9, read by a streaming query into
Parquet that is stopped midway and restarted from its checkpoint, holds every acked seq
exactly once."""

from __future__ import annotations

import contextlib
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from ordq.common.errors import ConfigError, GapDetected
from ordq.common.proc import load_stretched
from ordq.coordinator.state import Cursor, QueueState, Segment, SegStatus
from ordq.coordinator.store import ZkStore
from ordq.sdk.replicas import ReplicaReader
from ordq.spark_source import SegmentRange, SourceOptions, capped_end, plan, read_range, register
from tests import spark_fixtures
from tests.cluster import FINISH_S, Cluster, cluster_fixture, wait_acked  # noqa: F401 - cluster_fixture
from tests.util import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.spark]
spark = spark_fixtures.spark

N = 9000
RATE = 3000.0


def test_a_streaming_query_reads_every_acked_seq_once_through_a_failover_and_a_restart(
        cluster: Cluster, spark: Any, tmp_path: Path) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    register(spark)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start_query(**trigger: Any) -> Any:
        df = (spark.readStream.format("ordq").option("zk", cluster.hosts).option("root", cluster.root)
              .option("queue", "q").load())
        return (df.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())

    def rows_read(query: Any) -> int:
        return sum(p["numInputRows"] for p in query.recentProgress)

    t0_us = time.time_ns() // 1000
    query = start_query(processingTime="200 milliseconds")
    producer = cluster.producer(n=N, rate=RATE)
    producer.start()
    try:
        wait_acked(producer, N // 3)
        cluster.head().master.kill()
        # Stop midway, once the query has read past the failover (the kill came at N/3 acked).
        wait_until(lambda: query.exception() is not None or rows_read(query) >= N // 2,
                   timeout_s=load_stretched(60), what="the query read half the queue")
        assert query.exception() is None
    finally:
        query.stop()
    first_run = rows_read(query)
    producer.join(FINISH_S)
    assert len(producer.acked) == N

    query = start_query(availableNow=True)  # from the checkpoint, to what is readable now
    try:
        assert query.awaitTermination(load_stretched(60)), "the restarted query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    # The restart read only what the first run had not: the checkpoint is the position.
    assert first_run + rows_read(query) == N, (first_run, rows_read(query))

    rows = spark.read.parquet(str(out)).selectExpr("seq", "payload", "seg", "unix_micros(timestamp) AS us").collect()
    seqs = sorted(r.seq for r in rows)
    assert len(rows) == N and seqs == list(range(N)), f"{len(rows)} rows, {len(set(seqs))} distinct seqs"
    t1_us = time.time_ns() // 1000
    assert all(t0_us <= r.us <= t1_us for r in rows)  # the producer's clock at send(), to the µs
    crcs = {a.seq: a.crc for a in producer.acked}
    assert all(zlib.crc32(r.payload) == crcs[r.seq] for r in rows)
    segs = sorted({r.seg for r in rows})
    assert len(segs) >= 2, (segs, cluster.state())  # the failover moved the queue to another segment


def test_spark_python_workers_import_pyspark_from_the_installed_package(spark: Any) -> None:
    """The streaming source's worker is a fresh interpreter per query that Spark waits a fixed
    10 s for. Imported from Spark's pyspark.zip (first on the workers' PYTHONPATH), pyspark is
    compiled anew at each start, 1.6-1.9 s of CPU against 0.5-0.65 s with the installed
    package's bytecode; beside six busy loops it connected back too late (issue 26)."""
    import pyspark

    where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert where == [pyspark.__file__]


def test_unknown_or_missing_options_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        SourceOptions.parse({"zk": "127.0.0.1:1", "queue": "q", "subscription": "s"})
    with pytest.raises(ConfigError, match="queue"):
        SourceOptions.parse({"zk": "127.0.0.1:1"})
    with pytest.raises(ConfigError):
        SourceOptions.parse({"zk": "127.0.0.1:1", "queue": "q", "start": "somewhere"})
    with pytest.raises(ConfigError, match="maxRowsPerBatch"):
        SourceOptions.parse({"zk": "127.0.0.1:1", "queue": "q", "maxRowsPerBatch": "0"})
    assert SourceOptions.parse({"zk": "z", "queue": "q", "MAXROWSPERBATCH": "7"}).max_rows_per_batch == 7
    with pytest.raises(ConfigError, match="bootstrap"):  # the cluster: its coordinators, or a registered name
        SourceOptions.parse({"queue": "q"})
    with pytest.raises(ConfigError):
        SourceOptions.parse({"bootstrap": "no-port", "queue": "q"})
    assert SourceOptions.parse({"bootstrap": "127.0.0.1:7100", "queue": "q"}).zk is None


def test_a_plan_cuts_segments_into_ranges_that_start_after_the_right_seq() -> None:
    # seg 0 sealed with seqs 0..119; seg 1 resent 110..119 then went on (open, first seq 110).
    st = QueueState("q", consume=(
        Segment(0, "g1", SegStatus.SEALED, end=120, first_seq=0, last_seq=119),
        Segment(1, "g2", SegStatus.OPEN),
    ), next_seg=2)
    start, end = Cursor(seg=0, offset=30, last_seq=29), Cursor(seg=1, offset=100, last_seq=209)
    got = [(r.segment.seg, r.first_offset, r.end_offset, r.after_seq)
           for r in plan(st, start, end, first_seqs={1: 110}, chunk_messages=50)]
    assert got == [(0, 30, 80, 29), (0, 80, 120, 79),
                   (1, 0, 50, 119), (1, 50, 100, 159)]  # the resent 110..119 are dropped, not read twice
    # Without a known first seq the open segment is read as one range.
    assert [(r.first_offset, r.end_offset) for r in plan(st, start, end, chunk_messages=50)][-1] == (0, 100)


def test_a_range_drops_seqs_already_read_and_refuses_a_gap(cluster: Cluster) -> None:
    """read_range on a real segment: seqs at or below ``after_seq`` are dropped (a resend
    after failover looks so), and a range that does not continue ``after_seq`` is a gap."""
    cluster.add_groups("g1")
    cluster.create_queue()
    producer = cluster.producer(n=100, rate=None)
    producer.start()
    producer.join(FINISH_S)
    segment = cluster.state().consume[0]
    with ZkStore.connect(cluster.hosts, cluster.root) as store, ReplicaReader(store) as reader:
        got = [seq for part in read_range(reader, SegmentRange("q", segment, 0, 100, 9)) for seq in part.seqs]
        assert got == list(range(10, 100))
        with pytest.raises(GapDetected):
            list(read_range(reader, SegmentRange("q", segment, 20, 100, 5)))


def test_a_row_cap_cuts_a_micro_batch_after_max_rows_stored_messages() -> None:
    st = QueueState("q", consume=(
        Segment(0, "g1", SegStatus.SEALED, end=120, first_seq=0, last_seq=119),
        Segment(1, "g2", SegStatus.OPEN),
    ), next_seg=2)
    start, end = Cursor(seg=0, offset=30, last_seq=29), Cursor(seg=1, offset=100, last_seq=209)
    assert capped_end(st, start, end, 50) == Cursor(seg=0, offset=80, last_seq=79)
    assert capped_end(st, start, end, 90) == Cursor(seg=1, offset=0, last_seq=119)  # seg 0 exactly
    # Into segment 1 (first seq 110: 10 resends): the cut's last seq counts them.
    assert capped_end(st, start, end, 100, {1: 110}) == Cursor(seg=1, offset=10, last_seq=119)
    assert capped_end(st, start, end, 120, {1: 110}) == Cursor(seg=1, offset=30, last_seq=139)
    # Segment 1's first seq unknown: it cannot be cut, so the batch ends before it.
    assert capped_end(st, start, end, 120) == Cursor(seg=1, offset=0, last_seq=119)
    assert capped_end(st, start, end, 10**6, {1: 110}) == end


@settings(max_examples=200, deadline=None)
@given(sizes=st_.lists(st_.integers(0, 40), min_size=1, max_size=5), resend=st_.integers(0, 5),
       skip=st_.integers(0, 40), cap=st_.integers(1, 150))
def test_a_capped_batch_plans_at_most_max_rows_and_its_cursor_matches_the_rows(
        sizes: list[int], resend: int, skip: int, cap: int) -> None:
    """Segments of ``sizes`` messages, each (but the first) starting with ``resend`` resends of
    the one before; the last is open. The capped end is a position whose planned ranges hold
    at most ``cap`` stored messages (exactly ``cap`` when the cap cuts) and whose last seq is
    the last seq of those messages."""
    segs, seq = [], 0
    for i, n in enumerate(sizes):
        first = max(0, seq - (resend if i else 0))
        last = first + n - 1
        sealed = i < len(sizes) - 1
        segs.append(Segment(i, "g1", SegStatus.SEALED if sealed else SegStatus.OPEN, end=n if sealed else None,
                            first_seq=first if sealed and n else None, last_seq=last if sealed and n else None))
        seq = max(seq, last + 1)
    state = QueueState("q", consume=tuple(segs), next_seg=len(sizes))
    # The true first seq of each segment (as the replicas know it).
    seq, true_first = 0, {}
    for i, n in enumerate(sizes):
        true_first[i] = max(0, seq - (resend if i else 0))
        seq = max(seq, true_first[i] + n)
    start_off = min(skip, sizes[0])
    start = Cursor(seg=0, offset=start_off, last_seq=true_first[0] + start_off - 1)
    end = Cursor(seg=len(sizes) - 1, offset=sizes[-1], last_seq=seq - 1)
    cut = capped_end(state, start, end, cap, true_first)
    planned = sum(r.end_offset - r.first_offset for r in plan(state, start, cut, first_seqs=true_first))
    total = sum(r.end_offset - r.first_offset for r in plan(state, start, end, first_seqs=true_first))
    assert planned == min(cap, total)
    # The cursor's last seq: the highest seq stored before the cut.
    stored = [true_first[s] + o for s in range(len(sizes)) for o in range(sizes[s])
              if (s, o) >= (start.seg, start.offset) and (s, o) < (cut.seg, cut.offset)]
    assert cut.last_seq == max([start.last_seq, *stored])


def test_max_rows_per_batch_caps_every_micro_batch_on_real_brokers(cluster: Cluster, spark: Any) -> None:
    """Admission control end to end: 1,000 stored messages in two segments read with
    ``maxRowsPerBatch`` 300 by an ``availableNow`` query: batches of at most 300 rows, every
    seq once."""
    cluster.add_groups("g1")
    cluster.create_queue()
    for _ in range(2):
        done = cluster.ordq("produce", "q", "--count", "500")
        assert done.returncode == 0, done.stderr.decode()
        assert cluster.ordq("queue", "roll", "q").returncode == 0
    register(spark)
    df = (spark.readStream.format("ordq").option("zk", cluster.hosts).option("root", cluster.root)
          .option("queue", "q").option("maxRowsPerBatch", "300").load())
    query = df.writeStream.format("memory").queryName("capped").trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(load_stretched(120)), f"not finished; batches so far: {query.recentProgress}"
        assert query.exception() is None
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [300, 300, 300, 100], sizes
    assert sorted(r.seq for r in spark.sql("SELECT seq FROM capped").collect()) == list(range(1000))


@settings(max_examples=200, deadline=None)
@given(sizes=st_.lists(st_.integers(0, 40), min_size=1, max_size=5), resend=st_.integers(0, 5),
       skip=st_.integers(0, 40), until=st_.integers(-1, 220))
def test_batches_cut_at_until_seq_end_exactly_there(sizes: list[int], resend: int, skip: int, until: int) -> None:
    """``untilSeq`` (``ordq verify --follow --until-seq``, issue 42: a big queue's first batch
    read its whole row cap and the run did not end in 5 minutes): batches cut by ``until_end``
    one after another never pass ``until``, and reach it when the queue holds it."""
    from ordq.spark_source import until_end

    segs, seq, true_first = [], 0, {}
    for i, n in enumerate(sizes):
        first = max(0, seq - (resend if i else 0))
        true_first[i] = first
        segs.append(Segment(i, "g1", SegStatus.SEALED if i < len(sizes) - 1 else SegStatus.OPEN,
                            end=n if i < len(sizes) - 1 else None,
                            first_seq=first if i < len(sizes) - 1 and n else None,
                            last_seq=first + n - 1 if i < len(sizes) - 1 and n else None))
        seq = max(seq, first + n)
    state = QueueState("q", consume=tuple(segs), next_seg=len(sizes))
    start_off = min(skip, sizes[0])
    at = Cursor(seg=0, offset=start_off, last_seq=true_first[0] + start_off - 1)
    end = Cursor(seg=len(sizes) - 1, offset=sizes[-1], last_seq=seq - 1)
    for _ in range(sum(sizes) + 2):
        cut = until_end(state, at, end, until, true_first)
        assert cut.last_seq <= max(until, at.last_seq)
        if cut == at:
            break
        at = cut
    assert at.last_seq == max(min(until, end.last_seq), true_first[0] + start_off - 1)


def test_credentials_shipped_with_the_job_are_what_the_query_reads_with(cluster: Cluster, spark: Any) -> None:
    """``ship_credentials`` (issue 44): the token travels as a file of the job (SparkFiles), so
    with tokens enforced a query whose options name only the shipped files reads the queue (the
    host's registered credentials hold no token: without the shipped one every call is refused);
    a wrong token fails the query, and ``failure_reason`` gives the refusal in one line."""
    import json

    import attrs
    from pyspark.errors import StreamingQueryException

    from ordq.spark_source import failure_reason, ship_credentials

    cluster.add_groups("g1")
    cluster.create_queue()
    done = cluster.ordq("produce", "q", "--count", "300")
    assert done.returncode == 0, done.stderr.decode()
    created = cluster.ordq("--json", "auth", "create", "--role", "consume:q")  # tokens enforced from here
    assert created.returncode == 0, created.stderr.decode()
    token = json.loads(created.stdout)["token"]
    register(spark)

    def run(credentials: Any, name: str) -> Any:
        options = ship_credentials(spark, bootstrap=cluster.bootstrap, credentials=credentials)
        assert options["credentialsFrom"] == "job" and options["tokenFile"].startswith("ordq-")
        assert token not in json.dumps(options)  # the token is in no option: in a shipped file
        df = spark.readStream.format("ordq").options(**options).option("queue", "q").load()
        query = df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
        try:
            with contextlib.suppress(StreamingQueryException):
                assert query.awaitTermination(load_stretched(120)), f"not finished: {query.recentProgress}"
        finally:
            query.stop()
        return query

    good = run(attrs.evolve(cluster.credentials, token=token), "shipped")
    assert good.exception() is None, failure_reason(good.exception())
    assert sorted(r.seq for r in spark.sql("SELECT seq FROM shipped").collect()) == list(range(300))
    bad = run(attrs.evolve(cluster.credentials, token="ordq_00000000_" + "A" * 43), "refused")
    assert bad.exception() is not None
    reason = failure_reason(bad.exception())
    assert reason.startswith("PermissionDenied: permission denied") and "\n" not in reason, reason

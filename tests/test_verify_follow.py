"""``ordq verify --follow`` (spark_order_check/follow.py): the ordering checks on a live queue.

The rule code (``_checks.instance_findings``) on micro-batches with the carried last row, and
the command on real brokers and ZooKeeper (both ``slow``; docs/CLI.md runs the command on a
real cluster in the default run): clean through a head-master kill -9, and a segment dropped
by retention before the query read it (a real gap) flagged with exit 1."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ordq.coordinator import state as sm
from ordq.coordinator.store import ZkStore
from ordq.spark_order_check.follow import OFFSET_BITS, Violation, check_rows
from tests import spark_fixtures
from tests.cluster import FINISH_S, Cluster, cluster_fixture, wait_acked  # noqa: F401 - cluster_fixture
from tests.util import C1_JVM_FLAGS

pytestmark = [pytest.mark.spark]
spark = spark_fixtures.spark


def _rows(spark: Any, stored: list[tuple[int, int, int]]) -> Any:
    """(seg, offset, seq) rows as the source gives them."""
    return spark.createDataFrame([(seq, seg, off) for seg, off, seq in stored], "seq long, seg long, offset long")


def _check(spark: Any, stored: list[tuple[int, int, int]], carry: tuple[int, int] | None = None
           ) -> tuple[dict[str, Violation], tuple[int, int] | None]:
    from ordq.spark_order_check.follow import stream_rows

    found, new = check_rows(spark, stream_rows(_rows(spark, stored), "q"), carry, "q", 7)
    return {v.cls: v for v in found}, new


def test_the_rules_flag_duplicates_gaps_and_reorder_within_and_across_batches(spark: Any) -> None:
    clean, carry = _check(spark, [(0, o, o) for o in range(5)])
    assert clean == {} and carry == (4, 4)
    # The next batch continues seq 4 at 0:4: a clean boundary, then the carry moves on.
    clean, carry = _check(spark, [(1, 0, 5), (1, 1, 6)], carry)
    assert clean == {} and carry == (6, 1 << OFFSET_BITS | 1)
    # A gap across the boundary (7 missing), a duplicate and a reorder inside the batch.
    found, _ = _check(spark, [(1, 2, 8), (1, 3, 9), (1, 4, 9), (1, 6, 10), (1, 5, 11)], carry)
    assert sorted(found) == ["duplicate", "gap", "out_of_order"]
    assert (found["gap"].seq, found["gap"].seq2, found["gap"].at, found["gap"].at2) == (7, 7, "1:1", "1:2")
    assert (found["duplicate"].seq, found["duplicate"].batch) == (9, 7)
    assert (found["out_of_order"].seq, found["out_of_order"].seq2, found["out_of_order"].at2) == (10, 11, "1:5")
    # A batch that re-reads the carried seq (a duplicate across the boundary) and one that
    # goes back in storage order across it.
    assert list(_check(spark, [(1, 2, 6)], carry)[0]) == ["duplicate"]
    assert list(_check(spark, [(0, 9, 7)], carry)[0]) == ["out_of_order"]


def _follow(cluster: Cluster, *args: str) -> subprocess.Popen[bytes]:
    return cluster.ordq_piped("verify", "--follow", "q", "--json", "--trigger", "0.3", "--master", "local[1]",
                              "--conf", f"spark.driver.extraJavaOptions={C1_JVM_FLAGS}", *args)


def _events(proc: subprocess.Popen[bytes], timeout_s: float = 180) -> tuple[int, list[dict[str, Any]], str]:
    out, err = proc.communicate(timeout=timeout_s)
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return proc.returncode, events, err.decode()[-3000:]


N = 6000


@pytest.mark.zk
@pytest.mark.slow  # a Spark start in a subprocess and several micro-batches: ~75 s on the shared box
def test_follow_is_clean_through_a_head_master_kill(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    proc = _follow(cluster, "--until-seq", str(N - 1), "--max-rows-per-batch", "2000")
    assert proc.stdout is not None
    started = json.loads(proc.stdout.readline() or "{}")  # the query runs: write while it reads
    assert started.get("event") == "started", (started, proc.poll())
    producer = cluster.producer(n=N, rate=1500.0)
    producer.start()
    wait_acked(producer, N // 3)
    cluster.head().master.kill()
    producer.join(FINISH_S)
    assert len(producer.acked) == N
    rc, events, err = _events(proc)
    assert rc == 0, err
    verdict = events[-1]
    assert verdict["event"] == "verdict" and verdict["verdict"] == "clean", verdict
    assert (verdict["rows"], verdict["first_seq"], verdict["last_seq"], verdict["violations"]) == (N, 0, N - 1, [])
    batches = [e for e in events if e["event"] == "batch"]
    assert len(batches) >= 3 and all(b["rows"] > a["rows"] for a, b in zip(batches, batches[1:], strict=False))
    # Admission control held: no micro-batch took more than 2,000 rows.
    assert max(b["rows"] - a["rows"] for a, b in zip([{"rows": 0}, *batches], batches, strict=False)) <= 2000
    assert len(cluster.state().consume) >= 2  # the kill moved the queue to another segment


def _produce(cluster: Cluster, n: int) -> None:
    done = cluster.ordq("produce", "q", "--count", str(n))
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.zk
@pytest.mark.slow  # three Spark starts in subprocesses: ~70 s on the shared box
def test_follow_flags_a_segment_dropped_before_it_was_read_and_stops_clean_on_ctrl_c(
        cluster: Cluster, tmp_path: Path) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    checkpoint = str(tmp_path / "checkpoint")
    _produce(cluster, 100)  # seqs 0..99 in segment 0
    proc = _follow(cluster, "--checkpoint", checkpoint)
    assert proc.stdout is not None
    for line in proc.stdout:  # the first run checks 0..99, then waits for more: Ctrl-C
        event = json.loads(line)
        if event["event"] == "batch" and event["last_seq"] == 99:
            break
    proc.send_signal(signal.SIGINT)
    rc, events, err = _events(proc)
    assert rc == 0, err
    assert (events[-1]["verdict"], events[-1]["rows"], events[-1]["last_seq"]) == ("clean", 100, 99), events[-1]
    # Two more segments; the first of them is dropped by retention before anyone read it.
    # A third roll seals segment 2 with its messages: a segment holding the queue's newest
    # message is kept until a later one is known stored (state.holds_newest), so segment 1 may
    # go only once segment 2 shows 200..299 sealed (without it the pop was refused).
    for _ in range(2):
        assert cluster.ordq("queue", "roll", "q").returncode == 0
        _produce(cluster, 100)
    assert cluster.ordq("queue", "roll", "q").returncode == 0
    with ZkStore.connect(cluster.hosts, cluster.root) as store:
        store.apply("q", lambda s, f: sm.pop(s, f, retention=True))  # segment 0 (read)
        store.apply("q", lambda s, f: sm.pop(s, f, retention=True))  # segment 1: seqs 100..199, unread
    assert cluster.state().consume[0].seg == 2
    rc, events, err = _events(_follow(cluster, "--checkpoint", checkpoint))
    assert rc == 1, err
    verdict = events[-1]
    assert verdict["verdict"] == "violations" and [v["cls"] for v in verdict["violations"]] == ["gap"]
    assert "expected seq 100, got 200" in verdict["violations"][0]["text"], verdict


def test_a_late_python_worker_is_named_in_one_line() -> None:
    """Spark's fixed 10 s wait for its Python worker (a busy machine): recognised, so the query
    is started again from its checkpoint, and said in one line once that is exhausted."""
    from ordq.spark_order_check.follow import late_worker_line, worker_late

    trace = ("org.apache.spark.SparkException: Python worker failed to connect back.\n"
             "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker(PythonWorkerFactory.scala:252)\n"
             "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python worker to connect "
             "back\n" + "\tat java.base/Thread.run(Thread.java:840)\n" * 20)
    assert worker_late(RuntimeError(trace))
    line = late_worker_line(4)
    assert "\n" not in line and "did not connect back within Spark's fixed 10 s (4 attempts)" in line
    assert not worker_late(RuntimeError("GapDetected: seq 5 missing"))


@pytest.mark.zk
@pytest.mark.slow  # a Spark start in a subprocess and a 12 s late worker: ~90 s on the shared box
def test_follow_survives_a_python_worker_that_connects_back_late(cluster: Cluster, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The streaming source's own Python worker starting 12 s late the first time (Spark waits
    a fixed 10 s; a busy machine): the query is started again from its checkpoint and checks
    every row, and no Java trace is printed (failed on the old code: error, a 25-line trace)."""
    import sys

    mark, wrapper = tmp_path / "late-once", tmp_path / "python"
    wrapper.write_text("#!/bin/sh\ncase \"$*\" in *python_streaming_source_runner*)\n"
                       f"  if [ ! -e {mark} ]; then touch {mark}; sleep 12; fi;;\nesac\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(wrapper))  # what Spark starts its Python workers with
    cluster.add_groups("g1")
    cluster.create_queue()
    _produce(cluster, 100)
    rc, events, err = _events(_follow(cluster, "--until-seq", "99", "--until", "240s"), timeout_s=400)
    assert mark.exists()  # the late start happened
    assert rc == 0, err
    assert (events[-1]["verdict"], events[-1]["rows"], events[-1]["last_seq"]) == ("clean", 100, 99), events[-1]
    assert "starting the query again from its checkpoint (1/3)" in err
    assert "MicroBatchExecution" not in err and "\tat org.apache.spark" not in err


@pytest.mark.zk
@pytest.mark.slow  # a Spark start in a subprocess: ~60 s on the shared box
def test_follow_until_seq_stops_at_that_seq_on_a_queue_holding_more(cluster: Cluster) -> None:
    """Issue 42: ``--until-seq 1000`` on a big queue did not finish in 5 minutes: the first
    micro-batch read the whole row cap (200,000 by default) before the seq was looked at. No
    batch reads past the seq now: the verdict covers exactly seqs 0..until."""
    cluster.add_groups("g1")
    cluster.create_queue()
    _produce(cluster, 5000)
    rc, events, err = _events(_follow(cluster, "--until-seq", "1000"), timeout_s=400)
    assert rc == 0, err
    verdict = events[-1]
    assert verdict["event"] == "verdict" and verdict["verdict"] == "clean", verdict
    assert (verdict["rows"], verdict["first_seq"], verdict["last_seq"]) == (1001, 0, 1000), verdict

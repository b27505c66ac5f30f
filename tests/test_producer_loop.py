"""The producer's event loop (ordq/common/loop.py, sdk/_producer_io.py): what runs where, and what a
send costs the loop. Failover over the loop is in test_failover.py and test_producer_leader.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ordq.common.loop import LoopThread
from ordq.common.proc import load_stretched
from ordq.sdk import BatchingConfig, Producer, ProducerConfig
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import wait_until


def test_loop_thread_runs_coroutines_callbacks_and_blocking_steps_and_stops_clean() -> None:
    lt = LoopThread("ordq-test-loop")
    lt.start()
    seen: list[str] = []
    done = threading.Event()

    async def where() -> str:
        blocking = await lt.run_blocking(lambda: threading.current_thread().name)
        return f"{threading.current_thread().name} {blocking.startswith('ordq-test-loop-blocking')}"

    assert lt.run(where(), 5) == "ordq-test-loop True"
    lt.call_soon(lambda: (seen.append(threading.current_thread().name), done.set()))
    assert done.wait(5) and seen == ["ordq-test-loop"]
    stuck = asyncio.run_coroutine_threadsafe(asyncio.sleep(3600), lt.loop)
    lt.stop()
    assert stuck.cancelled()
    assert lt.loop.is_closed()
    assert not any(t.name == "ordq-test-loop" for t in threading.enumerate())
    lt.stop()  # idempotent
    # A thread that finishes after stop (a producer's roll answered after close) hands its
    # result to a closed loop: dropped, not a RuntimeError that kills that thread.
    lt.call_soon(seen.append, "after stop")
    assert seen == ["ordq-test-loop"]


@pytest.fixture(name="queue")
def queue_fixture(cluster: Cluster) -> Cluster:
    cluster.add_groups("g1")
    cluster.create_queue()
    return cluster


def ordq_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("ordq-producer")}


@pytest.mark.zk
def test_sends_wake_the_loop_at_most_once_per_batch(queue: Cluster) -> None:
    cfg = ProducerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q",
                         batching=BatchingConfig(linger_ms=20, max_batch_messages=50))
    with Producer(cfg) as p:
        assert ordq_threads() == {"ordq-producer"}  # one loop; no sender or ack-reader threads
        loop = p._loop  # noqa: SLF001 - counting its wake-ups
        assert loop is not None
        wakes = 0
        call_soon = loop.call_soon

        def counting(fn: object, *args: object) -> None:
            nonlocal wakes
            wakes += 1
            call_soon(fn, *args)  # type: ignore[arg-type]

        loop.call_soon = counting  # type: ignore[method-assign]
        futures = [p.send(b"m%d" % i) for i in range(5000)]
        p.flush(30)
        assert [f.result(0).seq for f in futures] == list(range(5000))
        batches = p.statistics().batches_acked
        assert batches >= 100  # max_batch_messages
        assert wakes <= batches + 1  # + flush()'s

    assert not ordq_threads()


@pytest.mark.zk
def test_a_lone_send_on_an_idle_pipe_goes_at_once_not_after_linger(queue: Cluster) -> None:
    cfg = ProducerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q",
                         batching=BatchingConfig(linger_ms=60_000))
    with Producer(cfg) as p:
        for i in range(20):
            assert p.send(b"lone %d" % i).result(10).seq == i  # a minute of linger would time out


@pytest.mark.zk
def test_a_batch_opened_behind_the_one_in_flight_goes_at_its_linger_not_at_the_ack(queue: Cluster) -> None:
    """Issue 39 (the e2e p99's first stage, P.open -> P.take): with one batch in flight
    (``eager_batches`` 1) a batch opened later goes when its linger is up, a second one in
    flight, as the pipelined mode has several. Before, nothing armed its linger timer (the loop
    had pumped with nothing open, and ``send()`` wakes it only for a batch due at once), so it
    waited for the first one's ack however late: the tail's +7-12 ms in that stage. Here the
    head's slave is stopped, so no ack comes while the test looks."""
    cfg = ProducerConfig(zk_hosts=queue.hosts, root=queue.root, queue="q", send_timeout_s=60.0,
                         batching=BatchingConfig(linger_ms=20))
    with Producer(cfg) as p:
        p.send(b"warm").result(30)
        core, stream = p._core, p._stream  # noqa: SLF001 - the in-flight count and the stream
        assert core is not None and stream is not None
        slave = queue.head().slave
        slave.pause()
        try:
            first = p.send(b"first")  # an idle pipe: handed out at once
            wait_until(lambda: core.inflight_batches == 1, timeout_s=10, what="the first batch in flight")
            second = p.send(b"second")
            # (Within the slave's ZooKeeper session, ~1 s: then the head is failed over.)
            wait_until(lambda: core.inflight_batches == 2 and p._stream is stream,  # noqa: SLF001
                       timeout_s=load_stretched(0.5), interval_s=0.005,
                       what="the second batch handed out at its 20 ms linger, while the first awaits its ack")
        finally:
            slave.resume()
        assert second.result(30).seq == first.result(30).seq + 1

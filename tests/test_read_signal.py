"""A reader or a produce stream waits on its own segment (issue 39): a Fetch long poll or a
Read stream waiting for data, and a produce stream waiting for acks, are woken by the LAC moves
of the segment they wait on and by the broker's other changes (a seal, a removal, a corrupt
copy, a failed link, a stop: ``Shared.changed``), never by another queue's LAC moves. Until
then the broker had one signal: beside a producer at 2,000 msgs/s on one queue, every caught-up
reader and every produce stream of every other queue woke hundreds of times a second.

The first test runs a real read path over a segment log on disk in this process
(bench/bench_read_answers.py); the second real broker processes (a master and its slave) and
real ZooKeeper, the master's wake-ups read from its counters."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import pytest

from bench.bench_read_answers import QUEUE, stream_bench
from ordq.common.security import channel as security_channel
from ordq.sdk import Producer, ProducerConfig
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.framing import GRPC_OPTIONS
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import wait_until


async def _until(cond: object, timeout_s: float = 10.0) -> None:
    """On the loop: until ``cond()`` holds (it is made true by the loop's other tasks)."""
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.001)


def test_a_long_poll_wakes_for_its_own_segment_and_every_broker_change_never_for_another_queues_lac() -> None:
    with stream_bench() as bench:
        shared, segment = bench.shared, bench.segment
        stats = shared.stats

        def waiting() -> bool:
            return segment.lac_signal is not None and bool(segment.lac_signal._waiters)  # noqa: SLF001

        async def run() -> None:
            loop = asyncio.get_running_loop()
            ask = pb.FetchRequest(queue=QUEUE, seg=0, offset=0, max_bytes=1 << 20, max_wait_ms=20_000, known_end=-1)
            poll = loop.create_task(bench.read.fetch(ask))
            await _until(waiting)
            # 500 LAC moves of another queue on this broker: the reader sleeps through them.
            for _ in range(500):
                bench.neighbour_moved()
                await asyncio.sleep(0)
            assert stats.read_wakeups == 0, f"woken {stats.read_wakeups} times by another queue's acks"
            assert not poll.done()
            # Its own segment's LAC moves: answered at once, after one wake-up.
            bench.add_batch(4, 100)
            answer = await asyncio.wait_for(poll, 5)
            assert answer.batches and stats.read_wakeups == 1

            # Nothing comes: the poll ends at its own deadline (its one wake-up).
            ask.offset, ask.max_wait_ms = answer.end_offset, 200
            t0 = time.monotonic()
            empty = await asyncio.wait_for(bench.read.fetch(ask), 5)
            assert not empty.batches and time.monotonic() - t0 >= 0.19 and stats.read_wakeups == 2

            # A broker-wide change still wakes every reader (it looks again and waits on).
            ask.max_wait_ms = 20_000
            poll = loop.create_task(bench.read.fetch(ask))
            await _until(waiting)
            with shared.cv:
                shared.changed()
            await _until(lambda: stats.read_wakeups == 3)
            await _until(waiting)
            assert not poll.done()
            # A seal (told with ``changed``, as Control.seal does) ends the poll: the sealed end.
            with shared.cv:
                segment.replica.seal()
                shared.changed()
            sealed = await asyncio.wait_for(poll, 5)
            assert sealed.sealed and not sealed.batches and stats.read_wakeups == 4

        shared.loop.run(run(), 60)


def test_a_lac_move_wakes_the_streams_owed_its_acks_before_its_readers() -> None:
    """Issue 39: the loop runs woken waiters in the order they were woken. With one signal for
    both, a LAC move woke the segment's readers and its produce streams in a set's order, and
    a reader woken ahead read and sent its answer before the ack went. Now a produce stream's
    wait (``segment_signals(acks=True)``) is woken first: here one such waiter beside 20
    readers', the order they resume in recorded."""
    from ordq.common.loop import Alarm

    with stream_bench() as bench:
        shared, segment = bench.shared, bench.segment
        order: list[str] = []

        async def wait(kind: str) -> None:
            alarm = Alarm()
            try:
                with shared.cv:
                    signals = shared.segment_signals(segment, acks=kind == "ack")
                assert await alarm.wait(time.monotonic() + 10, *signals)
                order.append(kind)
            finally:
                alarm.close()

        async def run() -> None:
            loop = asyncio.get_running_loop()
            tasks = [loop.create_task(wait("reader")) for _ in range(10)]
            tasks.append(loop.create_task(wait("ack")))
            tasks += [loop.create_task(wait("reader")) for _ in range(10)]
            await asyncio.sleep(0)  # every one waits now
            with shared.cv:
                shared.lac_moved([segment])
            await asyncio.wait_for(asyncio.gather(*tasks), 10)

        shared.loop.run(run(), 30)
        assert order[0] == "ack" and order.count("reader") == 20, order


@pytest.mark.zk
def test_a_read_stream_and_produce_streams_of_one_queue_sleep_through_a_neighbour_queues_acks_on_a_real_master(
        cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("a", ["g1"])
    cluster.create_queue("b", ["g1"])
    config = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="a", credentials=cluster.credentials)

    def send_a() -> None:
        with Producer(config) as p:
            p.send(b"a").result(30)

    send_a()  # a's segment on the master, one message
    address = cluster.store.live_members("g1")["master"].address
    assert address is not None

    def stats() -> dict:
        return dict(json.loads(cluster.transport.health(address).stats_json))

    ch = security_channel(address, cluster.credentials, GRPC_OPTIONS)
    idle_writes: list[queue.SimpleQueue[pb.ProduceRequest | None]] = []
    held: list[object] = []  # the idle produce calls (a dropped call object is cancelled)
    try:
        # 10 produce streams of a, open and never written (as the noisy-neighbour drill's abuser's)
        for _ in range(10):
            requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
            idle_writes.append(requests)
            held.append(pb_grpc.BrokerStub(ch).Produce(iter(requests.get, None), timeout=60))
        wait_until(lambda: stats()["produce_wakeups"] >= 10, timeout_s=10, what="the idle produce streams waiting")
        before = stats()
        # A caught-up reader of a: a Read stream at a's end, long-polling (20 s).
        stream = pb_grpc.BrokerStub(ch).Read(pb.FetchRequest(queue="a", seg=0, offset=1, max_bytes=1 << 20,
                                                              max_wait_ms=20_000, known_end=-1, stream_ms=20_000),
                                             timeout=60)
        wait_until(lambda: stats()["fetches"] > before["fetches"], timeout_s=10, what="the stream waiting on a")
        waiting = stats()
        # A neighbour producer on b, one batch at a time: each ack is a LAC move of b.
        neighbour = cluster.producer(n=400, queue="b", writer="B", rate=400)
        t_load = time.monotonic()
        neighbour.start()
        neighbour.join(60)
        assert len(neighbour.acked) == 400 and neighbour.error is None
        after = stats()
        elapsed = time.monotonic() - t_load
        moves = after["ack_writes"] - waiting["ack_writes"]
        woken = after["read_wakeups"] - waiting["read_wakeups"]
        produce_woken = after["produce_wakeups"] - waiting["produce_wakeups"]
        print(f"b's produce answers (LAC moves) {moves} in {elapsed:.1f} s; a's reader woken {woken} times; "
              f"produce streams woken {produce_woken} times")
        assert moves >= 100, f"the neighbour's acks came in {moves} answers: too few to tell"
        # A few broker-wide changes (the neighbour's stream opening and ending) wake it; b's LAC moves do not.
        assert woken <= 10, f"a's reader woke {woken} times during {moves} LAC moves of b"
        # b's own stream wakes at its segment's LAC moves (1-2 a batch: the slave's answer, the
        # master's sync); a's 10 idle streams only at their 1 s recheck. Before: each of the 11
        # at every LAC move of any queue.
        assert produce_woken <= 3 * moves + 10 * (elapsed + 2), \
            f"produce streams woke {produce_woken} times during {moves} LAC moves of b"
        assert after["produce_late_acks"] == 0, "a produce stream found acks due only at its recheck"

        # a's own LAC moves: the stream answers at once.
        got: list[pb.FetchResponse] = []
        reader = threading.Thread(target=lambda: got.append(next(stream)), daemon=True)
        reader.start()
        t0 = time.monotonic()
        send_a()
        reader.join(20)
        assert got and got[0].batches, "the reader of a got a's new message"
        assert time.monotonic() - t0 < 15, "answered at the LAC move, not at the long poll's end"
        stream.cancel()
    finally:
        for requests in idle_writes:
            requests.put(None)
        ch.close()

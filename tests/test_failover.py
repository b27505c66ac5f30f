"""Broker faults under continuous load (DESIGN §6), on real broker processes and ZooKeeper.

Each test runs a producer and a consumer (threads here: the fault hits brokers) at the same
time, injects the fault once a share of the messages was acked, and then checks with
``tests.order_check``: the consumer received seq 0..N-1 exactly once and in order, every acked
seq among them, payloads intact. No coordinator daemon runs: producers and consumers fail
over, seal and pop on their own.
"""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoNodeError

from ordq.broker_group import lean_link
from ordq.common.errors import OrdqError
from ordq.coordinator.state import SegStatus
from ordq.wire import lean_produce
from ordq.wire.batch import Message, encode_batch
from ordq.wire.errors import SegmentNotWritable
from ordq.wire.lean_produce import LeanProduceStream
from tests.cluster import (  # noqa: F401 - cluster_fixture
    FINISH_S,
    LOAD_RATE,
    Cluster,
    LoadConsumer,
    LoadProducer,
    cluster_fixture,
    finish,
    start_load,
    wait_acked,
)
from tests.order_check import check_delivery, read_audit
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 16_000  # messages per default test: ~4 s of load at LOAD_RATE


@pytest.fixture(name="links", params=["grpc", pytest.param("lean", marks=pytest.mark.heavy)])
def links_fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The data path's two internal hops: both lean links (the default since issue 39, fast39k)
    or gRPC (what clients fall back to, and older peers speak): ``ORDQ_PRODUCE_LINK`` and
    ``ORDQ_REPLICATION_LINK`` set for the brokers this test starts, which inherit it, and for its
    producer and consumer. The lean variants are in the end-to-end tier (the default one is near
    its time budget); every other test of the default tier takes the lean links."""
    monkeypatch.setenv(lean_produce.ENV, request.param)
    monkeypatch.setenv(lean_link.ENV, request.param)
    return str(request.param)


def check_links(cluster: Cluster, producer: LoadProducer, links: str) -> None:
    """The run took the links asked for: the producer's stream, the links the brokers publish."""
    stream = producer._producer._stream if producer._producer is not None else None  # noqa: SLF001
    if stream is not None:
        assert isinstance(stream, LeanProduceStream) == (links == "lean"), type(stream)
        assert getattr(stream, "fell_back", None) is None, "the producer reached its master's lean link"
    for gid in cluster.groups:
        for role, published in (("master", "produce"), ("slave", "replication")):
            try:
                node = json.loads(cluster.store.client.get(cluster.paths.live(gid, role))[0])
            except NoNodeError:
                continue  # killed
            assert bool(node.get(published)) == (links == "lean"), (gid, role, node)


def check_run(cluster: Cluster, producer: LoadProducer, consumer: LoadConsumer, n: int) -> None:
    """The order check over what the threads saw, and over the SDK's audit files (what the
    Spark verifier reads): both must find seq 0..n-1, every acked one, once and in order."""
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == n
    acked, instances = read_audit(cluster.base / "audit", "s")
    assert check_delivery(acked, instances) == summary


def open_seg(cluster: Cluster) -> int:
    seg = cluster.state().open_segment
    assert seg is not None
    return seg.seg


def assert_sealed_or_popped(cluster: Cluster, seg: int) -> None:
    s = cluster.state().segment(seg)
    assert s is None or s.status is SegStatus.SEALED, f"segment {seg} is {s}"


def test_head_master_killed(cluster: Cluster, links: str) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N)
    wait_acked(producer, N // 4)
    check_links(cluster, producer, links)
    seg0 = open_seg(cluster)
    cluster.head().master.kill()
    finish(producer, consumer)

    check_run(cluster, producer, consumer, N)
    assert producer.stats is not None and producer.stats.failovers >= 1
    assert producer.stats.head == "g2"
    assert_sealed_or_popped(cluster, seg0)  # sealed from the slave (its master is dead)


def test_head_slave_killed(cluster: Cluster, links: str) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N)
    wait_acked(producer, N // 3)
    check_links(cluster, producer, links)
    seg0 = open_seg(cluster)
    cluster.head().slave.kill()
    finish(producer, consumer)

    check_run(cluster, producer, consumer, N)
    assert producer.stats is not None and producer.stats.failovers >= 1
    assert_sealed_or_popped(cluster, seg0)  # sealed from the master


def test_both_processes_of_head_group_killed(cluster: Cluster) -> None:
    """Producers fail over and go on; the consumer waits at the dead group's segment until
    one of its processes returns, then finishes."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N)
    wait_acked(producer, N // 4)
    seg0 = open_seg(cluster)
    g1 = cluster.head()
    # Both at once (hung first, then killed): were the slave to outlive the master by a few
    # ms, the producer's failover could seal segment 0 from it first, a different fault.
    g1.master.pause()
    g1.slave.pause()
    g1.master.kill()
    g1.slave.kill()

    producer.join(FINISH_S)  # the producer does not wait for the dead group
    assert producer.stats is not None and producer.stats.failovers >= 1
    assert len(producer.acked) == N
    # The consumer cannot pass segment 0 (nobody can read it, nobody can seal it) ...
    stats = consumer.statistics()
    assert stats is not None and stats.seg == seg0, stats
    assert consumer.alive() and consumer.last_seq() < N - 1
    st = cluster.state()
    seg = st.segment(seg0)
    assert seg is not None and seg.status is SegStatus.SEALING, st

    # ... until one process returns: then it seals the segment, drains it, and moves on.
    cluster.restart(g1.slave)
    cluster.restart(g1.master)
    consumer.join(FINISH_S)
    check_run(cluster, producer, consumer, N)
    assert_sealed_or_popped(cluster, seg0)


def test_every_group_lost_in_turn_then_one_returns(cluster: Cluster) -> None:
    """Both heads' masters are killed in turn: the producer has no writable group and waits.
    Once a master returns and its group's backlog is consumed, the producer itself admits the
    group again (no daemon runs) and the stream completes."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N)
    wait_acked(producer, N // 4)
    g1 = cluster.head()
    g1.master.kill()
    cluster.wait_state(lambda s: s.head == "g2", what="the producer to fail over to g2")
    wait_acked(producer, N // 2)
    cluster.groups["g2"].master.kill()
    cluster.wait_state(lambda s: not s.send, what="the producer to fail over from g2 too")
    acked = len(producer.acked)
    cluster.restart(g1.master)
    cluster.wait_state(lambda s: s.head == "g1", timeout_s=60, what="g1 admitted again once drained")
    wait_acked(producer, acked + 1000)
    finish(producer, consumer)
    check_run(cluster, producer, consumer, N)


def test_head_master_hung_then_resumed(cluster: Cluster, links: str) -> None:
    """SIGSTOP the head master past the send deadline: the producer fails over; once resumed,
    the old master refuses writes to its old segment and reconciles it to the sealed end."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    cluster.store.create_subscription("q", "idle")  # keeps segment 0 from being popped
    producer, consumer = start_load(cluster, N)
    wait_acked(producer, N // 4)
    check_links(cluster, producer, links)
    seg0 = open_seg(cluster)
    g1 = cluster.head()
    g1.master.pause()
    try:
        # hung for longer than the send deadline: the producer moved on to g2 and writes there
        wait_until(lambda: (s := producer.statistics()) is not None and s.failovers >= 1 and s.head == "g2",
                   timeout_s=30, interval_s=0.02, what="the producer to fail over")
        moved_at = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= moved_at + 1000 or producer.error, timeout_s=30,
                   interval_s=0.02, what="acks from the new head")
    finally:
        g1.master.resume()
    finish(producer, consumer)
    check_run(cluster, producer, consumer, N)

    zk_seg = cluster.state().segment(seg0)
    assert zk_seg is not None and zk_seg.status is SegStatus.SEALED and zk_seg.end is not None, zk_seg
    address = g1.master.address
    assert address is not None

    def reconciled() -> bool:
        info = cluster.transport.segment_info(address, "q", seg0)
        return info.sealed and info.end == zk_seg.end

    wait_until(reconciled, timeout_s=30, interval_s=0.05, what=f"old master reconciles segment {seg0}")
    st = cluster.state()
    # Fenced: the resumed master refuses any further write to its old segment.
    batch = encode_batch([Message(payload=b"late")], epoch=st.producer_epoch, first_seq=N)
    # with the producer's own epoch key (the claim's secret): refused for the segment, not the key
    key = producer._producer._epoch_key if producer._producer is not None else ""
    stream = cluster.transport.open_produce(address, "q", seg0, st.producer_epoch, key)
    try:
        stream.send([batch])
        with pytest.raises(OrdqError) as refused:
            for ack in stream.acks():
                raise AssertionError(f"the old master acked a late write: {ack}")
        assert isinstance(refused.value, SegmentNotWritable), refused.value
    finally:
        stream.close()


def test_two_subscriptions_at_different_speeds(cluster: Cluster) -> None:
    """A fast and a slow subscription each get the whole ordered stream across a failover;
    a segment is dropped only once both passed it. The slow one is held inside segment 0 until
    the fast one is done: paced alone, on a loaded machine it kept up with the slowed producer
    and passed segment 0 first (the test then proved nothing and failed, stop 92)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = N // 2
    producer = cluster.producer(n=n, rate=LOAD_RATE)
    fast = cluster.consumer(until=n - 1, sub="fast")
    # held at seq n // 8: segment 0 holds at least the n // 3 acked before the kill below
    slow = cluster.consumer(until=n - 1, sub="slow", pause_s=0.05, fetch_max_bytes=16 << 10, hold_at=n // 8)
    producer.start()
    fast.start()
    slow.start()
    wait_acked(producer, n // 3)
    seg0 = open_seg(cluster)
    cluster.head().master.kill()
    producer.join(FINISH_S)
    fast.join(FINISH_S)
    # the fast one passed segment 0 but it stays for the slow one
    st = cluster.state()
    zk_seg = st.segment(seg0)
    assert zk_seg is not None, st
    assert zk_seg.last_seq is not None and slow.last_seq() < zk_seg.last_seq, (slow.last_seq(), zk_seg)
    slow.release()
    slow.join(FINISH_S)
    for c in (fast, slow):
        summary = check_delivery(producer.acked, [c.delivered])
        assert summary.acked == summary.delivered == n
    # both passed segment 0: the slow consumer's advance popped it
    cluster.wait_state(lambda s: s.segment(seg0) is None, what=f"segment {seg0} popped")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["master", "slave", "both", "hang"])
def test_repeated_head_faults_long(cluster: Cluster, fault: str) -> None:
    """Slow variant: the head hit four times while messages flow (restarted, or resumed, each
    time), about 10,000 messages between faults; the stream ends after the last one."""
    cluster.add_groups("g1", "g2", "g3")
    cluster.create_queue()
    producer, consumer = start_load(cluster, 10**7)  # open-ended: ended by stop_sending()
    for _ in range(4):
        wait_acked(producer, len(producer.acked) + 10_000, timeout_s=120)
        head = cluster.head()
        victims = {"master": [head.master], "slave": [head.slave], "both": [head.master, head.slave],
                   "hang": [head.master]}[fault]
        for v in victims:
            v.pause()
        if fault != "hang":
            for v in victims:
                v.kill()
        cluster.wait_state(lambda s, g=head.gid: s.head != g, what="the head to move")
        for v in victims:
            if fault == "hang":
                v.resume()
            else:
                cluster.restart(v)
    wait_acked(producer, len(producer.acked) + 10_000, timeout_s=120)
    producer.stop_sending()
    producer.join(FINISH_S)
    consumer.until = producer.n - 1
    consumer.join(FINISH_S)
    check_run(cluster, producer, consumer, producer.n)

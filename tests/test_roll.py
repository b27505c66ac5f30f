"""Rolling a queue's open segment (``ordq queue roll``, ``ordq.coordinator.state.roll``) under load
on real brokers: the head seals its segment and continues on the next one on the same group;
the producer follows with the next seq, the consumer reads across every boundary, nothing is
lost or reordered, also when the head master is killed between rolls.
"""

from __future__ import annotations

import json

import pytest

from ordq.admin.groups import roll_queue
from ordq.coordinator.state import SegStatus
from ordq.sdk.replicas import ReplicaReader
from tests.cluster import (  # noqa: F401 - fixture
    FINISH_S,
    Cluster,
    cluster_fixture,
    finish,
    start_load,
    wait_acked,
)
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 24_000  # 6 s at the load rate: every roll and the kill land while messages flow


def roll(cluster: Cluster, *, cli: bool) -> dict:
    if cli:  # the operator's command, as a separate process
        out = cluster.ordq("queue", "roll", "q", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    with ReplicaReader(cluster.store) as reader:
        return roll_queue(cluster.store, reader, "q").to_dict()


def test_rolls_under_load_and_a_head_master_kill_lose_nothing(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N)
    rolled = []
    for i in range(6):
        wait_acked(producer, (i + 1) * N // 10)
        r = roll(cluster, cli=i == 0)
        assert r["sealed"] and r["new_seg"] > r["sealing_seg"]
        rolled.append(r)
        if i == 1:  # the head's master dies between two rolls: fail over, roll on the next head
            victim = cluster.head().master
            victim.kill()
            wait_until(lambda head=r["head"]: cluster.state().head != head, timeout_s=30, what="the failover")
    finish(producer, consumer)
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == N
    st = cluster.state()
    # Every rolled segment still listed is sealed (the consumer popped those it finished).
    assert all(s.status is SegStatus.SEALED for s in st.consume if s.seg in {r["sealing_seg"] for r in rolled})
    assert st.open_segment is not None and st.open_segment.seg >= 7  # 6 rolls and a failover


def test_roll_of_a_queue_without_an_open_segment_is_a_clear_error(cluster: Cluster) -> None:
    cluster.store.add_group("g9")  # registered, never started: nothing can be admitted
    cluster.store.create_queue("idle", ["g9"])
    cluster.start_daemon("coordinator")  # the admin CLI asks its admin API (issue 37)
    out = cluster.ordq("queue", "roll", "idle")
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    assert b"has no open segment" in out.stderr, out.stderr


def test_roll_to_next_spreads_segments_over_the_groups_and_loses_nothing(cluster: Cluster) -> None:
    """A queue whose rolls move writes on (``--roll-to next``): each roll opens the next
    segment on the other group, the old head rejoins the send list once the consumer has read
    and popped its segment; the producer follows every move, nothing lost or reordered."""
    cluster.add_groups("g1", "g2")
    out = cluster.ordq("queue", "create", "q", "--roll-to", "next")
    assert out.returncode == 0, out.stderr
    assert "to the next group" in cluster.ordq("queue", "describe", "q").stdout.decode()
    cluster.start_daemon("coordinator")  # admits a drained head back at the tail
    wait_until(lambda: cluster.state().send == ("g1", "g2"), timeout_s=30, what="both groups sending")
    # The flow must outlast the four rolls and rejoins: the last old head can rejoin only once
    # its segment is popped, which waits for a message after it (a group keeps the queue's
    # newest message for a new producer leader). It is open-ended, stopped after the last
    # rejoin (issue 26: a fixed count of 72,000 was all sent, acks recorded behind, before the
    # third roll at load ~15: its sealed segment held the newest message, never popped).
    # The consumer rejoins after losing its lease, as an application does (under load its 2 s
    # ZooKeeper session expired; it stopped reading and no old head could rejoin).
    producer, consumer = start_load(cluster, 10**7, rejoin=True)
    heads = []
    for i in range(4):
        wait_acked(producer, (i + 1) * N // 6)
        before = cluster.state().head
        r = roll(cluster, cli=i % 2 == 0)
        assert r["sealed"] and r["head"] != before, (r, before)  # writes moved to the other group
        heads.append(r["head"])
        # The old head holds backlog: out of the send list until its segments are popped, which
        # is once the consumer (behind on a loaded box) has read past them.
        sealed = cluster.state().segment(r["sealing_seg"])
        if sealed is not None and sealed.last_seq is not None:  # (else read and popped already, or empty)
            wait_until(lambda last=sealed.last_seq: consumer.last_seq() > last, timeout_s=120, interval_s=0.1,
                       what=f"the consumer to read past seg {sealed.seg} (last seq {sealed.last_seq})")
        wait_until(lambda old=before: old in cluster.state().send, timeout_s=30,
                   what=f"{before} rejoining the send list once its segment was read")
    producer.stop_sending()
    producer.join(FINISH_S)
    consumer.until = producer.n - 1
    consumer.join(FINISH_S)
    summary = check_delivery(producer.acked, consumer.instances, redelivery=len(consumer.instances) > 1)
    assert summary.acked == summary.delivered == producer.n
    assert heads == ["g2", "g1", "g2", "g1"]


def test_ordq_produce_counts_a_roll_as_a_roll_not_a_failover(cluster: Cluster) -> None:
    """``ordq produce`` across its own roll said "(1 failovers)" with no fault anywhere (stop 94's
    drive): a roll is a new segment on the same group, counted apart (``ProducerStats.rolls``,
    ``ordq_producer_rolls_total``); failovers count the head moving to another group."""
    cluster.add_groups("g1", "g2")
    out = cluster.ordq("queue", "create", "q", "--segment-bytes", "256KiB")
    assert out.returncode == 0, out.stderr
    out = cluster.ordq("produce", "q", "--count", "600", "--size", "1000", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["acked"] == 600 and summary["failovers"] == 0 and summary["rolls"] >= 1, summary
    assert cluster.state().head == "g1"  # no fault: the head never moved

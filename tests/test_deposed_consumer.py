"""A consumer deposed while it was inside a blocking call (issue 26), reproduced in-process and
deterministically: the "freeze" is a hook in the consumer's own commit that expires its
ZooKeeper session (as a SIGSTOP past the session does), lets a successor take over and
deliver, and only then returns.

The promise (DESIGN §5 Consumer, sdk/consumer.py): no hand-out without a lease check after
any blocking call; a resumed deposed consumer raises ``NotLeader`` — never ``RetentionOvertook``
with advice to reset the subscription to earliest (that would redeliver all of it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import attrs
import pytest
from kazoo.client import KazooClient

from ordq.common.errors import NotLeader
from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk


def produce(cluster: Cluster, n: int) -> None:
    # A long send timeout: on a loaded machine a 1 s one fails over, and this test is not about that.
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=30.0)) as p:
        futures = [p.send(b"m%06d" % i) for i in range(n)]
        futures[-1].result(60)


def consumer_config(cluster: Cluster) -> ConsumerConfig:
    return ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                          lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                          commit=CommitConfig(every_messages=1, every_ms=50.0))


def expire_session(cluster: Cluster, consumer: Consumer) -> None:
    """What a freeze past the session does to ``consumer``: ZooKeeper ends its session (its lock
    node goes, a standby is elected). kazoo's own harness trick: close the session from another
    client holding the same session id and password."""
    client = consumer._client
    assert client is not None
    other = KazooClient(hosts=cluster.hosts, client_id=client.client_id, timeout=2.0)
    other.start(timeout=10)
    other.stop()
    other.close()


def test_consumer_frozen_inside_its_periodic_commit_hands_out_nothing_more(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 20)
    first = Consumer(consumer_config(cluster))
    first.start()
    successor: list[int] = []
    try:
        got = first.poll(max_messages=1)  # one read buffers all 20; seq 0 is in hand
        assert [m.seq for m in got] == [0]
        commits = first._commits
        assert commits is not None
        real_commit: Callable = commits.commit

        def frozen_commit(cursor: object, **kwargs: object) -> None:
            # The periodic commit the check before handing out runs after confirming the lease:
            # it lands, then the process "freezes" past its session while a successor takes
            # over and delivers.
            commits.commit = real_commit  # type: ignore[method-assign]  # once
            real_commit(cursor, **kwargs)
            expire_session(cluster, first)
            lease = first._lease
            assert lease is not None
            wait_until(lambda: not lease.valid(), timeout_s=30, what="the frozen consumer's lease to run out")
            with Consumer(consumer_config(cluster)) as second:
                while not successor:
                    successor.extend(m.seq for m in second.poll(timeout_s=0.1))
                second.commit()

        commits.commit = frozen_commit  # type: ignore[method-assign]
        # Finishes seq 0, so a commit is due (every message): the hook runs inside the check
        # before handing out (LeaseChecks.before_hand_out).
        with pytest.raises(NotLeader):
            late = first.poll(max_messages=1)
            pytest.fail(f"the deposed consumer handed out {[m.seq for m in late]} after its successor "
                        f"delivered {successor}")
        assert successor[0] == 1  # the successor resumed after the committed seq 0
    finally:
        try:
            first.close()
        except NotLeader:
            pass


def test_resumed_deposed_consumer_behind_popped_segments_raises_not_leader(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 10)
    first = Consumer(consumer_config(cluster))
    first.start()
    try:
        seqs: list[int] = []
        while len(seqs) < 10:
            seqs.extend(m.seq for m in first.poll(timeout_s=0.1))
        first.commit()  # its cursor: segment 0, offset 10, seq 9
        expire_session(cluster, first)  # frozen from here on
        # Meanwhile the queue moves on: more in segment 0, a roll, segment 1; the successor
        # reads it all and segment 0 is popped.
        produce(cluster, 40)
        assert cluster.ordq("queue", "roll", "q").returncode == 0
        produce(cluster, 10)
        with Consumer(consumer_config(cluster)) as second:
            last = -1
            give_up = time.monotonic() + 120
            while last < 59 or cluster.state().segment(0) is not None:
                assert time.monotonic() < give_up, f"successor at seq {last}, segment 0 not popped"
                for m in second.poll(timeout_s=0.1):
                    last = m.seq
                second.commit()
        assert cluster.state().trimmed_seq >= 49
        # The first resumes: its next reads find segment 0 gone and seqs 10..49 with it.
        deadline = time.monotonic() + 30
        with pytest.raises(NotLeader):  # RetentionOvertook here advised a reset to earliest
            while time.monotonic() < deadline:
                assert not first.poll(timeout_s=0.1), "the deposed consumer handed out messages"
    finally:
        try:
            first.close()
        except NotLeader:
            pass


def test_close_while_zookeeper_does_not_answer_finishes_within_seconds(cluster: Cluster) -> None:
    """Ctrl-C on `ordq consume` (issue 26): the lock release on close rode out a lost
    connection for ever, kazoo's default retry backing off up to an hour."""
    cluster.add_groups("g1")
    cluster.create_queue()
    produce(cluster, 5)
    cfg = attrs.evolve(consumer_config(cluster), coordinator_outage_s=1.0)
    c = Consumer(cfg)
    c.start()
    seqs: list[int] = []
    while len(seqs) < 5:
        seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
    c.commit()
    lock, client = c._election, c._client
    assert lock is not None and client is not None
    # The delete goes out and no answer ever comes (ZooKeeper stopped or cut off): kazoo's own
    # release waits on it without a timeout. An answer that never comes is a result never set.
    client.delete_async = lambda *_a, **_k: client.handler.async_result()  # type: ignore[method-assign]
    closer = threading.Thread(target=c.close, daemon=True)
    started = time.monotonic()
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive(), "close() still releasing the lock after 60 s"
    assert time.monotonic() - started < 30

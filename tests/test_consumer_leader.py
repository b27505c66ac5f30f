"""Consumer leader faults (DESIGN §6): the consumer is a separate process, killed -9 under load;
a standby waiting in the subscription's election resumes from the committed cursor.

Here, and only here, redelivery is allowed: the standby redelivers exactly the messages after
the last committed cursor, in order. Each instance sees strictly increasing seqs; together
they cover every acked seq.
"""

from __future__ import annotations

import pytest

from ordq.common.errors import WaitTimeout
from ordq.sdk import Consumer, ConsumerConfig
from tests.cluster import (  # noqa: F401 - cluster_fixture
    CLIENT_SESSION_TIMEOUT_S,
    FINISH_S,
    LOAD_RATE,
    Cluster,
    cluster_fixture,
)
from tests.helpers.load import ConsumerProgram
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 16_000


def start_pair(cluster: Cluster, n: int, **options: object) -> tuple[ConsumerProgram, ConsumerProgram]:
    """A leading consumer program and a standby waiting in the election behind it."""
    leader = cluster.spawn_consumer("c1", until=n - 1, hold=True, **options)  # type: ignore[arg-type]
    standby = cluster.spawn_consumer("c2", until=n - 1, hold=True)
    leader.go()
    leader.wait_leader()
    standby.go()
    path = cluster.paths.sub_leader("q", "s")
    wait_until(lambda: len(cluster.lock_contenders(path)) == 2, timeout_s=30, interval_s=0.05,
               what="the standby to wait in the subscription's election")
    assert standby.event("leader") is None
    return leader, standby


def check_takeover(cluster: Cluster, acked: list, leader: ConsumerProgram, standby: ConsumerProgram) -> None:
    assert standby.wait_exit(FINISH_S) == 0, standby.records()[-3:]
    start = standby.event("leader")
    assert start is not None
    first = leader.deliveries()
    summary = check_delivery(acked, [first, standby.deliveries()], redelivery=True,
                             starts=[None, start["last_seq"]])
    # The cursor it resumed from was committed by the killed leader, for messages that leader
    # had finished with: never past what it recorded, and it did commit progress before.
    assert 0 <= start["last_seq"] <= first[-1].seq, (start, first[-1].seq)
    assert summary.redelivered == first[-1].seq - start["last_seq"]


def test_consumer_leader_killed(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer = cluster.producer(n=N, rate=LOAD_RATE)
    producer.start()
    leader, standby = start_pair(cluster, N)
    wait_until(lambda: leader.delivered_count() >= N // 3, timeout_s=60, interval_s=0.01,
               what="the leader to deliver a third")
    leader.proc.kill()
    producer.join(FINISH_S)
    check_takeover(cluster, producer.acked, leader, standby)


def test_consumer_leader_dies_inside_a_delivered_batch(cluster: Cluster) -> None:
    """The application dies while handling a message of a batch that ``poll`` returned (the
    cursor is committed at every poll here): nothing of that batch may count as consumed."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = N // 2
    leader, standby = start_pair(cluster, n, commit_every=1, crash_at=n * 3 // 4)
    producer = cluster.producer(n=n, rate=LOAD_RATE)
    producer.start()
    assert leader.wait_exit(60) == -9
    producer.join(FINISH_S)
    check_takeover(cluster, producer.acked, leader, standby)


def test_iterating_consumer_commits_only_what_the_application_finished(cluster: Cluster) -> None:
    """``for m in consumer`` inside ``with``: an error while handling seq K commits up to K-1
    (K is redelivered); so does leaving the loop with ``break`` while holding K (the consumer
    cannot know whether the application finished K); ``commit()`` before ``break`` says it did."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer = cluster.producer(n=3000, rate=None)
    producer.start()
    producer.join(FINISH_S)
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)

    class AppFailed(Exception):
        pass

    with pytest.raises(AppFailed), Consumer(cfg) as c:
        for m in c:
            if m.seq == 1500:
                raise AppFailed
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1499
    with Consumer(cfg) as c:
        for m in c:
            assert m.seq == 1500
            break
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1499
    with Consumer(cfg) as c:
        for m in c:
            assert m.seq == 1500
            c.commit()
            break
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1500


@pytest.mark.slow
def test_consumer_leader_killed_repeatedly_long(cluster: Cluster) -> None:
    """Slow variant: 120,000 messages, three consumer leaders killed in turn."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 120_000
    producer = cluster.producer(n=n, rate=LOAD_RATE)
    producer.start()
    instances = [cluster.spawn_consumer("c0", until=n - 1)]
    instances[0].wait_leader()
    path = cluster.paths.sub_leader("q", "s")
    for k in range(1, 4):
        standby = cluster.spawn_consumer(f"c{k}", until=n - 1)
        wait_until(lambda: len(cluster.lock_contenders(path)) == 2, timeout_s=30, interval_s=0.05,
                   what="a standby waiting")
        wait_until(lambda k=k: sum(c.delivered_count() for c in instances) >= k * n // 6, timeout_s=120,
                   interval_s=0.01, what="progress")
        instances[-1].proc.kill()
        instances.append(standby)
        standby.wait_leader()
    producer.join(FINISH_S * 2)
    assert instances[-1].wait_exit(FINISH_S) == 0
    starts = [None] + [c.event("leader")["last_seq"] for c in instances[1:]]  # type: ignore[index]
    check_delivery(producer.acked, [c.deliveries() for c in instances], redelivery=True, starts=starts)


def test_a_consumer_not_elected_in_time_raises_wait_timeout(cluster: Cluster) -> None:
    """kazoo's Lock raises LockTimeout where the SDK expected False: a consumer not elected
    within ``leader_timeout_s`` raised kazoo's exception, not ordq's WaitTimeout."""
    cluster.add_groups("g1")
    cluster.create_queue()
    cluster.store.create_subscription("q", "s")
    holder = cluster.store.client.Lock(cluster.paths.sub_leader("q", "s"), "another consumer")
    assert holder.acquire(timeout=30)
    try:
        config = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                                leader_timeout_s=1.0)
        with pytest.raises(WaitTimeout, match="not elected consumer in 1.0s"):
            Consumer(config).start()
        assert cluster.lock_contenders(cluster.paths.sub_leader("q", "s")) == ["another consumer"]  # left no node
    finally:
        holder.release()

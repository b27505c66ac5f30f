"""Subscriptions come and go (`ordq sub create|delete`) on real brokers: a subscription created
at a seq starts exactly there (an application that keeps its position in its own database
resumes effectively-once); deleting a held subscription is refused unless forced, and a
forced delete stops its consumer (its lease goes with it); a deleted, abandoned subscription
no longer keeps a consumed segment from being popped.
"""

from __future__ import annotations

import json

import pytest

from ordq.common.errors import SubscriptionNotFound
from ordq.sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk


def produce(cluster: Cluster, n: int) -> None:
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q")) as p:
        futures = [p.send(b"m") for _ in range(n)]
        futures[-1].result(30)


def consumer(cluster: Cluster, sub: str) -> Consumer:
    return Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription=sub,
                                   lease_ttl_s=CLIENT_SESSION_TIMEOUT_S))


def first_seq(c: Consumer) -> int:
    while not (batch := c.poll(max_messages=1)):
        pass
    return batch[0].seq


def test_create_at_seq_latest_and_delete(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 100)
    out = cluster.ordq("sub", "create", "q", "at40", "--start", "seq", "40")
    assert out.returncode == 0 and b"first delivered: seq 40" in out.stdout, out.stderr
    again = cluster.ordq("sub", "create", "q", "at40")
    assert again.returncode == 1 and b"already exists" in again.stderr and b"Traceback" not in again.stderr
    late = json.loads(cluster.ordq("sub", "create", "q", "late", "--start", "latest", "--json").stdout)
    assert late["cursor"]["last_seq"] == 99
    later = cluster.ordq("sub", "create", "q", "later", "--start", "latest")
    assert b"first delivered: seq 100, once it is sent" in later.stdout, later.stdout  # not stored yet
    early = cluster.ordq("sub", "create", "q", "early")  # earliest: seq 0 is stored (issue 24: "once it is sent")
    assert early.stdout.endswith(b"first delivered: seq 0\n"), early.stdout
    assert cluster.ordq("sub", "delete", "q", "early").returncode == 0
    assert cluster.ordq("sub", "delete", "q", "later").returncode == 0
    with consumer(cluster, "at40") as c:
        assert first_seq(c) == 40
    produce(cluster, 1)
    with consumer(cluster, "late") as c:
        assert first_seq(c) == 100

    held = consumer(cluster, "at40")
    held.start()
    try:
        refused = cluster.ordq("sub", "delete", "q", "at40")
        assert refused.returncode == 1 and b"is held by consumer" in refused.stderr, refused.stderr
        forced = cluster.ordq("sub", "delete", "q", "at40", "--force")
        assert forced.returncode == 0 and b"that consumer stops" in forced.stdout, forced.stderr

        def stopped() -> bool:
            try:
                held.poll(timeout_s=0.05)
            except SubscriptionNotFound:  # final: the consumer does not rejoin a deleted subscription
                return True
            return False

        wait_until(stopped, timeout_s=30, what="the held consumer to find its subscription gone")
    finally:
        gone = SubscriptionNotFound("q", "at40")
        held.__exit__(SubscriptionNotFound, gone, None)
    subs = json.loads(cluster.ordq("sub", "list", "q", "--json").stdout)["subscriptions"]
    assert [s["subscription"] for s in subs] == ["late"]


def test_deleting_an_abandoned_subscription_lets_consumed_segments_go(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    assert cluster.ordq("sub", "create", "q", "abandoned").returncode == 0
    produce(cluster, 50)
    assert cluster.ordq("queue", "roll", "q").returncode == 0  # segment 0 sealed, 1 open
    produce(cluster, 10)
    with consumer(cluster, "live") as c:
        got = []
        while len(got) < 60:
            got.extend(m.seq for m in c.poll())
        c.commit()
    assert cluster.state().consume[0].seg == 0  # "abandoned" has not read segment 0: kept
    assert cluster.ordq("sub", "delete", "q", "abandoned").returncode == 0
    cluster.start_daemon("coordinator")  # it pops consumed segments
    cluster.wait_state(lambda st: st.consume[0].seg == 1, what="segment 0 popped once nobody needs it")

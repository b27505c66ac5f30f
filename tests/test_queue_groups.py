"""A queue's groups change while it runs (`ordq queue add-group` / `remove-group`), on real
brokers: a group joins the end of the send list; a removed head is failed over (producers go
on at the next group, nothing lost or reordered) and leaves the queue once subscriptions have
read its segments."""

from __future__ import annotations

import pytest

from ordq.sdk import Consumer, ConsumerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.test_disk import produce

pytestmark = pytest.mark.zk


def test_add_and_remove_a_group_of_a_running_queue(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue(groups=["g1"])
    produce(cluster, 100)
    out = cluster.ordq("queue", "add-group", "q", "g2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == "group g2 serves queue q; groups: g1, g2; send list: g1 -> g2"

    alone = cluster.ordq("queue", "remove-group", "q", "g2")  # not the only sender: fine to leave later
    assert alone.returncode == 0, alone.stderr
    assert cluster.state().send == ("g1",)
    only = cluster.ordq("queue", "remove-group", "q", "g1")
    assert only.returncode == 1 and "the only group taking writes" in only.stderr.decode()
    assert cluster.ordq("queue", "add-group", "q", "g2").returncode == 0

    first = cluster.ordq("queue", "remove-group", "q", "g1")  # the head: failed over to g2
    assert first.returncode == 1
    assert "group g1 left the send list of q but still holds segments [0]" in first.stderr.decode()
    assert cluster.state().send == ("g2",)
    produce(cluster, 100)  # seqs 100..199 on g2
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Consumer(cfg) as c:
        seqs: list[int] = []
        while len(seqs) < 200:
            seqs.extend(m.seq for m in c.poll())
        c.commit()
    assert seqs == list(range(200))
    assert cluster.state().consume[0].gid == "g2"  # the consumer popped g1's segment on its way
    done = cluster.ordq("queue", "remove-group", "q", "g1")
    assert done.returncode == 0, done.stderr
    assert cluster.state().groups == ("g2",)
    missing = cluster.ordq("queue", "add-group", "q", "g9")
    assert missing.returncode == 1 and "g9" in missing.stderr.decode() and b"Traceback" not in missing.stderr

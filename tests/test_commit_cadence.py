"""How often a consumer commits by itself (issue 39). Each commit is a call to the coordinator
and a ZooKeeper write, an fdatasync in ZooKeeper's log beside the brokers' own on a shared disk:
at the old default (every 200 ms) a steady stream cost the coordinator and ZooKeeper ~8 ms of CPU
a commit, ~40 ms a second. The default now commits once a second (or every 10,000 messages)."""

from __future__ import annotations

import threading
import time

import pytest

from ordq.sdk import CommitConfig, Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture

pytestmark = pytest.mark.zk

WINDOW_S = 3.0


def test_a_steady_stream_is_committed_about_once_a_second_by_default(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue()
    stop = threading.Event()

    def feed() -> None:  # ~200 msgs/s until told: the consumer always has something new
        with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q",
                                     send_timeout_s=30.0)) as p:
            while not stop.wait(0.005):
                p.send(b"m")

    feeder = threading.Thread(target=feed, name="feed", daemon=True)
    feeder.start()
    config = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                            lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    assert config.commit == CommitConfig(every_messages=10_000, every_ms=1000.0)
    try:
        with Consumer(config) as c:
            flowing = time.monotonic() + 60
            while not c.poll(timeout_s=0.5):  # until the stream flows
                assert time.monotonic() < flowing, "nothing delivered in 60 s"
            before, delivered = c.statistics().commits, 0
            started = time.monotonic()
            while time.monotonic() - started < WINDOW_S:
                delivered += len(c.poll(timeout_s=0.1))
            commits = c.statistics().commits - before
    finally:
        stop.set()
        feeder.join(60)
    assert delivered > 50, delivered
    # one a second at most (the one due when the window began may land in it too); the old
    # default made ~15 here
    assert commits <= WINDOW_S + 1, f"{commits} commits in {WINDOW_S} s of steady delivery"

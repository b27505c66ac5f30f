"""A one-message ``ordq produce`` (issue 42: 0.73 s on a quiet box): the calls it makes before
its message and what its process loads. Real ZooKeeper, broker and coordinator processes."""

from __future__ import annotations

import pytest

from tests.cluster import Cluster, cluster_fixture, modules_loaded_by  # noqa: F401 - fixture

pytestmark = pytest.mark.zk

# What a producer never uses: the consumer, the asyncio clients, groups, topics, the metrics.
NOT_FOR_A_PRODUCER = ("ordq.sdk.consumer", "ordq.sdk.aio", "ordq.sdk.group", "ordq.sdk.topic_producer",
                      "ordq.sdk.find", "ordq.sdk.metrics", "prometheus_client")


def test_a_one_message_produce_loads_no_consumer_nor_metrics(cluster: Cluster) -> None:
    """Its calls before the message: the CLI's check and the producer's settings (each sent at
    once to a coordinator it knows: no "who leads" first, a round trip each; that call is not
    counted by the coordinator's metrics), the lease, the claim, the head's master."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    described = cluster.coordinator_requests(rpc="Describe", outcome="ok")
    done = cluster.ordq("produce", "q", "--count", "1")
    assert done.returncode == 0, done.stderr.decode()
    assert cluster.coordinator_requests(rpc="Describe", outcome="ok") - described == 3  # check, settings, master
    assert modules_loaded_by(cluster, NOT_FOR_A_PRODUCER, "produce", "q", "--count", "1") == []


def test_a_produce_waiting_for_its_coordinators_says_so(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: anything that waits longer than a second says what it waits for; the CLI's
    check of the queue (before the producer's own waits, which say theirs) said nothing."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    [coordinator] = [p for p in cluster.coordinators if p.alive()]
    monkeypatch.setenv("ORDQ_PROGRESS", "1")  # its waits said, as on a terminal
    coordinator.pause()  # accepts connections, never answers
    try:
        done = cluster.ordq("--zk-timeout", "3", "produce", "q", "--count", "1")
    finally:
        coordinator.resume()
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "ordq: waiting for the cluster's coordinators to answer for queue q ..." in err, err
    assert "no coordinator of the cluster answered" in err, err

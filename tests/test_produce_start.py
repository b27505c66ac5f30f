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

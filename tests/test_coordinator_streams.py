"""A client's calls that the coordinator answered free their HTTP/2 streams: a long-lived client
(a consumer) is never refused for calls it made before. Real ZooKeeper, real coordinator process."""

from __future__ import annotations

import pytest

from ordq.coordinator.client import CoordinatorClient, Held
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture

pytestmark = pytest.mark.zk

MAX_STREAMS = 100  # coordinator/service_frame.py FrameConfig.max_streams_per_connection


def test_reads_of_a_missing_record_do_not_use_up_the_connection(cluster: Cluster) -> None:
    """A consumer reads its subscription's settings every few seconds (sdk/_consumer_delay.py);
    with none set, the coordinator's read is a NoNodeError it catches. Guard: ``zk_answer``
    (coordinator/zk_answer.py), which raises it without kazoo's reference cycle. Failing first:
    each such call kept its stream until a full garbage collection, and the connection's call
    after the 100th was refused (UNAVAILABLE, RST_STREAM with error code 7): an idle
    ``ordq consume`` lost its heartbeats and its last commit ~8 minutes in."""
    cluster.add_groups("g1")
    cluster.create_queue("q", ["g1"])
    cluster.store.create_subscription("q", "s")
    client = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials, timeout_s=10)
    try:
        lease = client.acquire("consumer", "q", "s", "reader", ttl_ms=60_000, timeout_s=30)
        assert isinstance(lease, Held), lease
        for _ in range(MAX_STREAMS + 20):
            assert client.record(lease, "settings", timeout_s=10) == {}
        client.heartbeat(lease, timeout_s=10)  # the lease's own calls still go through
        client.release(lease, timeout_s=10)
    finally:
        client.close()

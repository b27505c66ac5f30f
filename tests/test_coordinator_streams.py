"""A client's calls that the coordinator answered free their HTTP/2 streams: a long-lived client
(a consumer) is never refused for calls it made before. Real ZooKeeper, real coordinator process."""

from __future__ import annotations

import pytest

from ordq.common.errors import ConfigError, QueueNotFound
from ordq.coordinator.client import CoordinatorClient, Held, Refusal
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


def test_a_standbys_polls_and_refused_calls_do_not_use_up_the_connection(cluster: Cluster) -> None:
    """What else a long-lived client repeats, each past the bound on one connection: a standby's
    Acquire refused while another holds the lease (sdk/_lease_client.py polls it for as long as
    it stands by), a Describe of a queue that is not there (a refusal), and the consumer's
    poll of its parked ledger's signal."""
    cluster.add_groups("g1")
    cluster.create_queue("q", ["g1"])
    cluster.store.create_subscription("q", "s")
    holder = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials, timeout_s=10)
    client = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials, timeout_s=10)
    try:
        lease = holder.acquire("consumer", "q", "s", "holder", ttl_ms=60_000, timeout_s=30)
        assert isinstance(lease, Held), lease
        for _ in range(MAX_STREAMS + 10):
            assert isinstance(client.acquire("consumer", "q", "s", "standby", ttl_ms=60_000, timeout_s=10), Refusal)
            with pytest.raises(QueueNotFound):
                client.describe("nosuchqueue", timeout_s=10)
            holder.record(lease, "parked_signal", timeout_s=10)
        assert client.describe("q", timeout_s=10).state.queue == "q"
    finally:
        holder.close()
        client.close()


def test_admin_calls_refused_by_zookeeper_do_not_use_up_the_connection(cluster: Cluster) -> None:
    """A long-lived admin client (an application's ``CoordinatorClient``; ``ordq top`` keeps one)
    repeats calls on one connection that ZooKeeper answers with an error the coordinator catches:
    a revoke of a token that is not there, a list of the revoked tokens where none was ever
    revoked (a NoNodeError each). Guard: ``PollHandler.async_result`` (coordinator/zk_tls.py)
    makes every kazoo result an ``AnswerResult`` (coordinator/zk_answer.py), whose ``get`` (where
    kazoo's blocking calls wait) raises a copy. Failing first: the 101st such call on the
    connection was refused (RST_STREAM, error code 7), and every call after it."""
    cluster.add_groups("g1")  # and the coordinator
    client = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials, timeout_s=10)
    try:
        for _ in range(MAX_STREAMS + 10):
            with pytest.raises(ConfigError, match="no token deadbeef"):
                client.admin("auth revoke", id="deadbeef", timeout_s=10)
            assert client.admin("auth list", all=True, timeout_s=10)["revoked"] == []
        assert client.admin("auth list", timeout_s=10)["tokens"] == []
    finally:
        client.close()

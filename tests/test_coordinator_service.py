"""The coordinator service (coordinator/service.py, coordinator/client.py) on real ZooKeeper,
real broker processes and real coordinator processes: claims, failovers and rolls go through
it; a follower names the leader; killing the leader during a producer failover stalls the
producer about one election; a second produce-token holder cannot use the current epoch."""

from __future__ import annotations

import time

import grpc
import pytest

from broker_group.log import Message, encode_batch
from broker_group.wire import ordq_pb2 as pb
from broker_group.wire import ordq_pb2_grpc as pb_grpc
from coordinator.client import CoordinatorClient
from coordinator.service import LEADER_METADATA_KEY, leader_address
from coordinator.state import SegStatus
from ordq.errors import EpochNotIssued, FencedError, NotCoordinatorLeader, PermissionDenied
from ordq.security import channel, ensure_coordinator_pki
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk


def coordinator(cluster: Cluster, name: str, *, session_timeout_s: float = 1.0) -> tuple[object, str]:
    proc = cluster.spawn(name, ["-m", "ordq.cli", "--zk", cluster.hosts, "--root", cluster.root, "coordinator", "run",
                                "--metrics", "127.0.0.1:0", "--interval", "0.2",
                                "--session-timeout", str(session_timeout_s)])
    line = proc.wait_for_line("SERVING ", timeout_s=30)
    proc.wait_for_line("READY", timeout_s=30)
    return proc, line.split()[-1]


def leader_now(cluster: Cluster) -> str:
    return leader_address(cluster.store.client, cluster.paths.coordinator_leader)


def elected(cluster: Cluster, address: str) -> None:
    """Wait until the coordinator at ``address`` leads and answers (a Pop of queue q)."""
    wait_until(lambda: leader_now(cluster) == address, timeout_s=30, interval_s=0.05, what=f"{address} elected")
    with CoordinatorClient(cluster.store, credentials=cluster.credentials) as c:
        wait_until(lambda: c.pop("q") is not None, timeout_s=30, interval_s=0.05, what="the leader answers")


def lead_producer_election(cluster: Cluster, ident: str = "P") -> object:
    lock = cluster.store.client.Lock(cluster.paths.producer_leader("q"), ident)
    assert lock.acquire(timeout=10)
    return lock


def test_claim_fail_over_roll_through_the_service(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    _, address = coordinator(cluster, "coordinator-1")
    elected(cluster, address)
    lock = lead_producer_election(cluster)
    client = CoordinatorClient(cluster.store, credentials=cluster.credentials)
    try:
        path = cluster.paths.producer_leader("q")
        c = client.claim("q", f"{path}/{lock.node}")
        st = cluster.state()
        assert c.epoch == st.producer_epoch == 1 and c.last is None
        assert st.producer_key is not None and c.key and st.producer_key != c.key
        assert (c.gid, c.seg) == (st.head, st.open_segment.seg)
        # a produce with the key is stored; the epoch without the key is refused
        master = cluster.store.live_members(c.gid)["master"].address
        stream = cluster.transport.open_produce(master, "q", c.seg, c.epoch, c.key)
        stream.send([encode_batch([Message(b"x", None, (), 0)], epoch=c.epoch, first_seq=0)])
        assert next(stream.acks()).count == 1
        stream.close()
        # a claim by a node that is not the first contender is refused, changing nothing
        other = cluster.store.client.Lock(path, "other")
        with pytest.raises(PermissionDenied):
            client.claim("q", f"{path}/not-a-node__lock__0000000099")
        assert cluster.state().producer_epoch == 1
        del other
        # fail over: sealed in the background, the new head opened on g2
        with pytest.raises(EpochNotIssued):
            client.fail_over("q", c.gid, c.seg, c.epoch, "wrong-key")
        st = client.fail_over("q", c.gid, c.seg, c.epoch, c.key)
        assert st.head != c.gid and st.open_segment is not None and st.open_segment.seg == c.seg + 1
        cluster.wait_state(lambda s: s.segment(c.seg).status is SegStatus.SEALED, what="old segment sealed")
        # roll: the open segment is sealed and the next one opens
        seg = st.open_segment.seg
        st = client.roll("q", st.head, seg, c.epoch, c.key)
        assert st.open_segment is not None and st.open_segment.seg == seg + 1
        # a second claim fences the first epoch
        c2 = client.claim("q", f"{path}/{lock.node}")
        assert c2.epoch == c.epoch + 1
        with pytest.raises(FencedError):
            client.fail_over("q", st.head, st.open_segment.seg, c.epoch, c.key)
    finally:
        client.close()
        lock.release()


def test_a_follower_names_the_leader(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")
    _, first = coordinator(cluster, "coordinator-1")
    elected(cluster, first)
    _, second = coordinator(cluster, "coordinator-2")
    creds = ensure_coordinator_pki(cluster.base / "tls")
    ch = channel(second, cluster.credentials, ())
    try:
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.CoordinatorStub(ch).Pop(pb.QueueRef(queue="q"), timeout=10)
        trailing = dict(info.value.trailing_metadata() or ())
        assert trailing.get(LEADER_METADATA_KEY) == first
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        ch.close()
    assert creds.cert_file is not None
    # the client starting at the follower follows it to the leader
    client = CoordinatorClient(cluster.store, credentials=cluster.credentials)
    client._leader = second
    try:
        assert client.pop("q").queue == "q"
        assert client._leader == first
    finally:
        client.close()
    from broker_group.errors import from_rpc_error

    assert isinstance(from_rpc_error(info.value, second), NotCoordinatorLeader)

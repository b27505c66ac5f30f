"""The coordinator service (coordinator/service.py, coordinator/client.py) on real ZooKeeper,
real broker processes and real coordinator processes: claims, failovers and rolls go through
it; a follower names the leader; killing the leader during a producer failover stalls the
producer about one election; a second produce-token holder cannot use the current epoch."""

from __future__ import annotations

import json
import time

import attrs
import grpc
import pytest

from ordq.common.errors import EpochNotIssued, FencedError, LeaseLost, NotCoordinatorLeader, PermissionDenied
from ordq.common.security import channel, ensure_coordinator_pki
from ordq.coordinator.client import CoordinatorClient, Held, Refusal
from ordq.coordinator.service import LEADER_METADATA_KEY, leader_address
from ordq.coordinator.state import SegStatus
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import Message, decode_batch, encode_batch
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


def elected(cluster: Cluster) -> str:
    """Wait until a coordinator leads and answers (a Pop of queue q); its address."""
    address = wait_until(lambda: leader_now(cluster), timeout_s=30, interval_s=0.05, what="a coordinator elected")
    with CoordinatorClient(cluster.store, credentials=cluster.credentials) as c:
        wait_until(lambda: c.pop("q") is not None, timeout_s=30, interval_s=0.05, what="the leader answers")
    return address


def lead_producer(client: CoordinatorClient, holder: str = "P") -> Held:
    """The producer lease of q (a long ttl: the test's steps must not outlast it)."""
    got = client.acquire("producer", "q", "", holder, ttl_ms=60_000)
    assert isinstance(got, Held), got
    return got


def test_claim_fail_over_roll_through_the_service(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")  # add_groups started coordinator-0
    elected(cluster)
    client = CoordinatorClient(cluster.store, credentials=cluster.credentials)
    try:
        lease = lead_producer(client)
        c = client.claim("q", lease)
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
        # a claim by another holder (refused the lease), with a forged key, or without a lease
        # is refused, changing nothing (tests/test_producer_lease.py: the planted election node)
        assert isinstance(client.acquire("producer", "q", "", "other"), Refusal)
        with pytest.raises(LeaseLost):
            client.claim("q", attrs.evolve(lease, holder="other", key="forged"))
        with pytest.raises(PermissionDenied):
            client.claim("q", attrs.evolve(lease, key=""))
        assert cluster.state().producer_epoch == 1
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
        c2 = client.claim("q", lease)
        assert c2.epoch == c.epoch + 1
        with pytest.raises(FencedError):
            client.fail_over("q", st.head, st.open_segment.seg, c.epoch, c.key)
        client.release(lease)
    finally:
        client.close()


def test_a_follower_names_the_leader(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("q")  # add_groups started coordinator-0, which leads
    first = elected(cluster)
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
    from ordq.wire.errors import from_rpc_error

    assert isinstance(from_rpc_error(info.value, second), NotCoordinatorLeader)


def coordinator_at(cluster: Cluster, address: str) -> object:
    for proc in cluster.coordinators:
        if proc.alive() and proc.wait_for_line("SERVING ", timeout_s=5) == address:
            return proc
    raise AssertionError(f"no coordinator process serves {address}")


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_losing_the_leading_coordinator_during_a_failover_stalls_the_producer_about_one_election(
        cluster: Cluster, fault: str) -> None:
    """``pause`` (SIGSTOP) is what a partition does to the leader's callers (issue 28's lab
    found it): it neither answers nor refuses, so a call must follow the election rather than
    wait its deadline on it."""
    from tests.cluster import finish, start_load, wait_acked
    from tests.order_check import check_delivery

    n = 16_000
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    cluster.start_daemon("coordinator-1")  # the harness's stand-in stops: these two are the coordinators
    cluster.start_daemon("coordinator-2")
    wait_until(lambda: leader_now(cluster) != "", timeout_s=30, interval_s=0.05, what="a coordinator elected")
    producer, consumer = start_load(cluster, n)
    wait_acked(producer, n // 4)
    leader = coordinator_at(cluster, leader_now(cluster))
    head = cluster.head()
    # The head's master and the leading coordinator die together: the producer's failover
    # needs the coordinator, so it waits for the standby's election (1 s sessions here).
    started = time.monotonic()
    getattr(leader, fault)()  # first: the failover must find it gone (or silent)
    head.master.kill()
    failed_over = 0

    def moved_on() -> bool:
        nonlocal failed_over
        stats = producer.statistics()
        if producer.error is not None:
            return True
        if not failed_over and stats is not None and stats.failovers >= 1 and stats.head != head.gid:
            failed_over = len(producer.acked)
        return bool(failed_over) and len(producer.acked) > failed_over

    wait_until(moved_on, timeout_s=60, interval_s=0.01, what="acks on the new head")
    stall = time.monotonic() - started
    print(f"producer stalled {stall:.2f}s (coordinator session 1 s, broker session 1 s, send timeout 1 s)")
    assert producer.error is None, producer.error
    finish(producer, consumer)
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == n
    # One election (1 s session) + the ack deadline (1 s) + the seal and restart of the stream,
    # with room for a loaded machine; a producer that waited for a dead coordinator's
    # answers until its own no_group_timeout_s (30 s) would fail this.
    assert stall < 12.0, stall


def test_a_second_produce_token_holder_cannot_write_with_the_current_epoch(cluster: Cluster) -> None:
    """The rogue holds a valid produce token for the queue and reads the current epoch from
    ZooKeeper, but not the epoch key: its Produce is refused, counted, nothing of it stored;
    the real producer goes on unaffected. (On main's broker the rogue batch was stored.)"""
    import attrs

    from ordq.common.security import register
    from ordq.coordinator.tokens import create_token, touch
    from ordq.sdk import BatchingConfig, Producer, ProducerConfig
    from ordq.wire.client import GrpcTransport
    from tests.helpers.load import make_payload, parse_payload

    cluster.add_groups("g1")
    client, root = cluster.store.client, cluster.root
    _, admin = create_token(client, root, {"*": ["admin"]}, "admin")
    _, real_token = create_token(client, root, {"q": ["produce"]}, "real producer")
    _, rogue_token = create_token(client, root, {"q": ["produce"]}, "rogue")
    touch(client, root)
    admin_creds = attrs.evolve(cluster.credentials, token=admin)
    register(cluster.hosts, root, admin_creds)  # the coordinator and admin reads of this cluster
    # A coordinator that has read the admin token (brokers before issue 23's certificate gate
    # take control calls only from the broker certificate or a token): it replaces the stand-in.
    cluster.start_daemon("coordinator-1")
    cluster.create_queue("q")
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=root, queue="q", batching=BatchingConfig(linger_ms=1.0),
                         credentials=attrs.evolve(cluster.credentials, token=real_token))
    with Producer(cfg) as producer:
        for i in range(100):
            producer.send(make_payload(i, "P", 64))
        producer.flush(30)
        st = cluster.state()
        seg, epoch = st.open_segment.seg, st.producer_epoch
        master = cluster.store.live_members(st.head)["master"].address
        ch = channel(master, attrs.evolve(cluster.credentials, token=rogue_token), ())
        try:
            batch = encode_batch([Message(make_payload(100, "ROGUE", 64), None, (), 0)], epoch=epoch, first_seq=100)
            call = pb_grpc.BrokerStub(ch).Produce(iter([pb.ProduceRequest(queue="q", seg=seg, epoch=epoch,
                                                                         batches=[batch])]),
                                                  metadata=(("authorization", f"Bearer {rogue_token}"),), timeout=10)
            with pytest.raises(grpc.RpcError) as info:
                list(call)
            assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED, info.value
            from ordq.wire.errors import from_rpc_error

            assert isinstance(from_rpc_error(info.value, master), EpochNotIssued)
        finally:
            ch.close()
        for i in range(100, 200):
            producer.send(make_payload(i, "P", 64))
        producer.flush(30)
        assert producer.statistics().failovers == 0
    transport = GrpcTransport(credentials=admin_creds)
    try:
        # The producer's ack needs the slave's synced end, which the slave tells it directly;
        # the master's LAC (what a read sees) moves when the slave's answer reaches it, just
        # after: under load the read came first and saw only the first 100 (default tier).
        wait_until(lambda: transport.fetch(master, "q", seg, 0, max_bytes=1, max_wait_ms=0).readable_end >= 200,
                   timeout_s=30, interval_s=0.02, what="the master's LAC past the 200 acked messages")
        res = transport.fetch(master, "q", seg, 0, max_bytes=1 << 20, max_wait_ms=0)
        stats = json.loads(transport.health(master).stats_json)
    finally:
        transport.close()
    stored = [parse_payload(m.payload) for raw in res.batches for m in decode_batch(raw)[1]]
    assert [(p.seq, p.writer) for p in stored] == [(i, "P") for i in range(200)]
    assert stats["refused"].get("EpochNotIssued", 0) >= 1 and stats["epoch_key_refusals"] >= 1, stats


def test_consumer_calls_subscribe_commit_pop_and_the_parking_queue(cluster: Cluster) -> None:
    from ordq.common.errors import AlreadyExists, ConflictError, IllegalTransition, NotLeader
    from ordq.coordinator.state import Cursor

    cluster.add_groups("g1")
    cluster.create_queue("q")
    with CoordinatorClient(cluster.store, credentials=cluster.credentials) as client:
        cursor, starts_at = client.subscribe("q", "s", ["earliest"])
        assert cursor == cluster.store.get_cursor("q", "s")[0] and starts_at is None
        with pytest.raises(AlreadyExists):
            client.subscribe("q", "s")
        holder = client.acquire("consumer", "q", "s", "consumer-1")
        standby = client.acquire("consumer", "q", "s", "consumer-2")
        assert isinstance(holder, Held) and isinstance(standby, Refusal) and standby.holder == "consumer-1"
        try:
            _, version = cluster.store.get_cursor("q", "s")
            ahead = Cursor(seg=cursor.seg, offset=5, last_seq=4)
            # only the holder of the consumer lease commits
            with pytest.raises(NotLeader):  # LeaseLost: a key that is not the holder's
                client.commit("q", "s", ahead, version, attrs.evolve(holder, key="standby's guess"))
            v2 = client.commit("q", "s", ahead, version, holder)
            assert cluster.store.get_cursor("q", "s") == (ahead, v2)
            with pytest.raises(ConflictError):  # a stale version
                client.commit("q", "s", ahead, version, holder)
            with pytest.raises(IllegalTransition):  # never backward
                client.commit("q", "s", cursor, v2, holder)
            with pytest.raises(IllegalTransition):  # never past the consume list
                client.commit("q", "s", Cursor(seg=99, offset=0, last_seq=4), v2, holder)
            assert cluster.store.get_cursor("q", "s") == (ahead, v2)
        finally:
            client.release(holder)
        assert client.pop("q").queue == "q"  # nothing to pop: the state as it is
        assert client.ensure_parking_queue("q", "s") == "q.parked.s"
        assert cluster.store.load_state("q.parked.s")[0].groups == ("g1",)
        assert client.ensure_parking_queue("q", "s") == "q.parked.s"  # there already


def test_a_refusal_is_final_for_the_producer(cluster: Cluster) -> None:
    """A broker's PermissionDenied (the producer's token revoked) fails what is pending and
    every later send with it at once: no failover, no seal, no new segment."""
    import attrs

    from ordq.common.security import register
    from ordq.coordinator.tokens import create_token, revoke_token, token_id, touch
    from ordq.sdk import BatchingConfig, Producer, ProducerConfig

    cluster.add_groups("g1", "g2")
    client, root = cluster.store.client, cluster.root
    _, admin = create_token(client, root, {"*": ["admin"]}, "admin")
    _, token = create_token(client, root, {"q": ["produce"]}, "producer")
    touch(client, root)
    register(cluster.hosts, root, attrs.evolve(cluster.credentials, token=admin))
    cluster.start_daemon("coordinator-1")  # with the admin token, as above
    cluster.create_queue("q")
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=root, queue="q", batching=BatchingConfig(linger_ms=1.0),
                         credentials=attrs.evolve(cluster.credentials, token=token))
    with Producer(cfg) as producer:
        producer.send(b"before").result(30)
        before = cluster.state()
        revoke_token(client, root, token_id(token))
        touch(client, root)
        # the brokers reload tokens on the change (a watch): sends pass until they have
        deadline = time.monotonic() + 30
        with pytest.raises(PermissionDenied):
            while time.monotonic() < deadline:
                producer.send(b"after").result(30)
        with pytest.raises(PermissionDenied):
            producer.send(b"later")
        assert producer.statistics().failovers == 0
    after = cluster.state()
    assert (after.send, after.consume, after.producer_epoch) == (before.send, before.consume, before.producer_epoch)

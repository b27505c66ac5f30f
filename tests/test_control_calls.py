"""Issue #23: brokers take control calls (Fence, Seal, Reconcile, Replicate) only from brokers and
coordinators, and never dial an address a caller names. Issue #25's smaller items in the same
handlers: out-of-range numbers and a 5,000-character queue name give typed errors.

Each attack is a hand-made client built from the generated stubs, with a real certificate and
token of the cluster (the client certificate ``ordq up`` issues and a consume-only token: any
token holder), against a real TLS group with tokens enforced. Each test checks that the call
is refused with a typed error, that the broker counts it in
``ordq_broker_refused_requests_total``, and that nothing was stored, lost or forged: both
replicas' files are read back independently of the broker processes.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

from ordq.broker_group import log as seglog
from ordq.broker_group.process import BrokerGroupProcesses
from ordq.broker_group.segment_scan import iter_file_batches
from ordq.common import security
from ordq.common.errors import BrokerUnavailable, ConfigError, OrdqError, PermissionDenied
from ordq.common.metrics import value
from ordq.common.security import Credentials, channel, ensure_coordinator_pki, ensure_pki, token_metadata
from ordq.coordinator import state as sm
from ordq.coordinator.seal import run_seal
from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import ZkStore
from ordq.coordinator.tokens import create_token, touch
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import Message, encode_batch
from ordq.wire.client import GrpcTransport
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS
from tests.helpers.one_group import Q, one_group
from tests.util import read_metrics, wait_until

ACKED = 30  # messages acked into segment 0 before each attack


@attrs.frozen
class Group:
    store: ZkStore
    procs: BrokerGroupProcesses
    broker: Credentials  # the brokers' own certificate (a test acting as the master)
    coordinator: Credentials  # the coordinators' certificate (the Seal protocol's caller)
    writer: Credentials  # client certificate, produce token: the real producer
    intruder: Credentials  # client certificate, consume-only token: any token holder

    def address(self, role: str) -> str:
        return self.store.live_members("g1")[role].address

    def data_dir(self, role: str) -> Path:
        return self.procs.master.data_dir if role == "master" else self.procs.slave.data_dir

    def refused(self, role: str, reason: str) -> float:
        member = self.procs.master if role == "master" else self.procs.slave
        assert member.metrics_url is not None
        return value(read_metrics(member.metrics_url), "ordq_broker_refused_requests_total", reason=reason) or 0.0


@pytest.fixture
def group(zk_server: Any, zk_root: str, tmp_path: Path) -> Iterator[Group]:
    yield from _group(zk_server, zk_root, tmp_path)


@pytest.fixture
def lean_group(zk_server: Any, zk_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Group]:
    """``group`` with its slave serving the lean replication link (off by default)."""
    from ordq.broker_group.lean_link import ENV

    monkeypatch.setenv(ENV, "lean")  # the broker processes inherit it
    yield from _group(zk_server, zk_root, tmp_path)


def _group(zk_server: Any, zk_root: str, tmp_path: Path) -> Iterator[Group]:
    with one_group(zk_server.connection_string, zk_root, tmp_path) as base:
        store = base.store
        _, produce_token = create_token(store.client, zk_root, {Q: ["produce", "consume"]}, "the real producer")
        _, consume_token = create_token(store.client, zk_root, {Q: ["consume"]}, "an intruder: consume only")
        touch(store.client, zk_root)
        g = Group(store, base.procs, base.broker_tls, base.coordinator_tls,
                  attrs.evolve(base.client, token=produce_token), attrs.evolve(base.client, token=consume_token))
        # Brokers learn tokens through a ZooKeeper watch: wait until the intruder's token reads,
        # so what follows tests the control calls, not that watch.
        wait_until(lambda: _reads(g, "master") and _reads(g, "slave"), timeout_s=20, what="tokens loaded")
        yield g


def _reads(g: Group, role: str) -> bool:
    t = GrpcTransport(rpc_timeout_s=5.0, credentials=g.intruder)
    try:
        t.fetch(g.address(role), Q, 0, 0, max_bytes=1, max_wait_ms=0)
        return True
    except PermissionDenied:
        return False
    finally:
        t.close()


def payload(seq: int) -> bytes:
    return b"%010d|real" % seq


def batch(first_seq: int, count: int, *, forged: bool = False) -> bytes:
    text = b"forged" if forged else b"real"
    msgs = [Message(payload=b"%010d|" % s + text) for s in range(first_seq, first_seq + count)]
    return encode_batch(msgs, epoch=1, first_seq=first_seq)


def produce(g: Group, first_seq: int, count: int, *, seg: int = 0, per_batch: int = 5) -> None:
    """The real producer: ``count`` messages from ``first_seq``, waiting for every ack."""
    t = GrpcTransport(rpc_timeout_s=5.0, credentials=g.writer)
    stream = t.open_produce(g.address("master"), Q, seg, 1)
    try:
        for s in range(first_seq, first_seq + count, per_batch):
            stream.send([batch(s, min(per_batch, first_seq + count - s))])
        for ack in stream.acks():
            if ack.last_seq == first_seq + count - 1:
                return
    finally:
        stream.close()
        t.close()


def stored(g: Group, role: str, seg: int = 0) -> list[tuple[int, int]]:
    """(seq, payload CRC) of every message in one replica's file, read without the broker."""
    path = seglog.segment_dir(g.data_dir(role), Q, seg) / seglog.SEGMENT_FILE
    out: list[tuple[int, int]] = []
    for header, messages in iter_file_batches(path):
        out.extend((header.first_seq + i, zlib.crc32(m.payload)) for i, m in enumerate(messages))
    return out


def real(first: int, count: int) -> list[tuple[int, int]]:
    return [(s, zlib.crc32(payload(s))) for s in range(first, first + count)]


def sealed_segment(g: Group) -> None:
    """Segment 0 holds ACKED messages on both replicas and is sealed (in ZooKeeper and on
    both brokers) by the Seal protocol, run as a broker of the group may (DESIGN §5); writes
    go on in segment 1."""
    produce(g, 0, ACKED)
    g.store.apply(Q, lambda st, _f: sm.roll(st, "g1", 0))
    t = GrpcTransport(rpc_timeout_s=5.0, credentials=g.broker)
    try:
        st = run_seal(g.store, t, Q, 0)
    finally:
        t.close()
    z = st.segment(0)
    assert z is not None and z.status is SegStatus.SEALED and z.end == ACKED


def call(address: str, creds: Credentials, rpc: Callable[[pb_grpc.BrokerStub, Any], Any]) -> Any:
    """One call through a hand-made stub (its own connection), as an attacker's program makes
    it; an ordq error comes back typed (``from_rpc_error``), anything else as is."""
    ch = channel(address, creds, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
    try:
        return rpc(pb_grpc.BrokerStub(ch), token_metadata(creds))
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, address) from exc
    finally:
        ch.close()


def refusal(address: str, creds: Credentials, rpc: Callable[[pb_grpc.BrokerStub, Any], Any]) -> OrdqError | None:
    try:
        call(address, creds, rpc)
    except OrdqError as exc:
        return exc
    return None


def reconcile(end: int, peer: str = "", seg: int = 0) -> Callable[[pb_grpc.BrokerStub, Any], Any]:
    req = pb.ReconcileRequest(queue=Q, seg=seg, end=end, peer=peer)
    return lambda stub, md: stub.Reconcile(req, timeout=20, metadata=md)


class ForgingServer:
    """An attacker's broker look-alike: TLS with a certificate of the cluster CA, and a Fetch
    that serves CRC-valid forged batches for whatever is asked. Counts the calls it gets."""

    def __init__(self, creds: Credentials) -> None:
        self.fetches = 0
        outer = self

        class Servicer(pb_grpc.BrokerServicer):
            def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:  # noqa: N802
                outer.fetches += 1
                end = request.known_end if request.known_end > 0 else request.offset + 5
                forged = batch_format.stamp_offset(batch(1000 + request.offset, end - request.offset, forged=True),
                                             request.offset)
                return pb.FetchResponse(batches=[forged], readable_end=end, sealed=True)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_BrokerServicer_to_server(Servicer(), self.server)
        port = self.server.add_secure_port("127.0.0.1:0", security.server_credentials(creds))
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(0)


def client_cert_only(creds: Credentials) -> Credentials:
    """The certificate and key of ``creds`` without a token (what a forging server shows)."""
    return attrs.evolve(creds, token=None)


# -- the attacks -----------------------------------------------------------------------------


def test_a_token_holder_cannot_reconcile_a_sealed_segment_away(group: Group) -> None:
    """Attack: Reconcile(seg, end=0) on master and slave of a sealed segment, consume token."""
    g = group
    sealed_segment(g)
    before = {role: g.refused(role, "PermissionDenied") for role in ("master", "slave")}
    for role in ("master", "slave"):
        err = refusal(g.address(role), g.intruder, reconcile(0))
        assert isinstance(err, PermissionDenied), err
        # Refused on its headers, before the request naming the queue was read (issue 25): "*".
        assert err.queue in (Q, "*") and err.role == "cluster"
    for role in ("master", "slave"):
        assert g.refused(role, "PermissionDenied") == before[role] + 1
        assert stored(g, role) == real(0, ACKED), f"{role}'s copy changed"
    # Even the coordinator cannot cut a segment below the end ZooKeeper records, nor ask for
    # an end past 2^63 (an uncaught ValueError before): typed ConfigError, counted, no change.
    for end in (0, ACKED - 1, ACKED + 1, 2**64 - 1):
        for role in ("master", "slave"):
            err = refusal(g.address(role), g.coordinator, reconcile(end))
            assert isinstance(err, ConfigError), (end, role, err)
            assert f"sealed end {ACKED}" in str(err)
    for role in ("master", "slave"):
        assert g.refused(role, "ConfigError") >= 4
        assert stored(g, role) == real(0, ACKED)
    # The coordinator's Reconcile to ZooKeeper's end is what the Seal protocol sends: accepted.
    for role in ("master", "slave"):
        assert call(g.address(role), g.coordinator, reconcile(ACKED)).end == ACKED


def test_reconcile_never_copies_from_an_address_the_caller_names(group: Group) -> None:
    """Attack: Reconcile(end=N, peer=<attacker's server>), that server showing the client
    certificate ``ordq up`` issues. The broker copies only from its group's registered peer."""
    g = group
    sealed_segment(g)
    forger = ForgingServer(client_cert_only(g.writer))
    try:
        for role in ("master", "slave"):
            err = refusal(g.address(role), g.intruder, reconcile(ACKED, forger.address))
            assert isinstance(err, PermissionDenied), err
            # Not even the coordinator's certificate makes a broker dial a named address.
            err = refusal(g.address(role), g.coordinator, reconcile(ACKED, forger.address))
            assert isinstance(err, ConfigError) and "registered peer" in str(err), err
        # A broker dialling that server (with its own broker certificate) does not get past
        # the TLS handshake: the client certificate is for client authentication only.
        t = GrpcTransport(rpc_timeout_s=3.0, credentials=g.broker)
        try:
            with pytest.raises(BrokerUnavailable):
                t.fetch(forger.address, Q, 0, 0, max_bytes=1 << 20, max_wait_ms=0, known_end=ACKED)
        finally:
            t.close()
        assert forger.fetches == 0
        for role in ("master", "slave"):
            assert stored(g, role) == real(0, ACKED), f"{role} copied forged batches"
    finally:
        forger.close()


def test_repair_copies_come_from_the_registered_peer_only(group: Group) -> None:
    """A copy that lacks part of a sealed segment is completed from its group's other member
    (its liveness node in ZooKeeper), up to the end ZooKeeper records: the Reconcile RPC from
    the coordinator with an empty (or the right) peer, and the broker's own repair thread."""
    g = group
    sealed_segment(g)
    slave = g.procs.slave
    slave.kill()
    path = seglog.segment_dir(slave.data_dir, Q, 0) / seglog.SEGMENT_FILE
    # Cut the slave's file after its first batch (the file is its batches, back to back): its
    # next start finds a copy of 5 of the 30 messages ZooKeeper records, and completes it.
    with open(path, "r+b") as f:
        f.truncate(len(batch(0, 5)))
    assert stored(g, "slave") == real(0, 5)
    slave.start()
    wait_until(lambda: "slave" in g.store.live_members("g1"), what="slave live again")
    wait_until(lambda: stored(g, "slave") == real(0, ACKED), timeout_s=30,
               what="the slave's copy completed from the master")
    assert call(g.address("slave"), g.coordinator, reconcile(ACKED, g.address("master"))).end == ACKED


def test_a_token_holder_cannot_seal_or_fence_the_open_segment(group: Group) -> None:
    """Attack: Seal (and Fence) on the open segment from a client: the head was dropped."""
    g = group
    produce(g, 0, 10)
    before = {role: g.refused(role, "PermissionDenied") for role in ("master", "slave")}
    seal = pb.SegmentRef(queue=Q, seg=0)
    fence = pb.FenceRequest(queue=Q, seg=0, epoch=1)
    for _ in range(3):
        for role in ("master", "slave"):
            err = refusal(g.address(role), g.intruder, lambda s, md: s.Seal(seal, timeout=10, metadata=md))
            assert isinstance(err, PermissionDenied) and err.role == "cluster", err
            # A produce token is no better: only brokers and coordinators seal and fence.
            err = refusal(g.address(role), g.writer, lambda s, md: s.Fence(fence, timeout=10, metadata=md))
            assert isinstance(err, PermissionDenied) and err.role == "cluster", err
    for role in ("master", "slave"):
        assert g.refused(role, "PermissionDenied") == before[role] + 6
        info = call(g.address(role), g.coordinator,
                    lambda s, md: s.SegmentInfo(pb.SegmentRef(queue=Q, seg=0), timeout=10, metadata=md))
        assert not info.sealed and info.end == 10
    # OpenSegments (issue 29: the coordinator's one probe of a master) lists every queue: cluster only
    listing = pb.OpenSegmentsRequest()
    err = refusal(g.address("master"), g.writer, lambda s, md: s.OpenSegments(listing, timeout=10, metadata=md))
    assert isinstance(err, PermissionDenied) and err.role == "cluster", err
    answer = call(g.address("master"), g.coordinator,
                  lambda s, md: s.OpenSegments(listing, timeout=10, metadata=md))
    assert [(o.queue, o.seg, o.end.end) for o in answer.segments] == [(Q, 0, 10)]
    # every message acked: all its bytes count for a roll by size (coordinator/duties.py)
    assert answer.segments[0].end.HasField("acked_bytes")
    assert answer.segments[0].end.acked_bytes == answer.segments[0].end.bytes > 0
    # SealMany (issue 43: a dead group's segments sealed in batches): cluster only, like Seal
    many = pb.SealManyRequest(segments=[pb.SegmentRef(queue=Q, seg=0)])
    err = refusal(g.address("slave"), g.writer, lambda s, md: s.SealMany(many, timeout=10, metadata=md))
    assert isinstance(err, PermissionDenied) and err.role == "cluster", err
    # a segment the broker does not hold is answered with its error; nothing else is sealed
    absent = pb.SealManyRequest(segments=[pb.SegmentRef(queue=Q, seg=77), pb.SegmentRef(queue="x/..", seg=0)])
    got = call(g.address("slave"), g.coordinator, lambda s, md: s.SealMany(absent, timeout=10, metadata=md))
    assert [bool(r.error) for r in got.results] == [True, True], got
    st = g.store.load_state(Q)[0]
    assert st.head == "g1" and st.open_segment is not None and st.open_segment.seg == 0
    produce(g, 10, 10)  # the real producer goes on in the same segment
    for role in ("master", "slave"):
        assert stored(g, role) == real(0, 20)


def test_a_client_cannot_feed_a_slave_and_a_broker_cannot_claim_a_lac_past_the_copy(group: Group) -> None:
    """Replicate from a client certificate is refused; from a broker certificate, a LAC of
    2^63-1 is refused (typed, counted) instead of letting the slave's readers see past it."""
    g = group
    produce(g, 0, 10)
    slave = g.address("slave")
    forged = batch_format.stamp_offset(batch(10, 5, forged=True), 10)
    feed = [pb.ReplicateRequest(hello=True), pb.ReplicateRequest(queue=Q, seg=0, batches=[forged], lac=15)]
    before = g.refused("slave", "PermissionDenied")
    err = refusal(slave, g.intruder, lambda s, md: list(s.Replicate(iter(feed), timeout=10, metadata=md)))
    assert isinstance(err, PermissionDenied), err
    assert g.refused("slave", "PermissionDenied") == before + 1
    before = g.refused("slave", "ConfigError")
    lie = [pb.ReplicateRequest(hello=True), pb.ReplicateRequest(queue=Q, seg=0, lac=2**63 - 1)]
    err = refusal(slave, g.broker, lambda s, md: list(s.Replicate(iter(lie), timeout=10, metadata=md)))
    assert isinstance(err, ConfigError) and "past this copy's end" in str(err), err
    assert g.refused("slave", "ConfigError") == before + 1
    # A batch that does not start a segment the slave holds no copy of is refused before any
    # copy is made (issue 28's lab: a partition held one in a TCP buffer past the seal and the
    # removal of its segment; after the heal the slave made an empty copy again).
    late = [pb.ReplicateRequest(hello=True),
            pb.ReplicateRequest(queue=Q, seg=7, batches=[batch_format.stamp_offset(batch(1909, 5), 1909)], lac=-1)]
    err = refusal(slave, g.broker, lambda s, md: list(s.Replicate(iter(late), timeout=10, metadata=md)))
    assert isinstance(err, ConfigError) and "no copy of that segment here" in str(err), err
    assert not seglog.segment_dir(g.data_dir("slave"), Q, 7).exists()
    res = call(slave, g.intruder, lambda s, md: s.Fetch(pb.FetchRequest(queue=Q, seg=0, offset=0, max_bytes=1 << 20,
                                                                         known_end=-1), timeout=10, metadata=md))
    assert res.readable_end <= 10
    assert stored(g, "slave") == real(0, 10)
    produce(g, 10, 10)  # the master's own replication stream was never disturbed
    assert stored(g, "slave") == real(0, 20)


def test_a_5000_character_queue_name_gets_a_typed_short_error(group: Group) -> None:
    """The error used to carry the name whole and exceed gRPC's metadata limit: the client
    got an untyped failure. Now: InvalidName (a ConfigError on the wire), the name cut short."""
    g = group
    name = "q" * 5000
    fetch = pb.FetchRequest(queue=name, seg=0, offset=0, max_bytes=1, known_end=-1)
    produce_req = pb.ProduceRequest(queue=name, seg=0, epoch=1, batches=[batch(0, 1)])
    calls: list[tuple[Credentials, Callable[[pb_grpc.BrokerStub, Any], Any]]] = [
        (g.intruder, lambda s, md: s.Fetch(fetch, timeout=10, metadata=md)),
        (g.writer, lambda s, md: list(s.Produce(iter([produce_req]), timeout=10, metadata=md))),
        (g.coordinator, lambda s, md: s.Seal(pb.SegmentRef(queue=name, seg=0), timeout=10, metadata=md)),
        (g.coordinator, reconcile_named(name)),
    ]
    for creds, rpc in calls:
        err = refusal(g.address("master"), creds, rpc)
        assert isinstance(err, ConfigError), err
        assert "invalid queue name" in str(err) and "(5000 chars)" in str(err) and len(str(err)) < 500
    assert g.refused("master", "InvalidName") == len(calls)


def reconcile_named(queue: str) -> Callable[[pb_grpc.BrokerStub, Any], Any]:
    req = pb.ReconcileRequest(queue=queue, seg=0, end=1)
    return lambda stub, md: stub.Reconcile(req, timeout=10, metadata=md)


# -- certificates (no broker) ----------------------------------------------------------------


def _usages(cert: str | None) -> set[str]:
    from cryptography import x509

    assert cert is not None
    c = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    return {u._name for u in c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value}


def test_client_certificates_are_for_client_authentication_only(tmp_path: Path) -> None:
    broker, client = ensure_pki(tmp_path)
    coordinator = ensure_coordinator_pki(tmp_path)
    assert _usages(client.cert_file) == {"clientAuth"}
    assert _usages(broker.cert_file) == _usages(coordinator.cert_file) == {"serverAuth", "clientAuth"}
    # A server showing the client certificate: a broker dialling it fails the TLS handshake.
    forger = ForgingServer(client)
    t = GrpcTransport(rpc_timeout_s=3.0, credentials=broker)
    try:
        with pytest.raises(BrokerUnavailable):
            t.fetch(forger.address, Q, 0, 0, max_bytes=1, max_wait_ms=0)
        assert forger.fetches == 0
    finally:
        t.close()
        forger.close()


def test_an_old_client_certificate_valid_for_servers_is_issued_again(tmp_path: Path) -> None:
    """``ordq up`` on a folder from before this rule: its client certificate also says
    serverAuth (it could pose as a broker). ensure_pki issues it again, clientAuth only; the
    CA and the broker certificate stay as they were."""
    broker, client = ensure_pki(tmp_path)
    assert client.cert_file is not None and client.key_file is not None and broker.cert_file is not None
    security._make_cert(tmp_path / "ca.pem", tmp_path / "ca-key.pem", Path(client.cert_file),  # the old rule
                        Path(client.key_file), security.CLIENT_CN, server=True)
    assert _usages(client.cert_file) == {"serverAuth", "clientAuth"}
    ca, broker_pem = (tmp_path / "ca.pem").read_bytes(), Path(broker.cert_file).read_bytes()
    again = ensure_pki(tmp_path)
    assert again == (broker, client)
    assert _usages(client.cert_file) == {"clientAuth"}
    assert (tmp_path / "ca.pem").read_bytes() == ca and Path(broker.cert_file).read_bytes() == broker_pem
    kept = Path(client.cert_file).read_bytes()
    ensure_pki(tmp_path)
    assert Path(client.cert_file).read_bytes() == kept  # issued once, then kept


def test_numbers_at_the_ends_of_their_fields_are_answered_or_refused_typed(group: Group) -> None:
    """Every control and data call with the largest value its field holds: an answer or a typed
    ordq error (never an uncaught exception in the broker, which the client sees untyped)."""
    g = group
    produce(g, 0, 10)
    big, big63, big32 = 2**64 - 1, 2**63 - 1, 2**32 - 1
    calls: list[tuple[str, Callable[[pb_grpc.BrokerStub, Any], Any]]] = [
        ("Fence epoch", lambda s, md: s.Fence(pb.FenceRequest(queue=Q, seg=0, epoch=big), timeout=10, metadata=md)),
        ("Fence seg", lambda s, md: s.Fence(pb.FenceRequest(queue=Q, seg=big, epoch=1), timeout=10, metadata=md)),
        ("Seal seg", lambda s, md: s.Seal(pb.SegmentRef(queue=Q, seg=big), timeout=10, metadata=md)),
        ("SegmentInfo seg", lambda s, md: s.SegmentInfo(pb.SegmentRef(queue=Q, seg=big), timeout=10, metadata=md)),
        ("Reconcile seg", lambda s, md: s.Reconcile(pb.ReconcileRequest(queue=Q, seg=big, end=big), timeout=10,
                                                    metadata=md)),
        ("Fetch offset", lambda s, md: s.Fetch(pb.FetchRequest(queue=Q, seg=0, offset=big, max_bytes=big32,
                                                               max_wait_ms=0, known_end=big63), timeout=10,
                                               metadata=md)),
        ("Fetch seg", lambda s, md: s.Fetch(pb.FetchRequest(queue=Q, seg=big, offset=0, max_bytes=1, max_wait_ms=0,
                                                            known_end=-1), timeout=10, metadata=md)),
        ("Read offset", lambda s, md: list(s.Read(pb.FetchRequest(queue=Q, seg=0, offset=big, max_bytes=1,
                                                                  max_wait_ms=0, known_end=-1, stream_ms=big32),
                                                  timeout=10, metadata=md))),
    ]
    for what, rpc in calls:
        for role in ("master", "slave"):
            try:
                call(g.address(role), g.coordinator, rpc)
            except BrokerUnavailable as exc:  # what an untyped failure (an uncaught exception) becomes
                assert "UNKNOWN" not in str(exc) and "Exception" not in str(exc), (what, role, exc)
            except OrdqError:
                pass  # typed: EpochNotIssued, SegmentNotFound, ... (Fetch and Read answer empty)
    for member in g.procs.members:
        assert "Traceback" not in member.log_tail(1000), f"{member.role}: an uncaught exception"
    for role in ("master", "slave"):
        assert stored(g, role) == real(0, 10)
    produce(g, 10, 10)  # the group still serves its producer


def _lean(address: str, creds: Credentials | None) -> tuple[Any, Any]:
    """A TLS connection to a slave's lean replication link (broker_group/lean_link.py) with
    ``creds``' certificate (None: with none)."""
    import socket
    import ssl

    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(cafile=(creds or group_ca[0]).ca_file)
    if creds is not None:
        assert creds.cert_file is not None and creds.key_file is not None
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=host), raw


group_ca: list[Credentials] = []


def _answers(sock: Any) -> list[pb.ReplicateResponse]:
    """Every frame the slave sends until it closes the link."""
    import struct

    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack(">I", data[:4])
        out.append(pb.ReplicateResponse.FromString(data[4:4 + n]))
        data = data[4 + n:]
    return out


def test_the_lean_replication_link_takes_only_brokers_and_checks_what_they_send(lean_group: Group) -> None:
    """Issue 39: the slave's lean replication link (its own port, published in its liveness
    node) refuses a client certificate before reading a frame, a connection without a
    certificate at the handshake, a frame longer than the broker's limit before its body, and
    a LAC past its copy from a broker certificate (each counted, nothing stored); the
    master's own link is not disturbed."""
    import json
    import ssl
    import struct

    from ordq.broker_group.lean_link import frame

    g = lean_group
    group_ca[:] = [g.broker]
    produce(g, 0, 10)
    node = json.loads(g.store.client.get(g.store.paths.live("g1", "slave"))[0])
    lean = node["replication"]
    assert lean != node["address"]
    forged = batch_format.stamp_offset(batch(10, 5, forged=True), 10)
    feed = frame(pb.ReplicateRequest(hello=True)) + frame(pb.ReplicateRequest(queue=Q, seg=0, batches=[forged],
                                                                             lac=15))
    before = g.refused("slave", "PermissionDenied")
    sock, raw = _lean(lean, g.intruder)  # a client certificate with a token's worth of rights
    with raw, sock:
        sock.sendall(feed)
        assert _answers(sock) == []  # closed unanswered
    wait_until(lambda: g.refused("slave", "PermissionDenied") == before + 1, timeout_s=10, what="refusal counted")
    try:  # no certificate: the handshake fails (TLS 1.3: the client learns it on its first read)
        sock, raw = _lean(lean, None)
        with raw, sock:
            sock.sendall(feed)
            got = _answers(sock)
    except (ssl.SSLError, ConnectionError):
        got = []
    assert got == []  # not even the hello answered
    before_config = g.refused("slave", "ConfigError")
    sock, raw = _lean(lean, g.broker)
    with raw, sock:  # a frame announced past the limit: refused before its body is read
        sock.sendall(frame(pb.ReplicateRequest(hello=True)) + struct.pack(">I", 1 << 31))
        assert _answers(sock) == [pb.ReplicateResponse()]  # the hello's answer, then closed
    sock, raw = _lean(lean, g.broker)
    with raw, sock:
        sock.sendall(frame(pb.ReplicateRequest(hello=True)) + frame(pb.ReplicateRequest(queue=Q, seg=0,
                                                                                        lac=2**63 - 1)))
        assert _answers(sock) == [pb.ReplicateResponse()]
    wait_until(lambda: g.refused("slave", "ConfigError") == before_config + 2, timeout_s=10, what="refusals counted")
    assert stored(g, "slave") == real(0, 10)
    produce(g, 10, 10)  # the master's own link was never disturbed
    assert stored(g, "slave") == real(0, 20)


class CountingTransport:
    """The coordinator's transport, counting the calls made through it by name."""

    def __init__(self, inner: GrpcTransport) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name == "close":
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


def test_a_listing_asks_a_group_once_also_for_the_segments_its_replica_sealed_first(group: Group) -> None:
    """Issue 43: right after a group's master died, each queue it headed holds a segment that
    ZooKeeper still calls sealing and the surviving replica has sealed already (its SealMany
    ran; the seals are not written yet). ``queue list`` asked each such segment's extent in calls
    of its own (SegmentInfo, then Fetch): at 10^5 queues it had not answered after 300 s. Now
    the one OpenSegments call per group names them too, with the same extents. Failing first:
    3 SegmentInfo and 3 Fetch calls beside the OpenSegments."""
    from ordq.admin.api import queue_row
    from ordq.admin.queue_list import list_rows
    from ordq.sdk.replicas import ReplicaReader

    produce(group, 0, ACKED)
    names = [Q, "idle-0", "idle-1"]
    group.store.create_queues(names[1:], ["g1"])
    for q in names:
        group.store.apply(q, lambda st, _f: sm.roll(st, "g1", 0))
    t = GrpcTransport(rpc_timeout_s=5.0, credentials=group.coordinator)
    try:
        slave = group.address("slave")
        for q in names:  # the slave sealed them; ZooKeeper says sealing still
            assert t.seal(slave, q, 0).end == (ACKED if q == Q else 0)
        group.procs.master.kill()
        wait_until(lambda: "master" not in group.store.live_members("g1"), what="the master's liveness gone")
        counting = CountingTransport(t)
        rows, corrupt = list_rows(group.store, ReplicaReader(group.store, counting), names, None,  # type: ignore[arg-type]
                                  queue_row)
        assert corrupt == [] and counting.calls == {"open_segments": 1}, counting.calls
        by_queue = {r["queue"]: (r["stored"], r["last_seq"]) for r in rows}
        assert by_queue == {Q: (ACKED, ACKED - 1), "idle-0": (0, -1), "idle-1": (0, -1)}, by_queue
    finally:
        t.close()


def _metric(g: Group, role: str, name: str) -> float:
    member = g.procs.master if role == "master" else g.procs.slave
    assert member.metrics_url is not None
    return value(read_metrics(member.metrics_url), name) or 0.0


def _feed_slave(g: Group, seg: int, *, answers_many: bool) -> list[pb.ReplicateResponse]:
    """As a master would: one large request then 40 small ones of a new segment on one
    Replicate stream, kept open until every request is answered; the slave's answers."""
    big = encode_batch([Message(payload=b"%010d|" % s + b"b" * 4096) for s in range(100)], epoch=1, first_seq=0)
    feed = [pb.ReplicateRequest(queue=Q, seg=seg, batches=[batch_format.stamp_offset(big, 0)], lac=-1)]
    feed += [pb.ReplicateRequest(queue=Q, seg=seg, batches=[batch_format.stamp_offset(batch(s, 1), s)], lac=-1)
             for s in range(100, 140)]
    answered = threading.Event()

    def requests() -> Iterator[pb.ReplicateRequest]:
        yield pb.ReplicateRequest(hello=True, answers_many=answers_many)
        yield from feed
        answered.wait(30)  # the stream ends (and the slave drops what it owes) once all are answered

    def rpc(stub: pb_grpc.BrokerStub, md: Any) -> list[pb.ReplicateResponse]:
        out: list[pb.ReplicateResponse] = []
        for resp in stub.Replicate(requests(), timeout=60, metadata=md):
            if resp.synced:
                out.append(resp)
            if sum(max(r.answered, 1) for r in out) >= len(feed):
                answered.set()
        return out

    return call(g.address("slave"), g.broker, rpc)


def test_the_slave_answers_what_one_commit_synced_with_one_answer(group: Group) -> None:
    """Issue 39: every request with batches is answered, in order, and one answer covers every
    request whose group commit is done when it is sent (``answered`` says how many), so the
    slave writes no more answers than it made syncs (before: one answer per request). A
    master whose hello does not say ``answers_many`` (an older one) still gets one per request.
    The real master counts them (its window of unanswered bytes drains to 0)."""
    g = group
    before = {k: _metric(g, "slave", k) for k in ("ordq_broker_syncs_total", "ordq_broker_replication_answers_total",
                                                  "ordq_broker_replication_answered_requests_total")}
    got = _feed_slave(g, 9, answers_many=True)
    after = {k: _metric(g, "slave", k) for k in before}
    assert sum(max(r.answered, 1) for r in got) == 41
    assert [[x.seg for x in r.synced] for r in got] == [[9]] * len(got)
    ends = [r.synced[0].synced_end for r in got]
    assert ends == sorted(ends) and ends[-1] == 140  # every batch synced before its answer
    delta = {k: after[k] - before[k] for k in before}
    assert delta["ordq_broker_replication_answered_requests_total"] == 41
    assert delta["ordq_broker_replication_answers_total"] == len(got)
    assert len(got) <= delta["ordq_broker_syncs_total"], (len(got), delta)
    old = _feed_slave(g, 10, answers_many=False)
    assert [r.answered for r in old] == [0] * 41
    assert old[-1].synced[0].synced_end == 140
    # The real master's stream: pipelined batches, every ack, and nothing left unanswered.
    produce(g, 0, 2000, per_batch=2)
    assert stored(g, "slave") == real(0, 2000)
    wait_until(lambda: _metric(g, "master", "ordq_broker_replication_lag_bytes") == 0, timeout_s=20,
               what="the master's window of unanswered bytes drained")

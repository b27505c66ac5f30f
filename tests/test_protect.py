"""A broker that protects itself (issue 25), on real broker processes and real ZooKeeper.

- Bytes checked on the way out: a byte flipped in a sealed segment of a running master is
  never delivered; the master sets its copy aside (counted, logged), readers go to the slave,
  and the master's copy is rebuilt from the slave.
- One memory budget per broker: huge fetches and unread Read streams are bounded, memory
  comes back when they end, and a producer of another queue on the same broker keeps being
  acked without failing over.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest

from ordq.admin.groups import roll_queue
from ordq.broker_group import log as seglog
from ordq.broker_group.answer import encode
from ordq.broker_group.segment_scan import iter_file_batches
from ordq.common.errors import OrdqError
from ordq.common.security import channel as security_channel
from ordq.sdk.replicas import ReplicaReader
from ordq.wire import batch as batch_format
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.client import GrpcTransport
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk


def _copy(data_dir: Path, queue: str, seg: int) -> list[tuple[int, int]]:
    """(seq, payload crc) of every message of one replica's copy, read from its file."""
    path = seglog.segment_dir(data_dir, queue, seg) / seglog.SEGMENT_FILE
    out = []
    for header, messages in iter_file_batches(path):
        out.extend((header.first_seq + i, zlib.crc32(m.payload)) for i, m in enumerate(messages))
    return out


def _stats(cluster: Cluster, address: str) -> dict:
    return dict(json.loads(cluster.transport.health(address).stats_json))


def test_a_byte_flipped_in_a_sealed_segment_of_a_running_master_is_never_delivered_and_repaired(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    n = 3000
    cluster.add_groups("g1")
    cluster.create_queue()
    producer = cluster.producer(n=n, rate=None)
    producer.start()
    producer.join(60)
    with ReplicaReader(cluster.store) as reader:
        roll_queue(cluster.store, reader, "q")  # segment 0 sealed, writes go on in segment 1
    cluster.wait_state(lambda st: st.consume[0].seg == 0 and st.consume[0].end == n, what="segment 0 sealed")
    subs = [f"s{i}" for i in range(6)]
    for sub in subs:  # all subscribed before anyone reads: nobody pops segment 0 early
        cluster.store.create_subscription("q", sub)
    group = cluster.groups["g1"]
    master = cluster.store.live_members("g1")["master"].address
    path = seglog.segment_dir(group.master.data_dir, "q", 0) / seglog.SEGMENT_FILE
    good = _copy(group.slave.data_dir, "q", 0)
    with open(path, "r+b") as f:  # the running master's file: its page cache sees the change
        size = f.seek(0, 2)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x40]))

    caplog.set_level(logging.WARNING, logger="ordq.consumer")
    consumers = [cluster.consumer(until=n - 1, sub=sub) for sub in subs]
    for c in consumers:
        c.start()
    for c in consumers:
        c.join(90)
    for c in consumers:
        summary = check_delivery(producer.acked, [c.delivered])
        assert summary.acked == summary.delivered == n

    # The master found it on the way out, counted it, said which segment, and rebuilt it.
    assert "segment q/0: a served read found corrupt bytes" in group.master.log_tail(200)
    assert any("seg 0" in r.getMessage() and master in r.getMessage() for r in caplog.records), \
        "the consumer names the broker and segment it fell back from"
    wait_until(lambda: (s := _stats(cluster, master))["corrupt"] == [] and s["reconciled"] >= 1,
               timeout_s=30, what="the master's copy repaired")
    stats = _stats(cluster, master)
    assert stats["corrupt_reads"] == 1
    assert _copy(group.master.data_dir, "q", 0) == good
    assert list(path.parent.glob("segment.log.corrupt-*")), "the corrupt copy is kept as evidence"
    res = cluster.transport.fetch(master, "q", 0, 0, max_bytes=64 << 20, max_wait_ms=0, known_end=n)
    assert sum(batch_format.parse_header(b).count for b in res.batches) == n  # served (and checked) again


# -- one memory budget per broker ----------------------------------------------------------------

HUGE = (1 << 32) - 1  # max_bytes a hostile reader asks for


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class _Sampler:
    """The peak RSS of one process, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def test_huge_fetches_and_unread_streams_stay_in_the_budget_and_a_neighbour_keeps_writing(cluster: Cluster) -> None:
    cluster.add_groups("g1")
    cluster.create_queue("a", ["g1"])
    cluster.create_queue("b", ["g1"])
    fill = cluster.producer(n=48_000, queue="a", writer="A", size=1000, rate=None, send_timeout_s=30.0)  # ~48 MB
    fill.start()
    fill.join(120)
    group = cluster.groups["g1"]
    pid = group.master.proc.pid
    assert pid is not None
    address = cluster.store.live_members("g1")["master"].address
    neighbour = cluster.producer(n=10**9, queue="b", writer="B", rate=500, send_timeout_s=20.0)
    neighbour.start()
    wait_until(lambda: len(neighbour.acked) >= 500, timeout_s=30, what="the neighbour writing")
    baseline = _rss_mib(pid)
    sampler = _Sampler(pid)

    ch = security_channel(address, cluster.credentials, GRPC_OPTIONS)
    stub = pb_grpc.BrokerStub(ch)
    huge = pb.FetchRequest(queue="a", seg=0, offset=0, max_bytes=HUGE, max_wait_ms=0, known_end=-1)
    outcomes: dict[str, int] = {}
    try:
        # 24 unread Read streams: started, never read.
        streams = [stub.Read(pb.FetchRequest(queue="a", seg=0, offset=0, max_bytes=HUGE, max_wait_ms=0,
                                             known_end=-1, stream_ms=60_000), timeout=120) for _ in range(24)]
        # 24 Fetch calls at once, three rounds (their answers are read).
        acked_before = len(neighbour.acked)
        for _ in range(3):
            calls = [stub.Fetch.future(huge, timeout=60) for _ in range(24)]
            for call in calls:
                try:
                    call.result()
                    outcomes["ok"] = outcomes.get("ok", 0) + 1
                except grpc.RpcError as exc:
                    err = from_rpc_error(exc, address)
                    outcomes[type(err).__name__] = outcomes.get(type(err).__name__, 0) + 1
        assert len(neighbour.acked) > acked_before, "the neighbour was acked while the fetches ran"
        during = sampler.peak
        for s in streams:
            s.cancel()
    finally:
        ch.close()
    peak = sampler.stop()
    print(f"master RSS: baseline {baseline:.0f} MiB, peak {peak:.0f} MiB (during fetches {during:.0f}); "
          f"fetch outcomes {outcomes}")
    stats = neighbour.statistics()
    assert stats is not None and stats.failovers == 0, f"the neighbour failed over: {stats}"
    assert neighbour.error is None
    # What the budget controls, exactly: the bytes it let this connection hold at once are its
    # share (32 MiB), plus one batch an answer may carry past its grant, plus the neighbour's
    # produce requests in flight (charged to another holder).
    budget = _stats(cluster, address)["budget"]
    assert budget["peak_bytes"] <= (32 << 20) + (2 << 20), f"the budget let more through than one share: {budget}"
    # RSS is more than the budget's bytes: gRPC's copy and TLS frames of answers it has taken
    # (a Read stream's answer leaves the budget once gRPC took it), and the allocator's slack.
    # Measured +67 to +200 MiB (docs/BENCHMARKS.md, "Memory budget"); before the budget
    # +2,372 MiB. Bound: the budget's whole total (256 MiB), which one connection's attack
    # must never cost.
    assert peak - baseline < 256, f"master RSS grew {peak - baseline:.0f} MiB (bound 256 MiB, the budget's total)"
    wait_until(lambda: _rss_mib(pid) < baseline * 1.10, timeout_s=30, interval_s=0.2,
               what=f"master RSS back within 10% of its baseline {baseline:.0f} MiB")
    assert "Traceback" not in group.master.log_tail(400), "cancelled streams log no tracebacks"
    assert "ExecuteBatchError" not in group.master.log_tail(400)
    neighbour.stop_sending()
    neighbour.join(60)  # every message the neighbour sent was acked, in order


@pytest.mark.parametrize("sizes, readable_end, sealed", [
    ([], 0, False), ([], 0, True), ([], 5, False), ([1], 1, False), ([127, 128, 300], 2**40, True),
    ([70_000, 3], 7, False), ([(1 << 21) + 5], 1, True),
])
def test_an_encoded_answer_is_the_fetch_response_protobuf_would_send(sizes: list[int], readable_end: int,
                                                                      sealed: bool) -> None:
    batches = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    ans = encode(batches, offset=3, end_offset=9, readable_end=readable_end, sealed=sealed)
    assert ans.wire == pb.FetchResponse(batches=batches, readable_end=readable_end, sealed=sealed).SerializeToString()
    assert ans.batch_bytes == sum(sizes) and ans.batches == len(sizes)
    assert ans.end_offset == (9 if batches else 3)


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def test_connections_that_never_finish_their_handshake_are_closed_and_do_not_lock_clients_out(
        cluster: Cluster) -> None:
    cluster.add_groups("g1")
    master = cluster.groups["g1"].master
    pid = master.proc.pid
    assert pid is not None and master.address is not None
    host, port = master.address.rsplit(":", 1)
    before = _fds(pid)
    silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(100)]  # no ClientHello, ever
    try:
        wait_until(lambda: _fds(pid) >= before + 90, timeout_s=10, what="the broker accepted them")
        assert cluster.transport.health(master.address).role == "master"  # a real client still gets in
        # Closed by the broker at its handshake deadline (10 s), not held for ever.
        wait_until(lambda: _fds(pid) <= before + 5, timeout_s=40, interval_s=0.2,
                   what=f"the silent connections closed (fds {_fds(pid)}, {before} before)")
    finally:
        for s in silent:
            s.close()


# -- refused before the body is read -------------------------------------------------------------

BODY = 20 << 20  # a request body a hostile caller sends with its call


def _received(port: int) -> int:
    """Bytes received so far on the server side of every TCP connection to ``port`` (the
    kernel's tcp_info, via ``ss``): what the broker took in, whoever read it."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True, check=True).stdout
    return sum(int(n) for n in re.findall(r"bytes_received:(\d+)", out))


def _padded(req: pb.FetchRequest, n: int) -> bytes:
    """``req`` grown to ``n`` more bytes by a field FetchRequest does not have (still valid)."""
    size, varint = n, bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        varint.append(byte | (0x80 if size else 0))
        if not size:
            break
    return req.SerializeToString() + bytes([(15 << 3) | 2]) + bytes(varint) + b"\0" * n


def test_a_bad_token_is_refused_before_the_request_body_is_read(cluster: Cluster) -> None:
    """The broker used to receive a 25 MiB request whole before it checked the token. Now the
    headers are checked first: a caller without a known token is refused, typed and counted,
    the broker having taken in the body's first flow-control window (1.5-5 MiB measured), not
    the 20 MiB. A Fetch request past its call's own limit is refused typed and counted."""
    from ordq.common.errors import ConfigError, PermissionDenied
    from ordq.coordinator.tokens import create_token, touch

    cluster.add_groups("g1")
    cluster.create_queue("a", ["g1"])
    _, token = create_token(cluster.store.client, cluster.root, {"*": ["consume"]}, "a real reader")
    touch(cluster.store.client, cluster.root)
    master = cluster.groups["g1"].master
    address = master.address
    assert address is not None
    port = int(address.rsplit(":", 1)[1])
    req = pb.FetchRequest(queue="a", seg=0, offset=0, max_bytes=1, max_wait_ms=0, known_end=-1)
    body = _padded(req, BODY)
    channels = [security_channel(address, cluster.credentials,
                                 [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]) for _ in range(2)]

    def call(tok: str, ch: grpc.Channel) -> tuple[Exception | None, int, float]:
        before, t0 = _received(port), time.monotonic()
        try:
            ch.unary_unary("/ordq.v1.Broker/Fetch")(body, metadata=(("authorization", f"Bearer {tok}"),), timeout=30)
            err = None
        except grpc.RpcError as exc:
            err = from_rpc_error(exc, address)
        return err, _received(port) - before, time.monotonic() - t0

    reader = GrpcTransport(credentials=attrs.evolve(cluster.credentials, token=token))

    def refused(kind: str = "PermissionDenied") -> int:
        return int(json.loads(reader.health(address).stats_json)["refused"].get(kind, 0))

    try:
        wait_until(lambda: reader.fetch(address, "a", 0, 0, max_bytes=1, max_wait_ms=0) is not None, timeout_s=20,
                   what="the real token loaded")
        refused_before = refused()
        # A caller on a connection of its own, then on one that just carried a 20 MiB body
        # (its flow-control windows grown by it): the first window is what the broker takes in.
        results = [call(bad, channels[0]) for bad in ("ordq_nosuchtoken", "", token[:-4] + "AAAA")]
        refused_after = refused()
        # With the real token the body is read whole; a Fetch request past its call's limit
        # (64 KiB) is then refused by the broker, typed and counted (gRPC's own receive limit,
        # 25 MiB for every call, refuses untyped and uncounted).
        config_before = refused("ConfigError")
        big, good_bytes, good_s = call(token, channels[1])
        config_after = refused("ConfigError")
        results += [call("ordq_nosuchtoken", channels[1])]
    finally:
        reader.close()
        for ch in channels:
            ch.close()
    print(f"a known token: {good_bytes / 2**20:.1f} MiB received in {good_s * 1000:.0f} ms, then refused; bad tokens: "
          + ", ".join(f"{type(e).__name__} after {n / 2**10:.0f} KiB in {s * 1000:.0f} ms" for e, n, s in results))
    assert good_bytes >= BODY  # what the broker takes in of a body it reads: the measure is real
    for i, (err, n, _s) in enumerate(results):
        assert isinstance(err, PermissionDenied), err
        # A fresh connection's first window (1.5-4 MiB measured): never the whole body. On a
        # connection a 20 MiB body has just grown (results[3]), gRPC's BDP probing allows up
        # to 16 MiB and the kernel's receive buffer up to tcp_rmem's max (6 MiB) on top, more
        # than this body: it was taken in whole once (21.0 MB), so no size bound holds there;
        # only the refusal, typed and counted, is checked for it.
        if i < 3:
            assert n < BODY // 2, f"the broker took in {n} bytes of a {BODY}-byte body it refused"
    assert refused_after - refused_before == 3
    assert isinstance(big, ConfigError) and "over this call's limit" in str(big), big
    assert config_after - config_before == 1


def _consumer_and_neighbour(cluster: Cluster, queue: str) -> tuple[str, str, str]:
    """Tokens (enforced from now on): one that may consume ``queue`` only, one that may consume
    every queue (a neighbour; it may also read the broker's counters); and g1's master address."""
    from ordq.coordinator.tokens import create_token, touch

    _, one = create_token(cluster.store.client, cluster.root, {queue: ["consume"]}, f"a consumer of {queue}")
    _, every = create_token(cluster.store.client, cluster.root, {"*": ["consume"]}, "a neighbour")
    touch(cluster.store.client, cluster.root)
    address = cluster.store.live_members("g1")["master"].address
    assert address is not None
    return one, every, address


@pytest.mark.slow
def test_a_tokens_calls_cost_its_own_share_of_the_broker_and_are_refused_before_their_body(cluster: Cluster) -> None:
    """Issue 25, the noisy neighbour: a token's requests past gRPC's receive limit (30 MiB,
    each received and decrypted up to 25 MiB before gRPC refused it) cost the broker what its
    neighbours' acks needed. Now the time the broker spends on a token's calls, refused ones
    included, is charged to that token (broker_group/request_time.py): once over its share,
    its next calls wait or are refused at once, typed (ResourceExhausted, "request time"),
    counted, before their body is read, while another token is served. The share is
    work-conserving (issue 39): it holds while another token is active, so the neighbour
    here keeps calling throughout (alone, the abuser would be served)."""
    from ordq.wire.errors import ResourceExhausted

    cluster.add_groups("g1")
    # A share this test's client can exceed (its TLS sends ~7 bodies of 30 MiB a second, each
    # charged ~26 ms: under the default 0.2 s per s).
    master = cluster.groups["g1"].master
    master.stop()
    # And held whenever the neighbour is active: by default a share holds only on a busy loop
    # (--request-busy-share 0.6, the noisy-neighbour drill's stop 60), which these ~0.2 s per s
    # of bodies do not make; this test is about the hold and the refusal themselves.
    master.proc.argv += ("--request-share", "0.02", "--request-busy-share", "0")
    cluster.restart(master)
    cluster.create_queue("a", ["g1"])
    abuser, other, address = _consumer_and_neighbour(cluster, "a")
    neighbour = GrpcTransport(credentials=attrs.evolve(cluster.credentials, token=other))
    wait_until(lambda: neighbour.fetch(address, "a", 0, 0, max_bytes=1, max_wait_ms=0) is not None, timeout_s=20,
               what="the neighbour's token loaded")
    body = _padded(pb.FetchRequest(queue="a", seg=0, offset=0, max_bytes=1, max_wait_ms=0, known_end=-1), 30 << 20)
    outcomes: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def abuse() -> None:
        ch = security_channel(address, cluster.credentials, [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])
        try:
            while not stop.is_set():
                try:
                    ch.unary_unary("/ordq.v1.Broker/Fetch")(body, metadata=(("authorization", f"Bearer {abuser}"),),
                                                            timeout=30)
                    what = "ok"
                except grpc.RpcError as exc:
                    err = from_rpc_error(exc, address)
                    what = (f"ResourceExhausted {err.resource}" if isinstance(err, ResourceExhausted)
                            else type(err).__name__)
                with lock:
                    outcomes[what] = outcomes.get(what, 0) + 1
        finally:
            ch.close()

    served: list[float] = []

    def neighbour_calls() -> None:  # an active neighbour: a call every 50 ms, each served
        while not stop.wait(0.05):
            if neighbour.fetch(address, "a", 0, 0, max_bytes=1, max_wait_ms=0) is not None:
                served.append(time.monotonic())

    threads = [threading.Thread(target=abuse, daemon=True) for _ in range(3)]
    threads.append(threading.Thread(target=neighbour_calls, daemon=True))
    for t in threads:
        t.start()
    try:
        wait_until(lambda: outcomes.get("ResourceExhausted request time", 0) >= 3, timeout_s=60,
                   what="the abuser's calls refused for its share of request time")
        n = len(served)
        wait_until(lambda: len(served) > n, timeout_s=20, what="the neighbour served meanwhile")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        print(f"abuser outcomes {outcomes}")
        try:
            stats = json.loads(neighbour.health(address).stats_json)
        finally:
            neighbour.close()
    print(f"request time {stats['request_time']}")
    assert not outcomes.get("ok")
    assert stats["request_time"]["refused"] >= 3 and stats["refused"].get("ResourceExhausted", 0) >= 3


def test_one_find_request_looks_at_each_segment_once_at_most(cluster: Cluster) -> None:
    """A consume token's single Find naming its queue's one segment 8,000 times (56 KB, under
    the control calls' 64 KiB limit) made the broker look the key up 8,000 times for one call,
    and a flood of such calls multiplies it. Guard: ``Finder.find`` refuses a request that
    names a segment twice, before any lookup: typed (ConfigError, INVALID_ARGUMENT), counted;
    an honest request is answered as before. (The size limit bounds how many segments one
    request can name.)"""
    from ordq.wire.errors import ConfigError

    cluster.add_groups("g1")
    cluster.create_queue("a", ["g1"])
    producer = cluster.producer(n=50, queue="a")
    producer.start()
    producer.join(60)
    token, reader, address = _consumer_and_neighbour(cluster, "a")
    client = GrpcTransport(credentials=attrs.evolve(cluster.credentials, token=token))
    counters = GrpcTransport(credentials=attrs.evolve(cluster.credentials, token=reader))
    try:
        honest = pb.FindRequest(queue="a", segments=[pb.FindSegmentRef(seg=0, known_end=-1)], key=b"none", limit=1)
        wait_until(lambda: client.find(address, honest) is not None, timeout_s=20, what="the token loaded")
        twice = pb.FindRequest(queue="a", segments=[pb.FindSegmentRef(seg=0, known_end=0)] * 8_000, key=b"none",
                               limit=1)
        started = time.monotonic()
        with pytest.raises(ConfigError, match="names segment 0 twice"):
            client.find(address, twice)
        print(f"8,000 refs of one segment: refused in {time.monotonic() - started:.3f} s")
        assert not client.find(address, honest).matches  # an honest request, answered as before
        refused = json.loads(counters.health(address).stats_json)["refused"]
    finally:
        client.close()
        counters.close()
    assert refused.get("ConfigError", 0) >= 1, refused


IDLE_STREAMS = 1200  # more than the calls the server admits at once (max_concurrent_rpcs 1,024)


@attrs.define
class _IdleStreams:
    """One consume token's idle Read streams on a master (fast39r, issue 39), beside a neighbour
    token that reads another queue of the same master while a producer writes it: queue a on
    g1 holds 10 messages, b is written at 200 msgs/s; tokens are enforced. Each stream starts
    at a's last message: it gets one answer, keeps its room (64 KiB, ReadAccount) and
    long-polls, never read."""

    cluster: Cluster
    address: str
    abuser: str
    neighbour: GrpcTransport
    producer: Any
    channels: list[grpc.Channel] = attrs.field(factory=list)

    @classmethod
    def set_up(cls, cluster: Cluster, master_args: Sequence[str] = ()) -> _IdleStreams:
        from ordq.common.security import register
        from ordq.coordinator.tokens import create_token

        cluster.add_groups("g1", extra_args={"master": master_args})
        cluster.create_queue("a", ["g1"])
        cluster.create_queue("b", ["g1"])
        fill = cluster.producer(n=10, queue="a", writer="A", rate=None)
        fill.start()
        fill.join(60)
        assert len(fill.acked) == 10 and fill.error is None
        _, writer = create_token(cluster.store.client, cluster.root, {"b": ["produce"]}, "the neighbour's producer")
        abuser, other, address = _consumer_and_neighbour(cluster, "a")
        register(cluster.hosts, cluster.root, attrs.evolve(cluster.credentials, token=writer))  # the producer's
        producer = cluster.producer(n=10**9, queue="b", writer="B", rate=200, send_timeout_s=20.0)
        producer.start()
        wait_until(lambda: len(producer.acked) >= 100, timeout_s=30, what="the neighbour's producer acked")
        neighbour = GrpcTransport(credentials=attrs.evolve(cluster.credentials, token=other))
        wait_until(lambda: neighbour.fetch(address, "b", 0, 0, max_bytes=1, max_wait_ms=0).batches, timeout_s=20,
                   what="the neighbour's token loaded")
        return cls(cluster, address, abuser, neighbour, producer)

    def open(self, n: int) -> list[Any]:
        """``n`` idle streams of the abuser, on connections of 100 streams each
        (max_streams_per_connection)."""
        while len(self.channels) * 100 < n:
            self.channels.append(security_channel(self.address, self.cluster.credentials,
                                                  [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]))
        idle = pb.FetchRequest(queue="a", seg=0, offset=9, max_bytes=1 << 20, max_wait_ms=30_000, known_end=-1,
                               stream_ms=60_000)
        meta = (("authorization", f"Bearer {self.abuser}"),)
        return [pb_grpc.BrokerStub(self.channels[i // 100]).Read(idle, metadata=meta, timeout=90) for i in range(n)]

    def neighbour_reads(self, seconds: float) -> tuple[int, list[str]]:
        """The neighbour reads b, a call every 50 ms (1 MiB asked, from its own share): how
        many were served, and the refusals."""
        until = time.monotonic() + seconds
        served, refused = 0, []
        while time.monotonic() < until:
            try:
                self.neighbour.fetch(self.address, "b", 0, 0, max_bytes=1 << 20, max_wait_ms=0)
                served += 1
            except OrdqError as exc:
                refused.append(repr(exc))
            time.sleep(0.05)
        return served, refused

    def outcomes(self, calls: list[Any]) -> dict[str, int]:
        """Each stream: "open", or how it ended ("ResourceExhausted <resource>" when typed)."""
        from ordq.wire.errors import ResourceExhausted

        out: dict[str, int] = {}
        for c in calls:
            if c.done():
                err = from_rpc_error(c, self.address)
                what = f"ResourceExhausted {err.resource}" if isinstance(err, ResourceExhausted) else repr(err)[:80]
            else:
                what = "open"
            out[what] = out.get(what, 0) + 1
        return out

    def stats(self) -> dict:
        return dict(json.loads(self.neighbour.health(self.address).stats_json))

    @staticmethod
    def odd_endings(calls: list[Any]) -> list[str]:
        """gRPC's own account of the calls that ended neither open nor refused typed."""
        from ordq.wire.errors import ResourceExhausted

        return [f"{c.code()} {c.details()!r} {c.debug_error_string()}" for c in calls
                if c.done() and not isinstance(from_rpc_error(c, ""), ResourceExhausted)]

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.neighbour.close()
        self.producer.stop()
        self.producer.join(30, check=False)  # its stream closed while the cluster still runs

    def neighbour_kept_writing(self, acked_before: int) -> None:
        wait_until(lambda: len(self.producer.acked) > acked_before + 100, timeout_s=20,
                   what="the neighbour's producer acked meanwhile")
        pstats = self.producer.statistics()
        assert pstats is not None and pstats.failovers == 0, f"the neighbour's producer failed over: {pstats}"


def test_one_tokens_idle_read_streams_cannot_take_the_calls_its_neighbours_need(cluster: Cluster) -> None:
    """fast39r (issue 39): an idle Read stream costs a broker next to nothing (64 KiB of budget
    room kept between answers, charged to its token; no thread; a wake-up only when its own
    segment moves), so a consume token can open very many. The memory budget bounds their
    room (32 MiB a token: the next test); but the calls the server admits at once are one pool
    for every caller (``max_concurrent_rpcs``, 1,024), and once one token's idle streams held
    them all, gRPC refused everyone's next call at once, untyped (a neighbour's Fetch:
    "Concurrent RPC limit exceeded"). Guard: a token holds at most ``max_calls_per_token``
    (256) calls open on a broker; its next are refused at once, typed (ResourceExhausted
    "calls") and counted. A neighbour (another token) reading and producing on the same master
    is never refused, and its producer keeps being acked."""
    lab = _IdleStreams.set_up(cluster)
    try:
        acked = len(lab.producer.acked)
        calls = lab.open(IDLE_STREAMS)
        # The neighbour reads b from the moment the streams are opened (every one of them had
        # reached the broker within 1 s before the guard): never refused.
        served, refused = lab.neighbour_reads(5.0)
        print(f"neighbour: {served} fetches served, {len(refused)} refused {refused[:3]}; "
              f"the abuser's calls ended meanwhile: {sum(c.done() for c in calls)}")
        assert not refused, f"the neighbour's reads were refused: {refused[:3]}"
        lab.neighbour_kept_writing(acked)
        # Past what one token may hold, the abuser's calls ended at once (refused, typed).
        wait_until(lambda: sum(c.done() for c in calls) >= IDLE_STREAMS - 256, timeout_s=30, interval_s=0.1,
                   what="the abuser's calls past its limit ended")
        outcomes = lab.outcomes(calls)
        stats = lab.stats()
    finally:
        lab.close()
    print(f"abuser's {IDLE_STREAMS} streams: {outcomes}")
    print(f"master: token calls {stats['token_calls']}, refused {stats['refused']}, budget {stats['budget']}")
    typed = outcomes.get("ResourceExhausted calls", 0)
    odd = IDLE_STREAMS - typed - outcomes.get("open", 0)
    if odd:
        print("the abuser's calls that ended otherwise:", lab.odd_endings(calls))
    # Past what one token may hold, none stayed open: they ended, refused typed and counted.
    assert outcomes.get("open", 0) <= 256 and typed + odd >= IDLE_STREAMS - 256, outcomes
    assert stats["token_calls"]["most"] <= 256
    assert stats["token_calls_refused"] >= typed and stats["refused"].get("ResourceExhausted", 0) >= typed
    # Once, in CI (stop 71, beside the heavy tier's other worker), 3 of the 1,200 ended CANCELLED
    # instead, not counted by the broker; not seen since in 18 runs here (busy loops, xdist, three
    # at once). They are the abuser's own calls (the neighbour's are asserted above), so a few are
    # let pass, reported with gRPC's own account (and the broker's admitted count) to find why.
    assert odd <= IDLE_STREAMS // 100, outcomes
    # The budget: at most one token's share at once (their first answers' grants), and once
    # answered each open stream holds its room, 64 KiB (plus the neighbour's requests in flight).
    assert stats["budget"]["peak_bytes"] <= (32 << 20) + (2 << 20), stats["budget"]
    assert stats["budget"]["used_bytes"] <= 256 * (64 << 10) + (1 << 20), stats["budget"]


def test_one_tokens_idle_read_streams_past_its_memory_share_are_refused_typed_and_its_neighbour_reads_on(
        cluster: Cluster) -> None:
    """fast39r (issue 39): the room idle streams keep (64 KiB each, ReadAccount) is charged to
    their token and connection: past one holder's share (here 4 MiB, ``--connection-budget``:
    64 streams), a stream's first answer waits for room (``wait_ms``: a Read stream's is its
    idle bound, 2 s here) and is refused, typed (ResourceExhausted "memory"), counted; the
    neighbour's reads (another token, another connection, 1 MiB asked each) are granted from
    their own share throughout, and its producer keeps being acked. The guard is the budget's
    holder share (budget.MemoryBudget.room); with it taken out (the holders' shares ignored)
    every stream is given its room and this test fails (checked by hand)."""
    lab = _IdleStreams.set_up(cluster, ("--connection-budget", "4", "--read-idle", "2"))
    try:
        calls = lab.open(100)
        wait_until(lambda: sum(c.done() for c in calls) >= 30, timeout_s=30, interval_s=0.1,
                   what="the abuser's streams past its share refused")
        acked = len(lab.producer.acked)
        served, refused = lab.neighbour_reads(3.0)
        print(f"neighbour: {served} fetches served, {len(refused)} refused {refused[:3]}")
        assert not refused, f"the neighbour's reads were refused: {refused[:3]}"
        lab.neighbour_kept_writing(acked)
        outcomes = lab.outcomes(calls)
        stats = lab.stats()
    finally:
        lab.close()
    print(f"abuser's 100 streams: {outcomes}; master budget {stats['budget']}")
    share = 4 << 20
    assert outcomes.get("ResourceExhausted memory", 0) >= 30 and outcomes.get("open", 0) <= share // (64 << 10), \
        outcomes
    assert stats["budget"]["refused"] >= 30 and stats["refused"].get("ResourceExhausted", 0) >= 30, stats
    assert stats["budget"]["used_bytes"] <= share + (1 << 20), stats["budget"]

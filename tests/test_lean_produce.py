"""The producer → master produce stream on the lean link (issue 39; ordq/wire/lean_produce.py,
broker_group/lean_produce.py): refusals travel typed as over gRPC (no I/O), and at a real TLS
master with tokens enforced every guard of the gRPC path holds against a hand-made client (no
certificate, plaintext, no token, a consume-only token, a token for another queue, garbage
hello, garbage frames, a frame past the receive limit announced by its length alone, a stale
epoch), while a real Producer sends over the link before and after, undisturbed."""

from __future__ import annotations

import asyncio
import ssl
import struct

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.errors import (
    BrokerUnavailable,
    ConfigError,
    EpochNotIssued,
    FencedError,
    OrdqError,
    PermissionDenied,
)
from ordq.common.metrics import value
from ordq.common.security import Credentials
from ordq.sdk import Producer, ProducerConfig
from ordq.wire import lean_produce
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import Message, encode_batch
from ordq.wire.errors import ResourceExhausted, SegmentNotWritable, error_json, from_error_json
from ordq.wire.lean_produce import ANSWER_LIMIT, LeanProduceStream, frame, open_link, read_frame, shut
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.util import guard_tokens, read_metrics

# -- refusals on the link, typed as over gRPC (no I/O) ------------------------------------------


@given(st.text(max_size=3000), st.integers(0, 2**40), st.integers(0, 2**40))
def test_a_refusal_is_the_same_error_after_the_link(queue: str, epoch: int, current: int) -> None:
    for exc in (FencedError(queue, epoch, current), PermissionDenied(queue, "produce", "no"),
                ConfigError(f"bad produce request: {queue}"),
                SegmentNotWritable("elsewhere", queue, epoch, "sealed"),
                ResourceExhausted("elsewhere", "memory", 5, "over budget")):
        back = from_error_json(error_json(exc), str(exc), "master:1")
        assert type(back) is type(exc)
        if isinstance(exc, (SegmentNotWritable, ResourceExhausted)):
            assert getattr(back, "address") == "master:1"  # noqa: B009 - the stream's master, as from_rpc_error
    assert isinstance(from_error_json("{not json", "boom", "m:1"), BrokerUnavailable)
    assert isinstance(from_error_json('{"kind": "nonsense", "fields": {}}', "boom", "m:1"), BrokerUnavailable)


# -- a real TLS master with tokens, a hand-made client ----------------------------------------

async def _answer(link: str, creds: Credentials, frames: list[bytes], *, hello: bytes | None = None) -> object:
    """Connect (``hello`` instead of the real one when given), write ``frames`` raw, return the
    first answer (acks, or the refusal raised as the SDK raises it) or the failure."""
    try:
        if hello is None:
            reader, writer = await open_link(link, creds)
        else:
            host, port = link.rsplit(":", 1)
            ctx = lean_produce.tls_context(creds, ssl.Purpose.SERVER_AUTH)
            reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx,
                                                           server_hostname=host if ctx else None)
            writer.write(hello)
    except (OSError, ssl.SSLError) as exc:
        return BrokerUnavailable(link, repr(exc))
    try:
        writer.write(b"".join(frames))
        body = await asyncio.wait_for(read_frame(reader, ANSWER_LIMIT, "answer"), 30)
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
        return BrokerUnavailable(link, repr(exc))
    finally:
        await shut(writer)
    if body is None:
        return BrokerUnavailable(link, "closed")
    answer = pb.ProduceLinkAnswer.FromString(body)
    if answer.error_json:
        return from_error_json(answer.error_json, answer.error_text, link)
    return list(answer.response.acks)


def _request(seg: int, epoch: int, queue: str = "q") -> bytes:
    # Epoch 0 and a far seq: were it let through, it would be fenced, never stored.
    return frame(pb.ProduceRequest(queue=queue, seg=seg, epoch=epoch,
                                   batches=[encode_batch([Message(payload=b"intruder")], epoch=epoch,
                                                         first_seq=10**12)]))


def test_every_guard_of_the_grpc_produce_stream_holds_on_the_lean_link(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lean_produce.ENV, "lean")
    cluster.add_groups("g1")
    cluster.create_queue("q")
    creds, consume, other = guard_tokens(cluster)
    admin = creds.token
    link = cluster.store.live_members("g1")["master"].produce
    assert link, "the master publishes its lean produce link"
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", credentials=creds)) as p:
        p.send(b"before").result(timeout=30)  # the producer's own send timeout: a first send elects and claims
        assert isinstance(p._stream, LeanProduceStream)  # the producer took the published link
        open_seg = cluster.state("q").open_segment
        assert open_seg is not None
        seg = open_seg.seg

        def answer(c: Credentials, frames: list[bytes], hello: bytes | None = None) -> object:
            return asyncio.run(_answer(link, c, frames, hello=hello))

        # No certificate of the CA, or no TLS at all: the link does not talk.
        assert isinstance(answer(Credentials(ca_file=creds.ca_file, token=admin), [_request(seg, 0)]),
                          BrokerUnavailable)
        assert isinstance(answer(Credentials(token=admin), [_request(seg, 0)]), BrokerUnavailable)

        def refused(c: Credentials, frames: list[bytes], kind: type[OrdqError] | tuple[type[OrdqError], ...],
                    hello: bytes | None = None) -> OrdqError:
            got = answer(c, frames, hello)
            assert isinstance(got, kind), got
            return got

        denied = refused(attrs.evolve(creds, token=None), [_request(seg, 0)], PermissionDenied)
        assert denied.role == "produce"  # type: ignore[attr-defined]
        denied = refused(attrs.evolve(creds, token=consume), [_request(seg, 0)], PermissionDenied)
        assert denied.role == "produce"  # type: ignore[attr-defined]
        denied = refused(attrs.evolve(creds, token=other), [_request(seg, 0)], PermissionDenied)
        assert denied.queue == "q"  # type: ignore[attr-defined]  # passed the connection's check, refused on the queue
        refused(creds, [_request(seg, 0, queue="bad name")], OrdqError)
        # A frame past the receive limit: refused on its length alone (its body is never sent).
        too_long = refused(creds, [struct.pack(">I", 200 << 20)], ConfigError)
        assert "over the limit" in str(too_long)
        refused(creds, [struct.pack(">I", 4) + b"\xff" * 4], ConfigError)  # a frame that is no ProduceRequest
        refused(creds, [], ConfigError, hello=struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff")  # garbage hello
        refused(creds, [], ConfigError, hello=struct.pack(">I", 1 << 30))  # a hello past its limit
        refused(creds, [_request(seg, 0)], (FencedError, EpochNotIssued))  # no epoch of ours
        p.send(b"after").result(timeout=30)  # the owner was never disturbed
        assert p.statistics().acked == 2
    master = cluster.groups["g1"].master
    assert master.metrics_url is not None
    counted = value(read_metrics(master.metrics_url), "ordq_broker_refused_requests_total", reason="PermissionDenied")
    assert counted is not None and counted >= 3


def test_a_link_that_cannot_be_reached_ends_the_stream_as_an_unavailable_broker() -> None:
    """No master listens at the published link: ``read_acks`` raises BrokerUnavailable naming
    the master's gRPC address (the producer then fails over, as from a broken gRPC stream), and
    ``close`` ends the stream quietly, before or after that."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused

    async def run() -> None:
        stream = LeanProduceStream(f"127.0.0.1:{port}", "master:1", "q", 0, 1, Credentials())
        stream.send([b"x"])
        with pytest.raises(BrokerUnavailable) as info:
            await stream.read_acks()
        assert info.value.address == "master:1"
        await stream.close()
        closed_early = LeanProduceStream(f"127.0.0.1:{port}", "master:1", "q", 0, 1, Credentials())
        await closed_early.close()
        with pytest.raises(BrokerUnavailable):
            await closed_early.read_acks()

    asyncio.run(run())


def test_a_send_to_an_idle_link_is_written_on_the_senders_turn_and_a_burst_keeps_its_order() -> None:
    """Issue 39 (fast39k): a synchronous send found the writer task idle and waited a turn of
    the loop for it; now ``send`` writes at once when nothing waits before it and the transport
    holds nothing. A burst (the transport busy) still gathers in the writer task; at the master
    every batch arrives once, in the order sent."""
    sent = [f"batch-{i}".encode() for i in range(300)]

    async def run() -> list[bytes]:
        got = bytearray()

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(1 << 16):
                got.extend(data)
            writer.close()

        server = await asyncio.start_server(sink, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stream = LeanProduceStream(f"127.0.0.1:{port}", "master:1", "q", 0, 1, Credentials())
        await stream._conn  # noqa: SLF001 - connected
        for _ in range(100):  # the writer task reaches its wait within a few turns
            if stream._idle:  # noqa: SLF001
                break
            await asyncio.sleep(0)
        assert stream._idle  # noqa: SLF001
        stream.send(sent[:1])
        assert stream.first_write_at is not None, "written on the sender's turn, not the writer task's"
        for i in range(1, len(sent), 3):
            stream.send(sent[i:i + 3])
        hello = len(frame(pb.ProduceLinkHello(token="")))

        def arrived() -> list[bytes]:
            """The batches of the whole frames the master got after the hello."""
            batches: list[bytes] = []
            at = hello
            while at + 4 <= len(got):
                (n,) = struct.unpack(">I", got[at:at + 4])
                if at + 4 + n > len(got):
                    break
                batches.extend(pb.ProduceRequest.FromString(bytes(got[at + 4:at + 4 + n])).batches)
                at += 4 + n
            return batches

        async with asyncio.timeout(30):
            while len(arrived()) < len(sent):
                await asyncio.sleep(0.01)
        await stream.close()
        server.close()
        await server.wait_closed()
        return arrived()

    assert asyncio.run(run()) == sent

"""The master's end of the lean produce link (issue 39; the client's end and the framing are
ordq/wire/lean_produce.py): producers' streams as framed protobuf on mutual-TLS asyncio
connections, on the broker's event loop, at a port of its own published in the master's
liveness node (``produce``).

Guarantee: every guard of the gRPC ``Produce`` call, by running the same code on each
connection: ``LinkContext`` answers what the gRPC handler asks of its call's context (the
peer's certificate, the token, the peer, ``write``, ``abort``), and the connection runs
``check_caller`` (dataplane.py: before any request is read) and ``produce`` under the
token's share of request time (``metered``), as ``_checked_first`` runs the gRPC call. So:
- with TLS no frame is read before the handshake verified a certificate of the cluster's CA;
- the hello's token is checked once for the connection (``Gate.check_caller``) and each
  request's queue by ``Gate.stream_check`` (a pass kept until the tokens reload);
- a frame longer than the broker's receive limit is refused from its length, its body unread;
  a frame that is no protobuf of its type is refused (ConfigError);
- the memory budget, the request-time share, epochs and fencing are dataplane.produce's own.
A refusal travels as a ``ProduceLinkAnswer`` with the kind and fields of gRPC's
``ordq-error`` trailer, then the link is closed; the producer raises the same error.

A hello with ``read`` makes the connection a consumer's Read streams instead (the client's end:
ordq/wire/lean_read.py): each later frame is a ``FetchRequest`` (at most SMALL_REQUEST_BYTES,
refused from its length), served as the gRPC ``Read`` call serves one, by the same code and
guards (``check_caller`` before the request is read, ``answer``'s role check on its queue,
``read_stream``'s memory budget, read pace and idle close, ``metered`` per stream), its answers
as ``ReadLinkAnswer`` frames and an ``end`` frame when the stream ends. Why: on gRPC each
answer cost the master's loop more than everything else of a batch (py-spy, issue 39).

A hello with ``watch`` (on a slave, whose one lean port this serves beside its master's
replication: lean_link.LeanServer tells them apart by the first frame) makes the connection a
producer's watch of that segment's synced end (synced_watch.py): ``check_caller`` and the
produce role on its queue first, ``metered`` as a call; then answers with the end, at once and
at every move, until the producer closes it. A produce request with ``local_acks`` (sent once
that watch was accepted) makes the stream's later acks mean "synced on this master"
(dataplane._read_produce; each answer says which kind it carries).

Rules: connections and framing here; no write-path state (write_path.py owns it).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from google.protobuf.message import DecodeError

from ordq.broker_group.config import server_options
from ordq.broker_group.dataplane import SMALL_REQUEST_BYTES, Parts, answer, check_caller, metered, produce, read_stream
from ordq.broker_group.lean_link import TaskServer, peer_cn
from ordq.broker_group.replica import Role
from ordq.broker_group.synced_watch import Watch
from ordq.common.errors import ConfigError
from ordq.common.security import Credentials
from ordq.wire import ordq_pb2 as pb
from ordq.wire.errors import abort
from ordq.wire.framing import PRODUCE_STEP_BYTES
from ordq.wire.lean_frames import read_answer_frame
from ordq.wire.lean_produce import HELLO_LIMIT, frame, read_frame, tls_context, tune

log = logging.getLogger("ordq.broker")


class LinkAborted(Exception):
    """The connection's answer was a refusal (sent): the handler ends (as gRPC's AbortError)."""


# A refusal's frame waits this long at most for a peer that takes nothing (an idle reader)
ABORT_DRAIN_S = 1.0


class LinkContext:
    """What dataplane's produce handler and its guards ask of a gRPC call's context, for one
    lean connection: its token (``invocation_metadata``), the peer's verified certificate
    (``auth_context``), the peer, and the answers (``write``, ``abort``)."""

    ANSWER: Any = pb.ProduceLinkAnswer  # the frames' message (a refusal's fields are the same in both)

    def __init__(self, writer: asyncio.StreamWriter, cn: str | None, token: str, peer: str) -> None:
        self._writer = writer
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._auth: dict[str, list[bytes]] = {"x509_common_name": [cn.encode()]} if cn else {}
        self._peer = peer
        self._trailer = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return self._peer

    async def write(self, resp: pb.ProduceResponse) -> None:
        self._writer.write(frame(pb.ProduceLinkAnswer(response=resp)))
        await self._writer.drain()

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._trailer = dict(metadata).get("ordq-error", "")

    async def abort(self, _code: Any, details: str) -> NoReturn:
        try:
            self._writer.write(frame(self.ANSWER(error_json=self._trailer, error_text=details)))
            async with asyncio.timeout(ABORT_DRAIN_S):
                await self._writer.drain()
        except (OSError, ssl.SSLError, TimeoutError):
            pass  # the client went away, or takes nothing: nothing more to answer
        raise LinkAborted(details)


class ReadLinkContext(LinkContext):
    """``LinkContext`` for Read streams: ``write`` takes an answer encoded by the read path
    (broker_group/answer.py) and frames it as a ``ReadLinkAnswer`` as it is."""

    ANSWER = pb.ReadLinkAnswer

    async def write(self, wire: bytes) -> None:  # type: ignore[override]
        self._writer.write(read_answer_frame(wire))
        await self._writer.drain()

    async def end(self) -> None:
        """The Read stream ended (as a gRPC Read call ends): the client may ask the next."""
        self._writer.write(_STREAM_END)
        await self._writer.drain()


_STREAM_END = frame(pb.ReadLinkAnswer(end=True))


class LeanProduceServer(TaskServer):
    """Listens on a port of its own and serves each connection as one produce stream."""

    def __init__(self, parts: Parts, creds: Credentials, *, handshake_timeout_s: float = 10.0) -> None:
        # A reader's buffer of PRODUCE_STEP_BYTES (asyncio pauses the socket at twice that): a
        # producer's request (~1 MiB) arrives without a pause and resume per 128 KiB (the
        # default limit), and what one connection holds unread stays bounded, as gRPC's window.
        super().__init__(tls_context(creds, ssl.Purpose.CLIENT_AUTH), handshake_timeout_s,
                         reader_limit=PRODUCE_STEP_BYTES)
        self._b = parts
        self._tls = creds.tls
        # as the gRPC server's receive limit: a request of at most REQUEST_BYTES plus one batch
        self._limit = int(dict(server_options(parts.shared.config))["grpc.max_receive_message_length"])
        self.refused_unframed = 0  # connections ended before a valid hello (counted, logged)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      first: bytes | None = None) -> None:
        """One connection; ``first``: its hello's body, read already (a slave's one lean port
        serves its master's replication too and told them apart by it: lean_link.LeanServer)."""
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        b = self._b
        if len(self._conns) > b.shared.config.max_connections:  # as the gRPC server's bound (SECURITY.md, Limits)
            self._conns.discard(task)
            writer.close()
            return
        arrived = b.gate.book.now()
        peer = writer.get_extra_info("peername")
        # TLS: the handshake (CERT_REQUIRED) already refused a peer without a certificate of the CA.
        ctx = LinkContext(writer, peer_cn(writer) if self._tls else None, "",
                          f"lean:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "lean")
        try:
            tune(writer)
            try:
                body = first if first is not None else await asyncio.wait_for(
                    read_frame(reader, HELLO_LIMIT, "produce link hello"), self._handshake_timeout_s)
                if body is None:
                    return
                hello = pb.ProduceLinkHello.FromString(body)
            except (ConfigError, DecodeError, TimeoutError) as exc:
                bad = exc if isinstance(exc, ConfigError) else ConfigError(f"bad produce link hello: {exc!r}")
                self.refused_unframed += 1
                b.shared.count_refused(bad)
                log.warning("produce link from %s refused: %s", ctx.peer(), bad)
                await abort(ctx, bad)  # type: ignore[arg-type]
            kind = ReadLinkContext if hello.read else LinkContext
            ctx = kind(writer, peer_cn(writer) if self._tls else None, hello.token, ctx.peer())
            if hello.read:
                await self._serve_reads(reader, ctx)  # type: ignore[arg-type]
                return
            if hello.HasField("watch"):
                await self._serve_watch(reader, writer, ctx, hello.watch, arrived)
                return
            log.info("produce stream from %s on the lean link", ctx.peer())

            async def run() -> None:
                await check_caller(b, ctx, "Produce", arrived)
                await produce(b, self._requests(reader), ctx)  # type: ignore[arg-type]

            await metered(b, ctx, run)  # type: ignore[arg-type]
        except LinkAborted:
            pass  # the refusal was sent (and counted where it was decided)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            log.debug("lean link from %s ended: %r", ctx.peer(), exc)
        finally:
            self._conns.discard(task)
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # a client that takes nothing holds no buffer of ours
            else:
                writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes) -> None:
        """A connection another listener took, its hello read (``first``): the slave's one lean
        port (lean_link.LeanServer)."""
        await self._handle(reader, writer, first)

    async def _serve_reads(self, reader: asyncio.StreamReader, ctx: ReadLinkContext) -> None:
        """Read streams, one after the other, each as the gRPC ``Read`` call serves one: the
        token checked before its request is read, the role on its queue, the stream charged
        to the token (``metered``); then its end. Ends at the client's clean close, or with a
        refusal (sent, LinkAborted)."""
        b = self._b

        async def one() -> bool:
            await check_caller(b, ctx, "Read", b.gate.book.now())  # type: ignore[arg-type]
            try:
                body = await read_frame(reader, SMALL_REQUEST_BYTES, "read request")
                if body is None:
                    return False
                req = pb.FetchRequest.FromString(body)
            except (ConfigError, DecodeError) as exc:
                bad = exc if isinstance(exc, ConfigError) else ConfigError(f"bad Read request: {exc}")
                b.shared.count_refused(bad)
                await abort(ctx, bad)  # type: ignore[arg-type]
            with b.shared.cv:
                b.shared.stats.read_link_streams += 1

            async def read() -> None:
                await read_stream(b, req, ctx)  # type: ignore[arg-type]

            await answer(b, ctx, "Read", req.queue, read)  # type: ignore[arg-type]
            await ctx.end()
            return True

        while await metered(b, ctx, one):  # type: ignore[arg-type]
            pass

    async def _serve_watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: LinkContext,
                           watched: pb.ReplicaSegment, arrived: float) -> None:
        """A producer's watch of its segment's synced end on this slave (synced_watch.py): the
        token checked before anything is told, the produce role on its queue, the connection
        charged to the token as a call (``metered``). Its answers carry the end at once (0 while
        this copy does not exist: the producer takes the watch as accepted on it) and at every
        move; it ends when the producer closes it. A watch on a
        master, a request on a watch, or one more on a segment held by ``WATCHES_PER_SEGMENT``
        (synced_watch.py) is refused."""
        b = self._b

        async def held() -> None:
            if b.shared.config.role is not Role.SLAVE:
                raise ConfigError(f"this is the master of group {b.shared.config.gid}: watch the slave's synced end")
            watch = Watch(watched.queue, watched.seg, writer)
            b.shared.synced_watches.add(watch, b.shared.address)
            with b.shared.cv:
                b.shared.stats.synced_watches += 1
            try:
                with b.shared.cv:
                    s = b.shared.segments.get((watched.queue, watched.seg))
                    end = 0 if s is None else s.replica.local_synced
                watch.offer(end)  # at once, even 0 (no copy here yet): the producer's sign the watch is on
                if await read_frame(reader, SMALL_REQUEST_BYTES, "synced-end watch") is not None:
                    raise ConfigError("a synced-end watch takes no requests")
            finally:
                b.shared.synced_watches.remove(watch)

        async def run() -> None:
            await check_caller(b, ctx, "Produce", arrived)
            await answer(b, ctx, "Produce", watched.queue, held)

        await metered(b, ctx, run)

    async def _requests(self, reader: asyncio.StreamReader) -> AsyncIterator[pb.ProduceRequest]:
        """The connection's requests. A frame past the limit or no ProduceRequest raises
        ConfigError (the stream's refusal); the producer going away ends them."""
        while True:
            try:
                body = await read_frame(reader, self._limit, "produce request")
            except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
                return
            if body is None:
                return
            try:
                req = pb.ProduceRequest.FromString(body)
            except DecodeError as exc:
                raise ConfigError(f"bad produce request: {exc}") from exc
            yield req

"""The master → slave replication stream as a lean link of its own: length-prefixed protobuf
frames over one TLS connection, on the brokers' event loops (issue 39).

Why: replication is an internal hop between two processes of one group, and every message
of a synchronous send crosses it twice (the batch, the slave's answer). A grpc.aio write
costs its loop ~0.3-0.6 ms and wakes gRPC's own threads on both sides; an asyncio transport
write is a buffered ``send`` on the loop's own socket (bench/bench_stages.py counts both).

Guarantee: the same messages and the same semantics as the gRPC ``Replicate`` stream
(``ReplicateRequest`` in, ``ReplicateResponse`` out, served by the one handler core,
broker_group/replication.py ``replicate_requests``); the same identity rule: with TLS only a
peer whose verified certificate names a broker or coordinator (``CLUSTER_CNS``) is served,
checked before any frame is read; a frame longer than the broker's receive limit is refused
before its body is read. The slave publishes this link's address in its liveness node
(``replication``); a master that finds none there (an older slave) uses gRPC.

Rules: framing and the TLS contexts here; no replication state (replication.py owns it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

from google.protobuf.message import DecodeError

from ordq.common.errors import ConfigError, OrdqError, PermissionDenied
from ordq.common.security import Credentials
from ordq.wire import lean_frames
from ordq.wire import ordq_pb2 as pb
from ordq.wire.framing import REQUEST_BYTES
from ordq.wire.lean_frames import add_replicate_request, frame, replicate_request_body
from ordq.wire.lean_produce import HELLO_LIMIT, open_tls, tls_context, tune

log = logging.getLogger("ordq.replication")

Send = Callable[[pb.ReplicateResponse], Awaitable[None]]
Serve = Callable[[AsyncIterator[pb.ReplicateRequest], Send], Awaitable[None]]
Clients = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]
# The switch (bench_stages, bench_e2e compare the two): a slave serves and publishes the lean
# link unless started with ORDQ_REPLICATION_LINK=grpc (then its master uses gRPC). The default
# since fast39k: the lowest CPU per batch (docs/BENCHMARKS.md), and a master that cannot reach
# the published link replicates over gRPC instead (replication.py), so a firewalled or NAT'd
# link port costs speed, not the group.
ENV = "ORDQ_REPLICATION_LINK"


def wanted() -> bool:
    """Does this slave serve the lean replication link? (``ORDQ_REPLICATION_LINK``, default lean)"""
    return os.environ.get(ENV, "lean") != "grpc"


class Outgoing(NamedTuple):
    """A replication request as the master's sender takes it (replication.py ``_take``):
    encoded by hand on either link (ordq/wire/lean_frames.py)."""

    queue: str
    seg: int
    batches: list[bytes]
    lac: int

    def body(self) -> bytes:
        """As the gRPC call sends it (``ReplicateRequest``'s bytes, encoded by hand)."""
        return replicate_request_body(self.queue, self.seg, self.batches, self.lac)


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next frame's body; None at a clean end of stream (between frames)."""
    return await lean_frames.read_frame(reader, limit, "replication frame")


def peer_cn(writer: asyncio.StreamWriter) -> str | None:
    cert = writer.get_extra_info("peercert") or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TaskServer:
    """A listener on a port of its own (TLS when ``ssl_ctx`` is given) whose connections are
    each a task of ``_handle``; ``stop`` cancels them and waits for them. The lean links'
    common part (this one's replication, broker_group/lean_produce.py's produce)."""

    def __init__(self, ssl_ctx: ssl.SSLContext | None, handshake_timeout_s: float, *,
                 reader_limit: int | None = None) -> None:
        self._ssl = ssl_ctx
        self._handshake_timeout_s = handshake_timeout_s
        self._reader_limit = reader_limit  # asyncio's StreamReader buffer (None: its default)
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._stopping = False

    async def start(self, host: str, port: int = 0) -> int:
        """On the loop: listen on ``host``:``port`` (0: any free port); return the port bound
        (OSError when it is taken)."""
        limit = {} if self._reader_limit is None else {"limit": self._reader_limit}
        self._server = await asyncio.start_server(
            self._connection, host.strip("[]"), port, ssl=self._ssl,
            ssl_handshake_timeout=self._handshake_timeout_s if self._ssl is not None else None, **limit)
        return int(self._server.sockets[0].getsockname()[1])

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            # Ended by ``stop``: a connection task that ends cancelled makes asyncio's streams
            # log "Exception in callback ... CancelledError" with a traceback (3.11 asks the
            # task for its exception), at every stop of a slave whose master was connected.

    async def stop(self) -> None:
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class LeanServer(TaskServer):
    """The slave's end: accepts the master's connection(s) and runs ``serve`` on each."""

    def __init__(self, creds: Credentials, allowed: frozenset[str], limit: int, serve: Serve,
                 on_refused: Callable[[OrdqError], None], *, handshake_timeout_s: float = 10.0,
                 clients: Clients | None = None) -> None:
        """``clients``: the handler of every other connection on this port (producers' watches and
        Read streams, broker_group/lean_produce.py), told apart by the first frame: the master's
        is a ``ReplicateRequest`` hello (field 5), which no client's ``ProduceLinkHello`` holds."""
        # The reader buffers up to twice its limit, a whole request of REQUEST_BYTES: read
        # (and decrypted) while the slave syncs the ones before (replica_commits.py), not
        # after them, as gRPC's threads read meanwhile.
        super().__init__(tls_context(creds, ssl.Purpose.CLIENT_AUTH), handshake_timeout_s,
                         reader_limit=REQUEST_BYTES // 2)
        self._allowed = allowed
        self._limit = limit
        self._serve = serve
        self._on_refused = on_refused
        self._clients = clients

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            tune(writer)
            hello: pb.ReplicateRequest | None = None
            if self._clients is not None:
                try:
                    first = await asyncio.wait_for(read_frame(reader, HELLO_LIMIT), self._handshake_timeout_s)
                except ConfigError as too_long:  # a first frame past HELLO_LIMIT: no hello of anyone we serve
                    self._on_refused(too_long)
                    log.warning("lean link refused: %s", too_long)
                    return
                if first is None:
                    return
                hello = _replication_hello(first)
                if hello is None:
                    await self._clients(reader, writer, first)
                    return
            if self._ssl is not None:
                cn = peer_cn(writer)
                if cn not in self._allowed:
                    exc = PermissionDenied("*", "cluster", f"only brokers and coordinators may replicate; the "
                                           f"peer's certificate is {cn!r}")
                    self._on_refused(exc)
                    log.warning("replication link refused: %s", exc)
                    return

            async def requests() -> AsyncIterator[pb.ReplicateRequest]:
                if hello is not None:
                    yield hello
                while (body := await read_frame(reader, self._limit)) is not None:
                    try:
                        yield pb.ReplicateRequest.FromString(body)
                    except DecodeError as exc:
                        raise ConfigError(f"bad replication frame: {exc}") from exc

            async def send(resp: pb.ReplicateResponse) -> None:
                writer.write(frame(resp))
                await writer.drain()

            await self._serve(requests(), send)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError) as exc:
            log.info("replication link from the master ended: %r", exc)
        except OrdqError:
            pass  # logged and counted by ``serve`` (replication.py replicate_requests); the link ends
        finally:
            self._conns.discard(task)
            writer.close()


def _replication_hello(body: bytes) -> pb.ReplicateRequest | None:
    """A master's first frame, or None for anything else (a client's hello)."""
    try:
        req = pb.ReplicateRequest.FromString(body)
    except DecodeError:
        return None
    return req if req.hello else None


class LeanCall:
    """The master's end, shaped like the gRPC call it stands in for: ``await write(req)``,
    ``async for resp in call``, ``cancel()``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int) -> None:
        self._reader, self._writer, self._limit = reader, writer, limit

    async def write(self, req: pb.ReplicateRequest) -> None:
        self._writer.write(frame(req))
        await self.drain()

    def write_now(self, reqs: list[Outgoing]) -> None:
        """Every request in one transport write (one copy, one run of TLS records; frames
        encoded by hand, ordq/wire/lean_frames.py), without waiting: the caller bounds what it
        writes (the replication window) or ``drain``s."""
        parts: list[bytes] = []
        for r in reqs:
            add_replicate_request(parts, r.queue, r.seg, r.batches, r.lac)
        self._writer.write(b"".join(parts))

    async def drain(self) -> None:
        await self._writer.drain()

    def __aiter__(self) -> LeanCall:
        return self

    async def __anext__(self) -> pb.ReplicateResponse:
        body = await read_frame(self._reader, self._limit)
        if body is None:
            raise ConnectionResetError("the slave closed the replication link")
        return pb.ReplicateResponse.FromString(body)

    def cancel(self) -> None:
        self._writer.close()


async def connect(address: str, creds: Credentials, limit: int, *, timeout_s: float = 5.0) -> LeanCall:
    """Open the link to a slave's ``address`` (taken from ZooKeeper, never from a caller): TCP
    within ``open_tls``'s reach, TLS within ``timeout_s`` (the caller falls back to gRPC when
    either fails, replication.py)."""
    reader, writer = await open_tls(address, tls_context(creds, ssl.Purpose.SERVER_AUTH), timeout_s=timeout_s)
    return LeanCall(reader, writer, limit)

"""The producer → master produce stream on a lean link of its own (issue 39): framed protobuf on
one mutual-TLS asyncio connection instead of a gRPC call. This module is the client's end
(``LeanProduceStream``, an ``AsyncProduceStream``) and the framing both ends share; the
master's end is broker_group/lean_produce.py.

Why: a synchronous send is a handful of stream messages through the master, and each gRPC
message costs ~0.3-0.5 ms of CPU per side and wakes gRPC's own threads (docs/BENCHMARKS.md,
"Beside the peers, on a quiet box"). An asyncio transport write is one buffered ``send`` on
the loop's own socket.

Protocol (proto/ordq/wire/ordq.proto, ``ProduceLinkHello``/``ProduceLinkAnswer``): each frame is
a 4-byte big-endian length and a protobuf body. The client sends one ``ProduceLinkHello`` (its
token), then ``ProduceRequest``s; the master answers ``ProduceLinkAnswer``s: acks in order, or
one refusal (the same kind and fields as gRPC's ``ordq-error`` trailer, ordq/wire/errors.py),
after which it closes the link. The client maps a refusal to the same error as over gRPC.

Guarantee: the same messages and semantics as the gRPC ``Produce`` stream; a producer whose
master publishes no link (or with ``ORDQ_PRODUCE_LINK=grpc`` in its environment) uses gRPC, and
so does one that cannot open the published link (a firewalled or NAT'd port): the stream then
carries everything on the gRPC call to the same master (``fallback``), in order, no failover.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable

from google.protobuf.message import DecodeError

from ordq.common.addresses import split_host_port
from ordq.common.errors import BrokerUnavailable, ConfigError, OrdqError
from ordq.common.security import Credentials
from ordq.common.stages import stamp
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import first_seqs
from ordq.wire.errors import from_error_json
from ordq.wire.framing import PRODUCE_STEP_BYTES, chunks
from ordq.wire.lean_frames import add_produce_request, frame, read_frame
from ordq.wire.produce_writer import ProduceWriter
from ordq.wire.transport import Ack, AsyncProduceStream

log = logging.getLogger("ordq.wire")

# The A/B switch: a master serves (and publishes) the link unless ORDQ_PRODUCE_LINK=grpc is in
# its environment; a producer uses a published link unless its own says ``grpc``.
ENV = "ORDQ_PRODUCE_LINK"
HELLO_LIMIT = 16 << 10  # a hello is a token: a longer first frame is refused unread
ANSWER_LIMIT = 64 << 20  # what a client reads of one answer (acks: a few bytes each)
CONNECT_TIMEOUT_S = 10.0  # the TLS handshake (as gRPC's CONNECT_ATTEMPT_MS)
REACH_TIMEOUT_S = 1.0  # the TCP connect: past it the link counts as unreachable (a fallback, below)


def wanted() -> bool:
    """Does this process use (or, a master, serve) the lean link? (``ORDQ_PRODUCE_LINK``, default lean)"""
    return os.environ.get(ENV, "lean") != "grpc"


def tune(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay (a synchronous send is one small frame) and TCP keepalive (a peer gone
    without a FIN is found within ~80 s, as gRPC's keepalive pings find it)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def tls_context(creds: Credentials, side: ssl.Purpose) -> ssl.SSLContext | None:
    """Mutual TLS with the cluster's CA (None: plaintext). The server side requires a
    certificate of the CA before any frame, as the gRPC server does (``require_client_auth``)."""
    if not creds.tls:
        return None
    ctx = ssl.create_default_context(side, cafile=creds.ca_file)
    if creds.cert_file is not None and creds.key_file is not None:
        ctx.load_cert_chain(creds.cert_file, creds.key_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if side is ssl.Purpose.CLIENT_AUTH:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def open_tls(address: str, ctx: ssl.SSLContext | None, *, timeout_s: float = CONNECT_TIMEOUT_S,
                   reach_s: float = REACH_TIMEOUT_S) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A lean link's connection to ``address`` (HOST:PORT, as published; both links): TCP within
    ``reach_s`` (a port a firewall drops is given up on well within a producer's
    ``send_timeout_s``: the caller falls back to gRPC), then TLS when ``ctx`` is given, within
    ``timeout_s``."""
    host, port = split_host_port(address)
    host = host.strip("[]")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), reach_s)
    tune(writer)
    if ctx is not None:
        try:
            await writer.start_tls(ctx, server_hostname=host, ssl_handshake_timeout=timeout_s)
        except BaseException:
            writer.transport.abort()
            raise
    return reader, writer


async def open_link(link: str, creds: Credentials, *, timeout_s: float = CONNECT_TIMEOUT_S
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a master's produce link ``link`` (HOST:PORT, as published) and send the hello."""
    reader, writer = await open_tls(link, tls_context(creds, ssl.Purpose.SERVER_AUTH), timeout_s=timeout_s)
    writer.write(frame(pb.ProduceLinkHello(token=creds.token or "")))
    return reader, writer


class LeanProduceStream(ProduceWriter):
    """One produce stream on the lean link, shaped as ``AioProduceStream`` (wire/aio_client.py):
    ``send`` never waits; one writer task (``ProduceWriter``) puts everything queued meanwhile
    into one transport write (a frame per ``PRODUCE_STEP_BYTES`` chunk, encoded by hand:
    ordq/wire/lean_frames.py); ``read_acks`` returns the acks of the next answer and ends by
    raising an ordq error (the master's refusal, typed as over gRPC, or BrokerUnavailable when
    the link failed). Errors name ``address``, the master's gRPC address, as a gRPC stream's do."""

    _ENDED = (OSError, ssl.SSLError, TimeoutError, ConfigError)
    _UNREACHABLE = (OSError, TimeoutError, ConfigError)  # the link could not be opened (ssl.SSLError is an OSError)

    def __init__(self, link: str, address: str, queue: str, seg: int, epoch: int, creds: Credentials, *,
                 epoch_key: str = "", fallback: Callable[[BaseException], AsyncProduceStream] | None = None) -> None:
        """``fallback``: when the link cannot be opened, the stream (the gRPC call on the same
        master) that carries everything instead; None: the stream ends, BrokerUnavailable."""
        self.link, self.address, self.queue, self.seg, self.epoch = link, address, queue, seg, epoch
        self.epoch_key = epoch_key
        self._fallback = fallback
        self.fell_back: AsyncProduceStream | None = None  # the stream that carries it instead of the link
        self._conn = asyncio.get_running_loop().create_task(self._open(creds))
        super().__init__()

    async def _open(self, creds: Credentials) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The link, or None once it could not be opened and ``fallback`` carries the stream.
        Nothing was written before (every write waits for this), so the order is the same."""
        try:
            return await open_link(self.link, creds)
        except self._UNREACHABLE as exc:
            if self._fallback is None or self._closed:
                raise
            self.fell_back = self._fallback(exc)
            return None

    async def _write(self, batches: list[bytes]) -> None:
        conn = await self._conn
        if conn is None:
            assert self.fell_back is not None
            self.fell_back.send(batches)
            return
        self._put(conn[1], batches)
        await conn[1].drain()  # the master reads no faster: hold further writes (flow control)

    def _write_now(self, batches: list[bytes]) -> bool:
        conn = self._conn
        if not conn.done() or conn.cancelled() or conn.exception() is not None:
            return False
        link = conn.result()
        if link is None:  # fallen back: the gRPC stream gathers its own writes
            assert self.fell_back is not None
            self.fell_back.send(batches)
            return True
        writer = link[1]
        if writer.transport.is_closing() or writer.transport.get_write_buffer_size():
            return False  # the writer task waits for the drain, then writes all that gathered
        self._put(writer, batches)
        return True

    def _put(self, writer: asyncio.StreamWriter, batches: list[bytes]) -> None:
        parts: list[bytes] = []
        for chunk in chunks(batches, PRODUCE_STEP_BYTES):
            add_produce_request(parts, self.queue, self.seg, self.epoch, self.epoch_key, chunk)
        stamp("P.write", first_seqs, batches)
        writer.write(b"".join(parts))  # one copy, one run of TLS records

    async def read_acks(self) -> list[Ack]:
        try:
            try:
                conn = await asyncio.shield(self._conn)
            except asyncio.CancelledError:
                if self._closed and self._conn.cancelled():  # closed before it connected
                    raise BrokerUnavailable(self.address, "produce stream closed") from None
                raise
            if conn is not None:
                body = await read_frame(conn[0], ANSWER_LIMIT, "produce link answer")
                stamp("P.ack")
                if body is None:
                    raise BrokerUnavailable(self.address, "produce stream ended")
                answer = pb.ProduceLinkAnswer.FromString(body)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, DecodeError) as exc:
            raise BrokerUnavailable(self.address, f"produce link {self.link}: {exc!r}") from exc
        except ConfigError as exc:
            raise BrokerUnavailable(self.address, str(exc)) from exc
        if conn is None:  # the gRPC call carries it: its errors as they are (a refusal stays final)
            assert self.fell_back is not None
            return await self.fell_back.read_acks()
        if answer.error_json:
            raise from_error_json(answer.error_json, answer.error_text, self.address)
        return [Ack(seg=a.seg, first_offset=a.first_offset, first_seq=a.first_seq, count=a.count)
                for a in answer.response.acks]

    async def close(self) -> None:
        """Close the link and wait for the writer to end."""
        self._closed = True
        self._writer.cancel()
        if not self._conn.done():
            self._conn.cancel()
        for task in (self._writer, self._conn):
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # the caller itself is being cancelled
            except (OSError, ssl.SSLError, TimeoutError, OrdqError):
                pass  # the link had failed: closing ends it anyway
            except Exception as exc:  # noqa: BLE001 - as AioProduceStream.close: never fail the failover
                log.warning("produce link to %s: its writer had failed: %r", self.link, exc)
        if self.fell_back is not None:
            await self.fell_back.close()
        if self._conn.done() and not self._conn.cancelled() and self._conn.exception() is None:
            conn = self._conn.result()
            if conn is not None:
                await shut(conn[1])


async def shut(writer: asyncio.StreamWriter, timeout_s: float = 1.0) -> None:
    """Close a link at once (as a gRPC call is cancelled: no TLS close_notify exchange, which
    would keep the socket open up to ``ssl_shutdown_timeout`` and outlive a stopped loop) and
    wait until its socket is closed."""
    writer.transport.abort()
    try:
        async with asyncio.timeout(timeout_s):
            await writer.wait_closed()
    except (OSError, ssl.SSLError, TimeoutError):
        pass  # closed anyway (or as good as: the socket goes with the transport's next callback)

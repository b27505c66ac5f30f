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

The slave's synced end (stop 77): a stream given its slave's link (``watch``) opens a second
connection there, a ``ProduceLinkHello`` with ``watch`` (queue, seg), once the master answered
its first batches. Its writes do not wait for it: until the slave accepts the watch the
master's acks mean both, as ever. Once accepted, the stream asks the master for acks after
its own sync (a ``ProduceRequest`` with ``local_acks``; each answer says which kind it
carries). Two reader tasks feed the master's acks and the slave's ends into ``BothSynced``
(ordq/wire/both_synced.py), and ``read_acks`` returns what both cover. The slave's answer then
reaches the producer in one hop, not through the master. A watch not accepted within
``WATCH_OPEN_S`` is given up (the stream stays on the master's acks); a watch that ends
fails the stream (BrokerUnavailable: a failover). ``ORDQ_SLAVE_ACKS=off`` turns it off.

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
from ordq.common.loop import track_connection
from ordq.common.security import Credentials
from ordq.common.stages import stamp
from ordq.wire import ordq_pb2 as pb
from ordq.wire.batch import first_seqs
from ordq.wire.both_synced import BothSynced
from ordq.wire.errors import from_error_json
from ordq.wire.framing import PRODUCE_STEP_BYTES, chunks
from ordq.wire.lean_frames import add_produce_request, frame, read_frame
from ordq.wire.produce_writer import ProduceWriter
from ordq.wire.transport import Ack, AsyncProduceStream

log = logging.getLogger("ordq.wire")

# The A/B switch: a master serves (and publishes) the link unless ORDQ_PRODUCE_LINK=grpc is in
# its environment; a producer uses a published link unless its own says ``grpc``.
ENV = "ORDQ_PRODUCE_LINK"
SLAVE_ACKS_ENV = "ORDQ_SLAVE_ACKS"  # the A/B switch of the slave's synced end watched by the producer
HELLO_LIMIT = 16 << 10  # a hello is a token: a longer first frame is refused unread
ANSWER_LIMIT = 64 << 20  # what a client reads of one answer (acks: a few bytes each)
CONNECT_TIMEOUT_S = 10.0  # the TLS handshake (as gRPC's CONNECT_ATTEMPT_MS)
REACH_TIMEOUT_S = 1.0  # the TCP connect: past it the link counts as unreachable (a fallback, below)
# The slave's watch opened and accepted within this (TCP, TLS, the slave's token check), or the
# stream goes without it (a hung slave, SIGSTOP, accepts TCP but never finishes TLS). Nothing
# waits for it: the stream writes meanwhile, on the master's acks of both (stop 78: a first
# write that waited for the watch made a failover ~13 ms slower).
WATCH_OPEN_S = 0.5
# An accepted watch: its connection and the slave's synced end at that moment
Watched = tuple[asyncio.StreamReader, asyncio.StreamWriter, int]


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
    track_connection(writer.transport)  # ends with the loop at the latest (a close that never came)
    tune(writer)
    if ctx is not None:
        try:
            await writer.start_tls(ctx, server_hostname=host, ssl_handshake_timeout=timeout_s)
        except BaseException:
            writer.transport.abort()
            raise
    return reader, writer


async def open_link(link: str, creds: Credentials, *, timeout_s: float = CONNECT_TIMEOUT_S,
                    hello: pb.ProduceLinkHello | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to a broker's lean link ``link`` (HOST:PORT, as published) and send the hello
    (``hello`` with the token set; None: a plain produce stream's)."""
    reader, writer = await open_tls(link, tls_context(creds, ssl.Purpose.SERVER_AUTH), timeout_s=timeout_s)
    first = pb.ProduceLinkHello() if hello is None else hello
    first.token = creds.token or ""
    writer.write(frame(first))
    return reader, writer


def slave_acks_wanted() -> bool:
    """Does this producer watch the slave's synced end (``ORDQ_SLAVE_ACKS``, default on; ``off``
    for A/B runs: the master's ack then means both, as before)?"""
    return os.environ.get(SLAVE_ACKS_ENV, "on") != "off"


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
                 epoch_key: str = "", fallback: Callable[[BaseException], AsyncProduceStream] | None = None,
                 watch: str = "") -> None:
        """``fallback``: when the link cannot be opened, the stream (the gRPC call on the same
        master) that carries everything instead; None: the stream ends, BrokerUnavailable.
        ``watch``: the slave's lean link, where the stream watches its segment's synced end
        (both_synced.py; "" or not reachable: the master's acks mean both, as before)."""
        self.link, self.address, self.queue, self.seg, self.epoch = link, address, queue, seg, epoch
        self.epoch_key = epoch_key
        self.watch = watch
        self._fallback = fallback
        self.fell_back: AsyncProduceStream | None = None  # the stream that carries it instead of the link
        # With the slave's watch open: the acks held until both cover them, fed by the two reader
        # tasks, and what ended the stream (a refusal, a broken link), for ``read_acks``
        self._both: BothSynced | None = None
        self._watch_conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._moved = asyncio.Event()
        self._answered = asyncio.Event()  # the master's first answer came (the watch opens after it)
        self._ended: OrdqError | None = None
        self._conn = asyncio.get_running_loop().create_task(self._open(creds))
        super().__init__()

    async def _open(self, creds: Credentials) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The link, or None once it could not be opened and ``fallback`` carries the stream.
        Nothing was written before (every write waits for this), so the order is the same.
        The slave's watch is opened once the master answered (``_watch_when_answered``).
        A close meanwhile leaves no connection open (a TLS transport left to the loop's close
        kept a producer's close waiting for ever)."""
        try:
            reader, writer = await open_tls(self.link, tls_context(creds, ssl.Purpose.SERVER_AUTH))
        except self._UNREACHABLE as exc:
            if self._fallback is None or self._closed:
                raise
            self.fell_back = self._fallback(exc)
            return None
        if self._closed:  # closed meanwhile, the cancellation swallowed on the way (a wait_for's)
            writer.transport.abort()
            raise asyncio.CancelledError
        writer.write(frame(pb.ProduceLinkHello(token=creds.token or "")))
        if self.watch and slave_acks_wanted():
            self._both = BothSynced(self.seg)
            self._readers = [asyncio.get_running_loop().create_task(self._read_master(reader)),
                             asyncio.get_running_loop().create_task(self._watch_when_answered(creds, writer))]
        return reader, writer

    @property
    def watching(self) -> bool:
        """The slave's watch is open and the master was asked for local acks."""
        return self._watch_conn is not None

    async def _watch_when_answered(self, creds: Credentials, writer: asyncio.StreamWriter) -> None:
        """The slave's watch, opened once the master's first answer came: a failover's first
        ack (a new stream's resends) does not share the producer's loop with a second TLS
        handshake. Once the slave accepted it: its end into ``_both``, the master asked for
        acks after its own sync (every later answer says so; those before meant both), then
        the slave's ends read until the stream ends. A watch refused or not opened in time:
        the stream stays on the master's acks of both."""
        await self._answered.wait()
        watched = await self._open_watch(creds)  # a cancel meanwhile aborts what it opened
        if watched is None:
            return
        if self._closed:  # closed as it opened (a wait_for's result can swallow the cancel)
            watched[1].transport.abort()
            return
        assert self._both is not None
        self._watch_conn = watched[:2]
        self._both.slave_synced(watched[2])
        writer.write(frame(pb.ProduceRequest(queue=self.queue, seg=self.seg, epoch=self.epoch,
                                             epoch_key=self.epoch_key, local_acks=True)))
        await self._read_watch(watched[0])

    async def _open_watch(self, creds: Credentials) -> Watched | None:
        """The slave's watch of this segment once accepted (its first answer: the synced end
        there now), or None when it cannot be opened, or is refused, within ``WATCH_OPEN_S``
        (logged: the master's acks then mean both; a slave that cannot judge tokens now holds
        no producer back)."""
        slave = f"slave {self.watch}"

        async def accepted() -> Watched:
            reader, writer = await open_link(self.watch, creds, hello=pb.ProduceLinkHello(
                watch=pb.ReplicaSegment(queue=self.queue, seg=self.seg)))
            try:
                body = await read_frame(reader, ANSWER_LIMIT, "synced-end watch answer")
                if body is None:
                    raise BrokerUnavailable(slave, "the watch closed before its first answer")
                answer = pb.ProduceLinkAnswer.FromString(body)
                if answer.error_json:
                    raise from_error_json(answer.error_json, answer.error_text, slave)
                return reader, writer, answer.synced.synced_end
            except BaseException:
                writer.transport.abort()
                raise

        try:
            return await asyncio.wait_for(accepted(), WATCH_OPEN_S)
        except (*self._UNREACHABLE, OrdqError, asyncio.IncompleteReadError, DecodeError) as exc:
            log.info("the slave's synced end (%s) cannot be watched (%r): acks come from the master alone",
                     self.watch, exc)
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
            conn = await asyncio.shield(self._conn)
        except asyncio.CancelledError:
            if self._closed and self._conn.cancelled():  # closed before it connected
                raise BrokerUnavailable(self.address, "produce stream closed") from None
            raise
        except self._UNREACHABLE as exc:
            raise BrokerUnavailable(self.address, f"produce link {self.link}: {exc!r}") from exc
        if conn is None:  # the gRPC call carries it: its errors as they are (a refusal stays final)
            assert self.fell_back is not None
            return await self.fell_back.read_acks()
        both = self._both
        if both is None:
            return (await self._next_acks(conn[0]))[0]
        while True:  # the two readers feed ``both``
            ready = both.ready()
            if ready:
                return ready
            if self._ended is not None:
                raise self._ended
            self._moved.clear()
            await self._moved.wait()

    async def _next_acks(self, reader: asyncio.StreamReader) -> tuple[list[Ack], bool]:
        """The acks of the master's next answer, and whether they are local (synced on the
        master only); its refusal, typed, or BrokerUnavailable."""
        try:
            body = await read_frame(reader, ANSWER_LIMIT, "produce link answer")
            stamp("P.ack")
            if body is None:
                raise BrokerUnavailable(self.address, "produce stream ended")
            answer = pb.ProduceLinkAnswer.FromString(body)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, DecodeError) as exc:
            raise BrokerUnavailable(self.address, f"produce link {self.link}: {exc!r}") from exc
        except ConfigError as exc:
            raise BrokerUnavailable(self.address, str(exc)) from exc
        if answer.error_json:
            raise from_error_json(answer.error_json, answer.error_text, self.address)
        return ([Ack(seg=a.seg, first_offset=a.first_offset, first_seq=a.first_seq, count=a.count)
                 for a in answer.response.acks], answer.response.local_acks)

    async def _read_master(self, reader: asyncio.StreamReader) -> None:
        """With a watch opened: the master's acks into ``_both`` (of both replicas' sync until
        the stream asked for local acks), until the stream ends."""
        assert self._both is not None
        try:
            while True:
                acks, local = await self._next_acks(reader)
                self._both.master_acked(acks, both=not local)
                self._answered.set()
                self._moved.set()
        except OrdqError as exc:
            self._end(exc)
        except Exception as exc:  # noqa: BLE001 - whatever broke it, the stream fails over (never hangs)
            self._end(BrokerUnavailable(self.address, f"produce link {self.link}: {exc!r}"))

    async def _read_watch(self, reader: asyncio.StreamReader) -> None:
        """The slave's synced ends of this segment into ``_both``, until the watch ends (any end
        fails the stream: without the slave's answers no ack can be settled)."""
        assert self._both is not None
        slave = f"slave {self.watch}"
        try:
            while True:
                try:
                    body = await read_frame(reader, ANSWER_LIMIT, "synced-end watch answer")
                    if body is None:
                        raise BrokerUnavailable(slave, "its synced-end watch ended")
                    answer = pb.ProduceLinkAnswer.FromString(body)
                except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError, DecodeError,
                        ConfigError) as exc:
                    raise BrokerUnavailable(slave, f"synced-end watch: {exc!r}") from exc
                if answer.error_json:
                    raise from_error_json(answer.error_json, answer.error_text, slave)
                if answer.synced.seg != self.seg or answer.synced.queue != self.queue:
                    raise BrokerUnavailable(slave, f"a synced end of {answer.synced.queue}/{answer.synced.seg} "
                                            f"on the watch of {self.queue}/{self.seg}")
                self._both.slave_synced(answer.synced.synced_end)
                self._moved.set()
        except OrdqError as exc:
            self._end(exc)
        except Exception as exc:  # noqa: BLE001 - as _read_master
            self._end(BrokerUnavailable(slave, f"synced-end watch: {exc!r}"))

    def _end(self, exc: OrdqError) -> None:
        if self._ended is None:
            self._ended = exc
        self._moved.set()

    async def close(self) -> None:
        """Close the link (and the slave's watch) and wait for the writer to end. Every
        connection already open is aborted first, before any wait: a close cancelled midway
        (a producer's close past its bound) leaves none behind, which uvloop's close of the
        loop would wait on for ever."""
        self._closed = True
        self._writer.cancel()
        if not self._conn.done():
            self._conn.cancel()
        for reader in self._readers:
            reader.cancel()
        for writer in self._writers():
            writer.transport.abort()
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
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self.fell_back is not None:
            await self.fell_back.close()
        for writer in self._writers():
            await shut(writer)

    def _writers(self) -> list[asyncio.StreamWriter]:
        """The connections open: the master's link, the slave's watch."""
        out = [] if self._watch_conn is None else [self._watch_conn[1]]
        if self._conn.done() and not self._conn.cancelled() and self._conn.exception() is None:
            conn = self._conn.result()
            if conn is not None:
                out.append(conn[1])
        return out


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

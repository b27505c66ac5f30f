"""The client side of the broker protocol: ``GrpcTransport`` implements the SDK's
``BrokerTransport`` and the Seal protocol's ``SealTransport`` over gRPC.

Every failed call raises an ordq error (``ordq.wire.errors.from_rpc_error``): typed when the
broker said what went wrong, ``BrokerUnavailable`` when it could not answer at all. Channels
are cached per address and closed with the transport.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import grpc

from ordq.common.errors import BrokerUnavailable
from ordq.common.security import Credentials, StubCache, channel, token_metadata
from ordq.wire import lean_produce
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import parse_header
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS, REQUEST_BYTES, chunks
from ordq.wire.lean_read import LINK_RETRY_S, LeanReadLink
from ordq.wire.transport import Ack, FetchResult, ReplicaEnd

T = TypeVar("T")
log = logging.getLogger("ordq.wire")


def _replica_end(e: pb.SegmentEnd) -> ReplicaEnd:
    return ReplicaEnd(end=e.end, first_seq=None if e.first_seq < 0 else e.first_seq,
                      last_seq=None if e.last_seq < 0 else e.last_seq, bytes=e.bytes)


class GrpcTransport:
    """Calls to broker processes. Thread-safe; ``close()`` closes every channel."""

    def __init__(self, *, rpc_timeout_s: float = 2.0, copy_timeout_s: float = 60.0,
                 credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials()  # none: plaintext (a --insecure cluster)
        self._md = token_metadata(self.credentials)
        self.rpc_timeout_s = rpc_timeout_s
        self.copy_timeout_s = copy_timeout_s
        self._stubs: StubCache[grpc.Channel, pb_grpc.BrokerStub] = StubCache(
            lambda address: channel(address, self.credentials, GRPC_OPTIONS), pb_grpc.BrokerStub, "transport")

    def _stub(self, address: str) -> pb_grpc.BrokerStub:
        return self._stubs.get(address)

    def _call(self, address: str, fn: Callable[[pb_grpc.BrokerStub], T]) -> T:
        try:
            with self._stubs.closed_calls():  # closed under a background seal's call (coordinator/head.py)
                return fn(self._stub(address))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, address) from exc

    def close(self) -> None:
        for ch in self._stubs.close():
            ch.close()

    # -- control ------------------------------------------------------------------------------

    def fence(self, address: str, queue: str, seg: int, epoch: int) -> ReplicaEnd:
        req = pb.FenceRequest(queue=queue, seg=seg, epoch=epoch)
        return _replica_end(self._call(address, lambda s: s.Fence(req, timeout=self.rpc_timeout_s, metadata=self._md)))

    def seal(self, address: str, queue: str, seg: int) -> ReplicaEnd:
        req = pb.SegmentRef(queue=queue, seg=seg)
        return _replica_end(self._call(address, lambda s: s.Seal(req, timeout=self.rpc_timeout_s, metadata=self._md)))

    def seal_many(self, address: str, segments: Sequence[tuple[str, int]]) -> dict[tuple[str, int], ReplicaEnd | None]:
        """Seal every (queue, seg) of ``segments`` at ``address`` in one call (cluster only):
        each one's end, or None for one the broker could not seal. Raises as ``seal`` when the
        broker does not answer."""
        req = pb.SealManyRequest(segments=[pb.SegmentRef(queue=q, seg=seg) for q, seg in segments])
        answer = self._call(address, lambda s: s.SealMany(req, timeout=self.copy_timeout_s, metadata=self._md))
        return {(r.segment.queue, int(r.segment.seg)): None if r.error else _replica_end(r.end)
                for r in answer.results}

    def copy_from_peer(self, address: str, queue: str, seg: int, peer: str, end: int) -> ReplicaEnd:
        req = pb.ReconcileRequest(queue=queue, seg=seg, end=end, peer=peer)
        return _replica_end(self._call(address, lambda s: s.Reconcile(req, timeout=self.copy_timeout_s,
                                                                      metadata=self._md)))

    def segment_info(self, address: str, queue: str, seg: int) -> pb.SegmentEnd:
        req = pb.SegmentRef(queue=queue, seg=seg)
        return self._call(address, lambda s: s.SegmentInfo(req, timeout=self.rpc_timeout_s, metadata=self._md))

    def open_segments(self, address: str, include: Iterable[tuple[str, int]] = ()) -> pb.OpenSegmentsResponse:
        """Every segment the broker at ``address`` holds and has not sealed, and those of
        ``include`` it holds sealed (cluster only)."""
        req = pb.OpenSegmentsRequest(include=[pb.SegmentRef(queue=q, seg=seg) for q, seg in include])
        return self._call(address, lambda s: s.OpenSegments(req, timeout=self.rpc_timeout_s, metadata=self._md))

    def find(self, address: str, req: pb.FindRequest) -> pb.FindResponse:
        """Key or time lookup (issue 41); the copy timeout: a missing index is rebuilt first."""
        return self._call(address, lambda s: s.Find(req, timeout=self.copy_timeout_s, metadata=self._md))

    def health(self, address: str) -> pb.HealthResponse:
        req = pb.HealthRequest()
        return self._call(address, lambda s: s.Health(req, timeout=self.rpc_timeout_s, metadata=self._md))

    # -- data -----------------------------------------------------------------------------------

    def fetch(self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
              known_end: int | None = None) -> FetchResult:
        req = pb.FetchRequest(queue=queue, seg=seg, offset=offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                              known_end=-1 if known_end is None else known_end)
        timeout = self.rpc_timeout_s + max_wait_ms / 1000.0
        res = self._call(address, lambda s: s.Fetch(req, timeout=timeout, metadata=self._md))
        return FetchResult(batches=list(res.batches), readable_end=res.readable_end, sealed=res.sealed)

    def open_produce(self, address: str, queue: str, seg: int, epoch: int, epoch_key: str = "") -> GrpcProduceStream:
        return GrpcProduceStream(self._stub(address), address, queue, seg, epoch, self._md, epoch_key=epoch_key)

    def reader(self) -> StreamedReads:
        return StreamedReads(self)


class StreamedReads:
    """``fetch`` for one reading thread, over the broker's Read streams: a fetch that
    continues the open stream (same replica, segment, limits, and the offset where its last
    answer ended) takes the stream's next answer — one stream message per readable range,
    not a call each; any other fetch closes it and opens a new one. The broker ends a stream
    after an empty answer or ``STREAM_S``, so the stream's deadline (``STREAM_S`` + the wait
    + the transport's ``rpc_timeout_s``) also bounds every answer when a broker hangs.

    A master that publishes a lean link (``link``) is read on it (ordq/wire/lean_read.py:
    the same streams, the same answers, less CPU on both sides); one whose link cannot be
    opened, or any replica without one, over gRPC."""

    STREAM_S = 1.0
    WATCHDOG_GRACE_S = 1.0  # past the deadline, before this side cancels a stream itself

    def __init__(self, transport: GrpcTransport) -> None:
        self._t = transport
        self._key: tuple[Any, ...] | None = None  # what the open stream reads, and from where next
        self._stream: _GrpcRead | _LinkRead | None = None
        self._conn: LeanReadLink | None = None  # the lean link last read on (one master at a time)
        self._link_down: dict[str, float] = {}  # a link that could not be opened -> until when not tried
        self.link_streams = self.grpc_streams = 0  # streams opened on each
        self.link_fallbacks = 0  # lean links that could not be opened (read over gRPC for LINK_RETRY_S each)

    def fetch(self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
              known_end: int | None = None, link: str = "") -> FetchResult:
        key = (address, queue, seg, offset, max_bytes, max_wait_ms, known_end)
        for fresh in (False, True):
            if fresh or key != self._key or self._stream is None:
                self._close_stream()
                self._stream = self._open(address, link, pb.FetchRequest(
                    queue=queue, seg=seg, offset=offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                    known_end=-1 if known_end is None else known_end, stream_ms=int(self.STREAM_S * 1000)))
            try:
                res = self._stream.next()
            except BaseException:
                self._close_stream()
                raise
            if res is None:
                self._close_stream()  # it ended after its last answer (quiet, or its time): a new one
                continue
            batches = list(res.batches)
            end = parse_header(batches[-1], verify_crc=False).end_offset if batches else offset
            self._key = (address, queue, seg, end, max_bytes, max_wait_ms, known_end)
            return FetchResult(batches=batches, readable_end=res.readable_end, sealed=res.sealed)
        raise BrokerUnavailable(address, "Read stream ended without an answer")

    def _open(self, address: str, link: str, req: pb.FetchRequest) -> _GrpcRead | _LinkRead:
        timeout = self.STREAM_S + req.max_wait_ms / 1000.0 + self._t.rpc_timeout_s
        conn = self._link(address, link)
        if conn is not None:
            self.link_streams += 1
            return _LinkRead(conn, req, timeout + self.WATCHDOG_GRACE_S)
        self.grpc_streams += 1
        return _GrpcRead(self._t, address, req, timeout, self.WATCHDOG_GRACE_S)

    def _link(self, address: str, link: str) -> LeanReadLink | None:
        """The open connection to ``link`` (opened now if need be), or None: read over gRPC."""
        now = time.monotonic()
        if not link or not lean_produce.wanted() or self._link_down.get(link, 0.0) > now:
            return None
        conn = self._conn
        if conn is not None and not conn.closed and conn.link == link:
            return conn
        if conn is not None:
            conn.close()
        self._conn = None
        try:
            self._conn = LeanReadLink(link, address, self._t.credentials)
        except OSError as exc:  # ssl.SSLError and TimeoutError too: a firewalled or NAT'd port, or a gone master
            self._link_down[link] = now + LINK_RETRY_S
            self.link_fallbacks += 1
            log.warning("the lean link %s of %s cannot be opened (%r): reading over gRPC for %gs", link, address,
                        exc, LINK_RETRY_S)
        return self._conn

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = self._key = None

    def close(self) -> None:
        self._close_stream()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _GrpcRead:
    """A Read call: its answers, then None; its own deadline enforced by this side too."""

    def __init__(self, t: GrpcTransport, address: str, req: pb.FetchRequest, timeout: float, grace: float) -> None:
        self._address = address
        self._call: Any = t._call(address, lambda s: s.Read(req, timeout=timeout, metadata=t._md))
        # A consumer was seen blocked in a Read stream's next() for minutes past its 3.2 s
        # deadline, the broker idle (issue 26, test_ctrl_c_on_consume). Cancelling ends that
        # next() with CANCELLED, which the reader takes as an unavailable broker and tries again.
        self._watchdog = threading.Timer(timeout + grace, self._call.cancel)
        self._watchdog.daemon = True
        self._watchdog.start()

    def next(self) -> pb.FetchResponse | None:
        try:
            return next(self._call)  # type: ignore[no-any-return]
        except StopIteration:
            return None
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self._address) from exc

    def close(self) -> None:
        self._watchdog.cancel()
        self._call.cancel()


class _LinkRead:
    """A Read stream on a lean link: its answers, then None. Left before its end, the link is
    closed (its remaining answers would come before the next stream's)."""

    def __init__(self, conn: LeanReadLink, req: pb.FetchRequest, deadline_s: float) -> None:
        self._conn, self._ended = conn, False
        conn.open(req, deadline_s)

    def next(self) -> pb.FetchResponse | None:
        res = self._conn.next_answer()
        self._ended = res is None
        return res

    def close(self) -> None:
        if not self._ended:
            self._conn.close()


_CLOSE = object()


class GrpcProduceStream:
    """One pipelined Produce call: ``send`` queues batches (coalesced into stream messages of
    up to ~REQUEST_BYTES), ``acks`` yields acks in order and ends by raising an ordq error."""

    def __init__(self, stub: pb_grpc.BrokerStub, address: str, queue: str, seg: int, epoch: int,
                 metadata: tuple[tuple[str, str], ...] = (), *, epoch_key: str = "") -> None:
        self.address, self.queue, self.seg, self.epoch = address, queue, seg, epoch
        self.epoch_key = epoch_key
        self._q: queue_mod.SimpleQueue[Any] = queue_mod.SimpleQueue()
        self._call = stub.Produce(self._requests(), metadata=metadata)

    def _requests(self) -> Iterator[pb.ProduceRequest]:
        while True:
            item = self._q.get()
            if item is _CLOSE:
                return
            batches: list[bytes] = list(item)
            size = sum(len(b) for b in batches)
            # Gather whatever else is already queued, then cut it into requests the broker
            # accepts (one ``send`` may hand over more than one request's worth).
            closing = False
            while size < REQUEST_BYTES:
                try:
                    more = self._q.get_nowait()
                except queue_mod.Empty:
                    break
                if more is _CLOSE:
                    closing = True
                    break
                batches.extend(more)
                size += sum(len(b) for b in more)
            for chunk in chunks(batches):
                yield pb.ProduceRequest(queue=self.queue, seg=self.seg, epoch=self.epoch, epoch_key=self.epoch_key,
                                       batches=chunk)
            if closing:
                return

    def send(self, batches: Sequence[bytes]) -> None:
        self._q.put(list(batches))

    def acks(self) -> Iterator[Ack]:
        try:
            for resp in self._call:
                for a in resp.acks:
                    yield Ack(seg=a.seg, first_offset=a.first_offset, first_seq=a.first_seq, count=a.count)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from exc
        raise BrokerUnavailable(self.address, "produce stream ended")

    def close(self) -> None:
        self._q.put(_CLOSE)
        self._call.cancel()


# The Seal protocol needs only part of the transport; one implementation serves both.
GrpcSealTransport = GrpcTransport

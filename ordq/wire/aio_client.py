"""The SDK's data path to brokers on grpc.aio: ``AioTransport`` implements
``ordq.wire.transport.AsyncBrokerTransport`` (the produce stream and Fetch) for a client whose I/O
runs on one event loop (``ordq.common.loop``). Control calls (fence, seal, ...) stay on the sync
``GrpcTransport``; the wire protocol is the same.

Rules:
- Make it, use it and close it on one event loop: grpc.aio channels belong to the loop that
  made them. One channel per broker address, closed with the transport.
- Every failed call raises an ordq error (``ordq.wire.errors.from_rpc_error``), as the sync
  client does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc

from ordq.common.errors import BrokerUnavailable
from ordq.common.security import Credentials, StubCache, aio_channel, token_metadata
from ordq.common.stages import stamp
from ordq.wire import ordq_pb2 as pb
from ordq.wire import ordq_pb2_grpc as pb_grpc
from ordq.wire.batch import first_seqs
from ordq.wire.errors import from_rpc_error
from ordq.wire.framing import GRPC_OPTIONS, PRODUCE_STEP_BYTES, chunks
from ordq.wire.lean_frames import encoded_stream, produce_request_body
from ordq.wire.lean_produce import ENV as LINK_ENV
from ordq.wire.lean_produce import LeanProduceStream
from ordq.wire.produce_writer import ProduceWriter
from ordq.wire.transport import Ack, FetchResult

log = logging.getLogger("ordq.wire")

LINK_RETRY_S = 60.0  # a lean link that could not be opened is tried again after this long


class BrokerStub(pb_grpc.BrokerStub):
    """The generated stub, with a Produce call whose requests are encoded by hand
    (``encoded_stream``: protobuf's serializer of the batches was ~2 ms per MiB on the loop)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.ProduceEncoded = encoded_stream(channel, "Produce", pb.ProduceResponse)


class AioTransport:
    def __init__(self, *, rpc_timeout_s: float = 2.0, credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials()
        self.rpc_timeout_s = rpc_timeout_s
        self._md = token_metadata(self.credentials)
        self._stubs: StubCache[grpc.aio.Channel, BrokerStub] = StubCache(
            lambda address: aio_channel(address, self.credentials, GRPC_OPTIONS), BrokerStub, "transport")
        self.link_fallbacks = 0  # produce streams carried by gRPC because their lean link could not be opened
        self._links_down: dict[str, float] = {}  # link -> when it last could not be opened (monotonic)

    def _stub(self, address: str) -> BrokerStub:
        return self._stubs.get(address)

    def has_channel(self, address: str) -> bool:
        """Is a channel to ``address`` open already (a stream there needs no new connection)?"""
        return self._stubs.has(address)

    def open_produce(self, address: str, queue: str, seg: int, epoch: int, epoch_key: str = "",
                     link: str = "", watch: str = "") -> AioProduceStream | LeanProduceStream:
        """The produce stream to the master at ``address``: on its lean link ``link`` when it
        publishes one (ordq/wire/lean_produce.py) and this process does not say
        ``ORDQ_PRODUCE_LINK=grpc``, watching the slave's synced end at ``watch`` (its lean link,
        "" for none); else a gRPC call. A link that cannot be opened hands the
        stream to a gRPC call to the same master (``link_fallbacks``), and for LINK_RETRY_S
        the next streams there go on gRPC at once."""
        def grpc_call() -> AioProduceStream:
            return AioProduceStream(self._stub(address), address, queue, seg, epoch, self._md, epoch_key=epoch_key)

        def fall_back(exc: BaseException) -> AioProduceStream:
            self.link_fallbacks += 1
            if link not in self._links_down:  # logged once per link
                log.warning("the lean produce link %s of master %s cannot be opened (%r): using gRPC to the "
                            "master (docs/OPERATIONS.md, The lean links)", link, address, exc)
            self._links_down[link] = time.monotonic()
            return grpc_call()

        down_at = self._links_down.get(link)
        if (link and os.environ.get(LINK_ENV) != "grpc"
                and (down_at is None or time.monotonic() - down_at >= LINK_RETRY_S)):
            return LeanProduceStream(link, address, queue, seg, epoch, self.credentials, epoch_key=epoch_key,
                                     fallback=fall_back, watch=watch)
        return grpc_call()

    async def fetch(self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
                    known_end: int | None = None) -> FetchResult:
        req = pb.FetchRequest(queue=queue, seg=seg, offset=offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                              known_end=-1 if known_end is None else known_end)
        try:
            res = await self._stub(address).Fetch(req, timeout=self.rpc_timeout_s + max_wait_ms / 1000.0,
                                                  metadata=self._md)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, address) from exc
        return FetchResult(batches=list(res.batches), readable_end=res.readable_end, sealed=res.sealed)

    async def close(self) -> None:
        for ch in self._stubs.close():
            await ch.close()


class AioProduceStream(ProduceWriter):
    """One pipelined Produce call on the running loop. ``send`` (on the loop, never waits)
    queues batches; one writer task (``ProduceWriter``) puts everything queued meanwhile into
    as few stream messages as the broker accepts (``chunks``), so a burst of sends costs one
    write. ``read_acks`` returns the acks of the next response, in order, and ends by raising
    an ordq error."""

    _ENDED = (grpc.RpcError,)

    def __init__(self, stub: BrokerStub, address: str, queue: str, seg: int, epoch: int,
                 metadata: tuple[tuple[str, str], ...] = (), *, epoch_key: str = "") -> None:
        self.address, self.queue, self.seg, self.epoch = address, queue, seg, epoch
        self.epoch_key = epoch_key  # the Claim's secret: brokers refuse the epoch without it
        self._call = stub.ProduceEncoded(metadata=metadata)
        super().__init__()

    async def _write(self, batches: list[bytes]) -> None:
        for chunk in chunks(batches, PRODUCE_STEP_BYTES):
            stamp("P.write", first_seqs, chunk)
            await self._call.write(produce_request_body(self.queue, self.seg, self.epoch, self.epoch_key, chunk))

    async def read_acks(self) -> list[Ack]:
        try:
            resp = await self._call.read()
            stamp("P.ack")
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.address) from exc
        if resp is grpc.aio.EOF:
            raise BrokerUnavailable(self.address, "produce stream ended")
        return [Ack(seg=a.seg, first_offset=a.first_offset, first_seq=a.first_seq, count=a.count)
                for a in resp.acks]

    async def close(self) -> None:
        """Cancel the call and wait for the writer to end."""
        self._closed = True
        self._call.cancel()
        self._writer.cancel()
        try:
            await self._writer
        except asyncio.CancelledError:
            if not self._writer.cancelled():
                raise  # the caller itself is being cancelled
        except Exception as exc:  # noqa: BLE001 - the writer died of it: closing this stream ends it anyway
            # Raised here it would end the producer's failure handling (which closes the
            # stream before it resumes on a new one), and leave flush() waiting for ever.
            log.warning("produce stream to %s: its writer had failed: %r", self.address, exc)

"""What the SDK needs from brokers: a small interface, implemented over gRPC in
``ordq/wire/client.py`` (blocking calls) and ``ordq/wire/aio_client.py`` (the data path
on a client's event loop); the wire protocol lives in one place. Errors are ``ordq.common.errors``
types (translated where they enter)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import attrs

# Segments one SealMany call may name: the broker refuses more (broker_group/control.py), and the
# coordinator's seal batches send this many (coordinator/daemon_seals.py SEAL_BATCH).
MAX_SEAL_MANY = 1000


@attrs.frozen
class ReplicaEnd:
    """What a replica reports for one segment after Seal or Fence."""

    end: int  # durable message count
    first_seq: int | None
    last_seq: int | None
    bytes: int = 0  # on disk


class SealTransport(Protocol):
    """What the Seal protocol needs from brokers (implemented over gRPC in ``client.py``)."""

    def seal(self, address: str, queue: str, seg: int) -> ReplicaEnd: ...

    def copy_from_peer(self, address: str, queue: str, seg: int, peer: str, end: int) -> ReplicaEnd: ...


class BatchSealTransport(SealTransport, Protocol):
    """Seal with one call for many segments of one replica (issue 43)."""

    def seal_many(self, address: str, segments: Sequence[tuple[str, int]]) -> dict[tuple[str, int],
                                                                                  ReplicaEnd | None]: ...


@attrs.frozen
class Ack:
    """Both replicas synced the batch whose first seq is ``first_seq``."""

    seg: int
    first_offset: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1


@attrs.frozen
class FetchResult:
    batches: list[bytes]  # whole encoded batches, in offset order
    readable_end: int  # LAC of an open segment, end of a sealed one
    sealed: bool  # the replica has sealed the segment (readable_end is final)


class ProduceStream(Protocol):
    """One pipelined produce stream to a master for (queue, seg, epoch)."""

    def send(self, batches: Sequence[bytes]) -> None:
        """Queue batches for sending (in order, many per stream message); never blocks long."""

    def acks(self) -> Iterator[Ack]:
        """Acks in order; ends by raising an OrdqError (FencedError, BrokerUnavailable, ...)."""
        ...

    def close(self) -> None: ...


class Reader(Protocol):
    """``BrokerTransport.fetch`` for one reading thread, which may keep a stream open between
    calls (a fetch that continues where the last one ended costs no call). ``link``: the
    replica's lean link (a master's, from its liveness node), "" for none."""

    # Lean links that could not be opened so far: those reads went over gRPC (counted, logged)
    link_fallbacks: int

    def fetch(
        self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
        known_end: int | None = None, link: str = "",
    ) -> FetchResult: ...

    def close(self) -> None: ...


class BrokerTransport(SealTransport, Protocol):
    def fence(self, address: str, queue: str, seg: int, epoch: int) -> ReplicaEnd: ...

    def open_produce(self, address: str, queue: str, seg: int, epoch: int, epoch_key: str = "") -> ProduceStream: ...

    def fetch(
        self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
        known_end: int | None = None,
    ) -> FetchResult:
        """Whole batches from ``offset``; ``known_end`` is the sealed end from ZooKeeper, if
        known: a replica holding less refuses (BrokerUnavailable) instead of reading short."""
        ...

    def reader(self) -> Reader:
        """A ``Reader`` for one thread's reads (a consumer's)."""
        ...

    def close(self) -> None: ...


class AsyncProduceStream(Protocol):
    """``ProduceStream`` on an event loop: ``send`` never waits; ``read_acks`` returns the
    acks of the next response, in order, and ends by raising an OrdqError."""

    # time.monotonic() when its first request was handed to the transport (None: not yet)
    first_write_at: float | None

    def send(self, batches: Sequence[bytes]) -> None: ...

    async def read_acks(self) -> list[Ack]: ...

    async def close(self) -> None: ...


class AsyncBrokerTransport(Protocol):
    """The data path of ``BrokerTransport`` on one event loop (made, used and closed there)."""

    def open_produce(self, address: str, queue: str, seg: int, epoch: int,
                     epoch_key: str = "", link: str = "", watch: str = "") -> AsyncProduceStream: ...
    # ``link``: the master's lean produce link as published ("" for none; ordq/wire/lean_produce.py);
    # ``watch``: its slave's lean link, where the stream watches the segment's synced end

    async def fetch(
        self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
        known_end: int | None = None,
    ) -> FetchResult: ...

    async def close(self) -> None: ...

"""What the SDK needs from brokers: a small interface, implemented over gRPC in
``broker_group/client.py`` (the wire protocol lives in one place). Errors are ``ordq.errors``
types (translated where they enter)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import attrs

from coordinator.seal import ReplicaEnd, SealTransport


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


class BrokerTransport(SealTransport, Protocol):
    def fence(self, address: str, queue: str, seg: int, epoch: int) -> ReplicaEnd: ...

    def open_produce(self, address: str, queue: str, seg: int, epoch: int) -> ProduceStream: ...

    def fetch(
        self, address: str, queue: str, seg: int, offset: int, *, max_bytes: int, max_wait_ms: int,
        known_end: int | None = None,
    ) -> FetchResult:
        """Whole batches from ``offset``; ``known_end`` is the sealed end from ZooKeeper, if
        known: a replica holding less refuses (BrokerUnavailable) instead of reading short."""
        ...

    def close(self) -> None: ...

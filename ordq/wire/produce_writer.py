"""The writing half of a pipelined produce stream, shared by its two transports (the gRPC call,
ordq/wire/aio_client.py ``AioProduceStream``, and the lean link, ordq/wire/lean_produce.py
``LeanProduceStream``).

Guarantee: ``send`` never waits; one writer task hands everything queued since its last write
to ``_write`` at once, in order, so a burst of sends costs one write (the transport splits it
into requests of at most ``PRODUCE_STEP_BYTES``); a send that finds the writer idle and the
transport empty is written on its own turn instead (``_write_now``: nothing waits before it,
so the order is the same); a write that fails or a stream that ended stops the writer quietly
(the stream's ``read_acks`` reports why).

Rules: no transport here; runs on the event loop that made it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence


class ProduceWriter:
    """Subclasses give ``_write`` (the batches of one turn) and ``_ENDED`` (the errors that
    mean the stream failed or ended: the writer stops, ``read_acks`` reports it)."""

    _ENDED: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._wake: asyncio.Future[None] | None = None
        self._closed = False
        self._idle = False  # the writer task waits for sends, no write of its own in progress
        self.first_write_at: float | None = None  # monotonic: the first request handed to the transport
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    def send(self, batches: Sequence[bytes]) -> None:
        # Written here, on the caller's turn of the loop, when nothing waits before them and the
        # writer is idle (``_write_now`` says whether the transport takes them at once): a
        # synchronous send then skips the hop to the writer task, a turn of the loop.
        if not self._pending and self._idle and not self._closed and self._write_now(list(batches)):
            self._written()
            return
        self._pending.extend(batches)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _write(self, batches: list[bytes]) -> None:
        raise NotImplementedError

    def _write_now(self, batches: list[bytes]) -> bool:
        """Hand ``batches`` to the transport without waiting, if it can take them so (an open
        connection with nothing buffered); False: the writer task writes them."""
        return False

    def _written(self) -> None:
        if self.first_write_at is None:  # once per stream: a failover's timing (FailoverTimes)
            self.first_write_at = time.monotonic()

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        ended: tuple[type[BaseException], ...] = (asyncio.InvalidStateError, *self._ENDED)
        try:
            while not self._closed:
                if not self._pending:
                    self._wake = loop.create_future()
                    self._idle = True
                    try:
                        await self._wake
                    finally:
                        self._idle = False
                    continue
                batches, self._pending = self._pending, []
                await self._write(batches)
                self._written()
        except ended:
            pass  # the stream failed or ended: read_acks reports why

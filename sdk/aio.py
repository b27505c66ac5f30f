"""asyncio API over the same producer and consumer cores.

The sync classes own the protocol; these wrappers turn send futures into awaitables and move
blocking calls off the event loop (``asyncio.to_thread``), so both APIs give exactly the same
ordering and durability guarantees.

The AsyncProducer runs the producer's I/O on the caller's own loop (``Producer.host_io_here``):
a send is written, and its ack settles the awaitable, on that loop, with no hand-off between
threads (a synchronous send, awaited one at a time, was ~100-150 µs slower through the sync
producer's loop thread: docs/BENCHMARKS.md, issue 39). So a coroutine that blocks the loop
holds up the producer's acks and timers too; ``io_thread=True`` gives the producer a loop
thread of its own, as the sync Producer has. ``send`` runs on the loop while the in-flight
window has room (it then only takes the producer's lock briefly) and goes to a thread only to
wait for room.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Sequence

from ordq.common.errors import WaitTimeout
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._futures import SendFuture, SendResult
from ordq.sdk._producer_types import ProducerConfig, StoredMessage
from ordq.sdk.consumer import Consumer
from ordq.sdk.producer import Producer
from ordq.wire.transport import BrokerTransport


class AsyncProducer:
    def __init__(self, config: ProducerConfig, *, transport: BrokerTransport | None = None,
                 io_thread: bool = False) -> None:
        """``io_thread``: the producer's I/O on a loop thread of its own, not on the caller's
        loop (for a caller whose loop may block for long: acks and timers then wait for it)."""
        self._sync = Producer(config, transport=transport)
        self._io_thread = io_thread
        self._bridge: _BatchBridge | None = None  # the asyncio futures of the batch being filled

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if not self._io_thread:
            self._sync.host_io_here()
        await asyncio.to_thread(self._sync.start)

    async def send(
        self, payload: bytes, *, key: bytes | None = None, headers: Sequence[tuple[str, bytes]] = (),
        deliver_at: float | datetime.datetime | None = None,
    ) -> asyncio.Future[SendResult]:
        """Queue a message (may wait for window space); returns an awaitable ack.
        ``deliver_at``: as ``Producer.send`` (delayed delivery)."""
        try:
            fut = self._sync.send(payload, key=key, headers=headers, timeout_s=0,  # never blocks
                                  deliver_at=deliver_at)
        except WaitTimeout:  # the window is full: wait for room off the loop
            fut = await asyncio.to_thread(self._sync.send, payload, key=key, headers=headers, deliver_at=deliver_at)
        bridge = self._bridge
        if bridge is None or not bridge.takes(fut):
            bridge = self._bridge = _BatchBridge(asyncio.get_running_loop(), fut)
        return bridge.add(fut)

    async def flush(self, timeout_s: float | None = None) -> None:
        await asyncio.to_thread(self._sync.flush, timeout_s)

    async def last_committed(self) -> StoredMessage | None:
        return await asyncio.to_thread(self._sync.last_committed)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)


class AsyncConsumer:
    def __init__(self, config: ConsumerConfig, *, transport: BrokerTransport | None = None) -> None:
        self._sync = Consumer(config, transport=transport)

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # as the sync consumer's: leaving on an error commits only what was finished
        await asyncio.to_thread(self._sync.__exit__, *exc)

    async def start(self) -> None:
        await asyncio.to_thread(self._sync.start)

    async def poll(self, timeout_s: float | None = None, *, max_messages: int | None = None) -> list[Delivered]:
        return await asyncio.to_thread(self._sync.poll, timeout_s, max_messages=max_messages)

    async def __aiter__(self) -> AsyncIterator[Delivered]:
        """As the sync iteration: a message counts as finished when the loop asks for the
        next; the one in hand when the loop breaks or raises does not."""
        while True:
            for m in await self.poll():
                yield m
                self._sync._mark_finished(m)  # noqa: SLF001 - the same consumer, another API

    async def commit(self, through: Delivered | None = None) -> None:
        await asyncio.to_thread(self._sync.commit, through)

    async def run_keyed(self, handler: Callable[[Delivered], object], *, workers: int,
                        stop: asyncio.Event | None = None, max_pending: int = 256, drain: bool = True) -> None:
        """``Consumer.run_keyed`` from asyncio: messages hashed by key to ``workers`` threads,
        per-key order, commits only over the finished prefix; returns once ``stop`` is set
        (or the task is cancelled) and the workers stopped. ``handler`` is a function (run in
        its worker thread) or a coroutine function (each call run on this loop, its worker
        waiting for it, so per-key order holds). Raises as ``Consumer.run_keyed`` does."""
        loop = asyncio.get_running_loop()
        call = handler
        if inspect.iscoroutinefunction(handler):
            def call(m: Delivered) -> object:
                return asyncio.run_coroutine_threadsafe(handler(m), loop).result()

        stopped = threading.Event()
        relay = asyncio.create_task(_relay(stop, stopped)) if stop is not None else None
        try:
            await asyncio.to_thread(self._sync.run_keyed, call, workers=workers, stop=stopped,
                                    max_pending=max_pending, drain=drain)
        finally:
            stopped.set()  # a cancelled caller stops the workers too
            if relay is not None:
                relay.cancel()

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)


async def _relay(stop: asyncio.Event, stopped: threading.Event) -> None:
    await stop.wait()
    stopped.set()


class _BatchBridge:
    """The asyncio futures of the messages of one batch, settled on their loop with one
    wake-up when the batch's outcome is known (one per message cost more than the send).

    Safe against the ack racing the wrapping: ``add`` runs on the loop, and ``_settle_all``
    does too (scheduled there from another thread; at once when the outcome is settled on the
    loop's own thread, the producer's I/O hosted there), so every future added before
    ``_settle_all`` runs is settled by it; one added after (the outcome already known) is
    settled at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, first: SendFuture) -> None:
        self.loop = loop
        self.outcome = first._outcome
        self.pending: list[tuple[SendFuture, asyncio.Future[SendResult]]] = []
        self.thread = threading.current_thread()  # the loop's (add runs there)
        first.add_done_callback(self._on_outcome)

    def _on_outcome(self, _fut: SendFuture) -> None:
        if threading.current_thread() is self.thread:
            self._settle_all()  # sets the futures' results; their awaiters run later, as always
        else:
            self.loop.call_soon_threadsafe(self._settle_all)

    def takes(self, fut: SendFuture) -> bool:
        return fut._outcome is self.outcome

    def add(self, fut: SendFuture) -> asyncio.Future[SendResult]:
        out: asyncio.Future[SendResult] = self.loop.create_future()
        if fut.done():
            _settle(fut, out)
        else:
            self.pending.append((fut, out))
        return out

    def _settle_all(self) -> None:
        pending, self.pending = self.pending, []
        for fut, out in pending:
            _settle(fut, out)


def _settle(fut: SendFuture, out: asyncio.Future[SendResult]) -> None:
    if out.done():
        return  # cancelled by its awaiter
    error = fut.exception(0)
    if error is not None:
        out.set_exception(error)
    else:
        out.set_result(fut.result(0))

"""The broker's event loop thread and the one wake-up signal its data path waits on.

Rules:
- Every gRPC call of a broker runs on one asyncio loop (``LoopThread``); code on it never
  blocks for long: ZooKeeper reads and control calls go to a worker thread
  (``run_blocking``), only a slave's inline append + fdatasync and short lock holds stay.
- ``Signal`` is how the data path learns that broker state changed (a sync finished, the
  slave answered, a segment was sealed, a stream failed): every waiter re-checks what it
  waits for after each ``fire``. State changes happen under the broker's lock before the
  signal fires, and a waiter checks and starts waiting without yielding to the loop in
  between, so no wake-up is lost. Other threads fire it through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent import futures
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in its own daemon thread until ``stop()``."""

    def __init__(self, name: str, *, workers: int = 64) -> None:
        self.loop = asyncio.new_event_loop()
        # Blocking work started from the loop (ZooKeeper, control calls, long disk reads).
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-work")
        self.loop.set_default_executor(self.pool)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        self._started = True

    @property
    def on_loop(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def run(self, coro: Awaitable[T], timeout_s: float | None = None) -> T:
        """From another thread: run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self._started and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self.loop.close()


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the loop's worker pool (for calls that may block: ZooKeeper, disk)."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Signal:
    """A broadcast wake-up for the loop's waiters: ``await wait()`` until the next ``fire()``."""

    def __init__(self, loop_thread: LoopThread) -> None:
        self._lt = loop_thread
        self._waiters: set[asyncio.Future[None]] = set()

    async def wait(self, timeout_s: float | None = None) -> None:
        """Until the next fire (or ``timeout_s``). Check the condition before calling, with no
        ``await`` in between."""
        fut: asyncio.Future[None] = self._lt.loop.create_future()
        self._waiters.add(fut)
        timer = None if timeout_s is None else self._lt.loop.call_later(max(timeout_s, 0.0), _settle, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.discard(fut)  # timed out or cancelled: forget it

    def fire(self) -> None:
        """Wake every waiter; from any thread."""
        if self._lt.on_loop:
            self._fire()
        else:
            try:
                self._lt.loop.call_soon_threadsafe(self._fire)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

    def _fire(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            _settle(fut)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)

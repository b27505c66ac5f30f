"""Keyed parallel delivery: the worker threads behind ``Consumer.run_keyed``.

Guarantee: a message goes to worker ``zlib.crc32(key) % workers`` (a message without a key
counts as the empty key, so such messages all go to worker 0 and keep their order among
themselves, as the verifier reads them); each worker runs the handler for its messages one at
a time in seq order, so messages of one key are handled in seq order while different keys run
in parallel. There is no order across keys. ``position()`` is the cursor after the contiguous
prefix of finished messages (``FinishedTracker``): the only thing the consumer may commit.

Rules:
- Owns the threads and their bounded queues; never touches ZooKeeper or brokers (the consumer
  commits ``position()`` through its one commit path).
- A message is registered with the tracker *before* it is queued, so a worker can never
  finish a seq the tracker does not know.
- Before each handler call a worker calls ``may_start`` (the consumer's lease check): when it
  raises, that error is ``fatal``, and no worker starts another message.
- After a handler error no worker starts another message (its key's later messages must not
  run before it); queued messages are abandoned, never finished, so the position stays below
  the failed one.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator.state import Cursor
from sdk._consumer_core import FinishedTracker

if TYPE_CHECKING:
    from sdk.consumer import Delivered

_STOP: Any = object()
_PUT_WAIT_S = 0.05  # how often a blocked submit looks at stop/failure (and lets commits run)


def worker_of(key: bytes | None, workers: int) -> int:
    """The worker a key maps to (stable across processes and runs: CRC-32, not ``hash``)."""
    return zlib.crc32(key or b"") % workers


class KeyedWorkers:
    """``workers`` threads running ``handler``; each with a queue of at most ``max_pending``."""

    def __init__(self, handler: Callable[[Delivered], object], *, workers: int, max_pending: int,
                 start: Cursor, may_start: Callable[[], None] = lambda: None, name: str = "ordq-keyed") -> None:
        self._handler = handler
        self._may_start = may_start
        self.fatal: BaseException | None = None  # may_start refused: the run must end with it
        self._lock = threading.Lock()  # guards the tracker and the failure
        self._tracker = FinishedTracker(position=start)
        self._abandon = threading.Event()
        self.failure: tuple[Delivered, BaseException] | None = None  # the lowest failed seq
        self.handled = 0
        self.abandoned = 0
        self._queues: list[queue.Queue[Delivered]] = [queue.Queue(maxsize=max_pending) for _ in range(workers)]
        self._threads = [threading.Thread(target=self._work, args=(q,), name=f"{name}-{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    def submit(self, m: Delivered, *, stop: threading.Event | None, waiting: Callable[[], None]) -> bool:
        """Queue ``m`` to its key's worker, blocking while that queue is full (``waiting`` is
        called every ~50 ms meanwhile). False: not queued, because a handler failed or
        ``stop`` is set; it stays registered and unfinished, so nothing past it commits."""
        with self._lock:
            self._tracker.dispatched(m.seq, Cursor(seg=m.seg, offset=m.offset + 1, last_seq=m.seq))
        q = self._queues[worker_of(m.key, len(self._queues))]
        while not self._abandon.is_set() and not (stop is not None and stop.is_set()):
            try:
                q.put(m, timeout=_PUT_WAIT_S)
                return True
            except queue.Full:
                waiting()
        return False

    def position(self) -> Cursor:
        with self._lock:
            assert self._tracker.position is not None  # started with one
            return self._tracker.position

    def moved(self, cursor: Cursor) -> None:
        with self._lock:
            self._tracker.moved(cursor)

    def unfinished(self) -> int:
        with self._lock:
            return self._tracker.unfinished

    def stop(self, *, drain: bool) -> None:
        """Stop the workers and wait for them. ``drain``: they first finish every queued
        message; else each finishes only the call in progress (a handler is never
        interrupted) and the queued ones are abandoned."""
        if not drain:
            self._abandon.set()
        for q in self._queues:
            q.put(_STOP)  # room comes: workers keep taking (and maybe skipping) until _STOP
        for t in self._threads:
            t.join()

    def _work(self, q: queue.Queue[Delivered]) -> None:
        while True:
            m = q.get()
            if m is _STOP:
                return
            if self._abandon.is_set():
                with self._lock:
                    self.abandoned += 1
                continue
            try:
                self._may_start()
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer's caller
                with self._lock:
                    self.fatal = self.fatal or exc
                    self.abandoned += 1
                self._abandon.set()
                continue
            try:
                self._handler(m)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer's caller
                with self._lock:
                    if self.failure is None or m.seq < self.failure[0].seq:
                        self.failure = (m, exc)
                self._abandon.set()
                continue
            with self._lock:
                self._tracker.finished(m.seq)
                self.handled += 1

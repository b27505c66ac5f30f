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
  the failed one. The consumer's handler applies the failure policy (sdk/parking.py) first:
  what reaches this pool as an error is ``raise`` (HandlerError) or a lost lease.
- ``control()`` queues a call of ``on_control(worker)`` behind each worker's queued messages:
  run on the worker's thread, between two of its messages, so it is ordered with its keys
  (the consumer replays parked messages of those keys there).
"""

from __future__ import annotations

import queue
import threading
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ordq.coordinator.state import Cursor
from ordq.sdk._consumer_core import FinishedTracker

if TYPE_CHECKING:
    from ordq.sdk._consumer_types import Delivered

_STOP: Any = object()
_CONTROL: Any = object()  # run ``on_control(worker)`` on that worker, between its messages
_PUT_WAIT_S = 0.05  # how often a blocked submit looks at stop/failure (and lets commits run)


def worker_of(key: bytes | None, workers: int) -> int:
    """The worker a key maps to (stable across processes and runs: CRC-32, not ``hash``)."""
    return zlib.crc32(key or b"") % workers


class KeyedWorkers:
    """``workers`` threads running ``handler``; each with a queue of at most ``max_pending``."""

    def __init__(self, handler: Callable[[Delivered], bool], *, workers: int, max_pending: int,
                 start: Cursor, may_start: Callable[[], None] = lambda: None,
                 on_control: Callable[[int], object] = lambda worker: None, name: str = "ordq-keyed") -> None:
        # handler(m): True once m is finished, False when it gave up on m (stopping): m stays
        # unfinished and no worker starts another message.
        self._handler = handler
        self._may_start = may_start
        self._on_control = on_control
        self.fatal: BaseException | None = None  # may_start refused: the run must end with it
        self._lock = threading.Lock()  # guards the tracker and the failure
        self._tracker = FinishedTracker(position=start)
        self._abandon = threading.Event()
        self.failure: tuple[Delivered, BaseException] | None = None  # the lowest failed seq
        self.handled = 0
        self.abandoned = 0
        self._queues: list[queue.Queue[Delivered]] = [queue.Queue(maxsize=max_pending) for _ in range(workers)]
        self._threads = [threading.Thread(target=self._work, args=(i, q), name=f"{name}-{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        for t in self._threads:
            t.start()

    def submit(self, m: Delivered, *, stop: threading.Event | None, waiting: Callable[[], None]) -> bool:
        """Queue ``m`` to its key's worker, blocking while that queue is full (``waiting`` is
        called every ~50 ms meanwhile). False: not queued, because a handler failed or
        ``stop`` is set; it stays registered and unfinished, so nothing past it commits."""
        with self._lock:
            self._tracker.dispatched(m.seq, Cursor(seg=m.seg, offset=m.offset + 1, last_seq=m.seq))
        return self._put(self._queues[worker_of(m.key, len(self._queues))], m, stop, waiting)

    def control(self, *, stop: threading.Event | None, waiting: Callable[[], None]) -> None:
        """Have every worker run ``on_control(its index)`` after the messages queued to it."""
        for q in self._queues:
            self._put(q, _CONTROL, stop, waiting)

    def _put(self, q: queue.Queue[Delivered], item: Any, stop: threading.Event | None,
             waiting: Callable[[], None]) -> bool:
        while not self._abandon.is_set() and not (stop is not None and stop.is_set()):
            try:
                q.put(item, timeout=_PUT_WAIT_S)
                return True
            except queue.Full:
                waiting()
        return False

    def wait(self, delay_s: float, stop: threading.Event | None) -> bool:
        """Wait ``delay_s`` (a retry's back-off); True, early, once the workers are stopping."""
        deadline = time.monotonic() + delay_s
        while not self._abandon.is_set() and not (stop is not None and stop.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._abandon.wait(min(left, _PUT_WAIT_S))
        return True

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

    def _control(self, worker: int) -> None:
        try:
            self._on_control(worker)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer's caller
            with self._lock:
                self.fatal = self.fatal or exc
            self._abandon.set()

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

    def _work(self, worker: int, q: queue.Queue[Delivered]) -> None:
        while True:
            m = q.get()
            if m is _STOP:
                return
            if m is _CONTROL:
                if not self._abandon.is_set():
                    self._control(worker)
                continue
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
                done = self._handler(m)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer's caller
                with self._lock:
                    if self.failure is None or m.seq < self.failure[0].seq:
                        self.failure = (m, exc)
                self._abandon.set()
                continue
            if not done:  # gave up while retrying it (stopping): unfinished
                with self._lock:
                    self.abandoned += 1
                self._abandon.set()
                continue
            with self._lock:
                self._tracker.finished(m.seq)
                self.handled += 1

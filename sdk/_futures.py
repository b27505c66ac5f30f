"""Send futures that cost almost nothing per message.

A ``concurrent.futures.Future`` builds a Condition and an RLock: ~7 µs each on the dev
machine, the largest single per-message cost of ``Producer.send`` (measured with timeit: a
slotted object is ~1.3 µs). Every message of a batch is acked together, so one
``BatchOutcome`` per batch holds the event, the result or error, and the callbacks; each
message gets a tiny ``SendFuture`` that points at it and knows its own seq.

Guarantee: a batch's outcome is set exactly once; callbacks run once, in the order they were
added, on the thread that settles the batch (the producer's event loop thread, where its ack
is read), or at once if already settled: a callback must not block (it holds up every ack).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class SendResult:
    seq: int
    seg: int
    offset: int


class BatchOutcome:
    """The fate of one batch: acked at (seg, first_offset) or failed with an exception."""

    __slots__ = ("first_seq", "seg", "first_offset", "error", "_event", "_callbacks", "_lock")

    def __init__(self) -> None:
        self.first_seq = -1
        self.seg = -1
        self.first_offset = -1
        self.error: BaseException | None = None
        self._event = threading.Event()
        self._callbacks: list[tuple[Callable[[SendFuture], Any], SendFuture]] = []
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        return self._event.is_set()

    def acked(self, *, seg: int, first_offset: int, first_seq: int) -> None:
        self._settle(seg=seg, first_offset=first_offset, first_seq=first_seq)

    def failed(self, error: BaseException) -> None:
        self._settle(error=error)

    def _settle(self, **fields: Any) -> None:
        with self._lock:
            if self._event.is_set():
                return  # settled once: a late second verdict is ignored
            for name, value in fields.items():
                setattr(self, name, value)
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn, fut in callbacks:
            fn(fut)

    def wait(self, timeout: float | None) -> None:
        if not self._event.wait(timeout):
            raise TimeoutError(f"send not acked within {timeout}s")

    def add_callback(self, fn: Callable[[SendFuture], Any], fut: SendFuture) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append((fn, fut))
                return
        fn(fut)


class SendFuture:
    """What ``Producer.send`` returns: the outcome of one message.

    The useful part of ``concurrent.futures.Future``'s API: ``result(timeout)``,
    ``exception(timeout)``, ``done()``, ``add_done_callback(fn)``. It cannot be cancelled (an
    ordered stream has no holes: a message is acked or the producer failed) and it is not a
    ``concurrent.futures.Future`` (``concurrent.futures.wait`` does not take it; the asyncio
    API wraps it itself).
    """

    __slots__ = ("seq", "_outcome")

    def __init__(self, seq: int, outcome: BatchOutcome) -> None:
        self.seq = seq
        self._outcome = outcome

    def done(self) -> bool:
        return self._outcome.settled

    def cancelled(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> SendResult:
        """(seq, seg, offset) once both replicas synced the message; raises the producer's
        error if it failed (FencedError, ClosedError, ...), TimeoutError after ``timeout``."""
        o = self._outcome
        o.wait(timeout)
        if o.error is not None:
            raise o.error
        return SendResult(seq=self.seq, seg=o.seg, offset=o.first_offset + self.seq - o.first_seq)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._outcome.wait(timeout)
        return self._outcome.error

    def add_done_callback(self, fn: Callable[[SendFuture], Any]) -> None:
        self._outcome.add_callback(fn, self)

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._outcome.error else "acked")
        return f"<SendFuture seq={self.seq} {state}>"

"""The elected coordinator and Python's cyclic garbage collector (issue 43): no collection while a
dead group's heads move, and a long collection said in the log.

Why: at 10^5 queues the leader holds a copy of every queue (``DaemonView``: ~7 container objects
a queue, ~700,000 in all), and a full (generation 2) collection walks every one of them with the
GIL held: 0.28-0.36 s for a heap like that in process on this box, more on the loaded leader. A
dead group's moves allocate ~10 objects a moved queue in seconds (its ~33,000 new states, the
planned moves, their transactions), and CPython starts a full collection once the objects that
survived since the last one reach a quarter of those that survived it: in process, planning
33,333 moves over such a heap took one full collection every time (0.45-0.80 s of its 0.9-1.6 s).
Every head must move within 10 s of the verdict; a collection can wait until they have.

Guarantee: nothing is freed that would not be, nor kept longer than the moves last (a few
seconds; what they drop meanwhile is mostly freed at once by reference counting, cycles are
collected once the collector is back on); the collector is back on after the block, whatever
it raised, unless it was off before. One process-wide switch, kept right while passes overlap
(a counter: the last one out switches it back).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("ordq.coordinator")

# A collection at least this long is said in the log (with its generation and what it freed).
LONG_COLLECTION_S = 0.2

_lock = threading.Lock()
_held = 0  # passes holding collections now
_was_enabled = True  # the collector's switch when the first of them began


@contextlib.contextmanager
def collections_held() -> Iterator[None]:
    """No cyclic garbage collection in this process while the block runs (see the module doc)."""
    global _held, _was_enabled
    with _lock:
        if _held == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if _held == 0 and _was_enabled:
                gc.enable()


class LongCollections:
    """A ``gc.callbacks`` entry that logs each collection of at least ``LONG_COLLECTION_S``
    (``clock``: seconds, injected for tests). Install it once a process (``install``)."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self.long = 0  # long collections seen (statistics, tests)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        took, self._started = self._clock() - self._started, None
        if took >= LONG_COLLECTION_S:
            self.long += 1
            log.info("a garbage collection of generation %s took %.2f s (%s objects freed)", info.get("generation"),
                     took, info.get("collected"))


_installed: LongCollections | None = None


def install_long_collection_log() -> LongCollections:
    """This process's ``LongCollections``, in ``gc.callbacks`` from the first call on."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = LongCollections()
            gc.callbacks.append(_installed)
        return _installed

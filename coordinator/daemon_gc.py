"""The elected coordinator and Python's cyclic garbage collector (issue 43): young collections
spaced out while it leads, no collection while a dead group's heads move, while a pass of the
heads' spread runs or a listing makes its rows, and a long collection said in the log.

Why: at 10^5 queues the leader holds a copy of every queue (``DaemonView``: ~7 container objects
a queue, ~700,000 in all), and a full (generation 2) collection walks every one of them with the
GIL held: 0.28-0.36 s for a heap like that in process on this box, more on the loaded leader. A
dead group's moves allocate ~10 objects a moved queue in seconds (its ~33,000 new states, the
planned moves, their transactions), and CPython starts a full collection once the objects that
survived since the last one reach a quarter of those that survived it: in process, planning
33,333 moves over such a heap took one full collection every time (0.45-0.80 s of its 0.9-1.6 s).
Every head must move within 10 s of the verdict; a collection can wait until they have.

Why young collections are spaced out while leading (scale43q): at 10^5 queues a pass over every
queue's copy (the heads' spread, every 2 s even when nothing moves; a listing) makes ~4
short-lived containers a queue, ~400,000, alive for the whole pass. With CPython's young
threshold (700) they survive the young collections the pass itself triggers and count as
survivors, so each pass ended in a full collection (the leader's one every 1-3 s). In process
(bench/bench_spread_gc.py), 10 spread passes over a 10^5-queue heap (~1.1 M containers): 13 full
collections, 7.7-8.2 s of the passes' 14.6-15.7 s of CPU, up to 0.71 s each; with a young
collection per ``LEADING_YOUNG_THRESHOLD`` containers: none, 6.0-7.9 s (docs/BENCHMARKS.md).

Why the spread pass and a listing hold the collector (scale43r): spaced, the young collections
a pass still triggered took 0.2-0.86 s of wall time each in the loaded leader. Held, the pass's
rows die by reference counting at its end: 10 passes in process took 5.0 s of CPU and one
middle collection (1 ms) with CPython's thresholds, 4.0 s and one young one spaced (against
12.6 s with 11 full collections, and 5.9 s with 21 young and middle ones). The spacing stays: the
heap's build (the reads of 10^5 states) took 9 full collections (2.2-2.5 s) with CPython's
thresholds, none spaced (docs/BENCHMARKS.md).

Guarantee: nothing is freed that would not be, nor kept longer than a held block lasts (the
moves, a spread pass, a listing: seconds; what they drop meanwhile is mostly freed at once by
reference counting, cycles are collected once the collector is back on); while leading,
cyclic garbage waits for at most ``LEADING_YOUNG_THRESHOLD`` container objects more. Each
setting is back after its block, whatever it raised, as it was before; process-wide, kept right
while blocks overlap (a counter: the last one out sets it back).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

log = logging.getLogger("ordq.coordinator")

# A collection at least this long is said in the log (with its generation and what it freed).
LONG_COLLECTION_S = 0.2
# The collections' counts and seconds are said at most this often (issue 43: measured in windows).
SUMMARY_EVERY_S = 60.0

# While leading: a young (generation 0) collection once this many more container objects were
# made than freed, not CPython's 700. Why 100,000: more than a pass over 10^4 queues makes, and
# a young collection of that many takes ~50 ms (in process, the 10^5 heap); a middle one (every
# 10 young) up to ~0.5 s while a pass over 10^5 queues is under way (docs/BENCHMARKS.md).
LEADING_YOUNG_THRESHOLD = 100_000

_lock = threading.Lock()
T = TypeVar("T")


class _ProcessSetting(Generic[T]):
    """A setting of this process changed while at least one block is in (``changed``): the first
    in saves it, the last out puts it back."""

    def __init__(self, read: Callable[[], T], write: Callable[[T], None]) -> None:
        self._read, self._write = read, write
        self._inside = 0
        self._before: T | None = None

    @contextlib.contextmanager
    def changed(self, to: Callable[[T], T]) -> Iterator[None]:
        """``to(before)`` while the block runs (and the others overlapping it)."""
        with _lock:
            if self._inside == 0:
                self._before = self._read()
                self._write(to(self._before))
            self._inside += 1
        try:
            yield
        finally:
            with _lock:
                self._inside -= 1
                if self._inside == 0:
                    self._write(self._before)  # type: ignore[arg-type]


_switch = _ProcessSetting(gc.isenabled, lambda on: gc.enable() if on else gc.disable())
_thresholds = _ProcessSetting(gc.get_threshold, lambda t: gc.set_threshold(*t))


def collections_held() -> contextlib.AbstractContextManager[None]:
    """No cyclic garbage collection in this process while the block runs (see the module doc)."""
    return _switch.changed(lambda _was_on: False)


def young_collections_spaced() -> contextlib.AbstractContextManager[None]:
    """While the block runs, a young collection once ``LEADING_YOUNG_THRESHOLD`` more containers
    were made than freed (if that is more than before; the older generations' as they were)."""
    return _thresholds.changed(lambda t: (max(t[0], LEADING_YOUNG_THRESHOLD), *t[1:]))


class LongCollections:
    """A ``gc.callbacks`` entry that logs each collection of at least ``LONG_COLLECTION_S``, and
    at most once per ``SUMMARY_EVERY_S`` (at a collection's end) how many ran by generation
    since the last such line, their seconds and the longest (``clock``: seconds, injected for
    tests). Install it once a process (``install``)."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self.long = 0  # long collections seen (statistics, tests)
        self._summary_at: float | None = None
        self._new_window()

    def _new_window(self) -> None:
        """Counts, seconds and the longest by generation, since the last summary line."""
        self._counts, self._seconds, self._longest = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if self._started is None:
            return
        ended = self._clock()
        took, self._started = ended - self._started, None
        generation = info.get("generation", 0)
        if took >= LONG_COLLECTION_S:
            self.long += 1
            log.info("a garbage collection of generation %s took %.2f s (%s objects freed)", generation,
                     took, info.get("collected"))
        if generation in (0, 1, 2):
            self._counts[generation] += 1
            self._seconds[generation] += took
            self._longest[generation] = max(self._longest[generation], took)
        if self._summary_at is None:
            self._summary_at = ended
        elif ended - self._summary_at >= SUMMARY_EVERY_S:
            log.info("garbage collections in %.0f s by generation 0/1/2: %s, %s s in all, the longest %s s",
                     ended - self._summary_at, "/".join(map(str, self._counts)),
                     "/".join(f"{s:.2f}" for s in self._seconds), "/".join(f"{s:.2f}" for s in self._longest))
            self._summary_at = ended
            self._new_window()


_installed: LongCollections | None = None


def install_long_collection_log() -> LongCollections:
    """This process's ``LongCollections``, in ``gc.callbacks`` from the first call on."""
    global _installed
    with _lock:
        if _installed is None:
            _installed = LongCollections()
            gc.callbacks.append(_installed)
        return _installed

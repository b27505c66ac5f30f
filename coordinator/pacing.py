"""A producer's urgent request before the daemon's idle work, in one coordinator process (issue 29).

The coordinator service (``service.py``) and the elected daemon (``daemon.py``) share one
process, hence one GIL. After a head master dies (or comes back) the daemon fails over, seals
and admits every queue that group headed: at 10,000 queues ~3,300 of each, minutes of
ZooKeeper writes and broker calls whose answers each take the GIL. A producer's ``FailOver``
(or a new leader's ``Claim``) is a handful of ZooKeeper round trips, each waiting its turn for
the GIL behind that storm: 219 ms median, 731 ms worst at 10,000 idle queues against 34 ms at
1,000 (BENCHMARKS, "10,000 queues"). Its writes stop until it is answered; the idle queues wait
on nobody.

So the service marks each urgent request while it is served (``RequestsFirst.serving``), and
the daemon waits while one is (``wait_turn``) before each idle queue's round or seal, and
between two slices of its re-reads (``daemon_view.READ_SLICE``) and of the queues it hands its
round pool (``daemon.ROUND_SLICE``): no new idle work starts until the request is answered, and
none that started holds the GIL for long (a profile of the storm, stop 28: re-reads 22-26 %,
queue rounds 21-24 %, handing 10,000 queues to the pool at once 15 % of its GIL time). Written
queues (``daemon.is_written``) never wait: a producer or consumer may be waiting on them too.

Guarantees: only timing changes. What the daemon does and how it writes (compare-and-set
transitions of ``state``) is the same, only later; a wait is bounded (``max_hold_s``), so a
stream of requests slows the idle work, never stops it.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
A = TypeVar("A")

# The service's requests that hold the daemon's idle work while served: those a producer's
# writes stop on until answered (a failover, a new leader's claim). Not Commit, Pop, Subscribe:
# consumers call them all the time, and nothing stops while they are served.
URGENT_RPCS = frozenset({"Claim", "FailOver"})
# The longest one idle queue's round or seal waits for urgent requests to end. A FailOver is
# tens of ms when its turns for the GIL are not behind the storm; 1 s bounds what a steady
# stream of them could hold the idle work back.
MAX_HOLD_S = 1.0


class RequestsFirst:
    """Urgent requests in flight, and idle work waiting for none to be (see the module doc)."""

    def __init__(self, *, max_hold_s: float = MAX_HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_hold_s = max_hold_s
        self._clock = clock
        self._cond = threading.Condition()
        self._serving = 0
        self.held = 0  # idle jobs that waited (a metric)
        self.held_s = 0.0  # and how long, in all

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around one urgent request: idle work starting meanwhile waits (``wait_turn``)."""
        with self._cond:
            self._serving += 1
        try:
            yield
        finally:
            with self._cond:
                self._serving -= 1
                if self._serving == 0:
                    self._cond.notify_all()

    def wait_turn(self) -> float:
        """Before one idle job: return once no urgent request is in flight, or after
        ``max_hold_s``; the seconds waited (0.0 at once when none is: the common case, one lock)."""
        with self._cond:
            if self._serving == 0:
                return 0.0
            started = self._clock()
            self._cond.wait_for(lambda: self._serving == 0, timeout=self.max_hold_s)
            waited = self._clock() - started
            self.held += 1
            self.held_s += waited
            return waited


def in_slices(items: Sequence[T], size: int, pause: Callable[[], object] | None) -> Iterator[Sequence[T]]:
    """``items`` ``size`` at a time, calling ``pause`` (a ``wait_turn``) between two slices."""
    for i in range(0, len(items), size):
        if i and pause is not None:
            pause()
        yield items[i:i + size]


def in_flight(items: Iterable[T], send: Callable[[T], R], wait: Callable[[T, R], A], *, limit: int,
              before_send: Callable[[T], object] | None = None) -> Iterator[tuple[T, A]]:
    """``wait(item, send(item))`` of each item, in order, with at most ``limit`` sent and not yet
    answered: once the oldest is answered the next is sent, before that answer is handed on, so
    the next request is on its way while the caller handles the answer. ``before_send(item)``
    runs before each send (a ``wait_turn``). An exception of ``send`` or ``wait`` ends it: the
    items not yielded may or may not have been sent.

    Why (issue 43): a dead group's ~170 move transactions at 10^5 queues went 4 at a time, the
    next 4 only once all 4 were answered (stop and go): ZooKeeper idled while this process
    handled the answers and built the next window."""
    if limit < 1:
        raise ValueError("limit must be >= 1")
    pending: collections.deque[tuple[T, R]] = collections.deque()
    todo = iter(items)

    def send_next() -> None:
        for item in todo:
            if before_send is not None:
                before_send(item)
            pending.append((item, send(item)))
            return

    for _ in range(limit):
        send_next()
    while pending:
        item, request = pending.popleft()
        answer = wait(item, request)
        send_next()
        yield item, answer

"""Each caller's fair turn at the coordinator service (issue 38), work-conserving.

The service is one process (one GIL) serving calls on a thread pool, whose requests queue on
one ZooKeeper session: a token that keeps 64 calls in flight took every worker, and another
queue's Commit waited behind them (p99 82 ms -> 3.4 s). Here at most ``slots`` calls do work at
once; a call that finds them taken waits for a turn, and each freed slot goes to the waiting
caller that used the least slot time lately (decayed with ``half_life_s``), oldest call first.
So a caller alone gets every slot (no throttling when nobody else waits), and a neighbour's
call, arriving beside a flood, is served at the next free slot.

A next free slot was not soon enough: the flood's calls that hold the two slots are its slowest
(a Describe of a queue with its live members, ~10 ZooKeeper round trips: 100-200 ms on a loaded
machine), and a neighbour's Commit waited for one of them to end (drill security-control-plane:
Commit p99 3.9-5.5x quiet beside six busy loops, the coordinator at 0.1 core: waiting, not
working). So ``reserved_slots`` more are kept for calls whose caller has *no other call
running*: a caller's first call in flight never waits behind another caller's second. And while
several callers called within ``active_s``, each runs at most its part of all the slots
(``SlotBook.cap``), rounded down (at least one), so that every caller's part fits beside the
others' at once: with 2 + 1 slots, 1 each while two or more call. With only the reserve, a
third caller (the drill's consumer committing) can hold the reserved slot, and the neighbour's
Commit waits behind the flood again (measured: p99 3.3-3.5x with the reserve alone, 1.5-3.1x
with the cap, 3.9-5.2x before either: docs/BENCHMARKS.md). Rounded up (2 of the 3 while two
call), the flood kept both shared slots and a neighbour's Commit ran in the reserved one beside
two of its calls (tests/test_coordinator_defences.py, one flooder and one neighbour: flooded
p50 14-20 ms, 14 ms rounded down, main 20-26 ms; docs/BENCHMARKS.md). The price: while another
caller called within ``active_s``, a caller runs one call at a time even when that other caller
has none running (the brokers' request-time share is applied the same way, within a window).

Why not the brokers' request-time bucket (broker_group/request_time.py): it holds a token in
debt even when nobody else waits (not work-conserving), and it delays by sleeping, which in a
thread-per-call server holds a worker; here a waiting call holds a worker too, so waiting is
bounded: ``max_waiting`` calls per caller and ``max_waiting_total`` in all, past which a call
is refused at once, and a call that waited ``max_delay_ms`` is refused then: RESOURCE_EXHAUSTED
(``ResourceExhausted``, retriable) with a retry hint (``TurnRefused.retry_ms``), counted.

Rules: no gRPC; threads and a clock only (injected for tests).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator

import attrs

from ordq.common.errors import ConfigError, OrdqError
from ordq.common.request_time import RequestTime, RequestTimeConfig


def _default_request_time() -> RequestTimeConfig:
    # A token's CPU share while others call too: 0.25 s/s of the one GIL (a commit costs ~2-3 ms,
    # so ~100/s per token); its bucket small, as the brokers' (a burst is what a neighbour feels);
    # each call's gRPC work outside its handler charged at 500 us (measured: ~0.3-0.6 ms).
    return RequestTimeConfig(share=0.2, burst_s=0.05, max_delay_ms=2_000, max_held=32, call_cost_us=500)


@attrs.frozen(kw_only=True)
class FairShareConfig:
    """The coordinator's turns (docs/SECURITY.md, Limits)."""

    slots: int = 2  # calls doing work at once; the GIL is one, and their ZooKeeper requests one session
    # More calls at once, only for a caller with no other call running (see the module doc).
    reserved_slots: int = 1
    max_waiting: int = 16  # calls of one caller waiting for a turn; past it, refused at once
    max_waiting_total: int = 48  # calls waiting in all (each holds a worker thread)
    max_delay_ms: int = 2_000  # a call that waited this long for its turn is refused
    half_life_s: float = 1.0  # how fast a caller's slot time is forgotten
    # A refusal is answered after this long (asleep: no slot, no GIL), so that a caller that asks
    # again at once is slowed as one that waits: refused at once, a 64-thread flood came back at
    # ~5,000 calls/s and its refusals alone took the GIL its neighbours needed (p99 x17).
    hold_refused_ms: int = 1_000
    max_held: int = 64  # refusals of one caller held at once; past it, at once
    max_held_total: int = 128  # in all (each holds a worker thread)
    # Each caller's share of the process's CPU (its handlers' thread time and a price per call),
    # the brokers' accounting (ordq/common/request_time.py), applied only while another caller
    # called within ``active_s``: a caller alone is never held.
    request_time: RequestTimeConfig = attrs.field(factory=_default_request_time)
    active_s: float = 1.0

    def __attrs_post_init__(self) -> None:
        if min(self.slots, self.max_waiting, self.max_waiting_total, self.max_delay_ms) <= 0 or self.half_life_s <= 0:
            raise ConfigError("fair share: slots, waiting bounds, delay and half-life must be > 0")
        if self.reserved_slots < 0:
            raise ConfigError("fair share: reserved slots must be >= 0")
        if min(self.hold_refused_ms, self.max_held, self.max_held_total) < 0:
            raise ConfigError("fair share: held refusals and their bounds must be >= 0")

    @property
    def threads(self) -> int:
        """Worker threads the server needs so that waiting and held calls never take them all."""
        return self.slots + self.reserved_slots + self.max_waiting_total + self.max_held_total + 16


class TurnRefused(OrdqError):
    """No turn for this call now; ``retry_ms``: when asking again may find one."""

    retriable = True

    def __init__(self, holder: str, why: str, retry_ms: int) -> None:
        super().__init__(f"{why}; retry in {retry_ms} ms")
        self.holder, self.why, self.retry_ms = holder, why, retry_ms


@attrs.define
class FairShareStatistics:
    served: int = 0  # calls that had a turn
    waited: int = 0  # of which waited for it
    waited_ms: int = 0  # in all
    refused: int = 0  # calls refused (too many waiting, or waited max_delay_ms)
    reserved: int = 0  # of the served, calls that took a reserved slot (their caller had none running)


@attrs.define
class SlotBook:
    """Which calls may run (pure: no threads, no clock; the caller serialises calls): ``slots``
    shared, and ``reserved`` more for a caller with no other call running (see the module doc).

    Guarantee: at most ``slots + reserved`` calls run; a call starts past ``slots`` only when its
    caller runs no other; while several callers call, none starts more than its ``cap``."""

    slots: int
    reserved: int
    running: int = 0
    running_of: dict[str, int] = attrs.field(factory=dict)  # holder -> its calls running

    def cap(self, callers: int) -> int:
        """The calls one caller may run at once while ``callers`` call (itself included): all the
        shared slots alone, else its part of every slot, rounded down (at least one), so that
        every caller's part fits beside the others' at once."""
        return self.slots if callers <= 1 else max(1, (self.slots + self.reserved) // callers)

    def fits(self, holder: str, callers: int = 1) -> bool:
        """Whether a call of ``holder`` may start now, while ``callers`` call."""
        mine = self.running_of.get(holder, 0)
        if mine >= self.cap(callers):
            return False
        return self.running < self.slots or (self.running < self.slots + self.reserved and not mine)

    def take(self, holder: str) -> bool:
        """Start a call of ``holder`` (it ``fits``); True when it took a reserved slot."""
        reserved = self.running >= self.slots
        self.running += 1
        self.running_of[holder] = self.running_of.get(holder, 0) + 1
        return reserved

    def release(self, holder: str) -> None:
        """A call of ``holder`` ended."""
        self.running -= 1
        left = self.running_of.pop(holder) - 1
        if left:
            self.running_of[holder] = left


@attrs.define(eq=False)
class _Ticket:
    holder: str
    order: int
    # On the turns' lock: a freed slot wakes only the call it goes to. One condition for all
    # woke every waiting call at each grant (up to 48), each for the GIL and the lock, beside
    # the calls doing work.
    cond: threading.Condition
    granted: bool = False


class FairTurns:
    """The turns (see the module doc). Thread-safe."""

    def __init__(self, config: FairShareConfig | None = None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.config = config or FairShareConfig()
        self.stats = FairShareStatistics()
        self._clock = clock
        self._sleep = sleep
        self._held: dict[str, int] = {}  # holder -> refusals being held
        self.request_time = RequestTime(self.config.request_time)  # guarded by _cond
        self._seen: dict[str, float] = {}  # holder -> when its last call arrived
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # only its lock is used: each ticket waits on its own
        self.slots = SlotBook(self.config.slots, self.config.reserved_slots)  # guarded by _cond
        self._waiting: dict[str, collections.deque[_Ticket]] = {}
        self._n_waiting = 0
        self._used: dict[str, tuple[float, float]] = {}  # holder -> (slot seconds, at), decayed
        self._order = itertools.count()
        self._mean_s = 0.005  # a call's slot time, moving average (for the retry hint)

    def used(self, holder: str, now: float) -> float:
        seconds, at = self._used.get(holder, (0.0, now))
        return float(seconds * 0.5 ** (max(now - at, 0.0) / self.config.half_life_s))

    @contextlib.contextmanager
    def turn(self, holder: str, _rpc: str = "") -> Iterator[None]:
        """Around one call's work: returns once it has a slot; TurnRefused when it may not wait."""
        cfg = self.config
        arrived = self._clock()
        self._paced(holder, arrived)
        refused: TurnRefused | None = None
        with self._cond:
            # Whoever waits does not fit (``_grant`` runs at every freed slot), so a call that fits
            # jumps no one: a free shared slot means nobody waits; a reserved one is for it alone.
            if self._fits(holder):
                self._take(holder)
            else:
                try:
                    self._wait(holder, arrived)
                except TurnRefused as exc:
                    refused = exc
                    hold = self._hold(holder, +1)
            if refused is None:
                self.stats.served += 1
        if refused is not None:
            if hold:
                try:
                    self._sleep(cfg.hold_refused_ms / 1000.0)
                finally:
                    with self._cond:
                        self._hold(holder, -1)
            raise refused
        started, cpu = self._clock(), time.thread_time()
        try:
            yield
        finally:
            now = self._clock()
            took = now - started
            cpu = time.thread_time() - cpu
            with self._cond:
                rt = self.request_time
                rt.charge(holder, cpu + rt.config.call_cost_us / 1e6, now)
                self._used[holder] = (self.used(holder, now) + took, now)
                self._mean_s += (took - self._mean_s) * 0.05
                self.slots.release(holder)
                self._grant(now)
                if len(self._used) > 4096:  # forget callers whose use has faded (as new)
                    self._used = {h: v for h, v in self._used.items() if self.used(h, now) > 1e-3}

    def _wait(self, holder: str, arrived: float) -> None:
        cfg = self.config
        queue = self._waiting.get(holder)
        if (queue is not None and len(queue) >= cfg.max_waiting) or self._n_waiting >= cfg.max_waiting_total:
            self.stats.refused += 1
            raise TurnRefused(holder, f"{len(queue or ())} calls of this caller wait for a turn already "
                                      f"({self._n_waiting} in all)", self._hint(len(queue or ())))
        ticket = _Ticket(holder, next(self._order), threading.Condition(self._lock))
        self._waiting.setdefault(holder, collections.deque()).append(ticket)
        self._n_waiting += 1
        deadline = arrived + cfg.max_delay_ms / 1000.0
        while not ticket.granted:
            left = deadline - self._clock()
            if left <= 0:
                self._drop(ticket)
                self.stats.refused += 1
                raise TurnRefused(holder, f"no turn within {cfg.max_delay_ms} ms (the coordinator is busy and "
                                          "this caller had more than its share)", self._hint(len(queue or ())))
            ticket.cond.wait(left)
        self.stats.waited += 1
        self.stats.waited_ms += int((self._clock() - arrived) * 1000)

    def _paced(self, holder: str, arrived: float) -> None:
        """The caller's share of the CPU (``request_time``), while another caller is active: a
        caller over it waits, asleep, until it is not; TurnRefused when the wait would pass
        ``max_delay_ms`` (after that long, at once past ``max_held`` waiting calls)."""
        rt = self.request_time
        with self._cond:
            self._seen[holder] = arrived
            if len(self._seen) > 4096:
                self._seen = {h: t for h, t in self._seen.items() if arrived - t < self.config.active_s}
            others = any(h != holder and arrived - t < self.config.active_s for h, t in self._seen.items())
            if not others:
                return
            wait, refuse = rt.admit(holder, arrived)
            if wait:
                rt.enter(holder)
        if wait:
            try:
                self._sleep(wait)
            finally:
                with self._cond:
                    rt.leave(holder)
        if refuse:
            with self._cond:
                self.stats.refused += 1
                retry_ms = max(50, int(rt.delay_s(holder, self._clock()) * 1000))
            raise TurnRefused(holder, f"this caller took more than its share of the coordinator "
                                      f"({rt.config.share:g} s of CPU per s while others call)", retry_ms)

    def _hold(self, holder: str, step: int) -> bool:
        """Count a refusal held (+1: False when over the bounds, answered at once) or done (-1)."""
        cfg = self.config
        n = self._held.get(holder, 0)
        if step > 0 and (not cfg.hold_refused_ms or n >= cfg.max_held
                         or sum(self._held.values()) >= cfg.max_held_total):
            return False
        if n + step > 0:
            self._held[holder] = n + step
        else:
            self._held.pop(holder, None)
        return True

    def _drop(self, ticket: _Ticket) -> None:
        queue = self._waiting[ticket.holder]
        queue.remove(ticket)
        self._n_waiting -= 1
        if not queue:
            del self._waiting[ticket.holder]

    def _fits(self, holder: str, callers: int | None = None) -> bool:
        return self.slots.fits(holder, self._callers(self._clock()) if callers is None else callers)

    def _callers(self, now: float) -> int:
        """Callers that called within ``active_s`` (``_paced`` notes each arrival)."""
        return sum(1 for t in self._seen.values() if now - t < self.config.active_s)

    def _take(self, holder: str) -> None:
        if self.slots.take(holder):
            self.stats.reserved += 1

    def _grant(self, now: float) -> None:
        """Free slots to the waiting callers that fit (``_fits``) and used the least lately,
        oldest call first."""
        callers = self._callers(now)
        while self._waiting:
            fitting = [h for h in self._waiting if self._fits(h, callers)]
            if not fitting:
                return
            holder = min(fitting, key=lambda h: (self.used(h, now), self._waiting[h][0].order))
            ticket = self._waiting[holder][0]
            self._drop(ticket)
            ticket.granted = True
            self._take(holder)
            ticket.cond.notify()

    def _hint(self, queued: int) -> int:
        return max(50, int((queued + 1) * self._mean_s / self.config.slots * 1000))

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
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import attrs

from ordq.common.counts import count_down, count_up
from ordq.common.errors import ConfigError, OrdqError
from ordq.common.request_time import RequestTime, RequestTimeConfig


def _default_request_time() -> RequestTimeConfig:
    # A caller's share of what the coordinator's calls cost the machine while a lighter caller
    # called within the last second (``contention_s``; CallerTime): 0.05 s per s. A call is
    # charged its handler's thread time, ``call_cost_us`` for the frame around it and
    # ``FairShareConfig.zk_request_cost_us`` per ZooKeeper request it waited for. Measured (a
    # hand-made client, one call at a time, load 1-3; docs/BENCHMARKS.md, stop e): a call refused
    # on its headers costs the coordinator 0.82-0.90 ms of CPU and ~18 context switches; each
    # ZooKeeper request of a call 0.72-0.76 ms more of the coordinator's and ZooKeeper's CPU
    # together (a Describe with config and live members: 4.8 requests, 4.3 ms in all; a Commit:
    # 3.7 requests, 5.7 ms). Why not more (stop k): a neighbour's call is mostly ZooKeeper
    # waiting, on the leader's one session behind the flooder's served requests; at 0.1 s per s
    # the drill's flood was served ~6 Describes (8 requests each) a second, ~65 % as many requests
    # as the neighbour's Commits, and their p99 was ~2x quiet; at 0.05, 3-5 a second, 1.37-1.71x
    # (one drill round each: tests/test_caller_share.py). A caller one call at a time is held only past
    # ``FairShareConfig.heavy_share``.
    return RequestTimeConfig(share=0.05, burst_s=0.05, max_delay_ms=2_000, max_held=32, call_cost_us=600,
                             contention_s=1.0)


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
    # What one ZooKeeper request a call waits for costs the machine (the kazoo thread's work and
    # ZooKeeper's), charged to the call's caller on top of its thread time: a call's own thread
    # only waits for ZooKeeper, so its thread time alone missed most of what a call costs (a
    # flood's calls were charged ~0.7 ms each, 4.3 ms spent: never paced).
    zk_request_cost_us: int = 650
    # Seconds per second past which a caller calling one at a time yields to one alike that used
    # less (CallerTime): above a neighbour committing every ~17 ms on a quiet machine (57 Commits a
    # second at ~4.2 ms: ~0.24 s per s; the drill's, ~0.2), with room: it is never held.
    heavy_share: float = 0.35
    max_paced_total: int = 64  # calls held for their caller's share at once, in all (each holds a worker)
    # Calls of one caller in the service at once, in any stage (its body awaited, paced, waiting,
    # held, running; calls that take no turn too): past it, refused (``FairTurns.refuse``: held
    # first as a refused turn while there is room). Each holds a worker
    # thread, and a caller withholding bodies on many connections (8 calls each) could otherwise
    # take every worker (``threads``).
    max_calls_per_caller: int = 64

    def __attrs_post_init__(self) -> None:
        if min(self.slots, self.max_waiting, self.max_waiting_total, self.max_delay_ms) <= 0 or self.half_life_s <= 0:
            raise ConfigError("fair share: slots, waiting bounds, delay and half-life must be > 0")
        if self.reserved_slots < 0:
            raise ConfigError("fair share: reserved slots must be >= 0")
        if self.max_calls_per_caller <= 0:
            raise ConfigError("fair share: calls per caller must be > 0")
        if min(self.hold_refused_ms, self.max_held, self.max_held_total, self.zk_request_cost_us,
               self.max_paced_total) < 0:
            raise ConfigError("fair share: held refusals, paced calls and their bounds, costs must be >= 0")

    @property
    def threads(self) -> int:
        """Worker threads the server needs so that waiting and held calls never take them all."""
        return (self.slots + self.reserved_slots + self.max_waiting_total + self.max_held_total
                + self.max_paced_total + 16)


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


@attrs.define
class CallerTime(RequestTime):
    """The brokers' request-time buckets (``RequestTime``), held under the coordinator's own rule
    of contention: a caller over its share is held while a *lighter* caller called within
    ``contention_s``: one with fewer other calls in flight (``begin``/``end``); or, once the
    caller used more than ``heavy_share`` lately (its charges decayed with ``half_life_s``), one
    with as many calls in flight that used less.

    The brokers hold a token only while another keeps to its share (more than half its bucket
    left). Here the costs are ZooKeeper requests as well as CPU, and a neighbour committing
    every 20 ms may be over the share now and then: the flood was then never held. Compared with
    the others instead, a flood (dozens of calls waiting) is held to its share whenever a
    neighbour calling one at a time is active, whatever either used, and a caller is never held
    because of a heavier one. Callers one call at a time each (the slots run one call of each
    while several call) are held only past ``heavy_share``, the heavier first, so that a
    neighbour committing every 20 ms (~0.2 s per s) is never held for a lighter third caller,
    while a caller calling back to back one at a time is held to about ``heavy_share``.
    Work-conserving as the brokers': a caller alone, or the lightest of those active, is never
    held, and owes nothing for what it took meanwhile."""

    half_life_s: float = 1.0
    heavy_share: float = 0.35  # seconds per second: past it, a caller yields to one alike that used less
    _recent: dict[str, tuple[float, float]] = attrs.field(factory=dict)  # caller -> (charged s, at), decayed
    _mean: dict[str, float] = attrs.field(factory=dict)  # caller -> what its calls cost, moving average
    _calls: dict[str, int] = attrs.field(factory=dict)  # caller -> its calls in flight (begin, not yet end)

    def begin(self, token: str) -> None:
        """A call of ``token`` arrived (until ``end``: waiting, held, or running)."""
        count_up(self._calls, token)

    def end(self, token: str) -> None:
        count_down(self._calls, token)

    def recent(self, token: str, now: float) -> float:
        """Seconds charged to ``token`` lately, decayed with ``half_life_s``."""
        seconds, at = self._recent.get(token, (0.0, now))
        return float(seconds * 0.5 ** (max(now - at, 0.0) / self.half_life_s))

    def contended(self, token: str, now: float) -> bool:
        """Whether a lighter caller than ``token`` (see the class doc; the call being judged not
        counted among ``token``'s in flight) called within ``contention_s``."""
        window = self.config.contention_s
        calls = max(0, self._calls.get(token, 0) - 1)
        used = self.recent(token, now)
        # What a caller using heavy_share s per s for ever has lately: share * half-life / ln 2.
        heavy = used > self.heavy_share * self.half_life_s / math.log(2)
        for other, at in self._active.items():
            if other == token or (window is not None and now - at > window):
                continue
            theirs = self._calls.get(other, 0)
            if theirs < calls or (theirs == calls and heavy and self.recent(other, now) < used):
                return True
        return False

    def charge(self, token: str | None, seconds: float, now: float) -> None:
        if token is not None and seconds > 0:
            self._recent[token] = (self.recent(token, now) + seconds, now)
            if len(self._recent) > 4096:  # forget callers whose use has faded (as new)
                self._recent = {t: v for t, v in self._recent.items() if self.recent(t, now) > 1e-4}
                self._mean = {t: m for t, m in self._mean.items() if t in self._recent}
        super().charge(token, seconds, now)

    def reserve(self, token: str, now: float) -> float:
        """Charge ``token`` now what its next call will likely cost (its calls' moving average;
        ``settle`` corrects it when the call ends); the seconds reserved. Charged only once a
        call ended, a flood's 64 calls let through on one look at its bucket each ran before any
        was charged: 90 calls a second served beside a neighbour, where its share was ~65."""
        est = self._mean.get(token, self.config.call_cost_us / 1e6)
        self.charge(token, est, now)
        return est

    def settle(self, token: str, reserved: float, actual: float, now: float) -> None:
        """A call of ``token`` that ``reserve``d ``reserved`` seconds cost ``actual``: charge the
        difference, or give it back."""
        mean = self._mean.get(token, actual)
        self._mean[token] = mean + (actual - mean) * 0.2
        if actual >= reserved:
            self.charge(token, actual - reserved, now)
            return
        back = reserved - actual
        level = self._now_level(token, now)
        self._level[token] = (min(self.config.burst_s, level + back), now)
        self._recent[token] = (max(0.0, self.recent(token, now) - back), now)


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
                 sleep: Callable[[float], object] = time.sleep, cpu: Callable[[], float] = time.thread_time,
                 zk_requests: Callable[[], int] = lambda: 0, spread: Callable[[], float] = random.random) -> None:
        """``cpu``: the calling thread's CPU seconds so far; ``zk_requests``: the ZooKeeper
        requests it waited for so far (``store_base.requests_waited``): what a call is charged;
        ``spread``: a number in [0, 1) for each held or paced call (``_spread_s``)."""
        self.config = config or FairShareConfig()
        self.stats = FairShareStatistics()
        self._clock = clock
        self._sleep = sleep
        self._cpu = cpu
        self._zk_requests = zk_requests
        self._spread = spread
        self._held: dict[str, int] = {}  # holder -> refusals being held
        self._n_paced = 0  # calls held for their caller's share, in all
        # guarded by _cond
        self.request_time = CallerTime(self.config.request_time, half_life_s=self.config.half_life_s,
                                       heavy_share=self.config.heavy_share)
        self._seen: dict[str, float] = {}  # holder -> when its last call arrived
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # only its lock is used: each ticket waits on its own
        self.slots = SlotBook(self.config.slots, self.config.reserved_slots)  # guarded by _cond
        self._waiting: dict[str, collections.deque[_Ticket]] = {}
        self._n_waiting = 0
        self._used: dict[str, tuple[float, float]] = {}  # holder -> (slot seconds, at), decayed
        self._order = itertools.count()
        self._mean_s = 0.005  # a call's slot time, moving average (for the retry hint)

    def _spread_s(self, seconds: float, *, least: float = 0.5, width: float = 1.0) -> float:
        """How long one held or paced call sleeps for ``seconds`` of holding: ``seconds`` times a
        factor drawn from [``least``, ``least`` + ``width``), at most ``max_delay_ms``. Why: a
        flood's calls arrive together and are refused or paced together; each held exactly its
        caller's time, they were answered together and came back together, a wave of dozens of
        calls at once for the GIL and the cores every second or so. Spread, they come back one
        by one (a measurement of one drill round, not conclusive: docs/BENCHMARKS.md, stop j)."""
        return min(seconds * (least + width * self._spread()), self.config.max_delay_ms / 1000.0)

    def used(self, holder: str, now: float) -> float:
        seconds, at = self._used.get(holder, (0.0, now))
        return float(seconds * 0.5 ** (max(now - at, 0.0) / self.config.half_life_s))

    @contextlib.contextmanager
    def turn(self, holder: str, _rpc: str = "", before_slot: Callable[[], object] | None = None) -> Iterator[None]:
        """Around one call's work: returns once it has a slot; TurnRefused when it may not wait.
        ``before_slot``: run once the caller's share let the call in and before it waits for a
        slot (the frame reads the request's body there: a caller that withholds it holds no
        slot); what it raises is charged as a refusal and raised."""
        with self._cond:
            self.request_time.begin(holder)
        try:
            with self._turn(holder, before_slot):
                yield
        finally:
            with self._cond:
                self.request_time.end(holder)

    @contextlib.contextmanager
    def _turn(self, holder: str, before_slot: Callable[[], object] | None = None) -> Iterator[None]:
        cfg = self.config
        arrived = self._clock()
        try:
            reserved = self._paced(holder, arrived)
        except TurnRefused:
            self._charge_refusal(holder)
            raise
        if before_slot is not None:
            try:
                before_slot()
            except BaseException:
                self._charge_refusal(holder, reserved)
                raise
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
            self._answer_refused(holder, refused, hold, reserved)
        started, cpu, zk = self._clock(), self._cpu(), self._zk_requests()
        try:
            yield
        finally:
            now = self._clock()
            took = now - started
            cost = self._cpu() - cpu + (self._zk_requests() - zk) * cfg.zk_request_cost_us / 1e6
            with self._cond:
                rt = self.request_time
                rt.settle(holder, reserved, cost + rt.config.call_cost_us / 1e6, now)
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

    def refuse(self, holder: str, refused: TurnRefused) -> NoReturn:
        """Answer ``refused`` to a call of ``holder`` that took no turn (the service's bound on a
        caller's calls at once): counted and charged as a refused turn, and held first while
        there is room (``max_held``, ``max_held_total``): answered at once, a caller past its bound
        asks again at once."""
        with self._cond:
            self.stats.refused += 1
            hold = self._hold(holder, +1)
        self._answer_refused(holder, refused, hold)

    def _answer_refused(self, holder: str, refused: TurnRefused, hold: bool, reserved: float = 0.0) -> NoReturn:
        """Charge a refused call, hold it ``hold_refused_ms`` if ``hold`` (counted in ``_held``
        already), then raise ``refused``."""
        self._charge_refusal(holder, reserved)
        if hold:
            try:
                self._sleep(self._spread_s(self.config.hold_refused_ms / 1000.0))
            finally:
                with self._cond:
                    self._hold(holder, -1)
        raise refused

    def _charge_refusal(self, holder: str, reserved: float = 0.0) -> None:
        """A refused call costs its frame (``call_cost_us``): charged as any (what was reserved
        for it settled), so that a caller coming back at once after each refusal pays for it."""
        with self._cond:
            rt = self.request_time
            rt.settle(holder, reserved, rt.config.call_cost_us / 1e6, self._clock())

    def _paced(self, holder: str, arrived: float) -> float:
        """The caller's share (``request_time``), while a lighter caller called within
        ``active_s`` (``CallerTime``): a caller over it waits, asleep, until it is not;
        TurnRefused when the wait would pass ``max_delay_ms`` (answered after that long), or at
        once past ``max_held`` of its calls (``max_paced_total`` in all) waiting so: then held as
        a refused turn while there is room (as long as its debt lasts, between ``hold_refused_ms``
        and ``max_delay_ms``), so that it does not come back at once. Returns the seconds
        charged ahead for the call (``CallerTime.reserve``)."""
        rt = self.request_time
        cfg = self.config
        with self._cond:
            self._seen[holder] = arrived
            if len(self._seen) > 4096:
                self._seen = {h: t for h, t in self._seen.items() if arrived - t < cfg.active_s}
            others = any(h != holder and arrived - t < cfg.active_s for h, t in self._seen.items())
            if not others:
                return 0.0
            wait, refuse = rt.admit(holder, arrived)
            if wait and self._n_paced >= cfg.max_paced_total:
                wait, refuse = 0.0, True
            if wait:
                rt.enter(holder)
                self._n_paced += 1
            # A call let through, paced or not, is charged its likely cost now, before any sleep,
            # so that the flood's next call waits behind this one. Charged after, a flood's calls
            # paced at once each waited out the same debt and were let through together: up to
            # ``max_held`` calls past its share at a time (CI: 27 Describes a second served
            # where its share was ~14).
            reserved = 0.0 if refuse else rt.reserve(holder, arrived)
            hold = refuse and not wait and self._hold(holder, +1)
            # Held as long as its debt lasts (up to max_delay_ms): held 1 s, a flood's calls past
            # those waiting came back ~50 times a second, each refusal ~1 ms and ~20 switches.
            hold_s = min(max(rt.delay_s(holder, arrived), cfg.hold_refused_ms / 1000.0),
                         cfg.max_delay_ms / 1000.0)
        if wait:
            try:  # never less than the caller's debt: it is let through after this sleep
                self._sleep(self._spread_s(wait, least=1.0, width=0.5))
            finally:
                with self._cond:
                    rt.leave(holder)
                    self._n_paced -= 1
        if hold:
            try:
                self._sleep(self._spread_s(hold_s))
            finally:
                with self._cond:
                    self._hold(holder, -1)
        if refuse:
            with self._cond:
                self.stats.refused += 1
                retry_ms = max(50, int(rt.delay_s(holder, self._clock()) * 1000))
            raise TurnRefused(holder, f"this caller took more than its share of the coordinator "
                                      f"({rt.config.share:g} s per s while a caller that used less calls)", retry_ms)
        return reserved

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

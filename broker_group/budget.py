"""One memory budget per broker for what it holds for its clients (issue 25).

Guarantee: the bytes a broker holds for clients at once — Fetch answers being built, Read
answers being built and sent (until the reader's gRPC window took them), produce requests
received and not yet placed — stay under ``total_bytes``, and under ``holder_bytes`` for one
holder: a connection (gRPC peer) and, when the caller shows a token, that token. One client
therefore cannot take the whole budget, nor a few tokens' worth of connections starve the rest.
A call that finds no room waits (``wait_ms``) on the broker's signal and is then refused with
``ResourceExhausted`` (typed, counted); a Read stream whose reader takes nothing for
``idle_ms`` is closed.

Rules:
- ``MemoryBudget`` is pure accounting: no gRPC, no clock, no waiting. It is used on the broker's
  event loop only (not thread-safe); the waiting lives in ``Lease`` (below): an answer waits
  for a release by what holds it back (its fullest holder, or anyone when the whole budget is
  full: ``on_release``), a produce request on the broker's ``Signal``; then it asks again.
- What is charged is the answer's or request's batch bytes. An answer lives twice on its way
  out (its encoded bytes, broker_group/answer.py, and gRPC's copy), so the process holds up to
  ~2x the charged bytes: size the budget with that (docs/OPERATIONS.md).
- Memory is not all one reader can take: the bytes of answers a token is given per second
  are paced too (``ReadPace``, ``read_rate_bytes``), because building and sending them takes
  the loop, the GIL and the CPU a neighbour queue's writes need.
- Freed memory goes back to the system (``tune_malloc``): glibc otherwise keeps freed large
  blocks in its heap once one has been freed (its dynamic mmap threshold), and RSS never drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ordq.common.errors import ConfigError
from ordq.common.security import bearer_token
from ordq.wire.errors import ResourceExhausted

if TYPE_CHECKING:
    from ordq.common.loop import KeyedLocks, Signal

log = logging.getLogger("ordq.broker")

ALL = "*"  # what an answer waits on when the whole budget, not one holder's share, is full

NO_ANSWER_LIMIT = 1 << 62  # a peer's answer: bounded by its grant alone


@attrs.frozen(kw_only=True)
class BudgetConfig:
    """The broker's memory budget (docs/SECURITY.md, Limits; sizing in docs/OPERATIONS.md)."""

    total_bytes: int = 256 << 20  # everything held for clients at once
    holder_bytes: int = 32 << 20  # one connection's (and one token's) share of it
    # Kept for produce requests: answers (Fetch, Read) may hold at most total - this, so that
    # readers on many connections with many tokens cannot leave a producer waiting for room
    # (an acked write must never starve behind reads; 8 readers' shares filled 256 MiB).
    # None: a quarter of total_bytes (64 MiB of the default 256).
    write_reserve_bytes: int | None = None
    wait_ms: int = 5_000  # how long a call waits for room before it is refused
    idle_ms: int = 30_000  # a Read stream whose reader takes nothing this long is closed
    # A call gets a shorter answer rather than wait, down to this (an answer is whole batches:
    # one batch larger than the grant is still sent, and charged).
    min_grant_bytes: int = 64 << 10
    # Answer bytes per second one token may take (ReadPace; None: no limit). Memory is not
    # the only thing one reader can take: building, encrypting and sending ~400 MB/s of huge
    # answers for one token held the loop and the GIL that a neighbour queue's produce, ack
    # and replication need (noisy-neighbour drill: its ack p99 4-19x its quiet p99).
    # 16 MiB/s since stop 70 (64 before): at 64 the abuse of the drill still took the master
    # +0.15-0.2 core and the neighbour's p99 2.4-2.6x; at 16, 1.8-2.0x. A reader keeping up
    # with its queue is not held to it (``tail_read_factor``).
    read_rate_bytes: int | None = 16 << 20
    # What a token reads of a queue is not paced up to this many times what was written to that
    # queue here since (ReadPace.fresh; 0: off): a consumer keeping up with a queue written
    # faster than the read rate is not left behind by another tenant's activity, while reading
    # back what the queue holds (catch-up, or abuse: a token's huge fetches of its own old data)
    # is paced. Two: room for the reader to catch up after a pause.
    tail_read_factor: float = 2.0
    # The most of that allowance a token keeps for one queue while it does not read it.
    tail_read_burst_bytes: int = 4 << 20
    # The largest answer one call of a token gets (peers: max_fetch_bytes). An answer is built,
    # copied into gRPC and sent in one piece on the loop's watch: a 32 MiB one held it for tens
    # of ms, a neighbour's acks with it. The SDK asks 4 MiB (fetch_max_bytes); an answer
    # shorter than asked is normal (the reader asks again from where it ended).
    token_answer_bytes: int = 4 << 20
    # A token's answer while another token is active (the read rate's condition, ``Lease``;
    # None: token_answer_bytes). gRPC takes an answer in one piece on the loop (its copy and
    # encryption): each 4 MiB answer held the loop 5-17 ms and a neighbour's acks waited
    # behind it, once per answer (noisy-neighbour drill at 4 MiB/s; docs/BENCHMARKS.md,
    # stop 68). In 256 KiB pieces the loop serves the neighbour between them.
    contended_answer_bytes: int | None = 256 << 10

    def __attrs_post_init__(self) -> None:
        if min(self.total_bytes, self.holder_bytes, self.wait_ms, self.idle_ms, self.min_grant_bytes,
               self.token_answer_bytes, self.contended_answer_bytes or 1) < 1:
            raise ConfigError("memory budget limits must be >= 1")
        if self.holder_bytes > self.total_bytes:
            raise ConfigError("holder_bytes (one connection's share) must be <= total_bytes")
        if not 0 <= self.reserve_bytes < self.total_bytes:
            raise ConfigError("write_reserve_bytes must be >= 0 and < total_bytes")
        if self.read_rate_bytes is not None and self.read_rate_bytes < 1:
            raise ConfigError("read_rate_bytes (answer bytes per second per token) must be >= 1, or None")
        if self.tail_read_factor < 0 or self.tail_read_burst_bytes < 0:
            raise ConfigError("tail_read_factor and tail_read_burst_bytes must be >= 0")

    @property
    def contended_answer_limit(self) -> int:
        """A token's largest answer while another token is active: ``contended_answer_bytes``,
        never more than ``token_answer_bytes`` (which alone applies when it is None)."""
        return min(self.token_answer_bytes, self.contended_answer_bytes or self.token_answer_bytes)

    @property
    def reserve_bytes(self) -> int:
        """What answers leave to produce requests (``write_reserve_bytes``, else total / 4)."""
        return self.total_bytes // 4 if self.write_reserve_bytes is None else self.write_reserve_bytes


@attrs.define
class BudgetStatistics:
    used_bytes: int = 0
    peak_bytes: int = 0
    grants: int = 0
    shortened: int = 0  # answers made shorter than asked for lack of room
    waited: int = 0  # calls that waited for room
    refused: int = 0  # calls refused (ResourceExhausted) after waiting
    idle_closed: int = 0  # Read streams closed because their reader took nothing for idle_ms
    paced: int = 0  # answers that waited for their token's read rate (ReadPace)
    paced_ms: int = 0  # how long they waited, in all


@attrs.define
class MemoryBudget:
    config: BudgetConfig
    stats: BudgetStatistics = attrs.field(factory=BudgetStatistics)
    _held: dict[str, int] = attrs.field(factory=dict)  # holder -> bytes
    _wakers: dict[str, list[Callable[[], None]]] = attrs.field(factory=dict)  # blocked on -> answers waiting

    def room(self, holders: Sequence[str], *, reserve: int = 0) -> int:
        """Bytes these holders may still take, leaving ``reserve`` of the total untaken."""
        room = self.config.total_bytes - reserve - self.stats.used_bytes
        for h in holders:
            room = min(room, self.config.holder_bytes - self._held.get(h, 0))
        return max(room, 0)

    def grant(self, holders: Sequence[str], want: int) -> int:
        """Take up to ``want`` bytes for an answer (at least ``min(want, min_grant_bytes)``),
        leaving ``write_reserve_bytes`` to produce requests, and return how many; 0: no room
        now (nothing taken)."""
        room = self.room(holders, reserve=self.config.reserve_bytes)
        if room < min(want, self.config.min_grant_bytes):
            return 0
        n = min(want, room)
        self.take(holders, n)
        self.stats.grants += 1
        self.stats.shortened += n < want
        return n

    def take(self, holders: Sequence[str], n: int) -> None:
        """Charge ``n`` bytes unconditionally (bytes already in memory, or an answer's last
        batch past its grant)."""
        for h in holders:
            self._held[h] = self._held.get(h, 0) + n
        self.stats.used_bytes += n
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.used_bytes)

    def release(self, holders: Sequence[str], n: int) -> None:
        for h in holders:
            left = self._held.get(h, 0) - n
            if left > 0:
                self._held[h] = left
            else:
                self._held.pop(h, None)
        self.stats.used_bytes -= n
        # Wake only the answers this can help: those held back by one of these holders'
        # shares, and those held back by the whole budget. (Waking every waiter at every
        # release, and polling every 50 ms, cost an abused broker most of its loop: 28 calls
        # waiting on one abuser's share woke at each of a neighbour's produce requests.)
        for key in (*holders, ALL):
            for wake in self._wakers.pop(key, ()):
                wake()

    def held(self, holder: str) -> int:
        return self._held.get(holder, 0)

    def blocked_on(self, holders: Sequence[str], want: int) -> str:
        """What keeps an answer of ``want`` bytes from these holders waiting: ``ALL`` (the
        budget, less the write reserve) or the holder whose share is fullest."""
        need = min(want, self.config.min_grant_bytes)
        if self.config.total_bytes - self.config.reserve_bytes - self.stats.used_bytes < need or not holders:
            return ALL
        return max(holders, key=self.held)

    def on_release(self, key: str, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (once) at the next release by holder ``key`` (``ALL``: by anyone);
        returns what cancels that."""
        self._wakers.setdefault(key, []).append(wake)

        def cancel() -> None:
            with contextlib.suppress(ValueError):
                self._wakers.get(key, []).remove(wake)
        return cancel


TOKEN = "token:"  # the prefix of a token holder (holders_of); the others are connections
FORGET_S = 10.0  # a reader of a queue not seen this long may be forgotten (ReadPace.fresh)


@attrs.define
class ReadPace:
    """Answer bytes per second per token: a token bucket (``rate`` bytes/s, holding at most
    ``burst``) per token holder; an answer waits while its token is in debt. Pure: the caller
    gives the clock. Calls without a token (the group's own peers: replication, repair) are
    not paced.

    Work-conserving (issue 39): ``contended(token, now, queue)`` (the broker's
    ``RequestTime.others_active``: another token active lately, not on the queue read) says
    whether others wait; a token alone is not paced, and what it is granted meanwhile empties
    its bucket but makes no debt. None: always paced.

    Fresh bytes are free (stop 70): of an answer of queue Q, up to ``tail_factor`` times what
    was written to Q here since the token last read it (``wrote``; kept up to ``tail_burst``)
    is not charged (``fresh``). A consumer keeping up with Q reads what Q's producer just wrote,
    at any rate; one reading back what Q holds is paced.

    Guarantee: over any interval of t seconds of contention, a token is granted at most
    ``burst + rate * t`` bytes, plus per queue it reads ``tail_burst + tail_factor * w`` (w:
    the bytes written to that queue here meanwhile), plus what its answers already granted
    were allowed to overrun (an answer is whole batches, settled to its actual size)."""

    rate: float
    burst: float
    contended: Callable[[str, float, str | None], bool] | None = None
    tail_factor: float = 0.0
    tail_burst: float = 0.0
    _level: dict[str, tuple[float, float]] = attrs.field(factory=dict)  # token -> (bytes left, at)
    _written: dict[str, int] = attrs.field(factory=dict)  # queue -> bytes written here (wrote)
    # (token, queue) -> (the queue's written bytes when the token last read it, fresh bytes left, when)
    _fresh: dict[tuple[str, str], tuple[int, float, float]] = attrs.field(factory=dict)

    def _now_level(self, holder: str, now: float) -> float:
        level, at = self._level.get(holder, (self.burst, now))
        return min(self.burst, level + max(now - at, 0.0) * self.rate)

    def _contended(self, holder: str, now: float, queue: str | None) -> bool:
        return self.contended is None or self.contended(holder, now, queue)

    def wait_s(self, holders: Sequence[str], now: float, queue: str | None = None) -> float:
        """How long an answer for these holders (of ``queue``) must wait before it may be granted."""
        debt = 0.0
        for h in holders:
            # its debt asked first: whether it is contended is the dearer question (issue 39).
            # Less than a byte owed is float dust of a wait just made: no wait.
            if h.startswith(TOKEN) and (owed := -self._now_level(h, now)) >= 1.0 and self._contended(h, now, queue):
                debt = max(debt, owed)
        return debt / self.rate

    def debit(self, holders: Sequence[str], n: float, now: float, queue: str | None = None) -> None:
        """Charge ``n`` answer bytes of ``queue`` (negative: give back what an answer did not use)."""
        for h in holders:
            if h.startswith(TOKEN):
                level = self._now_level(h, now)
                left = level - n
                if left < 0.0 and not self._contended(h, now, queue):
                    left = max(left, min(level, 0.0))  # alone: the bucket empties, no new debt
                self._level[h] = (left, now)
        if len(self._level) > 4096:  # forget tokens whose bucket is full again (as new)
            self._level = {h: (lv, at) for h, (lv, at) in self._level.items()
                           if lv + (now - at) * self.rate < self.burst}

    def wrote(self, queue: str, n: int) -> None:
        """``n`` bytes were written to ``queue`` here (a produce request placed)."""
        if self.tail_factor > 0:
            self._written[queue] = self._written.get(queue, 0) + n

    def fresh(self, token: str, queue: str, n: int, now: float) -> int:
        """How many of an answer's ``n`` bytes of ``queue`` to ``token`` are not charged to its
        rate: at most ``tail_factor`` times what was written to the queue since the token last
        read it, plus what it left of that before (at most ``tail_burst``). Taken: a token's
        first read of a queue (or first in ``FORGET_S``) finds nothing fresh, whatever the
        queue held before."""
        if self.tail_factor <= 0:
            return 0
        written = self._written.get(queue, 0)
        seen, left, _ = self._fresh.get((token, queue), (written, 0.0, now))
        left = min(self.tail_burst, left + (written - seen) * self.tail_factor)
        used = min(max(n, 0), int(left))
        self._fresh[(token, queue)] = (written, left - used, now)
        if len(self._fresh) > 4096:  # forget readers gone quiet (they start again from nothing fresh)
            self._fresh = {k: v for k, v in self._fresh.items() if now - v[2] < FORGET_S}
            if len(self._fresh) > 4096:
                self._fresh.clear()
        return used


def token_holder(context: Any) -> str | None:
    """The holder a call's token stands for (a hash: the token itself is never kept); None
    for a call without one (the group's own peers)."""
    token = bearer_token(context)
    return None if token is None else TOKEN + hashlib.sha256(token.encode()).hexdigest()[:16]


def holders_of(context: Any) -> tuple[str, ...]:
    """Who a call's bytes are charged to: its connection, and its token when it shows one."""
    token = token_holder(context)
    return (f"peer:{context.peer()}",) if token is None else (f"peer:{context.peer()}", token)


class Lease:
    """The bytes one call holds in the budget; released (all of them) by ``release``."""

    def __init__(self, budget: MemoryBudget, signal: Signal, holders: Sequence[str], address: str,
                 pace: ReadPace | None = None, contended: Callable[[str, float, str | None], bool] | None = None,
                 queue: str | None = None, turns: KeyedLocks | None = None) -> None:
        self.budget, self.signal, self.holders, self.address = budget, signal, tuple(holders), address
        self.pace = pace
        # a token's calls waiting for its read rate, in turn (``paced``; None: each on its own)
        self.turns = turns
        # another token active lately, not on the queue read (RequestTime.others_active)
        self.contended = contended
        self.queue = queue  # the queue this call reads (None: not known, or not a read)
        self.token = next((h for h in self.holders if h.startswith(TOKEN)), None)
        self.for_token = self.token is not None  # a client's call, not a peer's
        self.bytes = 0
        self.paced_bytes = 0  # answer bytes debited to the token's read rate, not yet settled

    async def acquire(self, want: int, *, wait_s: float | None = None, what: str = "answer") -> int:
        """Take up to ``want`` more bytes for an answer, first waiting for the token's read rate
        (``pace``), then up to ``wait_s`` (default ``wait_ms``) for room; ResourceExhausted
        (counted) if none came."""
        await self.paced()
        n = await self._granted(min(want, self.answer_bytes()), wait_s, what)
        if self.pace is not None:
            self.pace.debit(self.holders, n, time.monotonic(), self.queue)
            self.paced_bytes += n
        return n

    def answer_bytes(self) -> int:
        """The most one answer of this call may carry now: a peer's, its grant; a token's,
        ``token_answer_bytes``, or ``contended_answer_bytes`` while another token is active."""
        cfg, token = self.budget.config, self.token
        if token is None:
            return NO_ANSWER_LIMIT
        if self.contended is not None and self.contended(token, time.monotonic(), self.queue):
            return cfg.contended_answer_limit
        return cfg.token_answer_bytes

    async def paced(self) -> None:
        """Wait (asleep: no CPU, nothing more taken) while this call's token is over its read
        rate: before an answer (``acquire``, or a Read stream's answer within the room it kept)."""
        pace = self.pace
        if pace is None or not self.for_token or pace.wait_s(self.holders, time.monotonic(), self.queue) <= 0:
            return
        # In turn: the first waiter sleeps out the token's debt, the rest wait behind it. Each
        # asleep on its own computed the same end of the debt, and every grant woke all the
        # token's waiters to put all but one back to sleep (24 Read streams: ~35 wake-ups per
        # answer; docs/BENCHMARKS.md, stop 70).
        began = time.monotonic()
        async with self.turns.hold(self.token) if self.turns is not None and self.token else contextlib.nullcontext():
            while (w := pace.wait_s(self.holders, time.monotonic(), self.queue)) > 0:
                await asyncio.sleep(w)  # others of the same token may have run meanwhile: ask again
        self.budget.stats.paced += 1  # its turn and its sleep, both for the rate
        self.budget.stats.paced_ms += int((time.monotonic() - began) * 1000)

    async def _granted(self, want: int, wait_s: float | None, what: str) -> int:
        b = self.budget
        n = b.grant(self.holders, want)
        if n:
            self.bytes += n
            return n
        cfg = b.config
        deadline = time.monotonic() + (cfg.wait_ms / 1000.0 if wait_s is None else wait_s)
        b.stats.waited += 1
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                b.stats.refused += 1
                full = b.room((), reserve=cfg.reserve_bytes) == 0
                raise ResourceExhausted(
                    self.address, "memory", cfg.total_bytes - cfg.reserve_bytes if full else cfg.holder_bytes,
                    f"no room for a {what} of up to {want} bytes: this connection/token holds "
                    f"{max(b.held(h) for h in self.holders)} of its {cfg.holder_bytes}, the broker "
                    f"{b.stats.used_bytes} of {cfg.total_bytes}")
            # Until a release that can help (budget.release), not a poll.
            woken: asyncio.Future[None] = loop.create_future()

            def wake(f: asyncio.Future[None] = woken) -> None:
                if not f.done():
                    f.set_result(None)

            cancel = b.on_release(b.blocked_on(self.holders, want), wake)
            try:
                await asyncio.wait((woken,), timeout=left)
            finally:
                cancel()
            n = b.grant(self.holders, want)
            if n:
                self.bytes += n
                return n

    async def admit(self, n: int, *, what: str = "request") -> None:
        """Charge ``n`` bytes that are in memory already (a received request); while that puts
        one of the holders or the broker over budget because of *other* calls, wait (up to
        ``wait_ms``) for them to release, then release it and raise ResourceExhausted."""
        b = self.budget
        b.take(self.holders, n)
        self.bytes += n
        if not self._crowded():
            return
        cfg = b.config
        deadline = time.monotonic() + cfg.wait_ms / 1000.0
        b.stats.waited += 1
        while self._crowded():
            left = deadline - time.monotonic()
            if left <= 0:
                b.stats.refused += 1
                self.release()
                raise ResourceExhausted(self.address, "memory", cfg.total_bytes,
                                        f"no room for a {what} of {n} bytes: the broker holds "
                                        f"{b.stats.used_bytes} of {cfg.total_bytes}")
            await self.signal.wait(min(left, 0.05))

    def _crowded(self) -> bool:
        """Over budget, and not only by this lease's own bytes (waiting would not help)."""
        b, cfg = self.budget, self.budget.config
        if cfg.total_bytes < b.stats.used_bytes > self.bytes:
            return True
        return any(cfg.holder_bytes < b.held(h) > self.bytes for h in self.holders)

    def settle(self, actual: int, *, keep: int = 0) -> None:
        """The call holds ``actual`` bytes now (an answer came out shorter, or one batch longer,
        than granted), or ``keep`` of those it held if that is more (a Read stream keeps room
        for its next answer: ``release``); its token's read rate is charged what the answer
        really holds, less its fresh bytes (``ReadPace.fresh``)."""
        if (pace := self.pace) is not None:
            now = time.monotonic()
            owed = actual - self.paced_bytes
            if self.token is not None and self.queue is not None:
                owed -= pace.fresh(self.token, self.queue, actual, now)  # what was just written: not charged
            pace.debit(self.holders, owed, now, self.queue)
            self.paced_bytes = 0
        held = max(actual, min(keep, self.bytes))
        if held > self.bytes:
            self.budget.take(self.holders, held - self.bytes)
        elif held < self.bytes:
            self.budget.release(self.holders, self.bytes - held)
            self.signal.fire()
        self.bytes = held

    def release(self, keep: int = 0) -> None:
        """Give back every byte held but ``keep`` (a Read stream's room for its next answer,
        read_path.ReadAccount)."""
        if self.bytes > keep:
            self.budget.release(self.holders, self.bytes - keep)
            self.bytes = keep
            self.signal.fire()  # calls waiting for room


# -- giving freed memory back ---------------------------------------------------------------------

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD_BYTES = 1 << 20


def tune_malloc() -> bool:
    """Have glibc serve blocks of 1 MiB and more (answers, requests) with mmap, returned to the
    system when freed. Fixing the threshold turns off glibc's dynamic one, which rises to the
    size of the largest block freed (up to 32 MiB) so that later large blocks come from the
    heap and stay in RSS after they are freed (the issue's "never released"). False where
    there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False

"""Each caller's share of a server's request time, like Kafka's request-time quota: a token
bucket of seconds per caller, pure (the caller gives the clock). Used by the brokers (per token,
on their event loop: broker_group/request_time.py, where the guarantee is told in full) and by
the coordinator service (per token, across its worker threads: coordinator/fair_share.py).

Rules: no gRPC, no clock, no waiting, no threads: the caller gives ``now`` and serialises calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import attrs

from ordq.common.counts import count_down, count_up
from ordq.common.errors import ConfigError


@attrs.frozen(kw_only=True)
class RequestTimeConfig:
    """One token's share of the broker's loop (docs/SECURITY.md, Limits; sizing in
    docs/OPERATIONS.md)."""

    # Seconds of loop time per second one token may take (None: no limit). The loop is one
    # thread: 0.2 leaves 80 % to the others however hard one token pushes.
    share: float | None = 0.2
    # What a token may take at once before it is held (its bucket): small, because a burst is
    # what a neighbour's p99 feels (an abuser's 50 calls opened at once).
    burst_s: float = 0.025
    max_delay_ms: int = 2_000  # a call that would wait longer than this is refused (after this long)
    max_held: int = 32  # calls of one token waiting at once; past it, a refusal comes at once
    # What a call costs the loop before and after its handler (gRPC's call object, context,
    # status), charged to its token on top of the handler's measured steps.
    call_cost_us: int = 150
    # What a request byte costs the broker as it is received (TLS decryption, copies); a
    # request refused by gRPC's receive limit is charged as that many bytes.
    byte_cost_ns: float = 1.0
    # A token is held only while another token keeping to its share has been active within
    # this long (a call, a stream step, a wait): alone, it may take the whole loop. None:
    # always held (not work-conserving).
    contention_s: float | None = 0.5
    # ... and only while the loop is busy: all tokens together were charged at least this many
    # seconds per second over about the last contention_s (None: any activity counts). A
    # neighbour over its share on a loop that is mostly idle takes nothing another token waits
    # for: holding it only delays its acks (noisy-neighbour drill, stop 60: an abuser's unread
    # streams, cheap and "keeping to their share", had the neighbour's produce stream held
    # 1.3 s a second while the loop was ~70 % idle; ack p99 23 -> 412 ms).
    busy_share: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.share is not None and not 0 < self.share <= 1:
            raise ConfigError("request-time share must be > 0 and <= 1 (seconds of loop time per second), or None")
        if self.burst_s <= 0 or min(self.max_delay_ms, self.max_held, self.call_cost_us, self.byte_cost_ns) < 0:
            raise ConfigError("request-time burst must be > 0; delays and costs >= 0")
        if self.contention_s is not None and self.contention_s <= 0:
            raise ConfigError("request-time contention window must be > 0 seconds, or None")
        if self.busy_share is not None and not 0 <= self.busy_share <= 1:
            raise ConfigError("request-time busy share must be >= 0 and <= 1 (seconds per second), or None")

    def byte_cost_s(self, n: int) -> float:
        return n * self.byte_cost_ns / 1e9


@attrs.define
class RequestTimeStatistics:
    charged_ms: int = 0  # loop time charged to tokens, in all
    throttled: int = 0  # calls (or stream steps) held for their token's debt
    throttled_ms: int = 0  # how long they were held, in all
    refused: int = 0  # calls refused because the wait would exceed max_delay_ms
    charges: int = 0  # times a token was charged (each costs the loop the bucket's arithmetic)


@attrs.define
class RequestTime:
    """A token bucket of loop seconds per token: filled at ``share`` seconds per second up to
    ``burst_s``; calls are charged what they took. Pure: the caller gives the clock.

    Guarantee: while another token keeping to its share is active (``contended``), a token is let through
    (``delay_s`` 0) only while it is not in debt; hence over any interval of t seconds of
    contention it is charged at most ``burst_s + share * t`` plus what the calls let through
    before the debt showed cost (each call is charged after its steps). A token alone is let
    through at once, and its bucket is not overdrawn meanwhile (at most empty)."""

    config: RequestTimeConfig
    stats: RequestTimeStatistics = attrs.field(factory=RequestTimeStatistics)
    _level: dict[str, tuple[float, float]] = attrs.field(factory=dict)  # token -> (seconds left, at)
    _waiting: dict[str, int] = attrs.field(factory=dict)  # token -> calls waiting (admit)
    _active: dict[str, float] = attrs.field(factory=dict)  # token -> when last active (contention_s)
    _queue: dict[str, str] = attrs.field(factory=dict)  # token -> the queue it was last let use (on_queue)
    _load: tuple[float, float] = (0.0, 0.0)  # (seconds charged to all tokens, decayed over contention_s; at)

    def seen(self, token: str, now: float) -> None:
        """``token`` is active now (a call, a step, a wait)."""
        active = self._active
        active[token] = now
        window = self.config.contention_s
        if len(active) > 64 and window is not None:  # forget tokens gone quiet (few are active at once)
            self._active = {t: at for t, at in active.items() if now - at <= window}
            self._queue = {t: q for t, q in self._queue.items() if t in self._active}

    def on_queue(self, token: str | None, queue: str) -> None:
        """``token`` was let use ``queue`` (its call or stream passed the gate): its activity
        counts as that queue's (``others_active``)."""
        if token is not None:
            self._queue[token] = queue

    def contended(self, token: str, now: float) -> bool:
        """Whether another token keeping to its share (more than half its bucket left) was
        active within ``contention_s`` (always, when ``contention_s`` is None): only then is
        a token's share enforced. The share protects those who keep to it: a token alone,
        or among tokens all over their shares, is not held (the loop's queue shares it
        among them), and a neighbour held for its debt is no reason to hold another. Nor is a
        token last let use this token's own last queue (``others_active``: one application's
        writer and reader)."""
        window = self.config.contention_s
        if window is None:
            return True
        if self.config.busy_share is not None and self.load(now) < self.config.busy_share:
            return False  # the loop is mostly idle: nobody waits for what this token takes
        half = self.config.burst_s / 2
        return any(self._now_level(other, now) > half
                   for other in self._other_tenants(token, now, window, self._queue.get(token)))

    def others_active(self, token: str, now: float, queue: str | None = None) -> bool:
        """Whether another token was active within ``contention_s`` (always, when it is None),
        however idle the loop and whatever its own share: what a token's read rate asks
        (budget.ReadPace). A stream of huge answers costs a neighbour latency (their reads,
        copies and encryption take the GIL in long pieces), not only loop time: gated as
        ``contended`` is, 4 loops of huge fetches were never paced (the loop was under its busy
        share; the neighbour's producer, at 2,000 msgs/s, over its own share) and the neighbour's
        ack p99 went 3 -> 40-70 ms (noisy-neighbour drill, stop 67).

        ``queue``: the queue this token's call reads. A token last seen on that same queue (its
        producer, another of its subscriptions) is not another tenant: the queue's own writer and
        reader are one application's two ends, and pacing the reader behind its own writer only
        made it fall behind (a consumer with a token of its own drained ~10 % slower, stop 68). A
        token whose queue is not known yet counts as another's."""
        window = self.config.contention_s
        if window is None:
            return True
        return any(self._other_tenants(token, now, window, queue))

    def _other_tenants(self, token: str, now: float, window: float, queue: str | None) -> Iterator[str]:
        """The tokens other than ``token`` active within ``window``, but those last let use
        ``queue`` (None: every one): one application's writer and reader are one tenant."""
        same = self._queue
        return (other for other, at in self._active.items()
                if other != token and now - at <= window and (queue is None or same.get(other) != queue))

    def load(self, now: float) -> float:
        """Seconds per second charged to all tokens lately (decayed over ``contention_s``)."""
        window = self.config.contention_s or 1.0
        total, at = self._load
        return total * math.exp(-max(now - at, 0.0) / window) / window

    def _now_level(self, token: str, now: float) -> float:
        cfg = self.config
        level, at = self._level.get(token, (cfg.burst_s, now))
        return min(cfg.burst_s, level + max(now - at, 0.0) * (cfg.share or 0.0))

    def delay_s(self, token: str | None, now: float) -> float:
        """How long a call of ``token`` must wait before it runs (0: now). None: not charged."""
        if token is None:
            return 0.0
        self.seen(token, now)  # also without a share: the read rate asks (budget.ReadPace)
        if self.config.share is None:
            return 0.0
        debt = -self._now_level(token, now)
        # its debt asked first: whether it is contended is the dearer question (issue 39)
        if debt <= 1e-9 or not self.contended(token, now):
            return 0.0
        return debt / self.config.share

    def admit(self, token: str | None, now: float) -> tuple[float, bool]:
        """(wait, refuse): how long a new call of ``token`` waits before it runs, and whether
        it is then refused instead (its token's wait would exceed ``max_delay_ms``). A refused
        call still waits ``max_delay_ms`` first, unless ``max_held`` calls of its token wait
        already: a client that retries at once after a refusal is slowed down as one that
        waits, while the calls it holds stay bounded (and cost nothing: the body is unread).
        The caller brackets the wait with ``enter``/``leave``. Counts what it decides."""
        wait = self.delay_s(token, now)
        cfg = self.config
        if wait * 1000 <= cfg.max_delay_ms:
            return self.held(wait), False
        self.stats.refused += 1
        if token is not None and self._waiting.get(token, 0) < cfg.max_held:
            return self.held(cfg.max_delay_ms / 1000.0), True
        return 0.0, True

    def enter(self, token: str) -> None:
        count_up(self._waiting, token)

    def leave(self, token: str) -> None:
        count_down(self._waiting, token)

    def step(self, token: str | None, now: float) -> float:
        """The wait before the next step of an open stream of ``token`` (a produce request, a
        Read answer), at most ``max_delay_ms`` at a time: a stream is held, never refused (a
        refused produce stream would make its producer fail over)."""
        return self.held(min(self.delay_s(token, now), self.config.max_delay_ms / 1000.0))

    def held(self, wait: float) -> float:
        if wait > 0:
            self.stats.throttled += 1
            self.stats.throttled_ms += int(wait * 1000)
        return wait

    def charge(self, token: str | None, seconds: float, now: float) -> None:
        """Charge ``seconds`` of the loop to ``token`` (None: not charged)."""
        if token is None:
            return
        self.stats.charges += 1
        self.seen(token, now)
        if self.config.share is None or seconds <= 0:
            return
        window = self.config.contention_s or 1.0
        self._load = (self.load(now) * window + seconds, now)
        level = self._now_level(token, now)
        left = level - seconds
        if left < 0.0 and not self.contended(token, now):
            left = max(left, min(level, 0.0))  # alone: the bucket empties, no new debt
        self._level[token] = (left, now)
        self.stats.charged_ms += int(seconds * 1000)  # rounding: a statistic, not the account
        if len(self._level) > 4096:  # forget tokens whose bucket is full again (as new)
            share, burst = self.config.share, self.config.burst_s
            self._level = {t: (lv, at) for t, (lv, at) in self._level.items() if lv + (now - at) * share < burst}

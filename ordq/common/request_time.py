"""Each caller's share of a server's request time, like Kafka's request-time quota: a token
bucket of seconds per caller, pure (the caller gives the clock). Used by the brokers (per token,
on their event loop: broker_group/request_time.py, where the guarantee is told in full) and by
the coordinator service (per token, across its worker threads: coordinator/fair_share.py).

Rules: no gRPC, no clock, no waiting, no threads: the caller gives ``now`` and serialises calls.
"""

from __future__ import annotations

import attrs

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

    def __attrs_post_init__(self) -> None:
        if self.share is not None and not 0 < self.share <= 1:
            raise ConfigError("request-time share must be > 0 and <= 1 (seconds of loop time per second), or None")
        if self.burst_s <= 0 or min(self.max_delay_ms, self.max_held, self.call_cost_us, self.byte_cost_ns) < 0:
            raise ConfigError("request-time burst must be > 0; delays and costs >= 0")

    def byte_cost_s(self, n: int) -> float:
        return n * self.byte_cost_ns / 1e9


@attrs.define
class RequestTimeStatistics:
    charged_ms: int = 0  # loop time charged to tokens, in all
    throttled: int = 0  # calls (or stream steps) held for their token's debt
    throttled_ms: int = 0  # how long they were held, in all
    refused: int = 0  # calls refused because the wait would exceed max_delay_ms


@attrs.define
class RequestTime:
    """A token bucket of loop seconds per token: filled at ``share`` seconds per second up to
    ``burst_s``; calls are charged what they took. Pure: the caller gives the clock.

    Guarantee: a token is let through (``delay_s`` 0) only while it is not in debt; hence over
    any interval of t seconds it is charged at most ``burst_s + share * t`` plus what the
    calls let through before the debt showed cost (each call is charged after its steps)."""

    config: RequestTimeConfig
    stats: RequestTimeStatistics = attrs.field(factory=RequestTimeStatistics)
    _level: dict[str, tuple[float, float]] = attrs.field(factory=dict)  # token -> (seconds left, at)
    _waiting: dict[str, int] = attrs.field(factory=dict)  # token -> calls waiting (admit)

    def _now_level(self, token: str, now: float) -> float:
        cfg = self.config
        level, at = self._level.get(token, (cfg.burst_s, now))
        return min(cfg.burst_s, level + max(now - at, 0.0) * (cfg.share or 0.0))

    def delay_s(self, token: str | None, now: float) -> float:
        """How long a call of ``token`` must wait before it runs (0: now). None: not charged."""
        if token is None or self.config.share is None:
            return 0.0
        debt = -self._now_level(token, now)
        return debt / self.config.share if debt > 1e-9 else 0.0

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
        self._waiting[token] = self._waiting.get(token, 0) + 1

    def leave(self, token: str) -> None:
        left = self._waiting.get(token, 0) - 1
        if left > 0:
            self._waiting[token] = left
        else:
            self._waiting.pop(token, None)

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
        if token is None or self.config.share is None or seconds <= 0:
            return
        self._level[token] = (self._now_level(token, now) - seconds, now)
        self.stats.charged_ms += int(seconds * 1000)  # rounding: a statistic, not the account
        if len(self._level) > 4096:  # forget tokens whose bucket is full again (as new)
            share, burst = self.config.share, self.config.burst_s
            self._level = {t: (lv, at) for t, (lv, at) in self._level.items() if lv + (now - at) * share < burst}

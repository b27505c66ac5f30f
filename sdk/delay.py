"""Delayed delivery that keeps order: when a message becomes deliverable, and the gate that
holds the head of the line until then.

Guarantee: a message is handed to the application no earlier than its *due time*, and never
before the messages ahead of it. Its due time is the later of

- its timestamp (set by the producer at ``send()``) plus the subscription's delay
  (``ordq sub create|alter --delay D``), when the subscription has one; and
- its own ``deliver_at`` (``Producer.send(..., deliver_at=T)``), carried in the message as the
  reserved header ``ordq-deliver-at`` (µs since the Unix epoch, decimal ASCII).

A message with neither is due at once, but still waits behind a held one: order before time.
Both inputs are in the stored message and the subscription's settings, so a failover (the
producer resends the same messages, timestamps included), a consumer restart or a cursor
reset computes the same due times again: nothing here is state that could be lost.

Rules: no I/O, no clocks, no threads: ``now_us`` comes in. The consumer (sdk/consumer.py)
asks ``due_prefix`` before handing out and waits, reading the clock itself, while the head
is held.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from ordq.common.errors import ConfigError

# The reserved header of a message's own due time. Its value is decimal ASCII, so `ordq peek`
# and `ordq consume` show it as text.
DELIVER_AT_HEADER = "ordq-deliver-at"
# A subscription delay is at most a week (what a standing buffer is for: a cancel window, a
# downstream system catching up); longer is a mistake, or a scheduler's job.
MAX_DELAY_MS = 7 * 24 * 3600 * 1000


def deliver_at_us(when: float | dt.datetime) -> int:
    """``when`` (Unix seconds, or an aware datetime) as µs since the Unix epoch. ConfigError
    for a naive datetime (whose zone would be a guess) or a negative time."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            raise ConfigError("deliver_at: a datetime needs a time zone (e.g. datetime.now(timezone.utc))")
        seconds = when.timestamp()
    elif isinstance(when, int | float) and not isinstance(when, bool):
        seconds = float(when)
    else:
        raise ConfigError(f"deliver_at: Unix seconds or an aware datetime, not {type(when).__name__}")
    if not seconds >= 0:  # also NaN
        raise ConfigError(f"deliver_at: {when!r} is before 1970")
    return int(round(seconds * 1e6))


def with_deliver_at(headers: Sequence[tuple[str, bytes]], when: float | dt.datetime) -> tuple[tuple[str, bytes], ...]:
    """``headers`` plus the reserved header for ``when``. ConfigError when they hold it already
    (one message has one due time)."""
    if any(name == DELIVER_AT_HEADER for name, _ in headers):
        raise ConfigError(f"deliver_at given twice: as an argument and as the header {DELIVER_AT_HEADER}")
    return (*headers, (DELIVER_AT_HEADER, str(deliver_at_us(when)).encode("ascii")))


def header_due_us(headers: Iterable[tuple[str, bytes]]) -> int:
    """The ``deliver_at`` a message carries (µs), 0 when none. A value that is not a decimal
    integer counts as none: a message is never held for ever by a header it cannot mean."""
    for name, value in headers:
        if name == DELIVER_AT_HEADER:
            try:
                return max(int(value.decode("ascii")), 0)
            except (UnicodeDecodeError, ValueError):
                return 0
    return 0


def due_us(timestamp_us: int, headers: Sequence[tuple[str, bytes]], delay_us: int) -> int:
    """When a message becomes deliverable (µs since the epoch; 0: at once)."""
    due = timestamp_us + delay_us if delay_us > 0 else 0
    if headers:
        due = max(due, header_due_us(headers))
    return due


def check_delay_ms(delay_ms: int) -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or not 0 <= delay_ms <= MAX_DELAY_MS:
        raise ConfigError(f"delay must be between 0 and 7 days (in ms: 0..{MAX_DELAY_MS}), not {delay_ms!r}")
    return delay_ms


class _Timed(Protocol):  # what the gate reads of a message (sdk Delivered, wire Message)
    @property
    def timestamp_us(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@attrs.define
class TimeGate:
    """Which messages at the head of the line are due, and what the consumer is waiting on.

    ``due_prefix(messages, now_us)`` counts the messages from the head that are due at
    ``now_us``: it stops at the first one that is not (order holds: later messages wait behind
    it even when they are due). ``held`` is (seq, due_us) of the head while it waits for its
    time, else None: one attribute, so another thread (the metrics, the consumer's reporter)
    reads a consistent pair.
    """

    delay_us: int = 0
    held: tuple[int, int] | None = None
    waits: int = 0  # times the head of the line was held for its time (a statistic)

    def due_of(self, m: _Timed) -> int:
        return due_us(m.timestamp_us, m.headers, self.delay_us)

    def due_prefix(self, messages: Sequence[_Timed], now_us: int, limit: int | None = None) -> int:
        n = len(messages) if limit is None else min(limit, len(messages))
        delay_us = self.delay_us
        for i in range(n):
            m = messages[i]
            # The common case (no delay, no headers) costs two comparisons per message.
            if delay_us <= 0 and not m.headers:
                continue
            due = due_us(m.timestamp_us, m.headers, delay_us)
            if due > now_us:
                if i == 0:
                    held = (int(getattr(m, "seq", -1)), due)
                    if held != self.held:
                        self.waits += 1
                        self.held = held
                else:
                    self.held = None
                return i
        self.held = None
        return n

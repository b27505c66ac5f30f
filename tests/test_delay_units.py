"""Delayed delivery without I/O: due times, the gate that holds the head of the line, the
state ``ordq sub list`` shows (sdk/delay.py, ordq/admin/queue_views.py)."""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.admin.queue_views import WAITING_ON_TIME, sub_state
from ordq.common.errors import ConfigError
from ordq.sdk.delay import (
    DELIVER_AT_HEADER,
    TimeGate,
    check_delay_ms,
    deliver_at_us,
    due_us,
    header_due_us,
    with_deliver_at,
)


class M(NamedTuple):
    seq: int
    timestamp_us: int
    headers: tuple[tuple[str, bytes], ...] = ()


def at(us: int) -> tuple[tuple[str, bytes], ...]:
    return ((DELIVER_AT_HEADER, str(us).encode()),)


def test_deliver_at_forms() -> None:
    assert deliver_at_us(1.5) == 1_500_000
    assert deliver_at_us(dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.UTC)) == 2_000_000
    with pytest.raises(ConfigError, match="time zone"):
        deliver_at_us(dt.datetime(2030, 1, 1))  # noqa: DTZ001 - the naive datetime refused
    with pytest.raises(ConfigError, match="before 1970"):
        deliver_at_us(-1)
    with pytest.raises(ConfigError):
        deliver_at_us("soon")  # type: ignore[arg-type]
    assert with_deliver_at((("a", b"1"),), 3) == (("a", b"1"), (DELIVER_AT_HEADER, b"3000000"))
    with pytest.raises(ConfigError, match="twice"):
        with_deliver_at(at(5), 3)


def test_due_is_the_later_of_delay_and_deliver_at() -> None:
    assert due_us(1_000, (), 0) == 0  # due at once
    assert due_us(1_000, (), 500) == 1_500
    assert due_us(1_000, at(9_000), 500) == 9_000
    assert due_us(1_000, at(1_200), 500) == 1_500
    assert due_us(1_000, (("x", b"y"),), 0) == 0
    # a header that means nothing never holds a message for ever
    assert header_due_us(((DELIVER_AT_HEADER, b"tomorrow"),)) == 0
    assert header_due_us(((DELIVER_AT_HEADER, b"\xff"),)) == 0


def test_delay_bounds() -> None:
    assert check_delay_ms(0) == 0
    for bad in (-1, 7 * 24 * 3600 * 1000 + 1, 1.5, True):
        with pytest.raises(ConfigError):
            check_delay_ms(bad)  # type: ignore[arg-type]


def test_gate_holds_the_head_and_everything_behind_it() -> None:
    gate = TimeGate(delay_us=0)
    line = [M(0, 10), M(1, 10, at(100)), M(2, 10), M(3, 10)]
    assert gate.due_prefix(line, now_us=50) == 1  # seq 1 is not due: 2 and 3 wait behind it
    assert gate.held is None  # the head (seq 0) is due
    assert gate.due_prefix(line[1:], now_us=50) == 0
    assert gate.held == (1, 100) and gate.waits == 1
    assert gate.due_prefix(line[1:], now_us=60) == 0
    assert gate.waits == 1  # the same wait
    assert gate.due_prefix(line[1:], now_us=100) == 3
    assert gate.held is None
    assert gate.due_prefix(line, now_us=0, limit=1) == 1


def test_gate_with_a_subscription_delay() -> None:
    gate = TimeGate(delay_us=1_000)
    line = [M(0, 0), M(1, 500), M(2, 900)]
    assert gate.due_prefix(line, now_us=999) == 0
    assert gate.due_prefix(line, now_us=1_500) == 2
    assert gate.due_prefix(line, now_us=1_900) == 3
    gate.delay_us = 0  # ordq sub alter --delay 0: at once
    assert gate.due_prefix(line, now_us=0) == 3


messages = st.lists(st.tuples(st.integers(0, 10_000), st.one_of(st.none(), st.integers(0, 20_000))),
                    max_size=30)


@given(messages, st.integers(0, 5_000), st.integers(0, 25_000), st.one_of(st.none(), st.integers(1, 30)))
def test_gate_hands_out_only_a_due_prefix(spec: list[tuple[int, int | None]], delay_us: int, now_us: int,
                                          limit: int | None) -> None:
    line = [M(i, ts, () if d is None else at(d)) for i, (ts, d) in enumerate(spec)]
    gate = TimeGate(delay_us=delay_us)
    n = gate.due_prefix(line, now_us, limit)
    # never early: every message handed out is due
    assert all(due_us(m.timestamp_us, m.headers, delay_us) <= now_us for m in line[:n])
    # never more than asked; and it stops only at a message that is not due (or the limit)
    cap = len(line) if limit is None else min(limit, len(line))
    assert n <= cap
    if n < cap:
        nxt = line[n]
        assert due_us(nxt.timestamp_us, nxt.headers, delay_us) > now_us
        assert gate.held == ((nxt.seq, due_us(nxt.timestamp_us, nxt.headers, delay_us)) if n == 0 else None)
    else:
        assert gate.held is None


def test_sub_state() -> None:
    now = 10_000_000
    waiting = {"holder": "c1", "seq": 4, "due_us": now + 1_000_000, "at_us": now - 100}
    assert sub_state(lag=5, held_by="c1", blocked=None, waiting=waiting, now_us=now) == WAITING_ON_TIME
    # a report by a consumer that no longer holds the subscription is not what it does
    assert sub_state(lag=5, held_by="c2", blocked=None, waiting=waiting, now_us=now) == "delivering"
    # an old report for a time gone by: no longer waiting
    stale = {**waiting, "due_us": now - 9_000_000, "at_us": now - 9_000_000}
    assert sub_state(lag=5, held_by="c1", blocked=None, waiting=stale, now_us=now) == "delivering"
    assert sub_state(lag=0, held_by="c1", blocked=None, waiting=None, now_us=now) == "caught up"
    assert sub_state(lag=3, held_by=None, blocked=None, waiting=None, now_us=now) == "no consumer"
    assert sub_state(lag=3, held_by="c1", blocked={"seq": 1}, waiting=waiting, now_us=now) == "blocked"

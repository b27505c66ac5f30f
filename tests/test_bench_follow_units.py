"""The pure parts of bench/bench_follow.py: the producer's ack timeline, the lag samples, the
trend and the pacing (no I/O, no timing)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bench.bench_follow import AckTimeline, Sample, due, keeps_up, samples, slope


def timeline(points: list[tuple[float, int]]) -> AckTimeline:
    t = AckTimeline()
    for time_, seq in points:
        t.record(time_, seq)
    return t


def test_timeline_end_and_reached() -> None:
    t = timeline([(1.0, 50), (2.0, 100), (3.0, 150)])
    assert t.end_at(0.5) == 0
    assert t.end_at(1.0) == 50
    assert t.end_at(2.5) == 100
    assert t.end_at(99.0) == 150
    assert t.reached(1) == 1.0
    assert t.reached(50) == 1.0
    assert t.reached(51) == 2.0
    assert t.reached(150) == 3.0
    assert t.reached(151) is None


def test_timeline_ignores_acks_that_move_back() -> None:
    t = timeline([(1.0, 100), (1.5, 50), (0.8, 120)])  # an older ack, then a clock read before the last
    assert t.seqs == [100, 120]
    assert t.times == [1.0, 1.0]  # time never goes back either


@given(st.lists(st.tuples(st.floats(0, 1e4), st.integers(1, 10**9)), max_size=60), st.floats(0, 1e4),
       st.integers(1, 10**9))
def test_timeline_is_monotone(points: list[tuple[float, int]], at: float, seq: int) -> None:
    t = timeline(points)
    assert t.times == sorted(t.times)
    assert t.seqs == sorted(set(t.seqs))
    end = t.end_at(at)
    assert end == max([s for tt, s in zip(t.times, t.seqs, strict=True) if tt <= at], default=0)
    when = t.reached(seq)
    if when is None:
        assert not t.seqs or t.seqs[-1] < seq
    else:
        assert t.end_at(when) >= seq


def batch(last_seq: int | None, event: str = "batch", **more: Any) -> dict[str, Any]:
    return {"event": event, "last_seq": last_seq, **more}


def test_samples_measure_against_the_acked_end() -> None:
    acked = timeline([(10.0, 1000), (11.0, 2000), (12.0, 3000)])
    lines = [
        (9.0, batch(10)),  # before the window
        (11.5, batch(1000, lag_s=0.4, lag_messages=900)),
        (12.5, batch(3000)),
        (12.6, batch(3500)),  # checked past the last ack seen (its ack not back yet)
        (12.7, {"event": "started"}),
        (12.8, batch(None)),
        (20.0, batch(3000)),  # after the window
    ]
    got = samples(lines, acked, 10.0, 13.0)
    assert got == [
        Sample(t=11.5, checked=1000, behind_seqs=1000, behind_s=1.5, own_lag_s=0.4, own_lag_messages=900),
        Sample(t=12.5, checked=3000, behind_seqs=0, behind_s=0.5, own_lag_s=None, own_lag_messages=None),
        Sample(t=12.6, checked=3500, behind_seqs=0, behind_s=0.0, own_lag_s=None, own_lag_messages=None),
    ]


def test_slope() -> None:
    assert slope([]) == 0.0
    assert slope([(1.0, 5.0)]) == 0.0
    assert slope([(1.0, 5.0), (1.0, 7.0)]) == 0.0
    assert abs(slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) - 2.0) < 1e-9


def lagging(growth: float, n: int = 40) -> list[Sample]:
    return [Sample(t=float(i), checked=i * 1000, behind_seqs=int(5000 + growth * i), behind_s=0.0, own_lag_s=None,
                   own_lag_messages=None) for i in range(n)]


def test_keeps_up_when_the_lag_is_flat_and_not_when_it_grows() -> None:
    ok, growth = keeps_up(lagging(0.0), rate=20_000)
    assert ok and growth == 0.0
    ok, growth = keeps_up(lagging(5_000.0), rate=20_000)  # loses 5,000 msgs/s
    assert not ok and abs(growth - 5_000.0) < 1e-6
    ok, _ = keeps_up(lagging(-3_000.0), rate=20_000)  # catching up
    assert ok


def test_keeps_up_looks_at_the_second_half() -> None:
    # a start-up backlog in the first half that is worked off, then flat: keeps up
    first = [Sample(t=float(i), checked=0, behind_seqs=20_000 * i, behind_s=0.0, own_lag_s=None, own_lag_messages=None)
             for i in range(20)]
    second = [Sample(t=float(20 + i), checked=0, behind_seqs=4_000, behind_s=0.0, own_lag_s=None,
                     own_lag_messages=None) for i in range(20)]
    assert keeps_up(first + second, rate=20_000)[0]


@given(st.floats(0.0, 1000.0), st.floats(1.0, 50_000.0), st.integers(1, 10**6), st.integers(0, 10**6))
def test_due_never_overshoots(elapsed: float, rate: float, total: int, sent: int) -> None:
    sent = min(sent, total)
    n = due(0.0, elapsed, rate, sent, total)
    assert n >= 0
    assert sent + n <= total
    assert sent + n <= int(elapsed * rate) + 1 or n == 0

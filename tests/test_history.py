"""The status page's ring buffer of samples (ordq/admin/history.py, issue 42), without I/O:
bounded, time only forward, rates from neighbouring samples, never a negative rate, the busiest
queues first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.admin.history import History, QueueSample, Sample, sample_of


def s(at_ms: int, **queues: tuple[int, int, int]) -> Sample:
    return Sample(at_ms=at_ms, queues={q: QueueSample(*v) for q, v in queues.items()})


def test_rates_and_lag_from_neighbouring_samples() -> None:
    h = History(capacity=4)
    h.add(s(0, a=(99, 50, 50), b=(-1, 0, 0)))
    h.add(s(10_000, a=(199, 100, 100), b=(9, 10, 0)))
    h.add(s(20_000, a=(5, 0, 6), b=(9, 10, 0)))  # a deleted and created again: no rate that step
    out = h.series()
    assert out["t_ms"] == [10_000, 20_000]
    assert out["queues"]["a"] == {"produce": [10.0, None], "consume": [5.0, None], "lag": [100, 6]}
    assert out["queues"]["b"] == {"produce": [1.0, 0.0], "consume": [1.0, 0.0], "lag": [0, 0]}
    assert out["queues"]["*"] == {"produce": [11.0, 0.0], "consume": [6.0, 0.0], "lag": [100, 6]}
    assert list(h.series(["b", "gone"])["queues"]) == ["b", "*"]


def test_the_oldest_goes_and_time_only_moves_forward() -> None:
    h = History(capacity=3)
    for t in range(5):
        h.add(s(t * 1000, a=(t, 0, 0)))
    assert [x.at_ms for x in h.samples()] == [2000, 3000, 4000]
    h.add(s(3500, a=(9, 0, 0)))  # a clock step back replaces the last
    assert [x.at_ms for x in h.samples()] == [2000, 3000, 3500]
    with pytest.raises(ValueError, match="capacity"):
        History(capacity=1)


def test_busiest_first_and_a_bounded_sample() -> None:
    h = History(capacity=10, max_queues=2)
    h.add(s(0, quiet=(10, 10, 0), busy=(10, 10, 0), stuck=(10, 0, 10)))
    h.add(s(10_000, quiet=(10, 10, 0), busy=(500, 400, 100), stuck=(10, 0, 10)))
    assert set(h.samples()[-1].queues) == {"busy", "stuck"}  # the most lag kept, quiet dropped
    assert h.busiest() == ["busy", "stuck"]


def test_a_sample_from_the_status_document() -> None:
    doc = {"queues": [
        {"queue": "q", "last_seq": 41, "subscriptions": [{"subscription": "s", "last_seq": 9, "lag": 32},
                                                          {"subscription": "t", "last_seq": -1, "lag": 42}]},
        {"queue": "bad", "error": "corrupt"},
        {"queue": "empty", "last_seq": None, "subscriptions": []}]}
    got = sample_of(doc, 7)
    assert got == Sample(at_ms=7, queues={"q": QueueSample(41, 10, 74), "empty": QueueSample(-1, 0, 0)})


counters = st.lists(st.tuples(st.integers(1, 60_000), st.integers(-1, 10**6), st.integers(0, 10**6)),
                    min_size=0, max_size=40)


@settings(max_examples=100, deadline=None)  # a loaded box stalls any one example
@given(counters, st.integers(2, 12))
def test_bounded_and_never_a_negative_rate(steps: list[tuple[int, int, int]], capacity: int) -> None:
    h = History(capacity=capacity)
    t = 0
    for dt, seq, lag in steps:
        t += dt
        h.add(s(t, q=(seq, max(0, seq - lag), lag)))
        assert len(h) <= capacity
    out = h.series()
    assert len(out["t_ms"]) == max(0, len(h) - 1) and out["t_ms"] == sorted(out["t_ms"])
    for key in ("produce", "consume"):
        assert all(r is None or r >= 0 for r in out["queues"]["*"][key])
        assert all(r is None or r >= 0 for r in out["queues"].get("q", {key: []})[key])


def test_the_sampler_keeps_one_sample_per_interval() -> None:
    """The page's viewers and the sampler thread offer documents; one is kept per interval."""
    from ordq.admin.status_page import Sampler

    sampler = Sampler(None, History(), interval_s=10.0)  # type: ignore[arg-type] - offer() reads no daemon

    def doc(at_ms: int, last: int) -> dict:  # type: ignore[type-arg]
        return {"generated_ms": at_ms, "queues": [{"queue": "q", "last_seq": last, "subscriptions": []}]}

    assert sampler.offer(doc(1_000, 9), now=100.0)
    assert not sampler.offer(doc(2_000, 19), now=105.0)  # a viewer's refresh in between
    assert sampler.offer(doc(11_000, 109), now=109.8)
    assert not sampler.offer({"generated_ms": 30_000, "error": "ZooKeeper away", "queues": []}, now=130.0)
    assert sampler.history.series()["queues"]["q"]["produce"] == [10.0]

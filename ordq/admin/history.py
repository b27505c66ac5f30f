"""Rates and lag over time for the status page: an in-process ring buffer of the coordinator's
samples, the last hour at 10 s (issue 42: the page had no rates and no lag over time).

Each sample is, per queue, its last seq (the produce side) and the sum of its subscriptions'
cursors and lag (the consume side) at one moment. Rates are the differences between two
neighbouring samples over the time between them: messages produced and consumed per second.

Rules: no I/O, no clock, no threads: the caller passes each sample with its time
(``ordq.admin.status_page`` samples the document it serves). A counter that goes back (a
queue deleted and created again, a subscription reset) gives no rate for that step, never a
negative one. Memory is bounded: ``capacity`` samples, each holding at most ``max_queues``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

INTERVAL_S = 10.0
CAPACITY = 360  # an hour at INTERVAL_S
MAX_QUEUES = 200  # the busiest (most backlogged) queues kept per sample; the rest are summed


@attrs.frozen
class QueueSample:
    """One queue at one moment."""

    last_seq: int  # -1: nothing produced
    consumed: int  # the sum over its subscriptions of the last seq consumed + 1
    lag: int  # the sum of its subscriptions' lag


@attrs.frozen
class Sample:
    at_ms: int
    queues: Mapping[str, QueueSample]


def sample_of(doc: Mapping[str, Any], at_ms: int) -> Sample:
    """A sample from the status document (``/status.json``: each queue as ``queue describe``)."""
    out = {}
    for q in doc.get("queues", []):
        if "error" in q or q.get("queue") is None:
            continue
        subs = q.get("subscriptions") or []
        last = q.get("last_seq")
        out[str(q["queue"])] = QueueSample(
            last_seq=int(last) if last is not None else -1,
            consumed=sum(int(s.get("last_seq", -1)) + 1 for s in subs),
            lag=sum(int(s.get("lag") or 0) for s in subs))
    return Sample(at_ms=at_ms, queues=out)


class History:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, *, capacity: int = CAPACITY, max_queues: int = MAX_QUEUES) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2 (a rate needs two samples)")
        self.capacity = capacity
        self.max_queues = max_queues
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> None:
        """Keep ``sample`` (the oldest goes when full). A sample not later than the last one
        replaces it: time only moves forward here."""
        if self._samples and sample.at_ms <= self._samples[-1].at_ms:
            self._samples.pop()
        if len(sample.queues) > self.max_queues:
            busiest = sorted(sample.queues.items(), key=lambda kv: (-kv[1].lag, -kv[1].last_seq, kv[0]))
            sample = Sample(at_ms=sample.at_ms, queues=dict(busiest[:self.max_queues]))
        self._samples.append(sample)

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def series(self, queues: Iterable[str] | None = None) -> dict[str, Any]:
        """For charts: ``t_ms`` (each step's end), and per queue (all of them when ``queues`` is
        None) and for ``*`` (every queue summed) the ``produce`` and ``consume`` rates
        (messages/s; None where no rate is known) and the ``lag`` at each step."""
        samples = list(self._samples)
        every = sorted({q for s in samples for q in s.queues})
        per: dict[str, dict[str, list[Any]]] = {}
        for name in every:
            produce: list[float | None] = []
            consume: list[float | None] = []
            lags: list[int | None] = []
            for before, now in zip(samples, samples[1:], strict=False):
                a, b = before.queues.get(name), now.queues.get(name)
                dt_s = (now.at_ms - before.at_ms) / 1000
                produce.append(_rate(a.last_seq if a else None, b.last_seq if b else None, dt_s))
                consume.append(_rate(a.consumed if a else None, b.consumed if b else None, dt_s))
                lags.append(b.lag if b else None)
            per[name] = {"produce": produce, "consume": consume, "lag": lags}
        steps = max(0, len(samples) - 1)
        total = {key: [_sum(per[n][key][i] for n in every) for i in range(steps)]
                 for key in ("produce", "consume", "lag")}
        shown = every if queues is None else [q for q in queues if q in per]
        return {"t_ms": [s.at_ms for s in samples[1:]], "queues": {**{n: per[n] for n in shown}, "*": total}}

    def busiest(self, window: int = 6) -> list[str]:
        """Queue names, busiest first: the most produced and consumed over the last ``window``
        steps, then the most lag now, then by name."""
        samples = list(self._samples)[-(window + 1):]
        if not samples:
            return []
        first, last = samples[0], samples[-1]

        def moved(name: str) -> int:
            a, b = first.queues.get(name), last.queues[name]
            if a is None:
                return 0
            return max(0, b.last_seq - a.last_seq) + max(0, b.consumed - a.consumed)

        return sorted(last.queues, key=lambda n: (-moved(n), -last.queues[n].lag, n))


def _sum(values: Iterable[float | int | None]) -> float | int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rate(a: int | None, b: int | None, dt_s: float) -> float | None:
    if a is None or b is None or dt_s <= 0 or b < a:
        return None  # not there at both ends, or the counter went back (recreated, reset)
    return (b - a) / dt_s

"""Stage stamps: where a message's time goes between ``send()`` and its future resolving, across
the producer, master and slave processes (issue 39's per-stage latency breakdown).

Guarantee: off unless the environment variable ``ORDQ_STAGE_STAMPS`` names a folder when the
process imports this module (or ``enable`` is called); then every ``stamp(name)`` appends one line ``<monotonic ns>
<name>`` to ``<folder>/<pid>``, written at once (a broker killed with SIGKILL loses nothing).
CLOCK_MONOTONIC is one clock for every process of a machine, so the lines of all processes
merge into one timeline (``breakdown``). Children inherit the variable: a bench that sets it
before starting its cluster stamps every process.

Rules:
- ``stamp`` never raises and, when off, costs one test of a module global: it sits on the
  hot paths (produce request read, forward to the slave, sync, ack).
- ``breakdown`` is pure (no I/O, no clock): stamps in, one row per step out.
- For one message at a time (synchronous sends): stamps of overlapping messages interleave and
  their steps mean nothing.
"""

from __future__ import annotations

import collections
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

ENV = "ORDQ_STAGE_STAMPS"

_folder = os.environ.get(ENV) or None
_fd: int | None = None


def enable(folder: Path) -> None:
    """Stamp into ``folder`` from now on, in this process and in the processes it starts."""
    global _folder, _fd
    os.environ[ENV] = str(folder)
    _folder, _fd = str(folder), None


def stamp(name: str) -> None:
    """Record that this process reached stage ``name`` now (no-op unless ``ORDQ_STAGE_STAMPS``)."""
    if _folder is None:
        return
    global _fd
    try:
        if _fd is None:
            _fd = os.open(os.path.join(_folder, str(os.getpid())), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(_fd, f"{time.monotonic_ns()} {name}\n".encode())
    except OSError:
        pass  # a measurement aid: never the reason a send fails


def read_stamps(folder: Path) -> list[tuple[int, str]]:
    """Every process's stamps in ``folder``, in time order."""
    out: list[tuple[int, str]] = []
    for f in folder.iterdir():
        for line in f.read_text().splitlines():
            t, _, name = line.partition(" ")
            if name:
                out.append((int(t), name))
    out.sort()
    return out


@attrs.frozen
class Step:
    """From stage ``start`` to the next stamp ``end``, in microseconds, over ``count`` rounds."""

    start: str
    end: str
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float


@attrs.frozen
class Breakdown:
    rounds: int  # rounds that ended in ``last``
    path: tuple[str, ...]  # the commonest sequence of stages of a round
    path_rounds: int  # rounds that took it
    total: Step  # first -> last
    steps: list[Step]  # every step seen, most total time first


def _pct(ordered: Sequence[float], p: float) -> float:
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]


def _step(start: str, end: str, values: list[float]) -> Step:
    v = sorted(values)
    return Step(start, end, len(v), _pct(v, 50), _pct(v, 90), _pct(v, 99), statistics.fmean(v))


def breakdown(stamps: Iterable[tuple[int, str]], first: str, last: str, *, skip: int = 0) -> Breakdown:
    """Cut the merged timeline into rounds, each from a ``first`` stamp to the next ``first``
    (the first ``skip`` rounds left out: warm-up), and time every step between consecutive
    stamps of a round; ``total`` is ``first`` -> ``last`` of the rounds that reached ``last``."""
    rounds: list[list[tuple[int, str]]] = []
    for t, name in stamps:
        if name == first:
            rounds.append([(t, name)])
        elif rounds:
            rounds[-1].append((t, name))
    rounds = rounds[skip:]
    steps: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    paths: collections.Counter[tuple[str, ...]] = collections.Counter()
    totals: list[float] = []
    for r in rounds:
        paths[tuple(n for _, n in r)] += 1
        for (t0, a), (t1, b) in zip(r, r[1:], strict=False):
            steps[(a, b)].append((t1 - t0) / 1000)
        ends = [t for t, n in r if n == last]
        if ends:
            totals.append((ends[0] - r[0][0]) / 1000)
    rows = sorted((_step(a, b, v) for (a, b), v in steps.items()), key=lambda s: -s.mean_us * s.count)
    path, n = paths.most_common(1)[0] if paths else ((), 0)
    return Breakdown(rounds=len(totals), path=path, path_rounds=n,
                     total=_step(first, last, totals or [0.0]), steps=rows)


def lines(b: Breakdown, *, top: int = 14) -> list[str]:
    """``b`` for people: the commonest path, then the steps taking the most time in all."""
    out = [f"{b.rounds} rounds; commonest path ({b.path_rounds}): {' > '.join(b.path)}",
           f"{'step':<28} {'n':>6} {'p50 µs':>9} {'p90 µs':>9} {'p99 µs':>9} {'mean µs':>9}"]
    for s in [b.total, *b.steps[:top]]:
        out.append(f"{s.start + ' > ' + s.end:<28} {s.count:>6} {s.p50_us:>9,.0f} {s.p90_us:>9,.0f} "
                   f"{s.p99_us:>9,.0f} {s.mean_us:>9,.0f}")
    return out

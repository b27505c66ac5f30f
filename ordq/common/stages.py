"""Stage stamps: where a message's time goes between ``send()`` and its future resolving, across
the producer, master and slave processes (issue 39's per-stage latency breakdown).

Guarantee: off unless the environment variable ``ORDQ_STAGE_STAMPS`` names a folder when the
process imports this module (or ``enable`` is called); then every ``stamp(name)`` appends one line ``<monotonic ns>
<name>`` to ``<folder>/<pid>``, written at once (a broker killed with SIGKILL loses nothing).
CLOCK_MONOTONIC is one clock for every process of a machine, so the lines of all processes
merge into one timeline (``breakdown``). Children inherit the variable: a bench that sets it
before starting its cluster stamps every process.

A stamp may carry keys: the first seqs of the batches it is about (``P.open`` … ``C.read``
below), so batches that overlap in flight (a steady rate, issue 39's p99) are told apart:
``keyed_breakdown`` follows each batch through every process by its first seq. While stamps are
on, every process also stamps its garbage collections (``gc.start``/``gc.stop``, key: the
generation), and ``gc_pauses`` pairs them.

The keyed stages of one batch, in the order they usually come:
``P.open`` (its first message added in ``send``), ``P.take`` (handed to the stream), ``P.write``
(handed to the transport), ``M.request``/``M.placed`` (the master read and placed it),
``M.forward`` (sent to the slave), ``M.sync``/``M.synced`` (the master's group commit: write,
then fdatasync done), ``S.request``, ``S.sync``/``S.synced``, ``S.answer`` (the slave's),
``M.ack`` (the ack taken for the producer), ``M.read`` (a consumer's Read answer holding it
built), ``P.acked``/``P.resolved`` (the producer read it, the futures resolved), ``C.read`` (a
consumer decoded it), ``C.poll`` (handed to the application).

Sampling (``ORDQ_STAGE_SAMPLE=N``, or ``enable(folder, every=N)``): keyed stamps are written
only for the batches whose first seq a hash picks, one in N, the same ones in every process
(each decides from the key alone), so a bench can leave the stamps on beside the figures it
reports (a few batches a second at issue 39's steady rate). Unkeyed stamps are then dropped
(``P.ack``: one a batch), but for the garbage collections'.

Rules:
- ``stamp`` never raises and, when off, costs one test of a module global: it sits on the
  hot paths (produce request read, forward to the slave, sync, ack). Keys given as a callable
  are computed only when on.
- ``breakdown``, ``keyed_breakdown`` and ``gc_pauses`` are pure (no I/O, no clock): stamps in,
  rows out.
- ``breakdown`` is for one message at a time (synchronous sends): stamps of overlapping
  messages interleave and its steps mean nothing; ``keyed_breakdown`` is for any rate.
"""

from __future__ import annotations

import collections
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

ENV = "ORDQ_STAGE_STAMPS"
SAMPLE_ENV = "ORDQ_STAGE_SAMPLE"  # one keyed batch in N (module docstring); unset or 1: every one


def _every_from_env() -> int:
    try:
        return max(1, int(os.environ.get(SAMPLE_ENV, "1")))
    except ValueError:
        return 1


_folder = os.environ.get(ENV) or None
_fd: int | None = None
_every = _every_from_env()
_HASH = 0x9E3779B1  # Fibonacci hashing: consecutive first seqs spread over the 32-bit range


Keys = Iterable[int] | Callable[[Any], Iterable[int]]


def enable(folder: Path, *, every: int = 1) -> None:
    """Stamp into ``folder`` from now on, in this process and in the processes it starts;
    keyed stamps for one batch in ``every`` (``sampled``)."""
    global _folder, _fd, _every
    os.environ[ENV] = str(folder)
    os.environ[SAMPLE_ENV] = str(max(1, every))
    _folder, _fd, _every = str(folder), None, max(1, every)
    _watch_gc()


def sampled(key: int, every: int) -> bool:
    """Is the batch whose first seq is ``key`` one of the one in ``every`` stamped? Pure: every
    process answers the same for the same key."""
    return every <= 1 or (key * _HASH) & 0xFFFFFFFF < (1 << 32) // every


def on() -> bool:
    """Are stamps being written (worth computing what only a stamp needs)?"""
    return _folder is not None


def stamp(name: str, keys: Keys = (), of: Any = None) -> None:
    """Record that this process reached stage ``name`` now (no-op unless ``ORDQ_STAGE_STAMPS``),
    for the batches whose first seqs are ``keys``, or ``keys(of)`` when ``keys`` is a function
    (called only when on: the hot path pays nothing for them)."""
    if _folder is None:
        return
    global _fd
    try:
        if _fd is None:
            _fd = os.open(os.path.join(_folder, str(os.getpid())), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        wanted = list(keys(of) if callable(keys) else keys)
        if _every > 1 and not name.startswith("gc."):  # a collection's key is its generation
            wanted = [k for k in wanted if sampled(k, _every)]
            if not wanted:
                return  # none of its batches sampled (or unkeyed: no batch to sample it by)
        ks = ",".join(map(str, wanted))
        os.write(_fd, f"{time.monotonic_ns()} {name} {ks}\n".encode() if ks else
                 f"{time.monotonic_ns()} {name}\n".encode())
    except Exception:  # noqa: BLE001 - a measurement aid: never the reason a send fails
        pass


def _on_gc(phase: str, info: dict[str, int]) -> None:
    stamp(f"gc.{phase}", (info.get("generation", -1),))


def _watch_gc() -> None:
    """While stamps are on, every collection is stamped: a pause on the hot path shows."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


if _folder is not None:
    _watch_gc()


@attrs.frozen
class Stamp:
    """One line of one process: ``name`` reached at ``ns`` (CLOCK_MONOTONIC) for ``keys``."""

    ns: int
    pid: int
    name: str
    keys: tuple[int, ...] = ()


def parse_line(pid: int, line: str) -> Stamp | None:
    """A stamp file's line (``<ns> <name>[ <key>,<key>...]``); None for a torn one."""
    parts = line.split(" ")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1]:
        return None
    try:
        keys = tuple(int(k) for k in parts[2].split(",")) if len(parts) > 2 and parts[2] else ()
    except ValueError:
        return None
    return Stamp(int(parts[0]), pid, parts[1], keys)


def read_keyed(folder: Path) -> list[Stamp]:
    """Every process's stamps in ``folder`` (file name: its pid), in time order."""
    out = [s for f in folder.iterdir() for line in f.read_text().splitlines()
           if (s := parse_line(int(f.name), line)) is not None]
    out.sort(key=lambda s: s.ns)
    return out


def read_stamps(folder: Path) -> list[tuple[int, str]]:
    """Every process's stamps in ``folder``, in time order, without their keys."""
    return [(s.ns, s.name) for s in read_keyed(folder)]


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
    max_us: float = 0.0


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
    return Step(start, end, len(v), _pct(v, 50), _pct(v, 90), _pct(v, 99), statistics.fmean(v), v[-1])


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


@attrs.frozen
class Arrival:
    """When batches reached ``stage``, in µs since each one's first stage: over every batch
    (``count`` of them) and over the tail (the batches whose total is at or past its p99)."""

    stage: str
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    tail_p50_us: float


@attrs.frozen
class KeyedBreakdown:
    batches: int  # batches that reached both the first and the last stage
    tail: int  # of them, the ones at or past the p99 of the total
    total: Step  # first -> last stage
    arrivals: list[Arrival]  # one per stage seen, in ``path`` order


def keyed_breakdown(stamps: Iterable[Stamp], path: Sequence[str]) -> KeyedBreakdown:
    """Follow each batch (a key) through ``path``: for every stage, when the batch first reached
    it, counted from when it reached ``path[0]``. Only batches that reached ``path[0]`` and
    ``path[-1]`` count. The tail is what the p99 is made of: comparing its arrivals with the
    median's says which stage the slow batches lost their time in."""
    wanted = set(path)
    seen: dict[int, dict[str, int]] = collections.defaultdict(dict)
    for s in stamps:
        if s.name in wanted:
            for k in s.keys:
                seen[k].setdefault(s.name, s.ns)
    first, last = path[0], path[-1]
    rounds = {k: at for k, at in seen.items() if first in at and last in at and at[last] >= at[first]}
    totals = {k: (at[last] - at[first]) / 1000 for k, at in rounds.items()}
    if not totals:
        return KeyedBreakdown(0, 0, _step(first, last, [0.0]), [])
    cut = _pct(sorted(totals.values()), 99)
    tail = {k for k, t in totals.items() if t >= cut}
    arrivals = []
    for stage in path:
        values = [(at[stage] - at[first]) / 1000 for at in rounds.values() if stage in at]
        tail_values = [(rounds[k][stage] - rounds[k][first]) / 1000 for k in tail if stage in rounds[k]]
        if values:
            v = sorted(values)
            arrivals.append(Arrival(stage, len(v), _pct(v, 50), _pct(v, 90), _pct(v, 99),
                                    _pct(sorted(tail_values), 50) if tail_values else float("nan")))
    return KeyedBreakdown(len(rounds), len(tail), _step(first, last, list(totals.values())), arrivals)


def tail_growth(b: KeyedBreakdown) -> list[tuple[str, str, float]]:
    """Where the tail fell behind: for each pair of consecutive stages (``path`` order), how
    much the tail's lag behind the median (tail p50 − p50) grew between them, in µs, most
    first. The step at the top is where the slow batches lost their time."""
    steps = []
    known = [a for a in b.arrivals if a.tail_p50_us == a.tail_p50_us]  # not NaN
    for x, y in zip(known, known[1:], strict=False):
        grew = (y.tail_p50_us - y.p50_us) - (x.tail_p50_us - x.p50_us)
        steps.append((x.stage, y.stage, grew))
    return sorted(steps, key=lambda s: -s[2])


def keyed_lines(b: KeyedBreakdown) -> list[str]:
    """``b`` for people: each stage's arrival since the first, for all batches and the tail,
    and the steps where the tail fell furthest behind the median."""
    w = max([12, *(len(a.stage) for a in b.arrivals)])
    out = [f"{b.batches} batches, {b.tail} in the tail (total >= its p99); {b.total.start} > {b.total.end}: "
           f"p50 {b.total.p50_us:,.0f} µs, p90 {b.total.p90_us:,.0f}, p99 {b.total.p99_us:,.0f}",
           f"{'reached':<{w}} {'n':>6} {'p50 µs':>9} {'p90 µs':>9} {'p99 µs':>9} {'tail p50':>9}"]
    for a in b.arrivals:
        out.append(f"{a.stage:<{w}} {a.count:>6} {a.p50_us:>9,.0f} {a.p90_us:>9,.0f} {a.p99_us:>9,.0f} "
                   f"{a.tail_p50_us:>9,.0f}")
    grew = [f"{x} > {y} +{us:,.0f} µs" for x, y, us in tail_growth(b)[:3] if us > 0]
    if grew:
        out.append("the tail fell behind the median most at: " + "; ".join(grew))
    return out


def gc_pauses(stamps: Iterable[Stamp]) -> dict[int, list[float]]:
    """Each process's garbage-collection pauses in µs (a ``gc.start`` and the next ``gc.stop``)."""
    started: dict[int, int] = {}
    out: dict[int, list[float]] = collections.defaultdict(list)
    for s in stamps:
        if s.name == "gc.start":
            started[s.pid] = s.ns
        elif s.name == "gc.stop" and s.pid in started:
            out[s.pid].append((s.ns - started.pop(s.pid)) / 1000)
    return dict(out)


def spans(stamps: Iterable[Stamp], pairs: Sequence[tuple[str, str]], *, signed: bool = False) -> list[Step]:
    """For each (start, end) of ``pairs``: how long the batches took from one to the other
    (each batch's first arrival at both), e.g. a group commit's write and fdatasync. A batch
    that reached ``end`` first is left out, unless ``signed`` (two stages of different
    processes that race, as the master's ack and the consumer's read): then it counts below 0."""
    seen = _first_arrivals(stamps, {n for pair in pairs for n in pair})
    out = []
    for a, b in pairs:
        values = [(at[b] - at[a]) / 1000 for at in seen.values() if a in at and b in at and (signed or at[b] >= at[a])]
        if values:
            out.append(_step(a, b, values))
    return out


def span_values(stamps: Iterable[Stamp], start: str, end: str) -> list[float]:
    """Every batch's ``start`` -> ``end`` in µs (signed), in first-seq order: ``spans``' samples."""
    seen = _first_arrivals(stamps, {start, end})
    return [(at[end] - at[start]) / 1000 for _, at in sorted(seen.items()) if start in at and end in at]


def _first_arrivals(stamps: Iterable[Stamp], wanted: set[str]) -> dict[int, dict[str, int]]:
    """Key -> stage -> when it first reached it (ns), for the stages ``wanted``."""
    seen: dict[int, dict[str, int]] = collections.defaultdict(dict)
    for s in stamps:
        if s.name in wanted:
            for k in s.keys:
                seen[k].setdefault(s.name, s.ns)
    return seen


"""Freezes of the disk under a drill's cluster, as the kernel counts its I/O (/proc/diskstats): a
stretch of at least ``min_us`` in which I/O was in flight and none completed. The
security-control-plane and noisy-neighbour drills watch the disk over their windows
(``watched``), leave the samples caught in one out of both sides of their latency ratios, and
print how many freezes each kind of window had (``leave_out``; docs/SECURITY.md, stop h). The
CPU's stalls (``cpu_stalls``, stop 65) are watched and left out the same way, by the same two.

Why: on this machine's virtual disk the whole device stops now and then for 150-460 ms (stop h:
every produce ack of the drill queue slower than 150 ms in the windows looked at came with one;
in quiet windows, in an ``idle`` control window where the attacker sent nothing, and in attack
windows alike, with or without discards). A 4 s window holds ~8,000 acks and one freeze delays
~900 of them, so any window with a freeze has its p99 set by it: the ratio then judged the disk's
moments, not the attack (an idle window was 7.9x its quiet one). The attacks themselves write
nothing (refusals are counted in memory, their log lines are rate-limited).

Rules: ``stalls``, ``outside`` and ``per_window`` are pure; ``DiskWatch`` is the one thread that
reads the disk's counters; ``watched`` and ``leave_out`` are the drills' one way to use them (the
freezes kept in ``ctx.notes["device_stalls"]``, the device in ``ctx.notes["device"]``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from ordq.drills import cpu_stalls

if TYPE_CHECKING:
    from ordq.drills.runner import DrillContext

MIN_STALL_US = 100_000  # nothing completed for this long with I/O in flight: ~100 writes at the drill's rate
EVERY_S = 0.02  # how often the counters are read


@attrs.frozen
class DiskSample:
    t_us: int  # wall clock (the drill's ``now_us``)
    done: int  # I/Os completed so far: reads, writes, discards and flushes
    in_flight: int
    # the writes and flushes completed so far and the ms they took (kept with the run, told)
    writes: int = 0
    write_ms: int = 0
    flushes: int = 0
    flush_ms: int = 0


def stalls(samples: Sequence[DiskSample], min_us: int = MIN_STALL_US) -> list[tuple[int, int]]:
    """The freezes ``[start, end]`` in µs: from the sample before the first in which nothing
    completed while I/O stayed in flight, to the first sample that saw a completion again (the
    freeze ended somewhere before it); only those frozen at least ``min_us`` between samples."""
    return _stretches(samples, min_us, lambda prev, cur: prev.in_flight > 0 and cur.in_flight > 0, end_at_next=True)


def idle(samples: Sequence[DiskSample], min_us: int = MIN_STALL_US) -> list[tuple[int, int]]:
    """The idle stretches ``[start, end]`` in µs: nothing in flight and nothing completed for at
    least ``min_us`` between samples, to the last idle sample. Under a steady stream a disk that
    does nothing is as telling as one that is frozen (stop 65: the brokers' syncs waited in them,
    on pages under writeback); they are told per kind of window, never left out."""
    return _stretches(samples, min_us, lambda prev, cur: prev.in_flight == 0 and cur.in_flight == 0,
                      end_at_next=False)


def _stretches(samples: Sequence[DiskSample], min_us: int, still: Callable[[DiskSample, DiskSample], bool], *,
               end_at_next: bool) -> list[tuple[int, int]]:
    """The runs of consecutive samples with no completion between them and ``still(prev, cur)``,
    lasting ``min_us`` or more: from the sample before the first to the last (or, with
    ``end_at_next``, to the first sample after the run)."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    last = None
    for prev, cur in itertools.pairwise(samples):
        if cur.done == prev.done and still(prev, cur):
            if start is None:
                start = prev.t_us
            last = cur.t_us
        elif start is not None and last is not None:
            if last - start >= min_us:
                out.append((start, cur.t_us if end_at_next else last))
            start = None
    if start is not None and last is not None and last - start >= min_us:
        out.append((start, last))
    return out


def outside(samples: Sequence[tuple[int, float]], frozen: Sequence[tuple[int, int]]
            ) -> tuple[list[tuple[int, float]], int]:
    """The (µs at, ms it took) samples whose span overlaps no freeze, and how many did."""
    kept = [(at, ms) for at, ms in samples
            if not any(at <= end and at + ms * 1000.0 >= start for start, end in frozen)]
    return kept, len(samples) - len(kept)


def per_window(frozen: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> int:
    """How many freezes began in one of ``spans`` ([from, to) in µs)."""
    return sum(any(a <= start < b for a, b in spans) for start, _end in frozen)


def device_of(folder: Path) -> str | None:
    """The /proc/diskstats name of the device holding ``folder``, or None (not a block device:
    tmpfs, overlay)."""
    st = os.stat(folder)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    with contextlib.suppress(OSError):
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if len(f) > 12 and (int(f[0]), int(f[1])) == (major, minor):
                return f[2]
    return None


def read(device: str) -> DiskSample | None:
    """The device's counters now (None when it is not listed)."""
    from ordq.drills.workload import now_us

    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if len(f) > 12 and f[2] == device:
            # reads, writes completed (fields 4 and 8); discards and flushes (15 and 19) where listed
            done = int(f[3]) + int(f[7]) + sum(int(f[i]) for i in (14, 18) if i < len(f))
            flushes = (int(f[18]), int(f[19])) if len(f) > 19 else (0, 0)
            return DiskSample(now_us(), done, int(f[11]), int(f[7]), int(f[10]), *flushes)
    return None


class DiskWatch:
    """Reads ``device``'s counters every ``EVERY_S`` in a thread, from ``start`` to ``stop``."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.samples: list[DiskSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-watch", daemon=True)

    def start(self) -> DiskWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                s = read(self.device)
                if s is not None:
                    self.samples.append(s)
            time.sleep(EVERY_S)

    def stop(self, keep: Path | None = None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Stop reading; the freezes and the idle stretches seen. The samples are written to
        ``keep`` (one per line: µs, completed, in flight, writes, ms writing, flushes, ms flushing)."""
        self._stop.set()
        self._thread.join(5)
        if keep is not None:
            with contextlib.suppress(OSError):
                keep.write_text("".join(f"{x.t_us} {x.done} {x.in_flight} {x.writes} {x.write_ms} {x.flushes} "
                                        f"{x.flush_ms}\n" for x in self.samples))
        return stalls(self.samples), idle(self.samples)


@contextlib.contextmanager
def watched(ctx: DrillContext) -> Iterator[None]:
    """Watch the disk under the drill's cluster and its CPU (``cpu_stalls``) while in the block:
    the disk's freezes then in ``ctx.notes["device_stalls"]`` (None: not a block device, not
    watched), the CPU's stalls in ``ctx.notes["cpu_stalls"]``, for ``leave_out``."""
    device = device_of(ctx.cluster.folder)
    disk = DiskWatch(device).start() if device is not None else None
    cpu = cpu_stalls.CpuProbe(ctx.run_dir / "cpu-stalls.txt")
    try:
        yield
    finally:
        ctx.notes["device_stalls"], ctx.notes["device_idle"] = (
            disk.stop(ctx.run_dir / "disk-samples.txt") if disk is not None else (None, None))
        ctx.notes["device"] = device
        ctx.notes["cpu_stalls"], ctx.notes["cpu_late_wakeups"] = cpu.stop(MIN_STALL_US)
        ctx.notes["cpu_probe_group"] = cpu.group


def _told(what: str, how: str, stalls: Sequence[tuple[int, int]], kinds: dict[str, list[tuple[int, int]]]) -> str:
    longest = max((b - a for a, b in stalls), default=0) / 1000
    return (f"{what} {len(stalls)} times ({how}; the longest {longest:.0f} ms): "
            + ", ".join(f"{name} {per_window(stalls, spans)} in {sum(b - a for a, b in spans) / 1e6:.0f} s"
                        for name, spans in kinds.items()))


def leave_out(ctx: DrillContext, series: dict[str, list[tuple[int, float]]],
              kinds: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, float]]]:
    """Each of ``series`` ((µs at, ms it took) samples) without those in flight during a freeze
    of the disk or a stall of the CPU seen by ``watched``, and an event telling them per kind of
    window (``kinds``: name -> its [from, to) spans in µs) and how many samples were left out; as
    given when neither was watched (said too)."""
    frozen, cpu = ctx.notes.get("device_stalls"), ctx.notes.get("cpu_stalls")
    unwatched = f"the disk under the cluster was not watched ({ctx.notes.get('device') or 'no block device'})"
    if frozen is None and cpu is None:
        ctx.event(f"{unwatched}, nor its CPU: no sample left out")
        return series
    told = []
    if frozen is None:
        told.append(unwatched)
    else:
        told.append(_told(f"the disk under the cluster ({ctx.notes.get('device')}) froze",
                          f"I/O in flight, none done for {MIN_STALL_US // 1000} ms or more", frozen, kinds))
        told.append(_told("it sat idle under the stream (told, kept)",
                          f"nothing in flight, none done for {MIN_STALL_US // 1000} ms or more",
                          ctx.notes.get("device_idle") or [], kinds))
    if cpu is not None:
        told.append(_told(f"the CPU stalled the cluster's group ({ctx.notes.get('cpu_probe_group', '?')})",
                          f"a sleeper in it woke {MIN_STALL_US // 1000} ms late or more", cpu, kinds)
                    + f"; {ctx.notes.get('cpu_late_wakeups', 0)} times {cpu_stalls.MIN_LATE_MS:g}-"
                      f"{MIN_STALL_US // 1000} ms late (kept)")
    out, left = {}, []
    for what, samples in series.items():
        out[what], n = outside(samples, [*(frozen or []), *(cpu or [])])
        left.append(f"{n} {what}s")
    ctx.event("; ".join(told) + f"; in flight during one, left out of both sides: {', '.join(left)}")
    return out

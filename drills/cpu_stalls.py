"""Stalls of the CPU under a drill's cluster: moments when a process in the cluster's CPU group
that only sleeps (``EVERY_S`` at a time) woke at least ``MIN_LATE_MS`` late. The
security-control-plane and noisy-neighbour drills run one such probe beside their cluster over
their windows (``device_stalls.watched``) and treat a stall of ``device_stalls.MIN_STALL_US`` as
they treat a freeze of the disk: the samples in flight during one are left out of both sides of
their latency ratios, and each kind of window's stalls are told (``device_stalls.leave_out``).

Why (stop 65; stop 64's acceptance runs): beside six busy loops one stretch of a few hundred ms
in which a window's acks all waited set that window's p99, in quiet windows (315 ms) as in
attacked ones (237 ms), and decided a round. The disk had not frozen. A sleeper in the group with
the highest ``cpu.shares`` is woken at once by CFS whatever its group's other threads do (it has
slept: its virtual runtime is behind theirs), so when it wakes 100 ms late the machine did not
run the cluster's group: the hypervisor took the CPU (steal), or the kernel did. Those are the
machine's, like the disk's freezes; an attack that made them would show as more stalls in its
windows than in the quiet ones, and the counts per kind of window are in every run's output.

Run as a script (``python cpu_stalls.py OUT SECONDS PARENT_PID``) with the standard library only: the probe
process holds nothing of ordq, so its own pauses are the machine's. ``CpuProbe`` starts and stops
it; ``read_stalls`` is pure over its output.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

EVERY_S = 0.005  # how long the probe sleeps each time
MIN_LATE_MS = 20.0  # a wake-up at least this late is written down (those of MIN_STALL_US are left out)
MAX_S = 4 * 3600.0  # the probe's own bound in time (it also ends when its drill is gone)


def probe(out: Path, seconds: float, parent: int) -> None:
    """Sleep ``EVERY_S`` at a time for ``seconds`` (or until killed), writing each wake-up at
    least ``MIN_LATE_MS`` late as ``<from µs> <to µs>`` (wall clock, the drills' ``now_us``): the
    stretch in which the process should have run and did not. It ends when ``parent`` (the
    drill) is no longer its parent, even one killed with SIGKILL before the probe began: nothing
    of a drill outlives it."""
    end = time.monotonic() + seconds
    with out.open("a", buffering=1) as f:
        f.write(f"# probing every {EVERY_S * 1e3:g} ms\n")
        # Late from the last wake-up, not from the start of this sleep: a stop that fell between
        # a wake-up and the next sleep (the loop's own steps, longer on a loaded machine) was
        # inside no measured span, and went unwritten (the loaded tier, stop 96).
        last = time.time_ns() // 1000
        while time.monotonic() < end and os.getppid() == parent:
            time.sleep(EVERY_S)
            now = time.time_ns() // 1000
            if now - last >= EVERY_S * 1e6 + MIN_LATE_MS * 1000:
                f.write(f"{last + int(EVERY_S * 1e6)} {now}\n")
            last = now


def read_stalls(text: str, min_us: int) -> tuple[list[tuple[int, int]], int]:
    """The stalls ``[from, to]`` in µs of at least ``min_us`` in the probe's output, and how many
    shorter late wake-ups it wrote down (told, not left out). A torn last line is skipped."""
    long, short = [], 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            continue
        a, b = int(parts[0]), int(parts[1])
        if b - a >= min_us:
            long.append((a, b))
        else:
            short += 1
    return long, short


class CpuProbe:
    """The probe process, started in this process's CPU group (the drills put themselves in the
    cluster's), writing to ``out``."""

    def __init__(self, out: Path) -> None:
        from ordq.drills.cpu_isolation import cgroup_of  # here: the script's own run imports no ordq

        self.out = out
        self.group = cgroup_of() or "?"  # its children, the probe among them, start in it
        out.write_text("")
        self._proc = subprocess.Popen([sys.executable, "-I", __file__, str(out), str(MAX_S), str(os.getpid())],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def probing(self) -> bool:
        """Whether the probe has begun its loop (its first line written)."""
        with contextlib.suppress(OSError):
            return self.out.read_text().startswith("# probing")
        return False

    def stop(self, min_us: int) -> tuple[list[tuple[int, int]], int]:
        """Stop the probe; the stalls of at least ``min_us`` and the count of shorter ones."""
        self._proc.kill()
        self._proc.wait(10)
        try:
            return read_stalls(self.out.read_text(), min_us)
        except OSError:
            return [], 0


if __name__ == "__main__":
    probe(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))

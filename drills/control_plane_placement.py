"""Where the ``security-control-plane`` drill's attacker runs (drills/control_plane.py), and what
that costs the machine: the attacker placed as a host of its own (one CPU, a low cgroup weight),
and each process's CPU use, wait for a CPU and context switches per kind of window
(``CpuUse``), read from /proc.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from ordq.drills import neighbour
from ordq.drills.cpu_isolation import CpuIsolation

# The leading coordinator apart (a round's variant ``/apart``, control_plane_plan): in a cgroup of
# its own at this weight, 8x below the cluster's and 4x above the attacker's. In production the
# coordinators run on hosts of their own, so what an attack costs the leader's CPU is not taken
# from the brokers'; on one machine the nearest is that a broker, a producer or ZooKeeper wanting
# a CPU always gets it before the leader does. The leader still gets what they leave (~0.5 of the
# 2 cores beside six busy loops, stop o: it used 0.23-0.32).
LEADER_SHARES = 32768
LEADER_GROUP = "leader"
CLUSTER_GROUP = "protected"  # neighbour.isolate's group of the cluster and the drill's clients


def place_leader(iso: CpuIsolation, pid: int, apart: bool) -> None:
    """Put the leading coordinator ``pid`` for a round: apart (its own group at ``LEADER_SHARES``,
    made at the first need) or in the cluster's group."""
    if apart and LEADER_GROUP not in iso.groups:
        iso.group(LEADER_GROUP, shares=LEADER_SHARES)
    iso.add(LEADER_GROUP if apart else CLUSTER_GROUP, [pid])


def thread_waits(pid: int) -> dict[int, int]:
    """Nanoseconds each live thread of ``pid`` has waited for a CPU while runnable (the second
    field of /proc/<pid>/task/<tid>/schedstat, ``run_delay``); empty when it is gone."""
    out: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[int(task.name)] = int((task / "schedstat").read_text().split()[1])
    return out


def thread_switches(pid: int) -> int:
    """Context switches of ``pid``'s live threads so far, voluntary (a wait: each call's hand-offs
    between gRPC's threads, a worker and ZooKeeper's) and not (preempted); 0 when it is gone."""
    n = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                n += sum(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                         if "ctxt_switches" in line)
    return n


def page_faults(pid: int) -> int:
    """Page faults of ``pid`` so far, minor and major (/proc/<pid>/stat; 0 when it is gone): each
    page of memory it touched for the first time is one (stop m's guess: a huge request's fresh
    memory slowed the cluster)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[7]) + int(fields[9])
    return 0


def waited_s(before: dict[int, int], after: dict[int, int]) -> float:
    """Seconds the threads of ``after`` waited for a CPU since ``before`` (a thread that ended
    meanwhile is not counted: a lower bound)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9


class CpuUse:
    """The CPU each process used (cores), how long its threads waited for one while runnable
    (ms per s: the scheduler's ``run_delay``, summed over threads), and how often they switched
    (per s: each a thread going to sleep or preempted), and its page faults (per s), per kind of
    window (``neighbour.cpu_seconds``, ``thread_waits``, ``thread_switches``, ``page_faults``)."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = {k: v for k, v in pids.items() if v is not None}
        self.wall: dict[str, float] = {}
        self.used: dict[str, dict[str, float]] = {}
        self.waited: dict[str, dict[str, float]] = {}
        self.switched: dict[str, dict[str, float]] = {}
        self.faulted: dict[str, dict[str, float]] = {}

    def _waits(self) -> dict[str, dict[int, int]]:
        return {name: thread_waits(pid) for name, pid in self.pids.items()}

    def _switches(self) -> dict[str, int]:
        return {name: thread_switches(pid) for name, pid in self.pids.items()}

    def _faults(self) -> dict[str, int]:
        return {name: page_faults(pid) for name, pid in self.pids.items()}

    @contextlib.contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        t0, c0, w0, s0 = time.monotonic(), neighbour.cpu_seconds(dict(self.pids)), self._waits(), self._switches()
        f0 = self._faults()
        try:
            yield
        finally:
            c1, w1, s1, f1 = neighbour.cpu_seconds(dict(self.pids)), self._waits(), self._switches(), self._faults()
            self.wall[kind] = self.wall.get(kind, 0.0) + time.monotonic() - t0
            use = self.used.setdefault(kind, {})
            for k in c1:
                if k in c0:
                    use[k] = use.get(k, 0.0) + c1[k] - c0[k]
            waited = self.waited.setdefault(kind, {})
            for k in w1:
                waited[k] = waited.get(k, 0.0) + waited_s(w0.get(k, {}), w1[k])
            for counted, before, after in ((self.switched, s0, s1), (self.faulted, f0, f1)):
                per = counted.setdefault(kind, {})
                for k in after:
                    per[k] = per.get(k, 0.0) + max(0, after[k] - before.get(k, 0))

    def __str__(self) -> str:
        return "; ".join(f"{kind}: " + ", ".join(f"{k} {v / self.wall[kind]:.2f}" for k, v in use.items())
                         for kind, use in self.used.items())

    def waits(self) -> str:
        """Each process's threads' wait for a CPU, ms per s of window, per kind of window."""
        return self._per_s(self.waited, 1000)

    def switches(self) -> str:
        """Each process's threads' context switches per s of window, per kind of window."""
        return self._per_s(self.switched, 1)

    def faults(self) -> str:
        """Each process's page faults per s of window, per kind of window."""
        return self._per_s(self.faulted, 1)

    def per_call(self, name: str, calls: int) -> str:
        """``name``'s context switches per s, quiet and attacked, and how many more per call the
        attacker had answered meanwhile (``calls``, over every attack window)."""
        quiets = [k for k in self.wall if k.startswith("quiet")]  # "quiet", or one of a kind ("quiet apart")
        attacked = [k for k in self.wall if k not in quiets]
        quiet_s, attacked_s = sum(self.wall[k] for k in quiets), sum(self.wall[k] for k in attacked)
        if not quiet_s or not attacked_s or not calls:
            return f"{name}: no quiet or attack window measured, or no call answered"
        quiet = sum(self.switched[k].get(name, 0.0) for k in quiets) / quiet_s
        during = sum(self.switched[k].get(name, 0.0) for k in attacked) / attacked_s
        rate = calls / attacked_s
        return (f"the attacker's calls answered: {calls} in {attacked_s:.1f} s of attack windows ({rate:.0f}/s); "
                f"{name}'s context switches {quiet:.0f}/s quiet, {during:.0f}/s attacked: "
                f"{(during - quiet) / rate:.1f} more per attacker call")

    def _per_s(self, of: dict[str, dict[str, float]], scale: float) -> str:
        return "; ".join(f"{kind}: " + ", ".join(f"{k} {scale * v / self.wall[kind]:.0f}" for k, v in per.items())
                         for kind, per in of.items())

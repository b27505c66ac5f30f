"""CPU isolation of a drill's processes with the cgroup v1 ``cpu`` controller, as separate hosts
would give it (the noisy-neighbour drill, issue 25).

On a small machine with no idle CPU, any extra work slows every process, so a latency ratio
judges the machine rather than the broker. With the controller writable (root, cgroup v1
``cpu`` at ``/sys/fs/cgroup/cpu``) a drill makes child groups of the hierarchy's root:

- ``protected``: the cluster and the drill's clients, with the highest ``cpu.shares``, so that
  busy loops and other work in the root group cannot take their CPU away;
- ``capped``: the abuser's client, under a CPU quota (its own small "host"), at ``ATTACKER_SHARES``
  (32x below the cluster's, still above busy loops) and on one CPU (``attacker_cpus``): it gets its
  quota beside busy loops, but only CPU the cluster does not want.

The disk's flusher: the kernel's ``writeback`` workqueue runs in the root group at nice 0, so a
placed attacker's group (``ATTACKER_SHARES``, 8x a nice-0 thread's weight) outranks it on the CPU
they share, and a flusher preempted between putting pages under writeback and submitting them
holds every broker's fdatasync on those pages with the disk idle (stop 65: "idle stretches" of
100-483 ms, the long ones only in attack windows). On hosts of their own the brokers' kernel does
not compete with a tenant, so ``FlusherPriority`` raises that workqueue to ``FLUSHER_NICE`` for
the run (its weight above every group but the cluster's) and puts the value found back after;
``ORDQ_DRILL_FLUSHER_NICE=keep`` leaves it alone (a measurement's control).

The JVMs' JIT compilers: ZooKeeper compiles in threads of its own at nice 19
(ordq/zk_server.py), CPU the cluster can do without. Inside ``protected`` a thread's nice
weighs only against its group's other threads: the group as a whole still outranks every
root-group thread, the kernel's own included, while any of its threads can run. So ZooKeeper's
C2 compiler, busy for 100-300 ms at a time for a minute after a new kind of traffic, stalled
the drill queue's acks (stop 73: clusters of 100-800 acks of 50-400 ms in the control-plane
drill's first rounds, each with the compiler threads of the three ZooKeeper nodes at 5-27 ticks
a 100 ms sample, and the root group's sampler not run for up to 300 ms). ``leave_compilers``
puts those threads back in the root group, where nice 19 means what it says: as on hosts of
their own, a JVM compiles in the CPU nobody else wants.

Every group is named ``ordq-drill-<owner pid>-<owner start time>-<name>``, and so is the flusher's
mark (a file in ``MARKS`` holding the value found). ``close`` moves its
processes back to the root group and removes it; a group or mark whose owner is gone (a drill
killed with SIGKILL) is swept by the next ``open_isolation``. Where the controller is not there or not
writable, ``open_isolation`` returns None and the reason: the drill then says it runs without
isolation.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PREFIX = "ordq-drill-"
MAX_SHARES = 262_144  # the kernel's ceiling for cpu.shares (v1)
PERIOD_US = 100_000
# A hand-made client "placed" as a host of its own: the control-plane drill's attacker and the
# noisy-neighbour drill's abuser. Why placed (stop g; docs/SECURITY.md, "Where the attacker runs"):
# the attacker is a client, on another host in production, so its own CPU is not the cluster's to
# defend. Under the quota alone its ~80 threads run on both cores at once in bursts and take CPU a
# host of its own would never take (stop f: pinned, the neighbour's Commit p99 1.29x quiet in one
# round, unpinned 2.5-3.1x, with as many calls answered). On one CPU it still takes up to half of one of the
# cluster's two cores: a harsher neighbour than a separate host. The ``unplaced`` windows keep
# the figure of the attacker on every CPU in every run's output, so nothing is hidden.
#
# Why placed also means a lower weight (stop h): a placed attacker at the cluster's cpu.shares
# still took its CPU from the cluster's processes on that CPU, and the drill queue's produce
# acks felt it whatever it sent: a ``hog`` window (a spinning thread, no call at all, ~0.2 core)
# was 2.6-2.8x its quiet window, the ``huge`` windows (~0.23 core, spent copying each 200 MiB
# request in the attacker's own gRPC client) up to 2.4x, while the flood and the targeted
# attacks (~0.05 core of the attacker's, and the leader's CPU up by 0.1) were 0.2-1.4x and an
# ``idle`` window 1.1x (docs/BENCHMARKS.md, stop h). At ``ATTACKER_SHARES`` the attacker runs on
# CPU the cluster does not want (32x less weight), still ahead of the six busy loops.
ATTACKER_SHARES = 8192
FLUSHER = Path("/sys/bus/workqueue/devices/writeback/nice")
FLUSHER_NICE = -20  # weight 88,761: above the attacker's group and the busy loops, below the cluster's
FLUSHER_ENV = "ORDQ_DRILL_FLUSHER_NICE"  # a nice value, or "keep"
MARKS = Path("/run")
FLUSHER_MARK = "flusher"


def cgroup_of(pid: int | str = "self") -> str | None:
    """The process's group of the cgroup v1 ``cpu`` controller (``/`` is the root), or None when
    it is gone or no such controller is listed."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _n, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the
    pid it names one process, even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(name: str) -> bool:
    parts = name[len(PREFIX):].split("-", 2)
    if len(parts) < 3 or not parts[0].isdigit():
        return True  # not ours to judge: leave it
    return _start_time(int(parts[0])) == parts[1]


COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre")  # HotSpot's thread names, cut at 15 bytes


def compiler_threads(pid: int) -> list[int]:
    """The ids of process ``pid``'s JIT compiler threads (none for a process that is not a JVM,
    or is gone)."""
    out = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "comm").read_text().startswith(COMPILER_THREADS):
                    out.append(int(task.name))
    return out


def _procs(group: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    return []


def _move(pid: int, group: Path) -> bool:
    """Put process ``pid`` (all its threads) in ``group``; False if it has exited."""
    try:
        (group / "cgroup.procs").write_text(str(pid))
    except ProcessLookupError:
        return False
    except OSError as exc:
        if exc.errno == 3:  # ESRCH
            return False
        raise
    return True


def _remove(group: Path, root: Path) -> bool:
    """Move what is left in ``group`` to ``root`` and remove it (a few tries: a process may fork
    while it is moved)."""
    for _ in range(20):
        for pid in _procs(group):
            with contextlib.suppress(OSError):
                _move(pid, root)
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.05)
    return False


def set_shares(group: Path, shares: int) -> None:
    """Give ``group`` this ``cpu.shares`` (its weight against the others: a measurement's knob)."""
    (group / "cpu.shares").write_text(str(shares))


def set_cpus(pid: int, cpus: set[int]) -> int:
    """Let every thread of process ``pid`` run only on ``cpus`` (``sched_setaffinity`` per thread:
    the call sets one; a thread started later inherits its starter's). Returns how many threads
    were set (0: the process is gone). Twice over, for a thread started during the first pass."""
    n = 0
    for _ in range(2):
        n = 0
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
                    os.sched_setaffinity(int(task.name), cpus)
                    n += 1
    return n


def sweep(root: Path = CPU_ROOT) -> list[str]:
    """Remove the drill groups whose owner process is gone; returns their names."""
    out = []
    with contextlib.suppress(OSError):
        for d in sorted(root.glob(PREFIX + "*")):
            if d.is_dir() and not _owner_alive(d.name) and _remove(d, root):
                out.append(d.name)
    return out


def _marks(marks: Path) -> list[Path]:
    return sorted(marks.glob(f"{PREFIX}*-{FLUSHER_MARK}"))


def _live_marks(marks: Path) -> list[Path]:
    return [m for m in _marks(marks) if _owner_alive(m.name)]


def _read_nice(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _put_back(mark: Path, flusher: Path, marks: Path) -> bool:
    """Remove ``mark``; when no live drill holds the flusher any more, write back the value it
    found. True if the value was written."""
    found = _read_nice(mark)
    mark.unlink(missing_ok=True)
    if found is None or _live_marks(marks):
        return False
    flusher.write_text(str(found))
    return True


class FlusherPriority:
    """The disk flusher's nice for one drill run (see the module's doc): ``raise_to(nice)``,
    ``restore()``. Its mark holds the value the first live drill found, so that drills that
    overlap put back the machine's value, not each other's."""

    def __init__(self, stem: str, flusher: Path = FLUSHER, marks: Path = MARKS) -> None:
        self.flusher, self.marks = flusher, marks
        self.mark = marks / f"{stem}{FLUSHER_MARK}"

    def raise_to(self, nice: int) -> str:
        """Set the flusher's nice; returns what was done, in words."""
        live = [v for v in map(_read_nice, _live_marks(self.marks)) if v is not None]
        found = live[0] if live else _read_nice(self.flusher)
        if found is None:
            raise OSError(f"cannot read {self.flusher}")
        self.mark.write_text(str(found))
        self.flusher.write_text(str(nice))
        return f"the disk's flusher (writeback workqueue) at nice {nice} for the run (the machine's value: {found})"

    def restore(self) -> None:
        _put_back(self.mark, self.flusher, self.marks)  # no mark (never raised): nothing written


def sweep_flusher(flusher: Path = FLUSHER, marks: Path = MARKS) -> list[str]:
    """Remove the flusher marks whose owner is gone, putting the value they found back when no
    live drill holds the flusher; returns their names."""
    out = []
    with contextlib.suppress(OSError):
        for mark in _marks(marks):
            if not _owner_alive(mark.name):
                _put_back(mark, flusher, marks)
                out.append(mark.name)
    return out


def unavailable(root: Path = CPU_ROOT) -> str | None:
    """Why the cpu controller cannot be used here, or None."""
    if not (root / "cpu.shares").exists() or not (root / "cgroup.procs").exists():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK) or not os.access(root / "cgroup.procs", os.W_OK):
        return f"{root} is not writable by this user (uid {os.getuid()}): not root"
    return None


class CpuIsolation:
    """The cgroups of one drill run: ``group(name, shares, quota_cores)``, ``add(name, pids)``,
    ``close()`` (also as a context manager)."""

    def __init__(self, root: Path = CPU_ROOT, flusher: Path = FLUSHER, marks: Path = MARKS) -> None:
        self.root = root
        me = os.getpid()
        self._stem = f"{PREFIX}{me}-{_start_time(me)}-"
        self.groups: dict[str, Path] = {}
        self.flusher = FlusherPriority(self._stem, flusher, marks)

    def raise_flusher(self, setting: str | None = None) -> str:
        """The disk flusher's priority for the run: ``setting`` (default: ``$ORDQ_DRILL_FLUSHER_NICE``,
        else ``FLUSHER_NICE``) is a nice value or ``keep``. Returns what was done, in words; a
        flusher that cannot be set is said, not raised (the drill runs on, and says it)."""
        setting = setting if setting is not None else os.environ.get(FLUSHER_ENV, str(FLUSHER_NICE))
        if setting == "keep":
            return f"the disk's flusher left at the machine's nice ({FLUSHER_ENV}=keep)"
        try:
            return self.flusher.raise_to(int(setting))
        except ValueError:
            raise ValueError(f"{FLUSHER_ENV} must be a nice value (-20..19) or keep, not {setting!r}") from None
        except OSError as exc:
            return f"the disk's flusher left at the machine's nice (cannot set it: {exc})"

    def group(self, name: str, *, shares: int = MAX_SHARES, quota_cores: float | None = None) -> Path:
        path = self.root / (self._stem + name)
        path.mkdir(exist_ok=True)
        self.groups[name] = path
        (path / "cpu.shares").write_text(str(shares))
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        quota = -1 if quota_cores is None else max(1000, int(quota_cores * PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(quota))
        return path

    def add(self, name: str, pids: list[int | None]) -> int:
        """Move the processes in ``pids`` (None and exited ones skipped) to group ``name``;
        returns how many were moved."""
        return sum(_move(pid, self.groups[name]) for pid in pids if pid is not None)

    def leave_compilers(self, pids: list[int | None]) -> int:
        """Put the JIT compiler threads of the processes in ``pids`` (JVMs: ZooKeeper) back in the
        root group, the rest of each process staying where it is (cgroup v1 moves a thread by
        its id in ``tasks``); returns how many were moved. See the module's doc."""
        moved = 0
        for pid in pids:
            if pid is None:
                continue
            for tid in compiler_threads(pid):
                with contextlib.suppress(OSError):  # it ended meanwhile
                    (self.root / "tasks").write_text(str(tid))
                    moved += 1
        return moved

    def close(self) -> list[str]:
        """Every group's processes back to the root group, the groups removed; returns the
        names that could not be removed (swept by a later run)."""
        with contextlib.suppress(OSError):
            self.flusher.restore()
        return [p.name for p in self.groups.values() if not _remove(p, self.root)]

    def __enter__(self) -> CpuIsolation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_isolation(root: Path = CPU_ROOT, flusher: Path = FLUSHER,
                   marks: Path = MARKS) -> tuple[CpuIsolation | None, str]:
    """Sweep stale drill groups and flusher marks, then a new ``CpuIsolation`` and what was done,
    or None and why not."""
    why = unavailable(root)
    if why is not None:
        return None, why
    swept = sweep(root) + sweep_flusher(flusher, marks)
    iso = CpuIsolation(root, flusher, marks)
    try:
        probe = iso.group("probe")
    except OSError as exc:
        iso.close()
        return None, f"cannot make a cgroup under {root}: {exc}"
    _remove(probe, root)
    del iso.groups["probe"]
    return iso, f"cgroup v1 cpu controller at {root}" + (f" (swept stale groups {swept})" if swept else "")


def attacker_cpus() -> tuple[set[int], set[int]]:
    """(the one CPU a placed attacker runs on: the last this process may use; every CPU it may
    use). On a machine of one CPU both are that CPU."""
    every = os.sched_getaffinity(0)
    return {max(every)}, set(every)

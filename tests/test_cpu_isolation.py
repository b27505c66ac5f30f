"""ordq.drills.cpu_isolation: the noisy-neighbour drill's cgroups are made, hold the processes put in
them, and are always removed (by ``close``, or by the next run's sweep when the owner died); the
disk flusher's priority is raised for a run and the machine's value always put back (the flusher
tests write a file of their own, not the kernel's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ordq.drills import cpu_isolation as ci


def test_unavailable_says_why(tmp_path: Path) -> None:
    assert "no cgroup v1 cpu controller" in (ci.unavailable(tmp_path) or "")


def _flusher(tmp_path: Path, value: str = "0") -> tuple[Path, Path]:
    flusher, marks = tmp_path / "nice", tmp_path / "marks"
    flusher.write_text(value + "\n")
    marks.mkdir()
    return flusher, marks


def _stem(pid: int) -> str:
    return f"{ci.PREFIX}{pid}-{ci._start_time(pid)}-"


def test_the_flusher_is_raised_for_a_run_and_put_back(tmp_path: Path) -> None:
    flusher, marks = _flusher(tmp_path, "3")
    mine = ci.FlusherPriority(_stem(os.getpid()), flusher, marks)
    assert "at nice -20" in mine.raise_to(-20) and "machine's value: 3" in mine.raise_to(-20)
    assert flusher.read_text() == "-20"
    mine.restore()
    assert flusher.read_text() == "3"
    assert list(marks.iterdir()) == []


def test_overlapping_drills_put_back_the_machines_value(tmp_path: Path) -> None:
    flusher, marks = _flusher(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = ci.FlusherPriority(_stem(os.getpid()), flusher, marks)
        second = ci.FlusherPriority(_stem(other.pid), flusher, marks)
        first.raise_to(-20)
        assert "machine's value: 0" in second.raise_to(-10)  # not the first drill's -20
        first.restore()
        assert flusher.read_text() == "-10"  # the second still runs
        second.restore()
        assert flusher.read_text() == "0"
    finally:
        other.kill()
        other.wait()


def test_a_killed_drills_flusher_is_put_back_by_the_next_sweep(tmp_path: Path) -> None:
    flusher, marks = _flusher(tmp_path)
    code = ("import os, sys, time\nfrom pathlib import Path\nfrom ordq.drills import cpu_isolation as ci\n"
            "me = os.getpid()\n"
            "ci.FlusherPriority(f'{ci.PREFIX}{me}-{ci._start_time(me)}-', Path(sys.argv[1]), Path(sys.argv[2]))"
            ".raise_to(-20)\nprint('raised', flush=True)\ntime.sleep(60)\n")
    drill = subprocess.Popen([sys.executable, "-c", code, str(flusher), str(marks)], stdout=subprocess.PIPE, text=True)
    try:
        assert drill.stdout is not None and drill.stdout.readline() == "raised\n"
        assert ci.sweep_flusher(flusher, marks) == []  # its owner lives: left alone
        assert flusher.read_text() == "-20"
    finally:
        drill.kill()  # SIGKILL: no finally of its own runs
        drill.communicate()
    swept = ci.sweep_flusher(flusher, marks)
    assert len(swept) == 1 and swept[0].startswith(f"{ci.PREFIX}{drill.pid}-")
    assert flusher.read_text() == "0"
    assert list(marks.iterdir()) == []


def test_the_flusher_setting_keep_bad_and_unwritable(tmp_path: Path) -> None:
    flusher, marks = _flusher(tmp_path)
    iso = ci.CpuIsolation(tmp_path, flusher, marks)
    assert "ORDQ_DRILL_FLUSHER_NICE=keep" in iso.raise_flusher("keep")
    assert flusher.read_text() == "0\n"
    with pytest.raises(ValueError, match="ORDQ_DRILL_FLUSHER_NICE must be a nice value"):
        iso.raise_flusher("high")
    gone = ci.CpuIsolation(tmp_path, tmp_path / "no-such-dir" / "nice", marks)
    assert "cannot set it" in gone.raise_flusher("-20")
    assert list(marks.iterdir()) == []


needs_cgroups = pytest.mark.skipif(ci.unavailable() is not None, reason=f"{ci.unavailable()}")


@needs_cgroups
def test_groups_hold_processes_and_are_removed() -> None:
    iso, how = ci.open_isolation()
    assert iso is not None, how
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with iso:
            capped = iso.group("capped", quota_cores=0.25)
            assert (capped / "cpu.cfs_quota_us").read_text().strip() == "25000"
            assert iso.add("capped", [child.pid, None]) == 1
            assert ci.cgroup_of(child.pid) == "/" + capped.name
        assert not capped.exists()
        assert ci.cgroup_of(child.pid) == "/"  # back in the root group
    finally:
        child.kill()
        child.wait()


@needs_cgroups
def test_a_dead_owners_groups_are_swept() -> None:
    owner = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    dead = int(owner.stdout)
    stale = ci.CPU_ROOT / f"{ci.PREFIX}{dead}-1-stale"  # start time 1: no live process has it
    stale.mkdir()
    try:
        assert stale.name in ci.sweep()
        assert not stale.exists()
    finally:
        if stale.exists():
            stale.rmdir()
    iso, _ = ci.open_isolation()
    assert iso is not None
    with iso:
        mine = iso.group("mine")
        assert mine.name not in ci.sweep()  # a live owner's group stays
        assert mine.exists()


@needs_cgroups
def test_the_neighbour_drills_abuser_is_placed_as_a_host_of_its_own() -> None:
    """Stop 63: the abuser's client took its CPU at the cluster's weight on both cores (0.2 core
    that a host of its own would never take from the broker); placed, it runs on one CPU in a
    group 32x lighter than the cluster's, as the control-plane drill's attacker does."""
    from ordq.drills import neighbour

    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
                              "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"  # its thread runs
        iso, judgement = neighbour.isolate({})
        assert iso is not None, judgement
        with iso:
            neighbour.place_abuser(iso, child.pid)
            capped, protected = iso.groups["capped"], iso.groups["protected"]
            assert ci.cgroup_of(child.pid) == "/" + capped.name
            assert int((capped / "cpu.shares").read_text()) == ci.ATTACKER_SHARES
            assert int((protected / "cpu.shares").read_text()) == ci.MAX_SHARES >= 32 * ci.ATTACKER_SHARES
            threads = [int(t.name) for t in Path(f"/proc/{child.pid}/task").iterdir()]
            assert len(threads) == 2
            assert all(os.sched_getaffinity(t) == ci.attacker_cpus()[0] for t in threads)
            assert "on one CPU" in judgement
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


@needs_cgroups
@pytest.mark.zk
def test_a_jvms_compiler_threads_are_left_in_the_root_group(make_zk) -> None:  # type: ignore[no-untyped-def]
    """Stop 73: in the cluster's group ZooKeeper's JIT compiler (nice 19) outranked every
    root-group thread, the kernel's own included, while it ran, and the drill queue's acks
    waited; in the root group nice 19 takes only idle CPU. The rest of the JVM stays protected."""
    server = make_zk()
    server.start()
    [st] = server.status()
    assert st.pid is not None
    compilers = ci.compiler_threads(st.pid)
    assert compilers  # C1 at least (the tests' servers stop at tier 1)
    iso, how = ci.open_isolation()
    assert iso is not None, how
    with iso:
        protected = iso.group("protected")
        assert iso.add("protected", [st.pid]) == 1
        assert iso.leave_compilers([st.pid, None]) == len(compilers)
        tasks = [int(t.name) for t in Path(f"/proc/{st.pid}/task").iterdir()]
        assert {tid: ci.cgroup_of(f"{st.pid}/task/{tid}") for tid in compilers} == {tid: "/" for tid in compilers}
        assert {ci.cgroup_of(f"{st.pid}/task/{tid}") for tid in tasks if tid not in compilers} == {"/" + protected.name}
    assert ci.cgroup_of(st.pid) == "/"
    assert ci.compiler_threads(os.getpid()) == []  # not a JVM

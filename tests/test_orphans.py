"""Nothing left running (issue 26): what a test starts dies with it, and leftovers of an owner
that died anyway are swept — only those.

- ``ordq.common.proc.DIE_WITH_PARENT`` (set for the whole test run in conftest.py): children get
  ``PR_SET_PDEATHSIG``; kill -9 of the process that started a ZooKeeper and a broker-like
  child takes them with it, a SIGSTOPped one too.
- ``sweep_orphans``: a detached child (as ``ordq up`` leaves them) of a dead owner whose command
  line names the swept folder is killed; a live owner's child, a process without an owner
  mark and one outside the folder are not.
- ``ordq drill`` ended by SIGTERM, SIGINT or kill -9 leaves none of the processes it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ordq.common.proc
from ordq.common.proc import OWNER_ENV, ManagedProcess, owner_token, sweep_orphans
from tests.cluster import REPO
from tests.util import wait_until

OWNER = """
import sys, time
from pathlib import Path
import ordq.common.proc as proc
from ordq.zk_server import ZkServer

folder, die, with_zk = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
proc.DIE_WITH_PARENT = die
pids = []
if with_zk:
    zk = ZkServer(folder / "zk")
    zk.start(timeout_s=120)
    pids += [p.pid for p in zk.processes]
for name in ("broker", "stopped"):
    p = proc.ManagedProcess(name, [sys.executable, "-c", "import time; time.sleep(600)", str(folder)],
                            run_dir=folder / "run")
    p.start()
    if name == "stopped":
        p.pause()  # a SIGSTOPped child dies too
    pids.append(p.pid)
(folder / "pids.tmp").write_text(" ".join(map(str, pids)))
(folder / "pids.tmp").replace(folder / "pids")
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] in "ZX"


def _start_owner(folder: Path, *, die: bool, with_zk: bool) -> tuple[subprocess.Popen[bytes], list[int]]:
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}  # the owner is the script, not this test
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder), "1" if die else "0", "1" if with_zk else "0"],
                             cwd=REPO, env=env)
    pids_file = folder / "pids"
    wait_until(lambda: pids_file.exists() or owner.poll() is not None, timeout_s=150, interval_s=0.1,
               what="the owner to start its children")
    assert owner.poll() is None, f"the owner exited with {owner.returncode}"
    return owner, [int(p) for p in pids_file.read_text().split()]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.zk
def test_kill_9_of_the_process_that_started_a_cluster_takes_its_children(tmp_path: Path) -> None:
    owner, pids = _start_owner(tmp_path, die=True, with_zk=True)
    try:
        assert len(pids) == 3 and not any(_gone(p) for p in pids)
        owner.kill()
        owner.wait(timeout=30)
        wait_until(lambda: all(_gone(p) for p in pids), timeout_s=30, interval_s=0.05,
                   what="ZooKeeper and the children to die with their owner")
    finally:
        _kill_all(pids)


def test_the_sweep_kills_only_leftovers_of_a_dead_owner_in_its_folders(tmp_path: Path) -> None:
    swept = tmp_path / "swept"
    swept.mkdir()
    owner, orphans = _start_owner(swept, die=False, with_zk=False)  # as `ordq up` leaves them: detached
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    spared = [
        # a live owner's child (this test's) naming the folder
        subprocess.Popen([*sleep, str(swept)], env={**os.environ, OWNER_ENV: owner_token()}),
        # no owner mark at all (someone else's process) naming the folder
        subprocess.Popen([*sleep, str(swept)], env={k: v for k, v in os.environ.items() if k != OWNER_ENV}),
        # a dead owner's, but outside the swept folders
        subprocess.Popen([*sleep, str(tmp_path / "elsewhere")], env={**os.environ, OWNER_ENV: "1:0"}),
    ]
    try:
        owner.kill()
        owner.wait(timeout=30)
        assert not any(_gone(p) for p in orphans)  # detached: they outlive their owner
        killed = sweep_orphans([swept])
        assert sorted(killed) == sorted(orphans)
        wait_until(lambda: all(_gone(p) for p in orphans), timeout_s=30, what="the orphans to die")
        assert all(p.poll() is None for p in spared)
    finally:
        _kill_all(orphans)
        for p in spared:
            p.kill()
            p.wait()


def test_a_child_started_from_a_thread_that_ended_lives_on(tmp_path: Path) -> None:
    """The death signal follows the thread that forked: children are forked by a spawner
    thread that lives as long as the process, not by the (pool) thread that asked."""
    assert ordq.common.proc.DIE_WITH_PARENT  # as conftest.py sets it for the whole run
    p = ManagedProcess("child", [sys.executable, "-c", "import time; time.sleep(1); print('ALIVE', flush=True); "
                                 "time.sleep(600)"], run_dir=tmp_path)
    t = threading.Thread(target=p.start)
    t.start()
    t.join()
    try:
        p.wait_for_line("ALIVE", timeout_s=60)  # ExternalProcessError if it was killed with the thread
    finally:
        p.kill()


STUBBORN = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
            "print('READY', flush=True)\n"
            "time.sleep(600)\n")


def test_stop_finishes_within_seconds_whatever_state_the_process_is_in(tmp_path: Path) -> None:
    """As ``ordq down`` does it (another object, through the pid file): a process that ignores
    SIGTERM, is SIGSTOPped, and has a child of its own that ignores SIGTERM too."""
    p = ManagedProcess("stubborn", [sys.executable, "-c", STUBBORN], run_dir=tmp_path)
    p.start()
    try:
        p.wait_for_line("READY", timeout_s=60)
        pid = p.pid
        assert pid is not None
        group = [int(t) for t in os.listdir("/proc") if t.isdigit() and _pgid(int(t)) == pid]
        assert len(group) == 2
        p.pause()
        other = ManagedProcess("stubborn", [sys.executable, "-c", STUBBORN], run_dir=tmp_path)
        started = time.monotonic()
        other.stop(timeout_s=1.0)
        took = time.monotonic() - started
        wait_until(lambda: all(_gone(q) for q in group), timeout_s=10, what="the process and its child to go")
        # 1 s of grace, then SIGKILL: seconds, not minutes, even on a loaded machine.
        assert took < 15, took
    finally:
        p.kill()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_what_a_test_starts_through_a_cli_that_exits_is_owned_by_the_run() -> None:
    """`ordq up` run by a test exits at once and leaves its servers running for the test: they
    must carry this run as owner (conftest.py), or another run's sweep would kill them."""
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ[{OWNER_ENV!r}])"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == owner_token()


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``ORDQ_OWNER=mark`` (inherited by everything a
    drill started with it starts: ZooKeeper, brokers, coordinators, workloads, the Spark JVM)."""
    want = f"{OWNER_ENV}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in environ and not _gone(int(name)):
            found.append(int(name))
    return found


# The cheapest drill with a cluster of its own: one ZooKeeper, brokers, two coordinators.
DRILL = ["drill", "kill-coordinator", "--messages", "2000", "--rate", "1000", "--seed", "1", "--master", "local[1]"]


@pytest.mark.zk
@pytest.mark.parametrize(("sig", "moment"), [
    (signal.SIGTERM, "load running"),
    pytest.param(signal.SIGKILL, "load running", marks=pytest.mark.slow),  # the death signal: test_kill_9_... above
    pytest.param(signal.SIGINT, "verifying", marks=[pytest.mark.spark, pytest.mark.slow]),
], ids=["sigterm-under-load", "kill-9-under-load", "sigint-while-verifying"])
def test_a_killed_drill_leaves_nothing_running(tmp_path: Path, sig: signal.Signals, moment: str) -> None:
    """Issue 26: SIGTERM did not end ``ordq drill``; after SIGINT its ZooKeeper ran on with
    parent pid 1. Whatever ends it, nothing it started is left, found by an owner mark in the
    environment (not by program name: other runs' servers on this machine are not ours)."""
    mark = f"drill-test-{os.getpid()}-{time.monotonic_ns()}"  # not pid:start, so no sweep ever takes it
    out_path = tmp_path / "drill.out"
    with open(out_path, "wb") as out:
        drill = subprocess.Popen([sys.executable, "-m", "ordq.cli", *DRILL, "--dir", str(tmp_path / "c")], cwd=REPO,
                                 env={**os.environ, OWNER_ENV: mark}, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        wait_until(lambda: moment in out_path.read_text() or drill.poll() is not None, timeout_s=240,
                   interval_s=0.05, what=f"the drill to reach {moment!r}")
        assert drill.poll() is None, out_path.read_text()
        started = _marked(mark)
        assert len(started) >= 9, started  # ZooKeeper, 6 brokers, 2 coordinators (and workloads)
        os.kill(drill.pid, sig)
        drill.wait(timeout=90)
        wait_until(lambda: not _marked(mark), timeout_s=60, interval_s=0.1,
                   what="every process the drill started to end")
        if sig != signal.SIGKILL:
            assert drill.returncode == 128 + sig, out_path.read_text()
            assert "cluster stopped" in out_path.read_text()  # stopped by the drill, not only by the death signal
    finally:
        if drill.poll() is None:
            drill.kill()
            drill.wait()
        _kill_all(_marked(mark))

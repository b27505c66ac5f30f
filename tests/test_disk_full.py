"""A replica's disk really full, under load: real broker processes, one of them on a small
tmpfs that fills (tests/test_log.py simulates ENOSPC inside one process; this is the filesystem
refusing the write).

What must hold (docs/OPERATIONS.md, failure table, "disk full"): the write fails, nothing
half-written is acked or served, the segment is frozen and the producer fails over; every acked
message is delivered once, in order; with space again, the group takes writes again without a
restart. The mount is this test's own, detached in its ``finally`` (lazily, while a
killed process may still hold a file), and a run killed before that is swept by the next.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import FINISH_S, Cluster, cluster_fixture, wait_acked  # noqa: F401 - provides the ``cluster`` fixture
from tests.order_check import check_delivery, read_audit
from tests.util import wait_until


def _cannot_mount() -> str | None:
    """Why no tmpfs can be mounted here (not root, no mount(8), or refused: a container may
    forbid it), or None. Tries one in a temporary folder, and detaches it."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("mount") is None:
        return "no mount(8)"
    with tempfile.TemporaryDirectory() as where:
        tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "ordq-test-probe", where],
                               capture_output=True, text=True, check=False)
        if tried.returncode != 0:
            return f"mount -t tmpfs failed: {tried.stderr.strip()}"
        subprocess.run(["umount", where], check=True)
    return None


_WHY_NOT = _cannot_mount()
pytestmark = [pytest.mark.zk, pytest.mark.skipif(_WHY_NOT is not None, reason=f"needs a tmpfs mount: {_WHY_NOT}")]

FULL_AT = "4m"  # the replica's filesystem: full after ~4,000 of the 1 KiB messages below
N = 10_000
SIZE = 1024
DISK_TEST_SEND_TIMEOUT_S = 30.0


MOUNT_SOURCE = "ordq-test-full-"  # + the pid of the test process that mounted it


def sweep_leftover_mounts() -> list[str]:
    """Detach the small disks of test processes that are gone (killed -9 before their
    ``finally``); return where they were mounted."""
    swept = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        source, where = line.split()[:2]
        if not source.startswith(MOUNT_SOURCE):
            continue
        pid = source.removeprefix(MOUNT_SOURCE)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["umount", "-l", where.replace("\\040", " ")], check=False)
            swept.append(where)
    return swept


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path: Path) -> Iterator[Path]:
    """g1's folder on a tmpfs of ``FULL_AT`` (the cluster keeps ``<tmp_path>/<gid>/<role>``
    under it). Named after this process, so that a later run detaches it if this one was
    killed before its ``finally``."""
    sweep_leftover_mounts()
    where = tmp_path / "g1"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_AT}", f"{MOUNT_SOURCE}{os.getpid()}", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def only_on_small_disk(cluster: Cluster, small_disk: Path, role: str) -> None:
    """Keep g1's other replica on the test's own disk (a symlink out of the tmpfs): only
    ``role``'s folder fills."""
    other = "slave" if role == "master" else "master"
    (cluster.base / f"g1-{other}").mkdir()
    (small_disk / other).symlink_to(cluster.base / f"g1-{other}", target_is_directory=True)


@pytest.mark.parametrize("role", ["master", "slave"])
def test_a_full_disk_fails_the_head_over_and_loses_nothing(cluster: Cluster, small_disk: Path, role: str) -> None:
    only_on_small_disk(cluster, small_disk, role)
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    # A send timeout no loaded machine's ack reaches: the failover is the full disk's (its
    # DiskFull answer fails it over at once), never a late ack's. At the tests' 1 s, beside six
    # busy loops, an ack 1 s late moved the head to g2 before the disk filled (stop 98).
    producer = cluster.producer(n=N, size=SIZE, rate=None, audit_dir=cluster.base / "audit",
                                send_timeout_s=DISK_TEST_SEND_TIMEOUT_S)
    consumer = cluster.consumer(until=N - 1, audit_dir=cluster.base / "audit")
    producer.start()
    consumer.start()
    producer.join(FINISH_S)
    consumer.join(FINISH_S)

    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == N
    acked, instances = read_audit(cluster.base / "audit", "s")
    assert check_delivery(acked, instances) == summary
    stats = producer.stats
    assert stats is not None and stats.failovers >= 1, stats  # off the full group, not a stall
    log = getattr(cluster.groups["g1"], role).log_tail(400)
    assert "no space" in log and "segment frozen" in log, log  # said where the operator looks
    # Still full: the broker says so in its liveness node, and g1 is admitted to no send list.
    # Before, it was made a head again as soon as its segment was read, and failed over again.
    wait_until(lambda: group_row(cluster, "g1")["disk_full"] == [role], timeout_s=30, interval_s=0.1,
               what=f"g1's {role} marked out of disk space")
    assert cluster.ordq("group", "drain", "g1").returncode == 0
    undrained = cluster.ordq("group", "undrain", "g1", "--json")
    assert json.loads(undrained.stdout)["queues"] == [{
        "queue": "q", "admitted": False,
        "why_not": "group g1 has a process whose disk is full (admitted again once it has room)"}], undrained
    assert "g1" not in cluster.state().send
    # Room again (the filesystem grown past the broker's disk_room_bytes) and g2 drained: g1
    # heads the queue and takes writes, with no restart of the process whose write failed.
    subprocess.run(["mount", "-o", "remount,size=96m", str(small_disk)], check=True)
    wait_until(lambda: group_row(cluster, "g1")["disk_full"] == [], timeout_s=30, interval_s=0.1,
               what="g1's mark cleared once it has room")
    wait_until(lambda: "g1" in cluster.state().send, timeout_s=60, interval_s=0.2,
               what="g1 back in the send list once its segment was read")
    drained = cluster.ordq("group", "drain", "g2")
    assert drained.returncode == 0, drained.stderr
    more = cluster.ordq("produce", "q", "--count", "2000", "--size", str(SIZE))
    assert more.returncode == 0 and b"acked 2000 of 2000" in more.stderr, more.stderr
    described = json.loads(cluster.ordq("queue", "describe", "q", "--json").stdout)
    last = described["consume"][-1]
    assert (last["gid"], last["status"], last["last_seq"]) == ("g1", "open", N + 1999), described


def group_row(cluster: Cluster, gid: str) -> dict:
    """``gid``'s row of ``ordq group list --json``."""
    listed = cluster.ordq("group", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return next(row for row in json.loads(listed.stdout) if row["group"] == gid)


def fill(where: Path) -> None:
    """Write zeros into ``where`` until its filesystem refuses more."""
    chunk = bytes(4 << 10)
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_a_new_segment_on_a_full_disk_fails_over_too(cluster: Cluster, small_disk: Path) -> None:
    """The full group is the only one (g2 drained): its failover may open the next segment on
    it again, if the coordinator moves writes on before it reads the broker's disk-full mark.
    Making that segment's files fails, and that too is a failover, not a refusal of the
    producer's request. Seen in the loaded tier (stop 96): such a write was answered "bad
    produce request: [Errno 28] No space left on device" (ConfigError, not retriable), and the
    producer stopped. Once the mark is read, no segment opens on g1: the producer waits. Once
    g2 is back, the stream goes on there."""
    only_on_small_disk(cluster, small_disk, "master")
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    drained = cluster.ordq("group", "drain", "g2")
    assert drained.returncode == 0, drained.stderr
    producer = cluster.producer(n=3000, size=SIZE, rate=500.0, audit_dir=cluster.base / "audit",
                                send_timeout_s=DISK_TEST_SEND_TIMEOUT_S)  # (as above)
    consumer = cluster.consumer(until=2999, audit_dir=cluster.base / "audit")
    producer.start()
    consumer.start()
    wait_acked(producer, 200)
    fill(small_disk)  # segment 0's next write fails; the failover can only open segment 1 on g1
    g1 = cluster.groups["g1"].master
    wait_until(lambda: "disk full (" in g1.log_tail(400) or producer.error is not None,
               timeout_s=30, interval_s=0.1, what="a write refused on the full disk")
    undrained = cluster.ordq("group", "undrain", "g2")
    assert undrained.returncode == 0, undrained.stderr
    producer.join(FINISH_S)
    consumer.join(FINISH_S)

    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == 3000
    assert cluster.state().send[0] == "g2", cluster.state()


def test_a_killed_runs_small_disk_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Guard: ``sweep_leftover_mounts`` (run before every small disk is made) detaches the
    mounts of test processes that are gone, and only those."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left, kept = tmp_path / "left", tmp_path / "kept"
    for where, pid in ((left, dead.pid), (kept, os.getpid())):
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", f"{MOUNT_SOURCE}{pid}", str(where)], check=True)
    try:
        swept = sweep_leftover_mounts()
        assert str(left) in swept and str(kept) not in swept, swept
        assert not os.path.ismount(left) and os.path.ismount(kept)
    finally:
        for where in (left, kept):
            subprocess.run(["umount", "-l", str(where)], check=False)

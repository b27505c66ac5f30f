"""A replica's disk really full, under load: real broker processes, one of them on a small
tmpfs that fills (tests/test_log.py simulates ENOSPC inside one process; this is the filesystem
refusing the write).

What must hold (docs/OPERATIONS.md, failure table, "disk full"): the write fails, nothing
half-written is acked or served, the segment is frozen and the producer fails over; every acked
message is delivered once, in order; with space again, the group takes writes again without a
restart. The mount is this test's own, detached in its ``finally`` (lazily, while a
killed process may still hold a file), so nothing outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import FINISH_S, Cluster, cluster_fixture  # noqa: F401 - provides the ``cluster`` fixture
from tests.order_check import check_delivery, read_audit
from tests.util import wait_until


def _cannot_mount() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("mount") is None:
        return "no mount(8)"
    return None


_WHY_NOT = _cannot_mount()
pytestmark = [pytest.mark.zk, pytest.mark.skipif(_WHY_NOT is not None, reason=f"needs a tmpfs mount: {_WHY_NOT}")]

FULL_AT = "4m"  # the replica's filesystem: full after ~4,000 of the 1 KiB messages below
N = 10_000
SIZE = 1024


@pytest.fixture(name="small_disk")
def small_disk_fixture(tmp_path: Path) -> Iterator[Path]:
    """g1's folder on a tmpfs of ``FULL_AT`` (the cluster keeps ``<tmp_path>/<gid>/<role>``
    under it)."""
    where = tmp_path / "g1"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_AT}", "ordq-test-full", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("role", ["master", "slave"])
def test_a_full_disk_fails_the_head_over_and_loses_nothing(cluster: Cluster, small_disk: Path, role: str) -> None:
    # Only this role's folder on the small disk: the other replica of g1 on the test's own.
    other = "slave" if role == "master" else "master"
    (small_disk / other).symlink_to(cluster.base / f"g1-{other}", target_is_directory=True)
    (cluster.base / f"g1-{other}").mkdir()
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    producer = cluster.producer(n=N, size=SIZE, rate=None, audit_dir=cluster.base / "audit")
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
    # Space again (the filesystem grown) and g2 drained: g1 heads the queue and takes writes, with
    # no restart of the process whose write failed.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    wait_until(lambda: "g1" in cluster.state().send, timeout_s=60, interval_s=0.2,
               what="g1 back in the send list once its segment was read")
    drained = cluster.ordq("group", "drain", "g2")
    assert drained.returncode == 0, drained.stderr
    more = cluster.ordq("produce", "q", "--count", "2000", "--size", str(SIZE))
    assert more.returncode == 0 and b"acked 2000 of 2000" in more.stderr, more.stderr
    described = json.loads(cluster.ordq("queue", "describe", "q", "--json").stdout)
    last = described["consume"][-1]
    assert (last["gid"], last["status"], last["last_seq"]) == ("g1", "open", N + 1999), described

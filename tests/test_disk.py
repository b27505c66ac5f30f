"""Disk is freed on real brokers: the files of segments popped from the consume list (read by
every subscription) go from both replicas, `ordq queue describe` shows bytes per segment and
per group, `queue delete` frees every replica's data, and a queue re-created under the same
name never meets the deleted one's segments (its incarnation tells them apart).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk import Consumer, ConsumerConfig, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - fixture
from tests.util import wait_until

pytestmark = pytest.mark.zk

PAYLOAD = 1024


def produce(cluster: Cluster, n: int, queue: str = "q") -> None:
    with Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue)) as p:
        futures = [p.send(b"%08d" % i + b"x" * (PAYLOAD - 8)) for i in range(n)]
        futures[-1].result(60)


def consume_all(cluster: Cluster, through_seq: int, queue: str = "q",
                until: Callable[[], bool] = lambda: True) -> list[int]:
    """Read through ``through_seq`` and go on polling (the consumer moves past a drained
    sealed segment on its next read) until ``until()``."""
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue, subscription="s",
                         zk_session_timeout_s=CLIENT_SESSION_TIMEOUT_S)
    seqs: list[int] = []
    with Consumer(cfg) as c:
        while not seqs or seqs[-1] < through_seq or not until():
            seqs.extend(m.seq for m in c.poll(timeout_s=0.1))
        c.commit()
    return seqs


def segment_folders(cluster: Cluster, queue: str = "q") -> dict[str, set[int]]:
    """Per replica (g1/master, ...), the segment folders of ``queue`` on its disk."""
    out = {}
    for gid, group in cluster.groups.items():
        for member in (group.master, group.slave):
            qdir = Path(member.data_dir) / queue
            segs = {int(p.name) for p in qdir.iterdir() if p.is_dir()} if qdir.exists() else set()
            out[f"{gid}/{member.role}"] = segs
    return out


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def describe(cluster: Cluster, queue: str = "q") -> dict:
    out = cluster.ordq("queue", "describe", queue, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_consumed_segments_leave_both_replicas_and_describe_shows_bytes(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    cluster.start_daemon("coordinator")  # pops segments every subscription has read
    per_segment = 1500
    for _ in range(4):
        produce(cluster, per_segment)
        out = cluster.ordq("queue", "roll", "q")
        assert out.returncode == 0, out.stderr
    view = describe(cluster)
    sealed = [c for c in view["consume"] if c["status"] == "sealed"]
    assert len(sealed) == 4 and all(c["bytes"] > per_segment * PAYLOAD for c in sealed), view["consume"]
    g1 = next(g for g in view["groups"] if g["group"] == "g1")
    assert g1["bytes"] == sum(c["bytes"] for c in view["consume"] if c["gid"] == "g1")
    master_dir = Path(cluster.groups["g1"].master.data_dir)
    before = folder_bytes(master_dir)
    assert before > 4 * per_segment * PAYLOAD

    # Once the consumer has read every sealed segment (and moved past the last one), they are
    # popped (by the consumer and the daemon) and both replicas of g1 remove their files.
    seqs = consume_all(cluster, 4 * per_segment - 1, until=lambda: len(cluster.state().consume) == 1)
    assert seqs == list(range(4 * per_segment))
    open_seg = cluster.state().consume[0].seg
    wait_until(lambda: segment_folders(cluster)["g1/master"] <= {open_seg}
               and segment_folders(cluster)["g1/slave"] <= {open_seg}, timeout_s=30,
               what=f"only segment {open_seg} left on g1's disks ({segment_folders(cluster)})")
    after = folder_bytes(master_dir)
    assert after < per_segment * PAYLOAD, (before, after)
    print(f"g1 master data folder: {before} bytes before, {after} after the pop")
    assert describe(cluster)["groups"][0]["bytes"] == 0


def test_queue_delete_frees_every_replica_and_a_recreated_queue_starts_clean(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 500)
    assert segment_folders(cluster)["g1/master"] == {0}
    first = cluster.state().incarnation
    assert cluster.ordq("queue", "delete", "q").returncode == 0
    wait_until(lambda: not any((Path(m.data_dir) / "q").exists()
                               for g in cluster.groups.values() for m in (g.master, g.slave)),
               timeout_s=30, what="the deleted queue's folders gone from every replica")

    # The same name again: a new incarnation, whose consumer reads only its own messages.
    cluster.create_queue()
    assert cluster.state().incarnation != first
    produce(cluster, 300)
    assert consume_all(cluster, 299) == list(range(300))


def test_a_replica_down_during_delete_frees_the_old_queue_when_it_starts(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    produce(cluster, 500)
    slave = cluster.groups["g1"].slave
    slave.kill()
    assert cluster.ordq("queue", "delete", "q").returncode == 0
    cluster.create_queue(groups=["g2"])  # same name, another group: g1 is not part of it
    produce(cluster, 200)
    assert (Path(slave.data_dir) / "q" / f"{0:012d}").exists()  # the old copy, while it is down
    cluster.restart(slave)
    assert not (Path(slave.data_dir) / "q").exists()  # freed before it served
    assert consume_all(cluster, 199) == list(range(200))

"""A group that heads many queues dies (issue 43, DESIGN §6 "a group that heads thousands of
queues dies"): real broker processes, a real coordinator process, real ZooKeeper. Both
processes of the head group are killed (-9); the coordinator moves every head off it in
batched transactions, the queue being written first, and its producer goes on on the new head;
when one of its processes returns, the old segments are sealed from it in batches."""

from __future__ import annotations

import pytest

from ordq.common.metrics import value
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import read_metrics, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]  # 39-106 s of real processes on a loaded box: the CI tier

IDLE = 60


def test_killing_a_group_moves_every_head_busy_queue_first(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue("busy", ["g1", "g2"])
    idle = [f"idle-{i:03d}" for i in range(IDLE)]
    created, _ = cluster.store.create_queues(idle, groups=["g1", "g2"])
    assert all(st.head == "g1" for st in created)
    producer = cluster.producer(n=10**6, queue="busy", rate=300.0)
    producer.start()
    # written for longer than a probe interval: the coordinator counts the queue as written
    wait_until(lambda: len(producer.acked) >= 300, timeout_s=60, what="300 acks on the busy queue")
    before = len(producer.acked)
    for member in cluster.groups["g1"].members:
        member.kill()

    def moved() -> bool:
        got = cluster.store.load_states(["busy", *idle])
        return all(not isinstance(v, Exception) and v[0].head == "g2" for v in got.values())

    wait_until(moved, timeout_s=60, interval_s=0.1, what="every head moved off g1")
    wait_until(lambda: len(producer.acked) >= before + 300, timeout_s=60, what="the producer going on on g2")
    # the busy queue's move was written before any idle queue's (its state znode changed
    # first; nothing writes it again: its old segment's replicas are both dead, no seal lands)
    mzxid = {q: cluster.store.client.exists(cluster.paths.state(q)).mzxid for q in ["busy", *idle]}
    assert mzxid["busy"] < min(mzxid[q] for q in idle)
    url = cluster.coordinators[0].wait_for_line("METRICS ", timeout_s=30).split()[-1]
    metrics = read_metrics(url)
    # the idle ones moved in batches, not one write each (a few may have gone alone first)
    assert (value(metrics, "ordq_coordinator_batched_moves_total") or 0) >= IDLE // 2
    assert (value(metrics, "ordq_coordinator_move_batches_total") or 0) <= 4
    producer.stop_sending()
    producer.join(60)
    assert producer.stats is not None and producer.stats.head == "g2"

    # one disk comes back (OPERATIONS, "Both processes of a group are lost"): the idle queues'
    # old segments are sealed from it in batches (one SealMany, one transaction per batch)
    cluster.restart(cluster.groups["g1"].slave)

    def sealed() -> bool:
        # Segment 0 (each queue's on g1) sealed; an idle queue's, sealed empty with no
        # subscription, may be popped at once after (state.pop, issue 43): gone counts as
        # sealed, since only a sealed segment is ever popped. The busy queue's holds messages:
        # it stays, sealed.
        got = cluster.store.load_states(["busy", *idle])
        return all(not isinstance(v, Exception)
                   and ((s := v[0].segment(0)) is None or s.status.value == "sealed") for v in got.values())

    wait_until(sealed, timeout_s=60, interval_s=0.1, what="every old segment sealed from g1's slave")
    busy = cluster.store.load_state("busy")[0].segment(0)
    assert busy is not None and busy.status.value == "sealed" and busy.end, busy
    metrics = read_metrics(url)
    assert (value(metrics, "ordq_coordinator_batched_seals_total") or 0) >= IDLE // 2

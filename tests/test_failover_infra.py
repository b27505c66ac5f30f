"""Faults of the coordination layer under continuous load (DESIGN §6): one ZooKeeper node of a
3-node ensemble killed, and the coordinator daemon killed. Neither may cost a message, reorder
one, or make the producer fail over.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from kazoo.recipe.election import Election

from ordq.coordinator.state import SegStatus
from ordq.zk_server import ZkServer
from tests.cluster import (  # noqa: F401 - fixture
    CLIENT_SESSION_TIMEOUT_S,
    Cluster,
    HandedOut,
    cluster_fixture,
    finish,
    start_load,
    wait_acked,
)
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 16_000
# These faults must not make the producer fail over. With the 1 s ack deadline of the other
# tests, a box loaded by other work (load average 14 once) stalled one ack past it, and the
# producer rightly failed over for that: the assertion then measured the box, not the fault.
# A stall this long during these faults would be theirs (e.g. a broker blocking on ZooKeeper).
NO_FAILOVER_SEND_TIMEOUT_S = 5.0
# How long a ZooKeeper leader that lost its followers goes on serving (the ensemble's syncLimit
# in ticks, ordq/zk_server.py: 5 s whatever the tick).
SYNC_LIMIT_S = 5.0


@pytest.mark.ensemble
def test_zookeeper_leader_node_killed(cluster: Cluster, zk_ensemble: ZkServer) -> None:
    """The ensemble's leader (the worst single node to lose: every client is cut off until a
    new one is elected) is killed -9 under load: no effect on produce or consume."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer, consumer = start_load(cluster, N, send_timeout_s=NO_FAILOVER_SEND_TIMEOUT_S)
    wait_acked(producer, N // 3)
    victim = zk_ensemble.leader()
    assert victim is not None
    try:
        zk_ensemble.kill(victim)
        wait_acked(producer, N // 3 + 2000)  # load goes on while ZooKeeper re-elects
        finish(producer, consumer)
    finally:
        zk_ensemble.restart(victim)
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == N
    assert producer.stats is not None and producer.stats.failovers <= 1, producer.stats  # no churn


@pytest.mark.ensemble
def test_zookeeper_quorum_lost_for_longer_than_a_request_timeout(cluster: Cluster, zk_ensemble: ZkServer) -> None:
    """Two of three nodes hang for 7.5 s (> the store's 5 s request timeout; no quorum, nobody
    is served once the leader notices) under load: nothing is lost. The head master takes no
    write once ZooKeeper has been silent for its session (the session guard, issue 28: it cannot
    tell a lost quorum from being cut off from a live one), so the producer waits and may fail
    over once, after the quorum is back (before the guard it wrote on through the outage).
    The consumer keeps reading, but it hands
    out nothing once it cannot be sure of its lease (two thirds of its session after the last
    answered renewal): it cannot tell a lost quorum from being cut off from a live one, where
    a successor may already deliver. When ZooKeeper is back it goes on where it stopped if its
    session survived the outage; if ZooKeeper expired it meanwhile (a loaded box may reconnect
    too late), it raises NotLeader and the application's next consumer resumes from the last
    commit. Either way: nothing lost, nothing delivered while unsure."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    # Enough messages (12 s at the load rate) that some are still to come after the outage.
    n = 3 * N
    producer, consumer = start_load(cluster, n, send_timeout_s=NO_FAILOVER_SEND_TIMEOUT_S, rejoin=True)
    wait_acked(producer, N // 4)
    followers = [st.node for st in zk_ensemble.status() if st.mode == "follower"]
    assert len(followers) == 2
    paused_at = time.monotonic()
    # The lease must have run out by then: renewals answered until the leader gives up, then
    # 2/3 of the session (plus a check).
    cutoff = paused_at + SYNC_LIMIT_S + CLIENT_SESSION_TIMEOUT_S * 2 / 3 + 0.3
    try:
        for i in followers:
            zk_ensemble.processes[i].pause()
        acked_at_pause = len(producer.acked)
        # The leader left alone answers reads until it notices its followers are gone (syncLimit,
        # 5 s here), a window in which no successor can be elected either (that needs a quorum,
        # then a whole session of silence); lease renewals answered then are true. After it, the
        # lease runs out within 2/3 of the 2 s session (plus a check): then nothing more.
        wait_until(lambda: time.monotonic() > cutoff, timeout_s=30, interval_s=0.05, what="the lease to run out")
        counted_at_cutoff = len(consumer.delivered)
        wait_until(lambda: time.monotonic() > paused_at + 7.5, timeout_s=30, interval_s=0.1,
                   what="an outage longer than a request timeout")
        # Judged by when each poll that handed out was called (the consumer's own clock, which
        # is this process's), not by the deliveries counted so far: a batch handed out before
        # the cutoff is still being counted after it on a loaded box (issue 26).
        late = [h for h in consumer.handed_out if h.called_at > cutoff]
        stalled = sum(h.count for h in consumer.handed_out)
        # Acks may go on while the lone leader still answers, but how many is the box's speed:
        # a test that waited for 4,000 here (1 s of load) held the quorum away for as long as
        # that took on a loaded box (60 s once: the producer's bound ran out; issue 26).
        print(f"acked at the pause {acked_at_pause}, at the end of the outage {len(producer.acked)}; "
              f"counted at the cutoff {counted_at_cutoff}, at the end of the outage {len(consumer.delivered)}; "
              f"handed out by then {stalled}\n"
              + _timeline(consumer.handed_out, paused_at, cutoff))
        assert not late, "delivered while not sure of its lease:\n" + _timeline(consumer.handed_out, paused_at, cutoff)
    finally:
        for i in followers:
            zk_ensemble.processes[i].resume()
        zk_ensemble.wait_serving(timeout_s=60)
    wait_until(lambda: sum(h.count for h in consumer.handed_out) > stalled, timeout_s=30,
               what="delivery to go on after the outage")
    finish(producer, consumer)
    summary = check_delivery(producer.acked, consumer.instances, redelivery=len(consumer.instances) > 1)
    assert summary.acked == summary.delivered == n
    assert producer.stats is not None and producer.stats.failovers <= 1, producer.stats  # no churn


def _timeline(handed_out: list[HandedOut], paused_at: float, cutoff: float) -> str:
    """The polls that handed out from 2 s before the pause, in seconds since the pause."""
    return "\n".join(f"  poll called {h.called_at - paused_at:+7.3f}s returned {h.returned_at - paused_at:+7.3f}s: "
                     f"{h.count} from seq {h.first_seq}; lease then valid until {h.valid_until - paused_at:+7.3f}s"
                     + ("  <- after the cutoff" if h.called_at > cutoff else "")
                     for h in handed_out if h.returned_at > paused_at - 2)


def test_coordinator_daemon_killed(cluster: Cluster) -> None:
    """Two coordinator daemons; the leading one is killed -9 under load: produce and consume
    go on untouched (no failover, nothing lost), and the standby, now elected, does the
    duties: with no producer running, only it fails the head over when the head dies."""
    cluster.add_groups("g1", "g2", "g3")
    cluster.create_queue()
    daemons = [cluster.start_daemon(f"coordinator-{i}") for i in (1, 2)]
    election = Election(cluster.store.client, cluster.paths.coordinator_leader)

    def leader_pid() -> int | None:
        first = (election.contenders() or [None])[0]
        return int(first.split("@")[0].rsplit("-", 1)[1]) if first else None  # "<host>-<pid>@<address>"

    wait_until(leader_pid, timeout_s=30, what="a coordinator leader")
    leading = next(d for d in daemons if d.pid == leader_pid())
    standby = next(d for d in daemons if d is not leading)
    metrics_url = standby.wait_for_line("METRICS ", timeout_s=5)

    producer, consumer = start_load(cluster, N, send_timeout_s=NO_FAILOVER_SEND_TIMEOUT_S)
    wait_acked(producer, N // 4)
    leading.kill()
    wait_until(lambda: leader_pid() == standby.pid, timeout_s=30, what="the standby daemon to be elected")
    finish(producer, consumer)
    summary = check_delivery(producer.acked, [consumer.delivered])
    assert summary.acked == summary.delivered == N
    assert producer.stats is not None and producer.stats.failovers <= 1, producer.stats  # no churn

    head = cluster.head()
    seg = cluster.state().open_segment
    assert seg is not None
    head.master.kill()
    st = cluster.wait_state(lambda s: s.head != head.gid and (x := s.segment(seg.seg)) is not None
                            and x.status is SegStatus.SEALED, what="the standby daemon to fail over and seal")
    assert st.open_segment is not None and st.open_segment.gid != head.gid
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    assert "ordq_coordinator_leader 1" in body
    assert 'ordq_coordinator_actions_total{kind="fail_over"}' in body, body

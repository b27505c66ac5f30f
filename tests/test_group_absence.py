"""A group gone from ZooKeeper is not a dead group (issue 43, coordinator/away.py): real
ZooKeeper, broker and coordinator processes.

- A coordinator started before its groups registered moved all their heads (seen once: it took
  both live groups for dead). Now a group absent at the start of a leadership term is waited
  for (the grace counts from the term's start): when the groups come, no head has moved.
- No storm from a slow machine: at load 35-40 the brokers' 1 s ZooKeeper sessions expired with
  nothing killed, and the coordinator moved 13,544 idle heads in one minute. Here one group's
  brokers are cut off from ZooKeeper (a silent proxy, as in tests/test_session_guard.py) until
  their sessions expire, while their processes still answer: the written queue moves at once
  (its producer asks), the idle queues keep their head past the grace because the
  coordinator's own probe hears the processes, and when the sessions are back the counters
  show the heads kept.
- A master frozen (SIGSTOP) past its session and resumed: the probe goes unanswered, the idle
  queues wait the grace, and the master registers again within it: no head moved.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ordq.broker_group.process import BrokerGroupProcesses
from ordq.common.metrics import value
from ordq.coordinator.state import QueueState
from tests.cluster import SESSION_TIMEOUT_S, Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.helpers.silent_proxy import SilentProxy
from tests.util import read_metrics, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]  # groups stopped, started and cut off: the CI tier

IDLE = 6


def states(cluster: Cluster, queues: list[str]) -> dict[str, QueueState]:
    got = cluster.store.load_states(queues)
    bad = {q: v for q, v in got.items() if isinstance(v, Exception)}
    assert not bad, bad
    return {q: v[0] for q, v in got.items()}  # type: ignore[index]


def metric(url: str, name: str, **labels: str) -> float:
    return value(read_metrics(url), name, **labels) or 0.0


def test_a_coordinator_started_before_its_groups_moves_no_head(cluster: Cluster) -> None:
    """Failing-first: with the grace off (every absence moving idle heads at once, as before)
    the coordinator failed every queue over while neither group was live (no open segment
    left), ``fail_over`` counted."""
    cluster.add_groups("g1", "g2")
    idle = [f"idle-{i}" for i in range(IDLE)]
    created, _ = cluster.store.create_queues(idle)
    heads = {st.queue: st.head for st in created}
    assert set(heads.values()) == {"g1", "g2"}
    # as `ordq down`: the coordinator first, then the groups
    for c in cluster.coordinators:
        c.stop()
    for g in cluster.groups.values():
        g.stop()
    wait_until(lambda: not cluster.store.live_members("g1") and not cluster.store.live_members("g2"),
               timeout_s=30, interval_s=0.05, what="both groups gone from ZooKeeper")
    # a grace longer than two groups take to start on a loaded box: this test is about its start
    coordinator = cluster.start_daemon("coordinator-1", extra=["--away-grace", "60", "--rebalance-moves-per-s", "0"])
    url = coordinator.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    wait_until(lambda: metric(url, "ordq_coordinator_away_groups") == 2, timeout_s=30, interval_s=0.1,
               what="the coordinator leading, both groups seen away")
    for g in cluster.groups.values():
        g.start()
    cluster.wait_live("g1", "g2")
    wait_until(lambda: metric(url, "ordq_coordinator_groups_back_total") == 2, timeout_s=30, interval_s=0.1,
               what="the coordinator seeing both groups back")
    after = states(cluster, idle)
    assert after == {st.queue: st for st in created}  # nothing moved, nothing rolled: as created
    body = read_metrics(url)
    assert (value(body, "ordq_coordinator_actions_total", kind="fail_over") or 0) == 0
    assert (value(body, "ordq_coordinator_groups_back_total") or 0) == 2
    assert (value(body, "ordq_coordinator_kept_heads_total") or 0) == IDLE
    assert (value(body, "ordq_coordinator_away_groups") or 0) == 0


@pytest.fixture
def proxied_g1(cluster: Cluster) -> Iterator[tuple[Cluster, SilentProxy]]:
    """g2 as usual; g1's brokers reach ZooKeeper through a proxy that can go silent."""
    host, port = cluster.hosts.split(",")[0].rsplit(":", 1)
    proxy = SilentProxy((host, int(port)))
    try:
        cluster.add_groups("g2")
        cluster.store.add_group("g1")
        group = BrokerGroupProcesses("g1", zk_hosts=f"127.0.0.1:{proxy.port}", root=cluster.root,
                                     base_dir=cluster.base, session_timeout_s=SESSION_TIMEOUT_S,
                                     tls=cluster.broker_tls)
        cluster.groups["g1"] = group  # the cluster's teardown stops it
        group.start()
        cluster.wait_live("g1")
        yield cluster, proxy
    finally:
        proxy.close()


def test_sessions_expired_under_a_live_process_move_only_the_written_queue(proxied_g1) -> None:
    """Failing-first: with every absence moving idle heads at once (as before), every idle
    queue failed over to g2 the moment g1's sessions expired."""
    cluster, proxy = proxied_g1
    # a short grace: past it, only the coordinator's probe keeps the idle heads; no spread of
    # heads (g1 heads every idle queue: the spread would move them to g2 in their own right)
    coordinator = cluster.start_daemon("coordinator-1", extra=["--away-grace", "2", "--rebalance-moves-per-s", "0"])
    url = coordinator.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    idle = [f"idle-{i}" for i in range(IDLE)]
    created, _ = cluster.store.create_queues(idle, groups=["g1", "g2"])
    assert all(st.head == "g1" for st in created)
    cluster.create_queue("busy", ["g1", "g2"])
    assert cluster.state("busy").head == "g1"
    producer = cluster.producer(n=10**6, queue="busy", rate=100.0)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 100, timeout_s=60, what="100 acks on the busy queue")

    proxy.silent.set()  # g1's brokers hear nothing from ZooKeeper; the coordinator still reaches them
    cut = time.monotonic()
    try:
        wait_until(lambda: not cluster.store.live_members("g1"), timeout_s=30, interval_s=0.05,
                   what="g1's sessions expired in ZooKeeper")
        expired = time.monotonic()
        # the written queue moves at once (its producer's writes are refused, it asks)
        cluster.wait_state(lambda s: s.head == "g2", queue="busy", timeout_s=30, what="the busy queue on g2")
        busy_moved = time.monotonic()
        # past the grace, the processes answer the probe: held, the idle heads stay
        wait_until(lambda: metric(url, "ordq_coordinator_held_groups") == 1, timeout_s=30, interval_s=0.1,
                   what="g1 held: away past the grace, its processes answering")
        held = time.monotonic()
        assert all(st.head == "g1" for st in states(cluster, idle).values())
        assert metric(url, "ordq_coordinator_deferred_moves_total") >= IDLE
        assert metric(url, "ordq_coordinator_away_probes_total", answer="answered") >= 1
    finally:
        proxy.silent.clear()
        proxy.reset()  # the partition heals: the brokers learn their sessions expired and register again
    healed = time.monotonic()
    cluster.wait_live("g1")
    print(f"g1's sessions expired {expired - cut:.2f}s after the cut; the busy queue on g2 {busy_moved - expired:.2f}s "
          f"after the expiry; g1 held {held - expired:.2f}s after it; "
          f"registered again {time.monotonic() - healed:.2f}s after the heal")
    wait_until(lambda: metric(url, "ordq_coordinator_groups_back_total") >= 1, timeout_s=30, interval_s=0.1,
               what="the coordinator seeing g1 back")
    after = states(cluster, idle)
    assert all(st.head == "g1" for st in after.values()), after
    assert all(s.gid == "g1" for st in after.values() for s in st.consume), after  # no segment moved to g2
    assert metric(url, "ordq_coordinator_kept_heads_total") >= IDLE
    assert metric(url, "ordq_coordinator_batched_moves_total") == 0
    before = len(producer.acked)
    wait_until(lambda: len(producer.acked) >= before + 100, timeout_s=60, what="the busy queue going on")
    producer.stop_sending()
    producer.join(60)


def test_a_master_frozen_past_its_session_and_resumed_keeps_its_idle_heads(cluster: Cluster) -> None:
    """Issue 43's acceptance: a broker frozen past its session (SIGSTOP) and resumed does not
    cause a mass failover. Frozen, it answers no probe ("silent", not "refused"): its idle
    queues wait the grace; resumed, it registers again on a new session and keeps them.
    Failing-first: with every absence moving idle heads at once (as before), every idle queue
    failed over to g2 when the frozen master's session expired."""
    cluster.add_groups("g1", "g2")
    # a grace the resumed master registers within even on a loaded box (the default is 10 s)
    coordinator = cluster.start_daemon("coordinator-1", extra=["--away-grace", "30", "--rebalance-moves-per-s", "0"])
    url = coordinator.wait_for_line("METRICS ", timeout_s=30).split()[-1]
    idle = [f"idle-{i}" for i in range(IDLE)]
    created, _ = cluster.store.create_queues(idle, groups=["g1", "g2"])
    assert all(st.head == "g1" for st in created)
    wait_until(lambda: metric(url, "ordq_coordinator_leader") == 1, timeout_s=30, interval_s=0.1,
               what="the coordinator leading")
    master = cluster.groups["g1"].master
    master.pause()
    paused = time.monotonic()
    try:
        wait_until(lambda: "master" not in cluster.store.live_members("g1"), timeout_s=30, interval_s=0.05,
                   what="the frozen master's session expired")
        wait_until(lambda: metric(url, "ordq_coordinator_away_probes_total", answer="silent") >= 1, timeout_s=30,
                   interval_s=0.1, what="the coordinator's probe of the frozen master unanswered")
        assert metric(url, "ordq_coordinator_deferred_moves_total") >= IDLE
    finally:
        master.resume()
    resumed = time.monotonic()
    cluster.wait_live("g1")
    print(f"frozen {resumed - paused:.2f}s; registered again {time.monotonic() - resumed:.2f}s after SIGCONT")
    wait_until(lambda: metric(url, "ordq_coordinator_groups_back_total") >= 1, timeout_s=30, interval_s=0.1,
               what="the coordinator seeing g1 back")
    after = states(cluster, idle)
    assert all(st.head == "g1" and all(s.gid == "g1" for s in st.consume) for st in after.values()), after
    body = read_metrics(url)
    assert (value(body, "ordq_coordinator_actions_total", kind="fail_over") or 0) == 0
    assert (value(body, "ordq_coordinator_kept_heads_total") or 0) >= IDLE

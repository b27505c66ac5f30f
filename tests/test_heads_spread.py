"""Heads spread back (issue 43): real broker, coordinator and ZooKeeper processes. A group whose
master is killed (-9) loses its heads to the others; once it is back (and live 10 s) the
coordinator moves idle queues' heads back to it, in batched transactions, never the queue being
written. ``ordq group rebalance`` (the operators' verb: --dry-run shows the plan, --max-moves
bounds it, a table or --json) does the same at once, with the coordinator's own pass off."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ordq.common.metrics import value
from tests.cluster import Cluster, cluster_fixture  # noqa: F401 - cluster_fixture
from tests.util import read_metrics, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]  # group restarts and a 10 s grace: the CI tier

IDLE = 30


def ordq(cluster: Cluster, *args: str) -> str:
    done = cluster.ordq(*args)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def heads(cluster: Cluster, queues: list[str]) -> Counter[str]:
    got = cluster.store.load_states(queues)
    return Counter(v[0].head or "" for v in got.values() if not isinstance(v, Exception))


def test_a_group_back_after_a_kill_gets_idle_heads_back_the_busy_queue_stays(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2", "g3")
    idle = [f"idle-{i:03d}" for i in range(IDLE)]
    cluster.store.create_queues(idle)  # spread: each group heads a third
    assert heads(cluster, idle) == Counter({"g1": 10, "g2": 10, "g3": 10})
    cluster.create_queue("busy", ["g1", "g2", "g3"])
    producer = cluster.producer(n=10**6, queue="busy", rate=200.0)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 200, timeout_s=60, what="200 acks on the busy queue")
    cluster.groups["g1"].master.kill()
    wait_until(lambda: heads(cluster, idle)["g1"] == 0, timeout_s=60, interval_s=0.2, what="every head off g1")
    busy_head = cluster.state("busy").head
    cluster.restart(cluster.groups["g1"].master)
    cluster.wait_live("g1")

    def spread() -> bool:  # over every queue, the busy one included (the coordinator counts it)
        c = heads(cluster, [*idle, "busy"])
        return max(c.values()) - min(c[g] for g in ("g1", "g2", "g3")) <= 1

    wait_until(spread, timeout_s=90, interval_s=0.5, what="idle heads spread back over g1, g2, g3")
    assert heads(cluster, idle)["g1"] >= 9
    before = len(producer.acked)
    wait_until(lambda: len(producer.acked) >= before + 200, timeout_s=60, what="the busy queue going on")
    assert cluster.state("busy").head == busy_head  # written all along: never moved
    url = cluster.coordinators[0].wait_for_line("METRICS ", timeout_s=30).split()[-1]
    metrics = read_metrics(url)
    assert (value(metrics, "ordq_coordinator_spread_moves_total") or 0) >= 9
    # the moved queues' old segments (empty, on g2 and g3, both live) are sealed
    wait_until(lambda: all(not isinstance(v, Exception) and all(s.status.value != "sealing" for s in v[0].consume)
                           for v in cluster.store.load_states(idle).values()),
               timeout_s=60, interval_s=0.5, what="every moved queue's old segment sealed")
    producer.stop_sending()
    producer.join(60)


def test_group_rebalance_shows_the_plan_then_moves_at_most_what_it_is_told(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    # the coordinator: only the verb moves heads (it replaces the stand-in add_groups started)
    cluster.start_daemon("coordinator-1", extra=["--rebalance-moves-per-s", "0"])
    idle = [f"idle-{i:03d}" for i in range(20)]
    cluster.store.create_queues(idle)
    assert heads(cluster, idle) == Counter({"g1": 10, "g2": 10})
    ordq(cluster, "group", "drain", "g2")  # every head to g1
    # (a master whose session lapsed on a loaded box is failed over and admitted again: wait)
    wait_until(lambda: heads(cluster, idle) == Counter({"g1": 20}), timeout_s=60, interval_s=0.2,
               what="every head on g1")
    ordq(cluster, "group", "undrain", "g2")  # admitted again, at the tail of each send list

    plan = json.loads(ordq(cluster, "--json", "group", "rebalance", "--dry-run"))
    assert plan["dry_run"] is True and plan["before"] == {"g1": 20, "g2": 0} and plan["after"] == {"g1": 10, "g2": 10}
    assert len(plan["moves"]) == 10 and {m["from"] for m in plan["moves"]} == {"g1"}
    assert heads(cluster, idle) == Counter({"g1": 20})  # a dry run moves nothing

    table = ordq(cluster, "group", "rebalance", "--max-moves", "4")
    assert "HEADS BEFORE" in table and "moved 4 heads" in table, table
    assert heads(cluster, idle) == Counter({"g1": 16, "g2": 4})
    done = json.loads(ordq(cluster, "--json", "group", "rebalance"))
    assert done["dry_run"] is False and len(done["moves"]) == 6 and done["after"] == {"g1": 10, "g2": 10}
    assert heads(cluster, idle) == Counter({"g1": 10, "g2": 10})
    again = json.loads(ordq(cluster, "--json", "group", "rebalance", "--dry-run"))
    assert again["moves"] == []
    bad = cluster.ordq("group", "rebalance", "--max-moves", "-1")
    assert bad.returncode != 0 and len(bad.stderr.decode().strip().splitlines()) == 1, bad.stderr

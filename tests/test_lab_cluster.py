"""A whole cluster in the lab (ordq/lab/cluster.py), deployed host by host, and partition drills
on it (issue 28): each drill runs a stream (drills/partitions.py's ``Stream``: a producer in h4
and a consumer in h5 of ``ordq.drills.workload``, each with a standby in the other client host)
inside their hosts, cuts the network with the nemesis while acks flow, heals, lets the stream
finish, and takes its verdict from ``spark_order_check`` over the audit files, as ``ordq drill``
does: 0 acked lost, 0 reordered, 0 delivered twice by one consumer, 0 concurrent consumers.

These four drills run on the module docstring's layout (ZooKeeper sharing hosts with brokers);
the ``ordq drill part-*`` drills (drills/partitions.py, tests/test_drill_partitions.py) run nine
kinds on the ``SPREAD`` layout, ZooKeeper on hosts of its own.

One cluster for the module (about 16 s to start at load 13). Needs root, ``ip netns`` and
iptables: skipped with one line elsewhere (tests/test_lab.py's condition).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ordq.drills import audit
from ordq.drills.partitions import Stream
from ordq.drills.verdict import Verifier
from ordq.drills.workload import now_us
from ordq.lab import Lab, Partition, cut_pair, isolate, split
from ordq.lab.cluster import CONSUMER_HOST, PRODUCER_HOST, ZK_HOSTS, LabCluster
from tests import spark_fixtures
from tests.test_lab import _NO_LAB
from tests.util import wait_until

if _NO_LAB:  # one line for the whole module
    pytest.skip(f"the lab needs root, ip netns and iptables: {_NO_LAB}", allow_module_level=True)

spark = spark_fixtures.spark

START_BUDGET_S = 30.0  # issue 28's acceptance: a full cluster in under 30 s
MESSAGES = 6000
RATE = 1000.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    started = time.monotonic()
    with Lab.create(tmp_path_factory.mktemp("labcluster"), hosts=5) as lab:
        the_cluster = LabCluster.start(lab)
        took = time.monotonic() - started
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print(f"\nlab + cluster (3 ZooKeeper, 3 groups, 2 coordinators) up in {took:.1f}s at load {load}: "
              f"{ {k: round(v, 1) for k, v in the_cluster.timings.items()} }")
        the_cluster.timings["total"] = took
        try:
            yield the_cluster
        finally:
            the_cluster.stop()


@pytest.mark.slow
def test_a_full_cluster_starts_in_the_lab_and_carries_a_queue(cluster: LabCluster, tmp_path: Path) -> None:
    # Measured and printed (the acceptance is 30 s); only a gross bound is asserted: the time
    # depends on the load beside the test (16 s at load 13, 52 s at load 13 with more starting).
    assert cluster.timings["total"] < 4 * START_BUDGET_S, cluster.timings
    groups = {g["gid"] if "gid" in g else g["group"]: g for g in cluster.groups()}
    for (gid, role), _proc in cluster.brokers.items():  # each at its own host's lab address
        assert str(groups[gid][role]).startswith(cluster.lab.address(cluster.host_of(gid, role)) + ":"), groups
    # the coordinators' lab addresses, registered where the clients in the hosts look (issue 37):
    # the client commands below find the cluster by them
    entries = json.loads(cluster.credentials_file.read_text())["clusters"]
    assert [e.get("coordinators") for e in entries.values()] == [cluster.bootstrap.split(",")], entries
    assert all(a.startswith(cluster.lab.address(h) + ":") for a, h in zip(cluster.bootstrap.split(","),
                                                                          cluster.coordinators, strict=True))
    out = cluster.call(PRODUCER_HOST, ["queue", "create", "orders"])
    assert "send head" in out, out
    cluster.call(PRODUCER_HOST, ["produce", "orders", "--count", "500"])
    cluster.call(CONSUMER_HOST, ["consume", "orders", "-s", "audit", "--count", "500", "--quiet",
                                 "--audit-dir", str(tmp_path / "audit")])
    delivered = audit.read_deliveries(tmp_path / "audit")
    assert sorted(d.seq for d in delivered) == list(range(500))


# -- partition drills ---------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    kind: str
    head: str
    partition: Partition
    to_next_ack_s: float | None  # cut -> first ack on a later segment (the failover)
    old_segment_acks_after_cut: int  # acks on the cut head's segment stamped after the cut began
    old_segment_acks_after_in_place: int  # ... after its rules were in place in every host
    install_s: float  # how long installing the cut took
    acked: int
    delivered: int
    violations: dict[str, int]


def _drill(cluster: LabCluster, spark: Any, folder: Path, kind: str,
           make: Callable[[str, str], Partition]) -> Outcome:
    """Run one partition drill: ``make(master host, slave host)`` of the head group is the cut."""
    assert wait_until(cluster.whole, timeout_s=60, what="the cluster whole before the drill")
    run = Stream(cluster, f"part-{kind}", folder, MESSAGES, RATE)
    run.start()  # leaders and standbys; the stream goes only then: the cut must find it running
    at = wait_until(lambda: (s := run.status("p1")).get("acked", 0) >= MESSAGES // 4 and s, timeout_s=60,
                    what="a quarter of the stream acked")
    head, seg = at["head"], at["seg"]
    master, slave = cluster.host_of(head, "master"), cluster.host_of(head, "slave")
    partition = make(master, slave)
    cut_us = now_us()
    cluster.lab.nemesis.replace(partition)
    in_place_us = now_us()  # the rules are in every host (iptables-restore in each took a while)
    print(f"\n{kind}: head {head} (master {master}, slave {slave}) segment {seg}; cut {sorted(partition.cuts)}")
    try:
        wait_until(lambda: run.later_segment_acked(seg), timeout_s=60,
                   what="an ack on a later segment while partitioned")
        time.sleep(2.0)  # keep the cut for a while: whatever takes writes past its session would show
    finally:
        cluster.lab.nemesis.heal()
    run.finish(stop=False, timeout_s=120)  # every acked message delivered; the standbys stopped
    leaders = {who: run.status(who).get("state") for who in run.procs}
    assert wait_until(cluster.whole, timeout_s=90, what="the cluster whole after heal")
    acks = audit.read_acks(run.audit_dir)
    deliveries = audit.read_deliveries(run.audit_dir)
    later = [a.ack_us for a in acks if a.seg > seg and a.ack_us >= cut_us]
    report = Verifier(spark=spark)([run.audit_dir], report_path=folder / "report.json")
    violations = {c.name: sum(k for _q, _s, k in c.by_subscription) for c in report.classes
                  if c.violation and any(k for _q, _s, k in c.by_subscription)}
    outcome = Outcome(kind=kind, head=head, partition=partition,
                      to_next_ack_s=(min(later) - cut_us) / 1e6 if later else None,
                      old_segment_acks_after_cut=sum(1 for a in acks if a.seg == seg and a.ack_us > cut_us),
                      old_segment_acks_after_in_place=sum(1 for a in acks if a.seg == seg and a.ack_us > in_place_us),
                      install_s=(in_place_us - cut_us) / 1e6,
                      acked=len({a.seq for a in acks}), delivered=len({d.seq for d in deliveries}),
                      violations=violations)
    print(f"{kind}: next ack {outcome.to_next_ack_s}s after the cut; acks on the cut segment after it: "
          f"{outcome.old_segment_acks_after_cut} ({outcome.old_segment_acks_after_in_place} after its rules were "
          f"in place, {outcome.install_s:.2f}s later); acked {outcome.acked}, delivered {outcome.delivered}; "
          f"violations {violations or 'none'}; clients: {leaders}")
    recorded = attrs.asdict(outcome, filter=lambda a, _v: a.name != "partition")
    (folder / "outcome.json").write_text(json.dumps({**recorded, "cut_us": cut_us, "segment": seg,
                                                     "clients": leaders}, indent=2))
    assert not violations, outcome
    # A client may lose its session to a cut ZooKeeper node (its standby takes over), but never
    # gives up on a coordinator behind the cut while another leads (without coordinator/client.py's
    # in-flight election check, isolate-coordinator: the producer failed, next ack 41 s after the cut).
    errors = {w: str(run.status(w).get("error", "")) for w in run.procs}
    stuck = {w: e for w, e in errors.items() if "no coordinator answered" in e}
    assert not stuck, stuck
    # a deposed producer's last acks may never have reached it: every seq is stored and delivered
    assert max(a.seq for a in acks) == MESSAGES - 1 and outcome.delivered == MESSAGES, outcome
    assert outcome.to_next_ack_s is not None, outcome
    return outcome


@pytest.mark.slow
def test_isolating_the_head_masters_host_loses_nothing(cluster: LabCluster, spark: Any, tmp_path: Path) -> None:
    """(a) The head master's host is cut from every other host (clients and ZooKeeper too)."""
    _drill(cluster, spark, tmp_path / "d", "isolate-head", lambda master, _s: isolate(master, cluster.lab.hosts))


@pytest.mark.slow
def test_cutting_master_from_slave_only_loses_nothing(cluster: LabCluster, spark: Any, tmp_path: Path) -> None:
    """(b) Only master <-> slave of the head group: each still reaches ZooKeeper and clients."""
    _drill(cluster, spark, tmp_path / "d", "cut-master-slave", lambda master, slave: cut_pair(master, slave))


@pytest.mark.slow
def test_head_master_on_the_zookeeper_minority_side_loses_nothing(cluster: LabCluster, spark: Any,
                                                                 tmp_path: Path) -> None:
    """(c) The ZooKeeper ensemble split: the head master's host alone on the minority side,
    the other ZooKeeper hosts (and the head's slave) on the majority's; the clients' hosts
    reach both sides, so the producer still reaches the master that lost its session."""
    def make(master: str, _slave: str) -> Partition:
        assert master in ZK_HOSTS
        return split([master], [h for h in ZK_HOSTS if h != master])

    _drill(cluster, spark, tmp_path / "d", "zk-minority-head", make)


@pytest.mark.slow
def test_isolating_the_elected_coordinators_host_loses_nothing(cluster: LabCluster, spark: Any,
                                                              tmp_path: Path) -> None:
    """The elected coordinator's host (h1 or h2: it also holds the head's master or slave) is
    cut from every other host: the producer's FailOver goes to a coordinator that never
    answers, until the standby is elected (coordinator/client.py follows the election)."""
    def make(_master: str, _slave: str) -> Partition:
        host = wait_until(cluster.elected_coordinator, timeout_s=60, what="a coordinator's election in its log")
        return isolate(host, cluster.lab.hosts)

    _drill(cluster, spark, tmp_path / "d", "isolate-coordinator", make)

"""The producer's lease from the coordinator (issue 37; DESIGN §5 Producer, Leases): on real
ZooKeeper, broker and coordinator processes, with the producer holding no ZooKeeper session.

- A second holder of a produce token of the queue cannot depose the real producer: Acquire
  answers who holds the lease, a Claim without it (or with a node planted in the old ZooKeeper
  election) is refused and counted, and the epoch stays; the lease is the other's only once the
  real producer released it.
- A producer paused (SIGSTOP) past its lease while a standby waits: the standby is granted the
  lease, claims and writes; the resumed producer is fenced (FencedError) and nothing it wrote
  late is stored: the audit files show no loss, no duplicate, no conflicting ack, order kept.
"""

from __future__ import annotations

import attrs
import pytest

from ordq.common.errors import LeaseLost, PermissionDenied
from ordq.common.metrics import value
from ordq.coordinator.client import CoordinatorClient, Held, Refusal
from ordq.coordinator.leases import Kind, LeaseName
from ordq.sdk import BatchingConfig, Producer, ProducerConfig
from ordq.spark_order_check import CLASSES
from ordq.spark_order_check.reference import check
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, FINISH_S, LOAD_RATE, Cluster, cluster_fixture  # noqa: F401
from tests.helpers.load import make_payload
from tests.helpers.produce import EXIT_FENCED
from tests.util import read_metrics, wait_until

pytestmark = pytest.mark.zk


def refusals(cluster: Cluster, outcome: str) -> float:
    """Requests the serving coordinator refused with ``outcome`` (an error type), all RPCs."""
    proc = [p for p in cluster.coordinators if p.alive()][-1]
    line = proc.wait_for_line("METRICS ", timeout_s=30)
    return value(read_metrics(line.split()[-1]), "ordq_coordinator_requests_total", outcome=outcome) or 0.0


def test_a_second_produce_token_holder_cannot_depose_the_real_producer(cluster: Cluster) -> None:
    """Guard: the producer lease (coordinator/service.py ``_claim`` takes only a lease; the
    ZooKeeper election path is gone). Issue 37's attack: a node planted first in the queue's
    producer election made its planter the "leader", and its Claim bumped the epoch and fenced
    the real producer."""
    from ordq.common.security import register
    from ordq.coordinator.tokens import create_token, touch

    cluster.add_groups("g1")
    client, root = cluster.store.client, cluster.root
    _, admin = create_token(client, root, {"*": ["admin"]}, "admin")
    _, real_token = create_token(client, root, {"q": ["produce"]}, "real producer")
    _, rogue_token = create_token(client, root, {"q": ["produce"]}, "rogue")
    touch(client, root)
    register(cluster.hosts, root, attrs.evolve(cluster.credentials, token=admin))
    cluster.start_daemon("coordinator-1")  # one that has read the tokens (as test_coordinator_service)
    cluster.create_queue("q")
    cfg = ProducerConfig(zk_hosts=cluster.hosts, root=root, queue="q", producer_id="real",
                         batching=BatchingConfig(linger_ms=1.0), lease_ttl_s=CLIENT_SESSION_TIMEOUT_S,
                         credentials=attrs.evolve(cluster.credentials, token=real_token))
    rogue = CoordinatorClient(bootstrap=cluster.bootstrap, timeout_s=10,
                              credentials=attrs.evolve(cluster.credentials, token=rogue_token))
    try:
        with Producer(cfg) as producer:
            for i in range(50):
                producer.send(make_payload(i, "P", 64))
            producer.flush(30)
            epoch = cluster.state().producer_epoch
            # Acquire answers who holds it, however often the rogue asks (and however long it waits).
            for _ in range(3):
                got = rogue.acquire("producer", "q", "", "rogue", ttl_ms=2000, wait_ms=500)
                assert isinstance(got, Refusal) and got.holder == "real", got
            denied = refusals(cluster, "PermissionDenied")
            lost = refusals(cluster, "LeaseLost")
            # A Claim without the lease; with a forged one; as the first node of the old election.
            with pytest.raises(PermissionDenied):
                rogue.claim("q", Held("producer", "q", "", "rogue", generation=0, key="", ttl_ms=2000), wait_s=5)
            with pytest.raises(LeaseLost):
                rogue.claim("q", Held("producer", "q", "", "rogue", generation=1, key="forged", ttl_ms=2000), wait_s=5)
            election = cluster.paths.producer_leader("q")
            planted = client.create(f"{election}/x__lock__-0000000001", b"rogue", makepath=True)
            try:
                with pytest.raises(PermissionDenied):
                    rogue.claim("q", planted, wait_s=5)
            finally:
                client.delete(planted)
            assert refusals(cluster, "PermissionDenied") >= denied + 2
            assert refusals(cluster, "LeaseLost") >= lost + 1
            assert cluster.state().producer_epoch == epoch  # nothing changed
            for i in range(50, 100):
                producer.send(make_payload(i, "P", 64))
            producer.flush(30)  # the real producer goes on, never fenced
            stats = producer.statistics()
            assert (stats.epoch, stats.failovers, stats.lease_lost) == (epoch, 0, 0), stats
        # Released at close: the other holder is granted it at once.
        got = rogue.acquire("producer", "q", "", "rogue", ttl_ms=2000)
        assert isinstance(got, Held) and got.generation == 2, got
    finally:
        rogue.close()


def test_a_producer_paused_past_its_lease_is_fenced_and_none_of_its_late_writes_lands(cluster: Cluster) -> None:
    """Guard: the epoch the successor's Claim issues (brokers fence the old one), with the lease
    granted to the waiting standby only after the paused holder's expired. The old producer's
    lease lapses and is lost while it is stopped; on resume it is fenced, never a second writer."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 12_000
    audit = cluster.base / "audit"
    consumer = cluster.consumer(until=n - 1, rejoin=True, audit_dir=audit)
    consumer.start()
    # P1 held at seq n/2 until its gate opens: the pause finds it sending, however late the
    # test sees its acks (tests.helpers.produce, --gate)
    p1 = cluster.spawn_producer("P1", total=n, rate=LOAD_RATE, hold=True, gate_at=n // 2)
    p2 = cluster.spawn_producer("P2", total=n, rate=LOAD_RATE, hold=True)
    p1.go()
    p1.wait_leader()
    p2.go()
    wait_until(lambda: "waits as a standby" in p2.proc.log_tail(200), timeout_s=30, interval_s=0.05,
               what="P2 to wait for the producer lease")
    p1.wait_acked(n // 4)
    p1.proc.pause()
    p1.open_gate()  # resumed, it sends on: those writes must not land
    try:
        p2.wait_leader()  # only once P1's lease expired on the coordinator: P1 is stopped, not renewing
        p2.wait_acked(2000)
    finally:
        p1.proc.resume()
    assert p1.wait_exit(30) == EXIT_FENCED, p1.records()[-2:]
    assert p2.wait_exit(FINISH_S) == 0, p2.records()[-2:]
    consumer.join(FINISH_S)
    # The coordinator's record: P2 holds generation 2 (P1 had 1); no ZooKeeper election was used.
    record, _ = cluster.store.read_lease(LeaseName(Kind.PRODUCER, "q"))
    assert record is not None and (record.holder, record.generation) == ("P2", 2), record
    assert not cluster.store.client.get_children(cluster.paths.producer_leader("q"))  # nobody joined it
    # Nothing P1 wrote after the takeover was stored: every seq from P2's first one is P2's.
    next_seq = p2.event("leader")["next_seq"]  # type: ignore[index]
    wrong = [d.seq for d in consumer.delivered if d.writer != ("P1" if d.seq < next_seq else "P2")]
    assert not wrong, f"seqs stored by the wrong producer around the takeover at {next_seq}: {wrong[:10]}"
    # The verifier's rules over the audit files: no loss, no duplicate, no conflicting ack, in order.
    counts = check(audit / "acks", audit / "deliveries").counts
    violations = {c.name: counts[c.name] for c in CLASSES if c.violation and counts.get(c.name)}
    assert not violations, violations
    assert counts.get("crc_conflict_acks", 0) == 0

"""Consumer leader faults (DESIGN §6): the consumer is a separate process, killed -9 under load;
a standby waiting for the subscription's lease resumes from the committed cursor.

Here, and only here, redelivery is allowed: the standby redelivers exactly the messages after
the last committed cursor, in order. Each instance sees strictly increasing seqs; together
they cover every acked seq.
"""

from __future__ import annotations

import pytest

from ordq.common.errors import WaitTimeout
from ordq.sdk import Consumer, ConsumerConfig
from tests.cluster import (  # noqa: F401 - cluster_fixture
    CLIENT_SESSION_TIMEOUT_S,
    FINISH_S,
    LOAD_RATE,
    Cluster,
    cluster_fixture,
)
from tests.helpers.load import ConsumerProgram
from tests.order_check import check_delivery
from tests.util import wait_until

pytestmark = pytest.mark.zk

N = 16_000


def start_pair(cluster: Cluster, n: int, **options: object) -> tuple[ConsumerProgram, ConsumerProgram]:
    """A leading consumer program and a standby waiting for the lease behind it."""
    leader = cluster.spawn_consumer("c1", until=n - 1, hold=True, **options)  # type: ignore[arg-type]
    standby = cluster.spawn_consumer("c2", until=n - 1, hold=True)
    leader.go()
    leader.wait_leader()
    asked = cluster.coordinator_requests(rpc="Acquire")
    standby.go()
    # A standby asks for the lease again and again (refused while the leader renews it).
    wait_until(lambda: cluster.coordinator_requests(rpc="Acquire") >= asked + 2, timeout_s=30, interval_s=0.1,
               what="the standby to wait for the subscription's lease")
    assert standby.event("leader") is None
    return leader, standby


def check_takeover(cluster: Cluster, acked: list, leader: ConsumerProgram, standby: ConsumerProgram) -> None:
    assert standby.wait_exit(FINISH_S) == 0, standby.records()[-3:]
    start = standby.event("leader")
    assert start is not None
    first = leader.deliveries()
    summary = check_delivery(acked, [first, standby.deliveries()], redelivery=True,
                             starts=[None, start["last_seq"]])
    # The cursor it resumed from was committed by the killed leader, for messages that leader
    # had finished with: never past what it recorded, and it did commit progress before.
    assert 0 <= start["last_seq"] <= first[-1].seq, (start, first[-1].seq)
    assert summary.redelivered == first[-1].seq - start["last_seq"]


def test_consumer_leader_killed(cluster: Cluster) -> None:
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    # The stream starts once the standby waits: started before, a leader can read all N (4 s at
    # LOAD_RATE) and leave while the standby's process is still starting under load, and the
    # standby then leads with nothing left to take over (seen beside the helpers' load).
    leader, standby = start_pair(cluster, N)
    producer = cluster.producer(n=N, rate=LOAD_RATE)
    producer.start()
    wait_until(lambda: leader.delivered_count() >= N // 3, timeout_s=60, interval_s=0.01,
               what="the leader to deliver a third")
    leader.proc.kill()
    producer.join(FINISH_S)
    check_takeover(cluster, producer.acked, leader, standby)


def test_consumer_leader_dies_inside_a_delivered_batch(cluster: Cluster) -> None:
    """The application dies while handling a message of a batch that ``poll`` returned (the
    cursor is committed at every poll here): nothing of that batch may count as consumed."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = N // 2
    leader, standby = start_pair(cluster, n, commit_every=1, crash_at=n * 3 // 4)
    producer = cluster.producer(n=n, rate=LOAD_RATE)
    producer.start()
    assert leader.wait_exit(60) == -9
    producer.join(FINISH_S)
    check_takeover(cluster, producer.acked, leader, standby)


def test_iterating_consumer_commits_only_what_the_application_finished(cluster: Cluster) -> None:
    """``for m in consumer`` inside ``with``: an error while handling seq K commits up to K-1
    (K is redelivered); so does leaving the loop with ``break`` while holding K (the consumer
    cannot know whether the application finished K); ``commit()`` before ``break`` says it did."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    producer = cluster.producer(n=3000, rate=None)
    producer.start()
    producer.join(FINISH_S)
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                         lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)

    class AppFailed(Exception):
        pass

    with pytest.raises(AppFailed), Consumer(cfg) as c:
        for m in c:
            if m.seq == 1500:
                raise AppFailed
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1499
    with Consumer(cfg) as c:
        for m in c:
            assert m.seq == 1500
            break
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1499
    with Consumer(cfg) as c:
        for m in c:
            assert m.seq == 1500
            c.commit()
            break
    assert cluster.store.get_cursor("q", "s")[0].last_seq == 1500


@pytest.mark.slow
def test_consumer_leader_killed_repeatedly_long(cluster: Cluster) -> None:
    """Slow variant: 120,000 messages, three consumer leaders killed in turn."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    n = 120_000
    producer = cluster.producer(n=n, rate=LOAD_RATE)
    producer.start()
    instances = [cluster.spawn_consumer("c0", until=n - 1)]
    instances[0].wait_leader()
    for k in range(1, 4):
        asked = cluster.coordinator_requests(rpc="Acquire")
        standby = cluster.spawn_consumer(f"c{k}", until=n - 1)
        wait_until(lambda asked=asked: cluster.coordinator_requests(rpc="Acquire") >= asked + 2, timeout_s=30,
                   interval_s=0.1, what="a standby waiting for the lease")
        wait_until(lambda k=k: sum(c.delivered_count() for c in instances) >= k * n // 6, timeout_s=120,
                   interval_s=0.01, what="progress")
        instances[-1].proc.kill()
        instances.append(standby)
        standby.wait_leader()
    producer.join(FINISH_S * 2)
    assert instances[-1].wait_exit(FINISH_S) == 0
    starts = [None] + [c.event("leader")["last_seq"] for c in instances[1:]]  # type: ignore[index]
    check_delivery(producer.acked, [c.deliveries() for c in instances], redelivery=True, starts=starts)


def test_a_consumer_not_granted_the_lease_in_time_raises_wait_timeout(cluster: Cluster) -> None:
    """A consumer whose subscription's lease another holds past ``leader_timeout_s`` raises
    ordq's WaitTimeout (and takes nothing: the holder keeps it)."""
    from ordq.coordinator.client import CoordinatorClient, Held
    from ordq.sdk._lease_client import CoordinatorLease

    cluster.add_groups("g1")
    cluster.create_queue()
    cluster.store.create_subscription("q", "s")
    coord = CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials)
    holder = CoordinatorLease(coord, "consumer", "q", "s", "another-consumer", ttl_s=2.0)
    try:
        assert holder.acquire(30)
        config = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s",
                                leader_timeout_s=1.0)
        with pytest.raises(WaitTimeout, match="no consumer lease in 1.0s"):
            Consumer(config).start()
        assert holder.valid() or holder.wait_valid(5.0)
        assert isinstance(holder.held, Held) and cluster.consumer_lease().holder == "another-consumer"
    finally:
        holder.stop()
        coord.close()


def test_a_consumer_paused_past_its_lease_rejoins_and_completes_the_run(cluster: Cluster) -> None:
    """Clients that stay (issue 37). Guards: the check before handing out (``LeaseChecks``:
    nothing is handed out unless ``lease.valid()`` by the consumer's own clock, confirmed again
    after any blocking call) and the rejoin (``Consumer._rejoin``: what was read and not handed
    out dropped, the cursor read again, the seq filter reset to its ``last_seq``).

    A consumer program SIGSTOPped past its lease delivers nothing beside its successor (the
    audit's ``concurrent_consumers`` is 0). Resumed, it learns the lease went to another, waits
    as a standby and, once the successor dies, reads on from the committed cursor by itself and
    completes the run: every acked seq delivered, in order within each stretch, no gap. On the
    election SDK the resumed program stopped for good with NotLeader (exit 2)."""
    from ordq.drills.audit import read_deliveries
    from ordq.spark_order_check import CLASSES
    from ordq.spark_order_check.reference import check

    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    audit = cluster.base / "audit"
    n = 8000
    first = cluster.spawn_consumer("c1", until=n - 1, commit_ms=100.0, hold=True)
    second = cluster.spawn_consumer("c2", until=n - 1, commit_ms=100.0, hold=True)
    first.go()
    first.wait_leader()
    asked = cluster.coordinator_requests(rpc="Acquire")
    second.go()
    wait_until(lambda: cluster.coordinator_requests(rpc="Acquire") >= asked + 2, timeout_s=60, interval_s=0.1,
               what="c2 to wait for the lease")
    # A slow stream (16 s), started once both consumers run: the faults land while it flows.
    producer = cluster.producer(n=n, rate=500.0, audit_dir=audit)
    producer.start()
    wait_until(lambda: first.delivered_count() >= n // 8, timeout_s=120, interval_s=0.05, what="c1 to deliver")
    first.proc.pause()
    try:
        second.wait_leader(60)  # granted only once c1's lease ran out on the coordinator's clock
        at = second.delivered_count()
        wait_until(lambda: second.delivered_count() >= at + 200, timeout_s=120, interval_s=0.05,
                   what="c2 to deliver")
    finally:
        first.proc.resume()
    # Resumed: it is a standby now (it asks for the lease again), alive, delivering nothing.
    asked = cluster.coordinator_requests(rpc="Acquire")
    wait_until(lambda: cluster.coordinator_requests(rpc="Acquire") >= asked + 2, timeout_s=60, interval_s=0.1,
               what="the resumed c1 to wait for the lease again")
    assert first.proc.alive() and first.event("error") is None, first.records()[-3:]
    wait_until(lambda: second.delivered_count() >= n // 2, timeout_s=120, interval_s=0.05,
               what="c2 to deliver half")
    second.proc.kill()
    producer.join(FINISH_S)
    assert first.wait_exit(FINISH_S) == 0, first.records()[-3:]
    rejoined = first.event("rejoined")
    assert rejoined is not None, first.records()[-3:]
    done = first.event("done")
    assert done is not None and done["stats"]["rejoins"] == 1, done

    # c1 before its pause, c2, c1 after its rejoin: each stretch starts right after the cursor
    # it read, in order, and together they cover every acked seq.
    records = first.records()
    cut = records.index(rejoined)
    before, after = [r for r in records[:cut] if "d" in r], [r for r in records[cut:] if "d" in r]
    from tests.helpers.load import deliveries_in

    start2 = second.event("leader")
    assert start2 is not None
    check_delivery(producer.acked, [deliveries_in(before), second.deliveries(), deliveries_in(after)],
                   redelivery=True, starts=[None, start2["last_seq"], rejoined["last_seq"]])
    # No delivery beside another consumer: the audit's own verdict (the verifier's rules).
    by: dict[str, list[int]] = {}
    for d in read_deliveries(audit):
        by.setdefault(d.consumer, []).append(d.deliver_us)
    rejoined_ids = [c for c in by if c.endswith("#1")]
    assert len(by) == 3 and len(rejoined_ids) == 1 and rejoined_ids[0][:-2] in by, sorted(by)  # c1 after its rejoin
    counts = check(audit / "acks", audit / "deliveries").counts
    violations = {c.name: counts[c.name] for c in CLASSES if c.violation and counts.get(c.name)}
    assert not violations and counts["concurrent_consumers"] == 0, violations


def test_an_idle_consumer_describes_the_queue_less_and_less_often(cluster: Cluster) -> None:
    """Guard: ``QueueView.idle`` (no watch: at the end of an open segment the state is read
    again after ``fetch_wait_ms``, then twice as long each time up to ``IDLE_MAX_S``, never once
    per fetch). Here the application polls every 20 ms with ``fetch_wait_ms`` 200: per fetch
    that was ~50 Describes a second, once per fetch wait ~5 (15 in 3 s, issue 39); now ~5 in 3 s,
    and the consumer still learns of a roll (the replica's answer says its segment is sealed)."""
    import time

    from ordq.sdk._queue_view import IDLE_MAX_S

    cluster.add_groups("g1")
    cluster.create_queue()
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s", fetch_wait_ms=200)
    with Consumer(cfg) as c:
        assert c.poll(timeout_s=0.02) == []
        before = cluster.coordinator_requests(rpc="Describe")
        started = time.monotonic()
        polls = 0
        while time.monotonic() - started < 3.0:
            assert c.poll(timeout_s=0.02) == []
            polls += 1
        took = time.monotonic() - started
        asked = cluster.coordinator_requests(rpc="Describe") - before
        print(f"{polls} polls in {took:.1f} s: {asked:.0f} Describe calls")
        assert 1 <= asked <= took / IDLE_MAX_S + 4, (asked, polls, took)
        assert cluster.ordq("queue", "roll", "q").returncode == 0
        wait_until(lambda: (c.poll(timeout_s=0.02), c._require(c._view).cached().segment(1))[1] is not None,
                   timeout_s=30, what="the consumer to learn of the roll")


def test_an_idle_consumers_renewals_vouch_for_its_state_and_tell_it_its_subscription_went(cluster: Cluster) -> None:
    """Guard: the consumer's lease renewals ask for the queue state's stamp while it idles
    (``LeaseRequest.with_state``; ``QueueView.heard``): the same stamp as its cached state's
    stands for a Describe. Stop 100: 40 idle consumers took 20-23 % of a core of the leading
    coordinator, a Describe a second each (its state, its cursor and its groups' live nodes).
    Here 8 s idle: 9 Describes before (the first ones, then one a second), 2 now (the first
    ones, until the idle wait outgrows the renewals' period; at most 6 allowed: a renewal late
    past the idle wait on a loaded box costs one). The renewals still
    tell it what a Describe told: a forced delete of its subscription stops it at once
    (the stamp -1, then the Describe's SubscriptionNotFound)."""
    import time

    from ordq.common.errors import SubscriptionNotFound

    cluster.add_groups("g1", "g2")
    cluster.create_queue()
    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s", fetch_wait_ms=200)
    c = Consumer(cfg)
    c.__enter__()
    try:
        assert c.poll(timeout_s=0.02) == []
        before = cluster.coordinator_requests(rpc="Describe")
        started = time.monotonic()
        while time.monotonic() - started < 8.0:
            assert c.poll(timeout_s=0.02) == []
        took = time.monotonic() - started
        asked = cluster.coordinator_requests(rpc="Describe") - before
        print(f"{took:.1f} s idle: {asked:.0f} Describe calls")
        assert asked <= 6, asked  # a renewal late past the idle wait (a loaded box) costs one
        forced = cluster.ordq("sub", "delete", "q", "s", "--force")
        assert forced.returncode == 0, forced.stderr
        deleted = time.monotonic()

        def stopped() -> bool:
            try:
                c.poll(timeout_s=0.02)
            except SubscriptionNotFound:
                return True
            return False

        wait_until(stopped, timeout_s=30, what="the idle consumer to find its subscription gone")
        print(f"stopped {time.monotonic() - deleted:.2f} s after the delete")
        assert time.monotonic() - deleted < 5.0
    finally:
        c.__exit__(SubscriptionNotFound, SubscriptionNotFound("q", "s"), None)


def test_an_idle_consumer_of_a_queue_never_written_costs_its_replica_a_zookeeper_read_a_second_at_most(
        cluster: Cluster) -> None:
    """Guard: ``ReadPath._absent_open`` (broker_group/read_path.py). A replica holds no copy of a
    segment nobody wrote yet, and each long poll of it that ended read the queue's state from
    ZooKeeper: here (polled every 20 ms, so each fetch waits 20 ms) 212 reads in 5 s for one
    idle consumer; stop 100's 40 idle consumers (polled with longer waits) ~100 of the 225
    ZooKeeper requests a second. Now the segment found open there is answered so for 1 s
    without reading. What it must not hide: the first message
    written is delivered, and a roll of the empty segment is followed (the consumer's own
    state tells it; the replicas learn the seal)."""
    import json
    import time

    cluster.add_groups("g1")
    cluster.create_queue()
    replicas = [m.address for m in cluster.store.live_members("g1").values()]

    def absent_reads() -> int:
        return sum(int(json.loads(cluster.transport.health(a).stats_json)["absent_state_reads"]) for a in replicas)

    cfg = ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", subscription="s", fetch_wait_ms=200)
    with Consumer(cfg) as c:
        assert c.poll(timeout_s=0.02) == []
        before = absent_reads()
        started = time.monotonic()
        while time.monotonic() - started < 5.0:
            assert c.poll(timeout_s=0.02) == []
        took = time.monotonic() - started
        reads = absent_reads() - before
        print(f"{took:.1f} s idle on a queue never written: {reads} ZooKeeper reads by its replicas")
        assert reads <= 2 * took + 3, reads  # one a second per replica read at most; before: 212 in 5 s
        assert cluster.ordq("queue", "roll", "q").returncode == 0  # segment 0 sealed empty, 1 open
        writer = cluster.producer(n=1, queue="q")
        writer.start()
        writer.join(60)
        assert len(writer.acked) == 1 and writer.error is None
        got = wait_until(lambda: c.poll(timeout_s=0.05) or None, timeout_s=30, what="the first message")
        assert [m.seq for m in got] == [0] and got[0].seg == 1

"""The coordinator daemon as real processes: fails the head over when a head process dies,
and a standby daemon takes over its duties when the leader is killed -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kazoo.recipe.election import Election

from ordq.coordinator.state import SegStatus
from ordq.coordinator.store import ZkStore
from tests.util import wait_until

pytestmark = pytest.mark.zk
REPO = Path(__file__).resolve().parent.parent


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)


def test_daemon_fails_over_and_standby_takes_over(zk_server, zk_root) -> None:
    hosts = zk_server.connection_string
    procs: list[subprocess.Popen[str]] = []
    try:
        with ZkStore.connect(hosts, zk_root) as store:
            members = {}
            for g in ("g1", "g2", "g3"):
                store.add_group(g)
                p = spawn("-m", "tests.helpers.live_member", hosts, zk_root, "1.0",
                          f"{g}:master", f"{g}:slave")
                procs.append(p)
                assert p.stdout is not None and p.stdout.readline().strip() == "READY"
                members[g] = p
            store.create_queue("q")
            daemons = []
            for _ in range(2):
                # --away-grace 1: in step 2 the standby starts leading after g2 is gone, so it never
                # saw g2's address to probe; an idle queue then waits the grace from the term's start
                # (coordinator/away.py), 10 s by default
                d = spawn("-m", "ordq.cli", "--zk", hosts, "--root", zk_root, "coordinator", "run",
                          "--metrics", "127.0.0.1:0", "--interval", "0.2", "--away-grace", "1")
                procs.append(d)
                assert d.stdout is not None
                metrics_line = d.stdout.readline().split()
                assert d.stdout.readline().startswith("SERVING")  # its coordinator service
                assert d.stdout.readline().startswith("READY")
                daemons.append((d, metrics_line[1]))

            election = Election(store.client, store.paths.coordinator_leader)
            leader_ident = wait_until(lambda: (election.contenders() or [None])[0], what="a leader")
            leader = next(d for d, _ in daemons if leader_ident.split("@")[0].endswith(f"-{d.pid}"))
            standby_url = next(url for d, url in daemons if d is not leader)

            # 1. head g1 loses its processes: the daemon fails over to g2 at once
            killed_at = time.monotonic()
            os.kill(members["g1"].pid, signal.SIGKILL)
            st = store.wait_state("q", lambda s: s.head == "g2", timeout_s=10)
            failover_s = time.monotonic() - killed_at
            assert st.consume[0].status is SegStatus.SEALING and st.open_segment.gid == "g2"
            assert failover_s < 5, failover_s  # ~1 s session expiry + one watch event

            # 2. the leading daemon is killed -9; the standby is elected and does the duties
            os.kill(leader.pid, signal.SIGKILL)
            os.kill(members["g2"].pid, signal.SIGKILL)
            st = store.wait_state("q", lambda s: s.head == "g3", timeout_s=15)
            assert [s.status for s in st.consume[:2]] == [SegStatus.SEALING, SegStatus.SEALING]
            # The daemon counts an action once its write landed: the state can be seen first.
            def standby_counted() -> str | None:
                body = urllib.request.urlopen(standby_url, timeout=5).read().decode()
                return body if 'ordq_coordinator_actions_total{kind="fail_over"}' in body else None

            body = wait_until(standby_counted, timeout_s=10, interval_s=0.1, what="the standby to count its fail-over")
            assert "ordq_coordinator_leader 1" in body
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p.stdout:
                p.stdout.close()


# -- issue 23: the coordinator keeps every list live; bad state is one queue's problem ------------

from ordq.sdk import Producer, ProducerConfig  # noqa: E402
from tests.cluster import (  # noqa: E402, F401 - cluster_fixture provides the ``cluster`` fixture
    CLIENT_SESSION_TIMEOUT_S,
    SEND_TIMEOUT_S,
    Cluster,
    cluster_fixture,
)
from tests.helpers.load import make_payload  # noqa: E402

DEADLINE_S = 60.0  # generous under load: each test reports what it measured


def _metrics(proc: object) -> str:
    url = proc.wait_for_line("METRICS ", timeout_s=5)  # type: ignore[attr-defined]
    try:
        return urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return ""


def _produce_and_close(cluster: Cluster, n: int) -> None:
    # a long send timeout: a producer starved by a busy machine must not fail over here
    producer = cluster.producer(n=n, rate=None, send_timeout_s=15.0)
    producer.start()
    producer.join(timeout_s=DEADLINE_S)
    assert [a.seq for a in producer.acked] == list(range(n))


def test_restart_of_the_whole_cluster_hides_no_acked_message(cluster: Cluster) -> None:
    """`ordq down && ordq up` with a finished producer: before, the restarted master froze the
    open segment, nobody rolled it, and a new consumer delivered nothing (last readable -1)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    daemon = cluster.start_daemon("coordinator-1")
    _produce_and_close(cluster, 100)  # the producer closed: nobody will write again
    before = cluster.state()
    was_open = before.open_segment
    assert was_open is not None and all(s.last_seq != 99 for s in before.consume), before  # 99 is in it
    head_master = cluster.groups[was_open.gid].master
    assert not cluster.transport.segment_info(head_master.address or "", "q", was_open.seg).frozen

    daemon.stop()  # `ordq down`: coordinators and every broker
    for group in cluster.groups.values():
        group.stop()
    for group in cluster.groups.values():  # `ordq up`: brokers, then coordinators
        group.start()
    cluster.wait_live("g1", "g2")
    restarted = time.monotonic()
    # the restarted master says it will never write the segment it held open
    assert cluster.transport.segment_info(head_master.address or "", "q", was_open.seg).frozen
    cluster.start_daemon("coordinator-2")

    consumer = cluster.consumer(until=99)
    consumer.start()
    consumer.join(timeout_s=DEADLINE_S)
    readable_s = time.monotonic() - restarted
    assert [d.seq for d in consumer.delivered] == list(range(100))
    # (the consumer may read the replicas' sealed end before the seal's CAS lands in ZooKeeper)
    st = cluster.wait_state(lambda s: (x := s.segment(was_open.seg)) is not None and x.status is SegStatus.SEALED,
                            timeout_s=DEADLINE_S, what="the segment held open sealed")
    assert st.segment(was_open.seg).last_seq == 99, st  # type: ignore[union-attr]
    assert st.open_segment is not None and st.open_segment.seg > was_open.seg  # writable again
    print(f"all 100 acked messages read {readable_s:.2f}s after the cluster restarted, with no producer")


def test_a_queue_whose_only_group_restarted_takes_writes_again_within_seconds(cluster: Cluster) -> None:
    """Before: its one group held the (unread) segment, I4 refused to admit it, and with no
    subscription the queue refused writes for ever."""
    cluster.add_groups("g1")
    cluster.create_queue("q")
    cluster.start_daemon("coordinator")
    _produce_and_close(cluster, 20)

    group = cluster.groups["g1"]
    group.kill()
    cluster.wait_state(lambda s: s.open_segment is None, timeout_s=DEADLINE_S, what="failed over: no group left")
    group.start()
    cluster.wait_live("g1")
    back = time.monotonic()
    st = cluster.wait_state(lambda s: s.head == "g1" and s.open_segment is not None, timeout_s=DEADLINE_S,
                            what="g1 admitted again with its backlog")
    writable_s = time.monotonic() - back
    assert st.consume[0].seg == 0 and st.consume[0].gid == "g1"  # its backlog, still there
    assert cluster.store.list_subscriptions("q") == []  # nobody read the backlog
    config = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                            lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Producer(config) as producer:  # a new producer leader: seqs go on
        futures = [producer.send(make_payload(20 + i, "P2", 200)) for i in range(10)]
        producer.flush(timeout_s=DEADLINE_S)
        assert [f.result(timeout=DEADLINE_S).seq for f in futures] == list(range(20, 30))
    consumer = cluster.consumer(until=29)  # then every message, in order, across both segments
    consumer.start()
    consumer.join(timeout_s=DEADLINE_S)
    assert [d.seq for d in consumer.delivered] == list(range(30))
    print(f"writable again {writable_s:.2f}s after its group came back live")


def test_an_idle_queue_keeps_no_empty_segment_after_its_head_fails_over(cluster: Cluster) -> None:
    """Issue 43 (docs/BENCHMARKS.md, "Why an idle queue gains segments at load 40"): an idle
    queue with no subscription failed over (a kill here; a session blip under load there) kept
    its old segment, sealed empty, for ever: one more per blip. Now it is sealed, then popped:
    one open segment left, 'earliest' unchanged (nothing was in it)."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    daemon = cluster.start_daemon("coordinator")
    cluster.groups["g1"].master.kill()
    st = cluster.wait_state(lambda s: s.head == "g2" and [x.seg for x in s.consume] == [1], timeout_s=DEADLINE_S,
                            what="q failed over to g2, its old segment sealed empty and popped")
    assert st.consume[0].status is SegStatus.OPEN and st.trimmed_seq == -1
    assert cluster.store.list_subscriptions("q") == []
    assert 'ordq_coordinator_actions_total{kind="pop"}' in _metrics(daemon)


def test_garbage_in_one_queue_state_is_that_queue_s_problem(cluster: Cluster) -> None:
    """Before: both coordinators' election threads died (UnicodeDecodeError) and no duty was
    done for any queue."""
    cluster.add_groups("g1", "g2")
    cluster.create_queue("q")
    cluster.create_queue("bad")
    daemons = [cluster.start_daemon(f"coordinator-{i}") for i in (1, 2)]
    wait_until(lambda: any("ordq_coordinator_leader 1" in _metrics(d) for d in daemons), timeout_s=DEADLINE_S,
               what="a coordinator leads")
    good = cluster.store.client.get(cluster.paths.state("bad"))[0]
    cluster.store.client.set(cluster.paths.state("bad"), b"\xff\xfe not a state \x00")

    # the other queue still gets its duties: its head master dies, it is failed over and sealed
    cluster.groups["g1"].master.kill()
    # (segment 0 was never written and q has no subscription: once sealed, empty, it is popped,
    # state.pop, issue 43; only a sealed segment is ever popped, so gone counts as sealed)
    st = cluster.wait_state(lambda s: ((x := s.segment(0)) is None or x.status is SegStatus.SEALED)
                            and s.head == "g2", timeout_s=DEADLINE_S, what="q failed over and its old segment sealed")
    assert st.open_segment is not None and st.open_segment.gid == "g2"
    assert all(d.alive() for d in daemons)
    leader = wait_until(lambda: next((d for d in daemons if "ordq_coordinator_leader 1" in _metrics(d)), None),
                        timeout_s=DEADLINE_S, what="a coordinator still leads")
    body = _metrics(leader)
    assert 'ordq_queue_state_corrupt{queue="bad"} 1.0' in body
    assert "ordq_coordinator_corrupt_state_total" in body and 'kind="fail_over"' in body

    # the CLI: one line naming the queue; the other queue is listed
    described = cluster.ordq("queue", "describe", "bad")
    err = described.stderr.decode().strip()
    assert described.returncode == 1 and len(err.splitlines()) == 1 and "'bad'" in err and "corrupt" in err
    listed = cluster.ordq("queue", "list")
    assert listed.returncode == 1 and b"q " in listed.stdout.replace(b"\n", b" ")
    assert len(listed.stderr.decode().strip().splitlines()) == 1 and "'bad'" in listed.stderr.decode()

    # the leader is killed: the standby's election thread is alive too, and it leads
    assert leader is not None
    leader.kill()
    standby = next(d for d in daemons if d is not leader)
    wait_until(lambda: "ordq_coordinator_leader 1" in _metrics(standby), timeout_s=DEADLINE_S,
               what="the standby leads with the garbage still there")
    wait_until(lambda: 'ordq_queue_state_corrupt{queue="bad"} 1.0' in _metrics(standby), timeout_s=DEADLINE_S,
               what="the standby reports the corrupt queue")
    cluster.store.client.set(cluster.paths.state("bad"), good)  # restored: served again, no report
    wait_until(lambda: 'ordq_queue_state_corrupt{queue="bad"}' not in _metrics(standby),
               timeout_s=DEADLINE_S, what="the restored queue no longer reported")
    assert standby.alive() and cluster.ordq("queue", "describe", "bad").returncode == 0


def test_one_queue_s_bad_state_or_bug_leaves_the_others_served(zk_server, zk_root, monkeypatch) -> None:
    """In process: garbage in queue a's state and a bug in queue b's round; queue c still gets
    its failover, the round goes on, and both are counted (no broker needed: liveness nodes
    are written by this test's own session)."""
    from ordq.coordinator.daemon import CoordinatorDaemon

    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        for g in ("g1", "g2"):
            store.add_group(g)
            for role in ("master", "slave"):
                store.register_live(g, role, address=f"127.0.0.1:0/{g}/{role}", incarnation="t")
        for q in ("a", "b", "c"):
            store.create_queue(q)
        store.client.set(store.paths.state("a"), b'{"queue": "a", "send": 1}')
        # away_grace_s=0: an absent group's idle queues move in this very round, as a group
        # whose process refused the probe does (no broker here to probe: coordinator/away.py)
        daemon = CoordinatorDaemon(store, identifier="t", away_grace_s=0)
        real = daemon._queue_round

        def buggy(queue: str) -> None:
            if queue == "b":
                raise RuntimeError("a bug in one queue's round")
            real(queue)

        monkeypatch.setattr(daemon, "_queue_round", buggy)
        store.client.delete(store.paths.live("g1", "master"))  # the head of every queue loses its master
        daemon.round()
        assert store.load_state("c")[0].head == "g2"  # served
        assert daemon.stats.corrupt == {"a": "TypeError: field 'groups' is not a list"}
        assert daemon.stats.corrupt_seen == 1
        assert daemon.stats.unexpected == 1 and daemon.stats.errors == 2
        body = daemon.metrics.registry  # the series are there for a scrape
        from prometheus_client import generate_latest

        text = generate_latest(body).decode()
        assert "ordq_coordinator_corrupt_state_total 1.0" in text
        assert "ordq_coordinator_unexpected_errors_total 1.0" in text


def test_a_coordinator_whose_election_thread_dies_exits_non_zero(zk_server, zk_root, monkeypatch) -> None:
    """Issue 23: the election thread died silently and the process went on, showing standby."""
    import signal as signal_module

    from ordq.cli import main
    from ordq.coordinator.daemon import CoordinatorDaemon

    def broken_round(self: CoordinatorDaemon) -> None:
        raise RuntimeError("a bug outside any queue")

    monkeypatch.setattr(CoordinatorDaemon, "round", broken_round)
    monkeypatch.setattr(signal_module, "signal", lambda *_a: None)  # keep pytest's handlers
    code = main(["--zk", zk_server.connection_string, "--root", zk_root, "coordinator", "run"])
    assert code == 1


def test_status_calls_a_cluster_with_no_leading_coordinator_unhealthy() -> None:
    from ordq.cluster_health import ProcessStatus, no_leader_unhealthy

    def coordinator(state: str) -> ProcessStatus:
        return ProcessStatus(name=f"c-{state}", kind="coordinator", pid=1, listen="x", state=state, healthy=True)

    zk = ProcessStatus(name="zk1", kind="zookeeper", pid=1, listen="x", state="standalone", healthy=True)
    assert all(s.healthy for s in no_leader_unhealthy([zk, coordinator("leader"), coordinator("standby")]))
    both_standby = no_leader_unhealthy([zk, coordinator("standby"), coordinator("standby")])
    assert [s.healthy for s in both_standby] == [True, False, False]
    assert "no coordinator leads" in both_standby[1].detail


def test_a_topic_and_its_consumer_group_come_back_whole_after_every_broker_and_coordinator_is_killed(
        cluster: Cluster) -> None:
    """Issue 29: topic and group state lives in ZooKeeper records and ordinary subscriptions;
    this drives it through a kill -9 of every broker and the coordinator while a member reads,
    then a new member joins: every message of every key is delivered, in order, no partition by
    two members at once."""
    from tests.test_consumer_group import Recorder, Running, make_topic, member, produce

    cluster.add_groups("g1", "g2")
    make_topic(cluster, "t")
    daemon = cluster.start_daemon("coordinator-1")
    rec = Recorder()
    running = [Running(member(cluster, "t", "a"), rec)]
    try:
        expected = {pl for ps in produce(cluster, "t", 120).values() for _s, pl in ps}
        wait_until(lambda: rec.payloads() >= expected, timeout_s=DEADLINE_S, what="the first 120 delivered")

        daemon.kill()  # every broker and coordinator -9; member a stays
        for group in cluster.groups.values():
            group.kill()
        for group in cluster.groups.values():
            group.start()
        cluster.wait_live("g1", "g2")
        cluster.start_daemon("coordinator-2")

        running.append(Running(member(cluster, "t", "b"), rec))  # a member joins after the restart
        expected |= {pl for ps in produce(cluster, "t", 120, start=120).values() for _s, pl in ps}
        wait_until(lambda: rec.payloads() >= expected, timeout_s=DEADLINE_S, what="all 240 delivered")
        assert cluster.store.read_topic("t").partitions == 4
    finally:
        for r in running:
            r.leave()
    rec.check()
    assert rec.payloads() == expected


@pytest.mark.heavy  # 11 s of real processes at load 1
def test_an_empty_segment_behind_an_unread_one_is_dropped_and_a_reader_goes_past_it(cluster: Cluster) -> None:
    """Issue 43: segment 0 holds three messages nobody subscribed to, so it stays; a failover of
    the idle head left segment 1 sealed empty behind it, which ``pop`` (the head only) kept for
    ever. The daemon drops it (``state.drop_empty``), the broker frees its files, and a new
    subscription from 'earliest' reads segment 0, goes on past the gap to segment 2, and gets
    every message in order, once."""
    from ordq.coordinator import state as sm

    cluster.add_groups("g1", "g2")
    cluster.create_queue("q", ["g1", "g2"])
    cluster.start_daemon("coordinator")
    first = cluster.producer(n=3)
    first.start()
    first.join(DEADLINE_S)
    assert len(first.acked) == 3
    st = cluster.state()
    assert st.head == "g1" and st.open_segment is not None and st.open_segment.seg == 0
    cluster.store.apply("q", lambda s, f: sm.fail_over(s, "g1", 0, f))  # an operator's, or a blip's
    cluster.wait_state(lambda s: (x := s.segment(0)) is not None and x.status is SegStatus.SEALED and x.end == 3,
                       timeout_s=DEADLINE_S, what="segment 0 sealed with its 3 messages")
    cluster.store.apply("q", lambda s, f: sm.fail_over(s, "g2", 1, f))  # the send list empties: both admitted again
    st = cluster.wait_state(lambda s: [x.seg for x in s.consume] == [0, 2], timeout_s=DEADLINE_S,
                            what="segment 1, sealed empty behind the unread segment 0, dropped")
    assert st.consume[0].end == 3 and st.open_segment is not None and st.trimmed_seq == -1
    g2 = cluster.groups["g2"].master.proc.log_path
    wait_until(lambda: "segment q/1 removed" in g2.read_text(errors="replace"), timeout_s=DEADLINE_S,
               what="g2's master freed segment 1")
    config = ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue="q", send_timeout_s=SEND_TIMEOUT_S,
                            lease_ttl_s=CLIENT_SESSION_TIMEOUT_S)
    with Producer(config) as producer:  # a new producer leader: seqs go on, on segment 2
        futures = [producer.send(make_payload(3 + i, "Q", 200)) for i in range(2)]
        producer.flush(timeout_s=DEADLINE_S)
        assert [(f.result(timeout=DEADLINE_S).seq, f.result().seg) for f in futures] == [(3, 2), (4, 2)]
    consumer = cluster.consumer(until=4)
    consumer.start()
    consumer.join(DEADLINE_S)
    assert [d.seq for d in consumer.delivered] == [0, 1, 2, 3, 4]
    assert [(d.writer, d.payload_seq) for d in consumer.delivered] == [("P", 0), ("P", 1), ("P", 2), ("Q", 3),
                                                                         ("Q", 4)]
    assert all(d.intact for d in consumer.delivered)


@pytest.mark.parametrize("prober", [False, True])
def test_a_leader_with_nothing_to_do_waits_between_its_rounds(zk_server, zk_root, prober: bool) -> None:
    """Past its sweep period, with and without a prober, the leading daemon's rounds come when a
    timer or a watch says so (at most every ``interval_s`` here): it does not spin. It did: the
    sweep's time, left in ``_until_next`` once the sweep went to shares and never moved on, spun
    every leader at ~18,600 rounds a second from 5 min after its election (the drills' third
    round: the leader at 0.67 cores with nothing to do), and a daemon without a prober at once."""
    import threading

    from ordq.coordinator.daemon import CoordinatorDaemon

    with ZkStore.connect(zk_server.connection_string, zk_root) as store:
        store.add_group("g1")
        store.create_queue("q")
        daemon = CoordinatorDaemon(store, identifier="t", interval_s=0.5, sweep_interval_s=0.2,
                                   prober=(lambda _address: {}) if prober else None)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        thread.start()
        try:
            wait_until(lambda: daemon.stats.is_leader and daemon.stats.rounds > 0, timeout_s=20)
            time.sleep(0.5)  # past the sweep period (what is measured: its rounds over time)
            before = daemon.stats.rounds
            time.sleep(2.0)
            rounds = daemon.stats.rounds - before
            assert rounds <= 2.0 / 0.5 * 3 + 5, f"{rounds} rounds in 2 s with nothing to do"
        finally:
            daemon.stop()
            thread.join(10)


def test_a_leader_s_rounds_run_with_young_collections_spaced_and_the_thresholds_come_back_after(
        zk_server, zk_root, monkeypatch) -> None:
    """While it leads, the daemon's rounds run with a young collection per
    ``LEADING_YOUNG_THRESHOLD`` containers made (coordinator/daemon_gc.py: at 10^5 queues each
    pass over every queue's copy ended in a full collection); once it stops leading, the
    process's thresholds are as they were. Fails on 680715c: its rounds saw CPython's 700."""
    import gc
    import threading

    from ordq.coordinator.daemon import CoordinatorDaemon
    from ordq.coordinator.daemon_gc import LEADING_YOUNG_THRESHOLD

    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        with ZkStore.connect(zk_server.connection_string, zk_root) as store:
            store.add_group("g1")
            store.create_queue("q")
            daemon = CoordinatorDaemon(store, identifier="t", interval_s=0.2, prober=None)
            seen: list[tuple[int, int, int]] = []
            one_round = daemon.round

            def noting_the_thresholds() -> None:
                seen.append(gc.get_threshold())
                one_round()

            monkeypatch.setattr(daemon, "round", noting_the_thresholds)
            thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
            thread.start()
            try:
                wait_until(lambda: len(seen) >= 2, timeout_s=20, what="two rounds")
            finally:
                daemon.stop()
                thread.join(10)
            assert not thread.is_alive()
            assert set(seen) == {(LEADING_YOUNG_THRESHOLD, 10, 10)}, seen
            assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)

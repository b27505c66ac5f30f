"""Consumer groups on keyed topics (sdk/group.py): the pure assignment, property-tested, and
members on real ZooKeeper and brokers sharing a topic's partitions through joins and leaves.

What must hold: every partition has exactly one owner and the owners' counts differ by at most
one; every message is delivered; within a partition (so within a key) a member's deliveries are
in seq order, and a member that takes a partition over starts at or before where the previous
one stopped (from the committed cursor, never past it): no two members deliver one partition at
once, nothing is skipped.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.admin.consumer_groups import group_generation, group_members
from ordq.cli import main
from ordq.common.errors import LeaseLost, PermissionDenied
from ordq.common.metrics import value
from ordq.common.proc import ManagedProcess
from ordq.coordinator import group_desk
from ordq.coordinator.client import CoordinatorClient, Held
from ordq.coordinator.group_assign import (
    MAX_MEMBERS,
    assign_partitions,
    member_consumer_id,
    member_of_consumer,
    owner_of,
    parse_consumer_id,
)
from ordq.coordinator.group_desk import split_partition_queue
from ordq.coordinator.lease_desk import Grant, LeaseDesk
from ordq.coordinator.leases import Kind, LeaseName, margin_s
from ordq.coordinator.topics import TopicConfig, partition_of, partition_queue
from ordq.sdk import CommitConfig, Delivered, GroupConfig, GroupMember, Producer, ProducerConfig
from ordq.sdk._lease_client import CoordinatorLease
from ordq.spark_order_check.reference import check
from ordq.spark_order_check.report import CLASSES
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, SEND_TIMEOUT_S, Cluster, module_cluster
from tests.util import read_metrics, wait_until

members_st = st.lists(st.text("abcdefgh0123456789-", min_size=1, max_size=6), min_size=1, max_size=12, unique=True)


@settings(max_examples=60, deadline=None)
@given(members=members_st, partitions=st.integers(0, 64))
def test_every_partition_has_one_owner_and_the_spread_differs_by_at_most_one(members: list[str],
                                                                             partitions: int) -> None:
    owned = assign_partitions(members, partitions)
    assert set(owned) == set(members)
    flat = sorted(p for ps in owned.values() for p in ps)
    assert flat == list(range(partitions))  # each exactly once
    counts = [len(ps) for ps in owned.values()]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=60, deadline=None)
@given(members=members_st, partitions=st.integers(1, 32), data=st.data())
def test_the_assignment_depends_only_on_the_set_of_members(members: list[str], partitions: int, data) -> None:
    shuffled = data.draw(st.permutations(members))
    assert assign_partitions(shuffled, partitions) == assign_partitions(members, partitions)


@settings(max_examples=60, deadline=None)
@given(members=members_st, partitions=st.integers(1, 32), newcomer=st.text("xyz", min_size=7, max_size=7))
def test_a_join_moves_few_partitions(members: list[str], partitions: int, newcomer: str) -> None:
    """Bonus, not a guarantee: a join moves at most what the newcomer takes plus a few
    re-balancing moves (round-robin over the sorted members would move most partitions)."""
    before, after = owner_of(members, partitions), owner_of([*members, newcomer], partitions)
    moved = sum(1 for p in range(partitions) if before[p] != after[p])
    taken = sum(1 for p in range(partitions) if after[p] == newcomer)
    assert moved <= 2 * taken + len(members)


def test_a_group_consumer_id_names_its_member_and_partition() -> None:
    """One definition of the id pattern for the SDK and the coordinator (group_assign.py)."""
    cid = member_consumer_id("m-1-p2", 3, 7)
    assert parse_consumer_id(cid) == ("m-1-p2", 3, 7) and member_of_consumer(cid) == "m-1-p2"
    assert parse_consumer_id("plain") is None and member_of_consumer("plain") == "plain"
    assert split_partition_queue("orders.p12") == ("orders", 12)
    assert split_partition_queue("orders") is None and split_partition_queue("orders.p01") is None


# -- members on a real cluster ---------------------------------------------------------------------

PARTITIONS = 4
KEYS = [b"key-%02d" % i for i in range(24)]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory) -> Cluster:  # type: ignore[no-untyped-def]
    with module_cluster(zk_server, tmp_path_factory, "group", "g1", "g2") as c:
        yield c


def make_topic(cluster: Cluster, topic: str, partitions: int = PARTITIONS) -> None:
    cluster.store.create_topic(topic, partitions)


def produce(cluster: Cluster, topic: str, n: int, *, start: int = 0,
            audit_dir: Path | None = None) -> dict[int, list[tuple[int, bytes]]]:
    """``n`` messages over KEYS, each routed to ``partition_of(key)``; payload ``key:i``.
    Returns per partition the (seq, payload) sent, in order."""
    sent: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    producers = {p: Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=partition_queue(topic, p),
                                            send_timeout_s=SEND_TIMEOUT_S, audit_dir=audit_dir,
                                            lease_ttl_s=CLIENT_SESSION_TIMEOUT_S))
                 for p in range(PARTITIONS)}
    try:
        for pr in producers.values():
            pr.start()
        futures = []
        for i in range(start, start + n):
            key = KEYS[i % len(KEYS)]
            p = partition_of(key, PARTITIONS)
            payload = b"%s:%d" % (key, i)
            futures.append((p, payload, producers[p].send(payload, key=key)))
        for p, payload, f in futures:
            sent[p].append((f.result(timeout=60).seq, payload))
    finally:
        for pr in producers.values():
            pr.close()
    return sent


class Recorder:
    """Every delivery: (partition, member, seq, key, payload, time), thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[int, str, int, bytes, bytes, float]] = []

    def handler(self, member: str):  # type: ignore[no-untyped-def]
        def handle(partition: int, m: Delivered) -> None:
            with self.lock:
                self.rows.append((partition, member, m.seq, m.key or b"", m.payload, time.monotonic()))
        return handle

    def payloads(self) -> set[bytes]:
        with self.lock:
            return {r[4] for r in self.rows}

    def check(self) -> None:
        """Per partition, in delivery order: runs of one member (tenures); inside a tenure seqs
        rise by one; a tenure starts at or before the previous one's end + 1 (it resumed from
        the committed cursor): no interleaving of two members, nothing skipped."""
        by_p: dict[int, list[tuple[str, int]]] = defaultdict(list)
        with self.lock:
            for p, member, seq, _k, _pl, _t in sorted(self.rows, key=lambda r: r[5]):
                by_p[p].append((member, seq))
        for p, rows in by_p.items():
            tenures: list[tuple[str, int, int]] = []  # member, first, last
            for member, seq in rows:
                if tenures and tenures[-1][0] == member:
                    who, first, last = tenures[-1]
                    assert seq == last + 1, f"partition {p}: {member} delivered {seq} after {last}"
                    tenures[-1] = (who, first, seq)
                else:
                    if tenures:
                        assert seq <= tenures[-1][2] + 1, f"partition {p}: {member} took over at {seq} after " \
                                                          f"{tenures[-1]}: skipped, or two members at once"
                    tenures.append((member, seq, seq))


def member(cluster: Cluster, topic: str, name: str) -> GroupMember:
    return GroupMember(GroupConfig(zk_hosts=cluster.hosts, root=cluster.root, topic=topic, group="G", member_id=name,
                                   lease_ttl_s=CLIENT_SESSION_TIMEOUT_S, takeover_poll_s=0.5,
                                   commit=CommitConfig(every_messages=20, every_ms=50)))


class Running:
    def __init__(self, m: GroupMember, rec: Recorder) -> None:
        self.member, self.stop = m, threading.Event()
        self.error: BaseException | None = None
        m.start()
        self.thread = threading.Thread(target=self._run, args=(rec,), daemon=True)
        self.thread.start()

    def _run(self, rec: Recorder) -> None:
        try:
            self.member.run(rec.handler(self.member.config.member_id), stop=self.stop, recheck_s=0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by leave()
            self.error = exc

    def leave(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.member.close()
        assert not self.thread.is_alive() and self.error is None, self.error


def topic_group(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``ordq topic group ...`` in-process: (exit code, stdout)."""
    capsys.readouterr()
    code = main(["--zk", cluster.hosts, "--root", cluster.root, "topic", "group", *argv])
    return code, capsys.readouterr().out


@pytest.mark.zk
def test_members_share_the_partitions_through_joins_and_leaves(cluster: Cluster,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    make_topic(cluster, "t1")
    rec = Recorder()
    a, b = Running(member(cluster, "t1", "a"), rec), Running(member(cluster, "t1", "b"), rec)
    running = [a, b]
    try:
        expected = {pl for ps in produce(cluster, "t1", 200).values() for _s, pl in ps}

        def split_as(want: dict[str, list[int]]) -> bool:
            return all(r.member.assignment() == want.get(r.member.config.member_id, []) for r in running)

        wait_until(lambda: split_as(assign_partitions(["a", "b"], PARTITIONS)), timeout_s=60,
                   what="a and b to lead two partitions each")
        wait_until(lambda: rec.payloads() >= expected, timeout_s=60, what="the first 200 delivered")
        c = Running(member(cluster, "t1", "c"), rec)  # a member joins
        running.append(c)
        expected |= {pl for ps in produce(cluster, "t1", 200, start=200).values() for _s, pl in ps}
        wait_until(lambda: split_as(assign_partitions(["a", "b", "c"], PARTITIONS)), timeout_s=60,
                   what="the partitions spread over a, b and c")
        # `ordq topic group` lists the member leases and the generation's assignment
        code, out = topic_group(cluster, capsys, "t1", "G", "--json")
        doc = json.loads(out)
        assert code == 0 and set(doc["members"]) == {"a", "b", "c"} and doc["generation"] >= 3
        assert {m: i["assigned"] for m, i in doc["members"].items()} == assign_partitions(["a", "b", "c"], PARTITIONS)
        code, out = topic_group(cluster, capsys, "t1", "G")
        assert code == 0 and "3 member(s) in generation" in out
        a.leave()  # a member leaves: it stops delivering, commits, releases; the others take over
        running.remove(a)
        expected |= {pl for ps in produce(cluster, "t1", 200, start=400).values() for _s, pl in ps}
        wait_until(lambda: split_as(assign_partitions(["b", "c"], PARTITIONS)), timeout_s=60,
                   what="b and c to take a's partitions")
        wait_until(lambda: rec.payloads() >= expected, timeout_s=60, what="all 600 delivered")
    finally:
        for r in running:
            r.leave()
    rec.check()
    assert {r[1] for r in rec.rows} == {"a", "b", "c"}


# -- membership is a lease: members killed, hung, forged ----------------------------------------------

def live_members(cluster: Cluster, topic: str) -> list[str]:
    """The members whose lease node the coordinator keeps (an expired one goes once it noticed)."""
    return sorted(group_members(cluster.store, topic, "G"))


def spawn_member(cluster: Cluster, topic: str, name: str, audit: Path) -> ManagedProcess:
    proc = cluster.spawn_ordq(name, "consume", "--topic", topic, "--group", "G", "--member", name, "--quiet",
                              "--json", "--audit-dir", str(audit))
    proc.wait_for_line("joined group", timeout_s=90)
    return proc


def wait_all_committed(cluster: Cluster, topic: str, sent: dict[int, list[tuple[int, bytes]]]) -> None:
    def done() -> bool:
        return all(cluster.store.get_cursor(partition_queue(topic, p), "G")[0].last_seq >= rows[-1][0]
                   for p, rows in sent.items())
    wait_until(done, timeout_s=120, what="every partition's cursor past its last acked message")


def verdict(audit: Path) -> dict[str, int]:
    """The verifier's violations (spark_order_check/reference.py: the rules in plain Python)."""
    counts = check(audit / "acks", audit / "deliveries").counts
    assert counts.get("concurrent_consumers", 0) == 0, counts
    return {c.name: counts[c.name] for c in CLASSES if c.violation and counts.get(c.name)}


def merge(a: dict[int, list[tuple[int, bytes]]], b: dict[int, list[tuple[int, bytes]]]) -> None:
    for p, rows in b.items():
        a.setdefault(p, []).extend(rows)


def held_by(cluster: Cluster, topic: str, member: str) -> list[int]:
    """The partitions whose consumer lease a consumer of ``member`` holds (not given back)."""
    held = []
    for p in range(PARTITIONS):
        record = cluster.consumer_lease(partition_queue(topic, p), "G")
        if record is not None and not record.released and parse_consumer_id(record.holder) is not None \
                and member_of_consumer(record.holder) == member:
            held.append(p)
    return held


def consumers_of(audit: Path, member: str) -> set[str]:
    """The consumer instances of ``member`` that wrote deliveries (one audit file each)."""
    ids = {f.name.split(".")[0].rpartition("-")[0] for f in (audit / "deliveries").glob("*")}  # <id>-<n>.tsv
    return {cid for cid in ids if parse_consumer_id(cid) is not None and member_of_consumer(cid) == member}


@pytest.mark.zk
def test_a_killed_member_process_gives_its_partitions_to_the_survivors(cluster: Cluster, tmp_path: Path) -> None:
    """Guard: membership is a lease the coordinator expires (coordinator/group_desk.py). A member
    killed (-9) leaves the group about one ttl later, the survivors take its partitions, and
    every acked message is delivered once per partition, in order (the verifier's classes)."""
    make_topic(cluster, "tk")
    audit = tmp_path / "audit"
    procs = {m: spawn_member(cluster, "tk", m, audit) for m in ("m1", "m2", "m3")}
    try:
        wait_until(lambda: live_members(cluster, "tk") == ["m1", "m2", "m3"], timeout_s=60, what="three members")
        sent = produce(cluster, "tk", 240, audit_dir=audit)
        wait_all_committed(cluster, "tk", sent)
        generation = group_generation(cluster.store, "tk", "G")
        procs.pop("m1").kill()
        killed = time.monotonic()
        merge(sent, produce(cluster, "tk", 240, start=240, audit_dir=audit))
        # the coordinator evicts the lease first, then writes the new generation (GroupDesk._refresh)
        wait_until(lambda: live_members(cluster, "tk") == ["m2", "m3"]
                   and group_generation(cluster.store, "tk", "G") > generation,
                   timeout_s=60, what="m1 to leave the group (a new generation without it)")
        left_after = time.monotonic() - killed
        wait_all_committed(cluster, "tk", sent)
        moved_after = time.monotonic() - killed
        print(f"m1 killed: out of the group after {left_after:.1f} s, every partition committed to the end after "
              f"{moved_after:.1f} s (member ttl 3 s)")
        assert left_after < 30, "a dead member stays in the group"
    finally:
        for proc in procs.values():
            proc.stop()
    assert verdict(audit) == {}


@pytest.mark.zk
def test_a_member_paused_past_its_ttl_loses_its_partitions_and_rejoins(cluster: Cluster, tmp_path: Path) -> None:
    """Guard: a member whose lease expired is evicted (a new generation without it) and its
    renewal is refused: it gives every partition up and joins again (GroupMember._rejoin), and
    gets partitions back in a later generation; never two consumers of a partition at once."""
    make_topic(cluster, "tp")
    audit = tmp_path / "audit"
    procs = {m: spawn_member(cluster, "tp", m, audit) for m in ("m1", "m2")}
    try:
        wait_until(lambda: live_members(cluster, "tp") == ["m1", "m2"], timeout_s=60, what="two members")
        sent = produce(cluster, "tp", 200, audit_dir=audit)
        wait_all_committed(cluster, "tp", sent)
        before = consumers_of(audit, "m1")
        assert before, "m1 delivered nothing before its pause"
        procs["m1"].pause()
        try:
            wait_until(lambda: live_members(cluster, "tp") == ["m2"], timeout_s=60, what="m1 evicted")
            merge(sent, produce(cluster, "tp", 200, start=200, audit_dir=audit))
            wait_all_committed(cluster, "tp", sent)  # m2 delivers every partition meanwhile
        finally:
            procs["m1"].resume()
        wait_until(lambda: live_members(cluster, "tp") == ["m1", "m2"], timeout_s=60, what="m1 to join again")
        # m2 may commit everything sent before it hands m1's partitions over: send once m1 holds one
        wait_until(lambda: held_by(cluster, "tp", "m1"), timeout_s=60, what="m1 to hold a partition again")
        merge(sent, produce(cluster, "tp", 200, start=400, audit_dir=audit))
        wait_all_committed(cluster, "tp", sent)
        wait_until(lambda: consumers_of(audit, "m1") - before, timeout_s=60,
                   what="m1 to deliver from a partition again")
    finally:
        for proc in procs.values():
            proc.stop()
    summary = procs["m1"].log_tail(400)
    assert '"rejoins": 1' in summary, summary
    assert verdict(audit) == {}


def refusals(cluster: Cluster, outcome: str) -> float:
    line = cluster.coordinators[0].wait_for_line("METRICS ", timeout_s=30)
    return value(read_metrics(line.split()[-1]), "ordq_coordinator_requests_total", outcome=outcome) or 0.0


@pytest.mark.zk
def test_a_forged_member_takes_partitions_only_by_joining_and_only_while_it_stays(cluster: Cluster) -> None:
    """Guard: the coordinator grants a group partition's consumer lease only to the consumer of
    the member owning it in the current generation (group_desk.check_consumer), bounds a
    group's members, and refuses a former owner's renewals after the grace. A consume token
    joining with made-up ids is refused (counted) every partition it does not own, cannot ask
    in an owner's name with its own member lease, and keeps what it owned only while it stays."""
    make_topic(cluster, "ta")
    rec = Recorder()
    running = [Running(member(cluster, "ta", "a"), rec), Running(member(cluster, "ta", "b"), rec)]
    try:
        wait_until(lambda: all(r.member.assignment() for r in running), timeout_s=60, what="a and b deliver")
        with CoordinatorClient(bootstrap=cluster.bootstrap, credentials=cluster.credentials) as c:
            membership = CoordinatorLease(c, "member", "ta", "G", "evil", ttl_s=1.0)
            assert membership.acquire(30)
            evil = membership.held
            assert evil.group_generation > 0
            mine = set(evil.partitions)
            assert mine == set(assign_partitions(["a", "b", "evil"], PARTITIONS)["evil"])
            denied = refusals(cluster, "PermissionDenied")
            others = [p for p in range(PARTITIONS) if p not in mine]
            owners = owner_of(["a", "b", "evil"], PARTITIONS)
            for p in others:
                q = partition_queue("ta", p)
                with pytest.raises(PermissionDenied, match="not the consumer"):
                    c.acquire("consumer", q, "G", member_consumer_id("evil", p, 1), member=membership.held)
                with pytest.raises(PermissionDenied, match="without that member's lease"):  # owner's id, our lease
                    c.acquire("consumer", q, "G", member_consumer_id(owners[p], p, 99), member=membership.held)
                with pytest.raises(PermissionDenied):  # not a group consumer at all
                    c.acquire("consumer", q, "G", "plain-consumer")
            assert refusals(cluster, "PermissionDenied") >= denied + 3 * len(others)

            def take(p: int) -> Held | None:  # what it owns it gets, as any member (once given up)
                got = c.acquire("consumer", partition_queue("ta", p), "G", member_consumer_id("evil", p, 1),
                                ttl_ms=1000, member=membership.held)
                return got if isinstance(got, Held) else None

            taken = {p: wait_until(lambda p=p: take(p), timeout_s=30, interval_s=0.1, what=f"partition {p} taken")
                     for p in sorted(mine)}
            wait_until(lambda: all(not set(r.member.assignment()) & mine for r in running), timeout_s=60,
                       what="a and b to give evil's partitions up")
            # It stops renewing its membership but goes on renewing its consumer leases: they are
            # refused once the generation without it is older than their ttl (+ margin).
            membership.stop(release=False)

            def consumer_leases_refused() -> bool:
                for p, held in taken.items():
                    try:
                        taken[p] = c.heartbeat(held)
                    except LeaseLost:
                        return True
                return False

            wait_until(consumer_leases_refused, timeout_s=30, interval_s=0.2, what="evil's renewals refused")
            assert "evil" not in live_members(cluster, "ta")
        # the members get every partition back and deliver everything, one member at a time
        wait_until(lambda: sorted(p for r in running for p in r.member.assignment()) == list(range(PARTITIONS)),
                   timeout_s=60, what="a and b to own every partition again")
        expected = {pl for ps in produce(cluster, "ta", 200).values() for _s, pl in ps}
        wait_until(lambda: rec.payloads() >= expected, timeout_s=60, what="all 200 delivered")
    finally:
        for r in running:
            r.leave()
    rec.check()


# -- the group desk on an in-memory store (the coordinator's logic, no I/O) ------------------------

class MemoryStore:
    """What LeaseDesk and GroupDesk read and write of ZooKeeper, in memory (unit tests only)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.leases: dict[object, tuple[object, int]] = {}
        self.groups: dict[tuple[str, str], tuple[int, int]] = {}

    def read_lease(self, name):  # type: ignore[no-untyped-def]
        return self.leases.get(name, (None, -1))

    def write_lease(self, name, record, version):  # type: ignore[no-untyped-def]
        assert self.leases.get(name, (None, -1))[1] == version
        self.leases[name] = (record, version + 1)
        return version + 1

    def delete_lease(self, name, version):  # type: ignore[no-untyped-def]
        self.leases.pop(name, None)

    def lease_members(self, tq, group):  # type: ignore[no-untyped-def]
        return sorted(n.member for n in self.leases if n.queue == tq and n.sub == group and n.member)

    def read_group(self, tq, group):  # type: ignore[no-untyped-def]
        return self.groups.get((tq, group))

    def write_group(self, tq, group, generation, version):  # type: ignore[no-untyped-def]
        assert self.groups.get((tq, group), (0, -1))[1] == version
        self.groups[(tq, group)] = (generation, version + 1)
        return version + 1

    def read_topic(self, topic):  # type: ignore[no-untyped-def]
        return TopicConfig(partitions=self.partitions)


def desk_at(partitions: int = 4):  # type: ignore[no-untyped-def]
    now = [0.0]
    desk = LeaseDesk(MemoryStore(partitions), term=lambda: 1, clock=lambda: now[0], sleep=lambda s: None)  # type: ignore[arg-type]
    return desk, now


def join(desk: LeaseDesk, member: str, ttl_ms: int = 1000):  # type: ignore[no-untyped-def]
    got, answer = desk.groups.join(LeaseName(Kind.MEMBER, "t.p0", "G", member), "t", ttl_ms)
    return got, answer


def test_the_generation_moves_with_every_join_expiry_and_leave() -> None:
    """Guard: group_desk bumps the generation on a grant to a new member, an expiry and a
    release, and answers each member's partitions of that generation; an expired member's
    renewal is refused (it rejoins) instead of reviving it."""
    desk, now = desk_at()
    a, ans_a = join(desk, "a")
    assert ans_a.generation == 1 and ans_a.partitions == (0, 1, 2, 3)
    b, ans_b = join(desk, "b")
    assert ans_b.generation == 2 and set(ans_b.partitions) == set(assign_partitions(["a", "b"], 4)["b"])
    again, none = join(desk, "b")  # the same member id while b lives: not granted
    assert none is None and again.holder == "b"
    _, beat = desk.groups.beat(LeaseName(Kind.MEMBER, "t.p0", "G", "a"), "t", a.record.generation, a.key)
    assert beat.generation == 2 and set(beat.partitions) == set(assign_partitions(["a", "b"], 4)["a"])
    now[0] = 0.9  # a renews, b does not
    desk.groups.beat(LeaseName(Kind.MEMBER, "t.p0", "G", "a"), "t", a.record.generation, a.key)
    now[0] = 1.3  # b's ttl + margin ran out
    _, beat = desk.groups.beat(LeaseName(Kind.MEMBER, "t.p0", "G", "a"), "t", a.record.generation, a.key)
    assert beat.generation == 3 and beat.partitions == (0, 1, 2, 3)
    with pytest.raises(LeaseLost):
        desk.groups.beat(LeaseName(Kind.MEMBER, "t.p0", "G", "b"), "t", b.record.generation, b.key)
    b2, ans_b2 = join(desk, "b")  # b rejoins: a new generation
    assert ans_b2 is not None and ans_b2.generation == 4 and ans_b2.partitions
    desk.groups.leave(LeaseName(Kind.MEMBER, "t.p0", "G", "b"), "t", b2.record.generation, b2.key)
    _, beat = desk.groups.beat(LeaseName(Kind.MEMBER, "t.p0", "G", "a"), "t", a.record.generation, a.key)
    assert beat.generation == 5 and beat.partitions == (0, 1, 2, 3)
    assert desk.groups.stats.generations == 5 and desk.groups.stats.expired >= 1


def test_a_group_has_at_most_max_members_and_only_owners_get_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard: the member bound (refused, counted) and the owner check of a partition's consumer
    lease, with the grace after which a former owner's renewals are refused. (The bound is
    lowered here: 1,000 joins one by one cost ~10 s of CPU on a loaded box.)"""
    assert MAX_MEMBERS == 1000
    monkeypatch.setattr(group_desk, "MAX_MEMBERS", 64)
    desk, now = desk_at(partitions=2)
    members = {f"m{i}": join(desk, f"m{i}", ttl_ms=60_000)[0] for i in range(64)}
    with pytest.raises(PermissionDenied, match="members"):
        join(desk, "one-more")
    assert desk.groups.stats.refused_full == 1
    owners = owner_of([f"m{i}" for i in range(64)], 2)
    name = LeaseName(Kind.CONSUMER, "t.p1", "G")
    with pytest.raises(PermissionDenied):
        desk.groups.check_consumer(name, member_consumer_id("m-not", 1, 1), renewing=False)
    not_owner = next(m for m in (f"m{i}" for i in range(64)) if m != owners[1])
    with pytest.raises(PermissionDenied):
        desk.groups.check_consumer(name, member_consumer_id(not_owner, 1, 1), renewing=False)
    with pytest.raises(PermissionDenied):  # the owner's id but for another partition's lease
        desk.groups.check_consumer(name, member_consumer_id(owners[0], 0, 1), renewing=False)
    holder = member_consumer_id(owners[1], 1, 1)
    with pytest.raises(PermissionDenied, match="without that member's lease"):  # the owner's id, no proof
        desk.groups.check_consumer(name, holder, renewing=False)
    member = members[owners[1]]
    desk.groups.check_consumer(name, holder, renewing=False, proof=(member.record.generation, member.key))
    granted = desk.acquire(name, holder, ttl_ms=1000)
    assert isinstance(granted, Grant)
    # every membership expires (nobody renews): p1 has no owner; its consumer renews for the grace only
    now[0] = 100.0  # every member expired (60 s + margin); the consumer lease revived meanwhile
    desk.heartbeat(name, granted.record.generation, granted.key)
    desk.groups.check_consumer(name, holder, renewing=True)  # a new generation now: the grace starts
    now[0] = 100.0 + 1.0 + margin_s(1000)
    with pytest.raises(LeaseLost):
        desk.groups.check_consumer(name, holder, renewing=True)
    assert desk.groups.stats.refused_renewals == 1

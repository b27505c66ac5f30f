"""Consumer groups on keyed topics (sdk/group.py): the pure assignment, property-tested, and
members on real ZooKeeper and brokers sharing a topic's partitions through joins and leaves.

What must hold: every partition has exactly one owner and the owners' counts differ by at most
one; every message is delivered; within a partition (so within a key) a member's deliveries are
in seq order, and a member that takes a partition over starts at or before where the previous
one stopped (from the committed cursor, never past it): no two members deliver one partition at
once, nothing is skipped.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq.coordinator.group_assign import assign_partitions, owner_of
from ordq.coordinator.topics import partition_of, partition_queue
from ordq.sdk import CommitConfig, Delivered, GroupConfig, GroupMember, Producer, ProducerConfig
from tests.cluster import CLIENT_SESSION_TIMEOUT_S, SEND_TIMEOUT_S, Cluster, module_cluster
from tests.util import wait_until

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


# -- members on a real cluster ---------------------------------------------------------------------

PARTITIONS = 4
KEYS = [b"key-%02d" % i for i in range(24)]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory) -> Cluster:  # type: ignore[no-untyped-def]
    with module_cluster(zk_server, tmp_path_factory, "group", "g1", "g2") as c:
        yield c


def make_topic(cluster: Cluster, topic: str, partitions: int = PARTITIONS) -> None:
    cluster.store.create_topic(topic, partitions)


def produce(cluster: Cluster, topic: str, n: int, *, start: int = 0) -> dict[int, list[tuple[int, bytes]]]:
    """``n`` messages over KEYS, each routed to ``partition_of(key)``; payload ``key:i``.
    Returns per partition the (seq, payload) sent, in order."""
    sent: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    producers = {p: Producer(ProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=partition_queue(topic, p),
                                            send_timeout_s=SEND_TIMEOUT_S,
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


@pytest.mark.zk
def test_members_share_the_partitions_through_joins_and_leaves(cluster: Cluster) -> None:
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

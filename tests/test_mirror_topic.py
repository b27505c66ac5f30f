"""``ordq mirror run`` of a keyed topic on real processes (issue 40): partition i of A's topic
to partition i of B's, so that each key keeps its order, through a kill -9 of the mirror; and
topics of different partition counts refused before anything is copied."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from ordq.coordinator.topics import partition_of, partition_queue
from ordq.mirror.chain import parse_chain
from ordq.sdk import Consumer, ConsumerConfig, TopicProducer, TopicProducerConfig
from tests.cluster import Cluster
from tests.test_mirror import end, last_readable, two  # noqa: F401 - provides the ``two`` fixture (clusters A and B)
from tests.util import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.heavy]
PARTITIONS, KEYS = 3, 24


def send(c: Cluster, keys_from: int, rounds: range) -> None:
    """Round r sends ``<key>:<r>`` with key ``k<i>`` for each of KEYS keys, and waits for the acks."""
    cfg = TopicProducerConfig(zk_hosts=c.hosts, root=c.root, topic="orders", lease_ttl_s=2.0, send_timeout_s=2.0)
    with TopicProducer(cfg) as p:
        for r in rounds:
            for i in range(keys_from, keys_from + KEYS):
                p.send(f"k{i}:{r}".encode(), key=f"k{i}")
        p.flush(60)


def read(c: Cluster, queue: str, n: int) -> list[tuple[int, bytes, bytes, list]]:
    """The first ``n`` messages of ``queue``: (seq, key, payload, chain)."""
    got: list[tuple[int, bytes, bytes, list]] = []
    cfg = ConsumerConfig(zk_hosts=c.hosts, root=c.root, queue=queue, subscription="check")
    with Consumer(cfg) as consumer:
        def more() -> bool:
            got.extend((m.seq, m.key or b"", m.payload, parse_chain(m.headers)) for m in consumer.poll(0.5))
            return len(got) >= n
        wait_until(more, timeout_s=120, what=f"{n} messages of {queue} on {c.root}")
    return got


def test_a_topic_mirror_copies_each_partition_to_the_same_partition_and_keeps_each_keys_order(
        two: tuple[Cluster, Cluster], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    a, b = two
    for c in (a, b):
        c.add_groups("g1", "g2")
        done = c.ordq("topic", "create", "orders", "--partitions", str(PARTITIONS))
        assert done.returncode == 0, done.stderr
    assert b.ordq("topic", "create", "two", "--partitions", "2").returncode == 0
    refused = a.ordq("mirror", "run", "--from", end(a, "topic:orders"), "--to", end(b, "topic:two"))
    err = refused.stderr.decode().strip().splitlines()
    assert refused.returncode == 1 and len(err) == 1, refused
    assert f"topic:orders has {PARTITIONS} partitions and " in err[0] and "topic:two has 2" in err[0]
    assert f"give the target topic {PARTITIONS} partitions" in err[0]
    refused = a.ordq("mirror", "run", "--from", end(a, "topic:orders"), "--to", end(b, "orders.p0"))
    assert refused.returncode == 1 and "a queue to a queue or a topic to a topic" in refused.stderr.decode()

    argv = ["-m", "ordq.cli", "mirror", "run", "--from", end(a, "topic:orders"), "--to", end(b, "topic:orders"),
            "--lease-ttl", "2", "--send-timeout", "1", "--retry-max", "1", "--max-batch", "50"]
    m1 = a.spawn("m1", [*argv, "--instance", "m1"])
    # the STARTED line itself: the partitions' threads log at once after it, so it is soon out of
    # a short tail (a heavy-tier failure at 15:06 on 2026-11-30: 'STANDBY ... orders.p1' there)
    started = m1.wait_for_line("STARTED", timeout_s=60)
    assert f"on each of {PARTITIONS} partitions" in started, started
    send(a, 0, range(0, 20))
    # kill -9 the mirror while it copies; a new instance goes on from what B holds
    wait_until(lambda: m1.log_tail(200).count("LEADING mirror") >= PARTITIONS, timeout_s=60,
               what="m1 to lead every partition")
    m1.kill()
    m2 = a.spawn("m2", [*argv, "--instance", "m2"])
    send(a, 0, range(20, 40))
    m2.wait_for_line("LEADING", timeout_s=60)

    per_partition: dict[int, int] = defaultdict(int)
    for i in range(KEYS):
        per_partition[partition_of(f"k{i}".encode(), PARTITIONS)] += 40
    for p in range(PARTITIONS):
        queue = partition_queue("orders", p)
        n = per_partition[p]
        source = read(a, queue, n)
        copy = read(b, queue, n)
        # partition p of B holds partition p of A: every message once, in A's order
        assert [(k, v) for _, k, v, _ in copy] == [(k, v) for _, k, v, _ in source]
        assert [chain[-1].seq for _, _, _, chain in copy] == [s for s, _, _, _ in source]
        assert all(partition_of(k, PARTITIONS) == p for _, k, _, _ in copy)
        rounds: dict[bytes, list[int]] = defaultdict(list)
        for _, k, v, _ in copy:
            rounds[k].append(int(v.split(b":")[1]))
        assert all(r == list(range(40)) for r in rounds.values()), "a key out of order"
        assert last_readable(b, queue) == n - 1  # and nothing more than once
    # the status of a topic's mirror: a row per partition, none behind
    status = a.ordq("mirror", "status", "--from", end(a, "topic:orders"), "--to", end(b, "topic:orders"), "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["partitions"]
    assert [r["source"].rsplit("/", 1)[1] for r in rows] == [partition_queue("orders", p) for p in range(PARTITIONS)]
    assert [(r["copied_seq"], r["lag_messages"]) for r in rows] == [
        (per_partition[p] - 1, 0) for p in range(PARTITIONS)]

"""Keyed topics on a real local cluster (one shared by the module): the CLI verbs in-process,
TopicProducer routing by key with two producers splitting the partitions, ``produce --topic``,
and a re-key seen by a running producer."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ordq.cli import main
from ordq.common.errors import ConfigError, PartitionNotLed, TopicChanged
from ordq.coordinator.topics import partition_of
from ordq.sdk import Consumer, ConsumerConfig, SendFuture, TopicProducer, TopicProducerConfig
from tests.cluster import Cluster, module_cluster
from tests.util import wait_until

pytestmark = pytest.mark.zk


@pytest.fixture(scope="module")
def cluster(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with module_cluster(zk_server, tmp_path_factory, "topics", "g1", "g2") as c:
        yield c


def ordq(cluster: Cluster, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(["--zk", cluster.hosts, "--root", cluster.root, *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def producer(cluster: Cluster, topic: str, partitions: tuple[int, ...] | None = None) -> TopicProducer:
    return TopicProducer(TopicProducerConfig(zk_hosts=cluster.hosts, root=cluster.root, topic=topic,
                                             partitions=partitions, lease_ttl_s=2.0))


def read_all(cluster: Cluster, queue: str, n: int) -> list[tuple[int, bytes | None, bytes]]:
    """The first ``n`` messages of ``queue`` as (seq, key, payload)."""
    got: list[tuple[int, bytes | None, bytes]] = []
    with Consumer(ConsumerConfig(zk_hosts=cluster.hosts, root=cluster.root, queue=queue, subscription="check")) as c:
        def more() -> bool:
            got.extend((m.seq, m.key, m.payload) for m in c.poll(timeout_s=0.5))
            return len(got) >= n
        wait_until(more, timeout_s=60, what=f"{n} messages of {queue}")
    return got


def test_the_topic_verbs(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ordq(cluster, capsys, "topic", "create", "orders", "--partitions", "3", "--segment-bytes", "1MiB")
    assert code == 0, err
    assert out.startswith("topic orders created: 3 partitions orders.p0..orders.p2; heads: ")
    code, out, _ = ordq(cluster, capsys, "topic", "list", "--json")
    assert json.loads(out) == [{"topic": "orders", "partitions": 3, "hash": "blake2b-64-mod", "groups": ["g1", "g2"]}]
    code, out, _ = ordq(cluster, capsys, "topic", "describe", "orders", "--json")
    view = json.loads(out)
    assert [q["queue"] for q in view["queues"]] == ["orders.p0", "orders.p1", "orders.p2"]
    assert view["config"]["segment_bytes"] == 1 << 20 and view["config"]["topic"] == "orders"
    # the partitions' heads spread over the two groups (each partition's group order rotated)
    heads = wait_until(lambda: [s.head for s in map(cluster.state, ("orders.p0", "orders.p1"))]
                       if all(cluster.state(q).head for q in ("orders.p0", "orders.p1")) else None, timeout_s=30)
    assert heads == ["g1", "g2"]
    code, out, _ = ordq(cluster, capsys, "topic", "describe", "orders")
    assert code == 0 and "orders.p2" in out and "(3 partitions, hash blake2b-64-mod)" in out
    code, _, err = ordq(cluster, capsys, "queue", "delete", "orders.p1")
    assert code != 0 and "ordq topic delete orders" in err
    code, _, err = ordq(cluster, capsys, "topic", "create", "orders", "--partitions", "2")
    assert code != 0 and "already exists" in err
    code, _, err = ordq(cluster, capsys, "topic", "alter", "orders", "--partitions", "4")
    assert code != 0 and "breaks their order" in err and "--rekey" in err
    code, _, err = ordq(cluster, capsys, "topic", "alter", "orders", "--partitions", "2", "--rekey")
    assert code != 0 and "would drop partitions orders.p2..orders.p2" in err
    code, _, err = ordq(cluster, capsys, "topic", "delete", "orders")
    assert code == 0, err
    code, out, _ = ordq(cluster, capsys, "topic", "list")
    assert out.strip() == "no topics (create one: ordq topic create NAME --partitions N)"
    assert not [q for q in cluster.store.list_queues() if q.startswith("orders.")]


def test_two_producers_split_the_partitions_and_every_key_keeps_its_order(cluster: Cluster) -> None:
    cluster.store.create_topic("pay", 3)
    keys = [f"customer-{i}" for i in range(12)]
    with producer(cluster, "pay", (0, 1)) as a, producer(cluster, "pay", (2,)) as b:
        assert (a.led, b.led, a.partitions) == ((0, 1), (2,), 3)
        sent: dict[str, list[bytes]] = {k: [] for k in keys}
        futures = []
        for n in range(5):
            for k in keys:
                p = a if a.partition_for(k) in a.led else b
                payload = f"{k}#{n}".encode()
                futures.append(p.send(payload, key=k))
                sent[k].append(payload)
        other = next(k for k in keys if b.partition_for(k) == 2)
        with pytest.raises(PartitionNotLed, match="partition 2, which this producer does not lead"):
            a.send(b"x", key=other)
        with pytest.raises(ConfigError, match="needs a key"):
            a.send(b"x", key=None)  # type: ignore[arg-type]
        for f in futures:
            f.result(timeout=60)
    for i in range(3):
        mine = [k for k in keys if partition_of(k.encode(), 3) == i]
        got = read_all(cluster, f"pay.p{i}", 5 * len(mine))
        assert [s for s, _, _ in got] == list(range(len(got)))  # the partition's own seqs
        for k in mine:  # each key in its one partition, in send order
            assert [p for _, key, p in got if key == k.encode()] == sent[k]
        assert {key for _, key, _ in got} == {k.encode() for k in mine}


def test_produce_routes_by_key_and_a_rekey_stops_a_running_producer(
        cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.store.create_topic("events", 2)
    part = partition_of(b"k7", 2)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    code, out, err = ordq(cluster, capsys, "produce", "--topic", "events", "--key", "k7", "--count", "3", "--json")
    assert code == 0, err
    assert json.loads(out)["queue"] == f"events.p{part}" and json.loads(out)["acked"] == 3
    code, _, err = ordq(cluster, capsys, "produce", "--topic", "events", "--count", "1")
    assert code != 0 and "--key" in err
    cluster.create_queue("plain")  # a queue's produce is as before
    code, out, err = ordq(cluster, capsys, "produce", "plain", "--count", "2", "--json")
    assert code == 0 and json.loads(out)["acked"] == 2, err
    with producer(cluster, "events") as p:
        p.send(b"before", key="k7").result(timeout=30)
        code, _, err = ordq(cluster, capsys, "topic", "alter", "events", "--partitions", "4", "--rekey")
        assert code == 0 and "order holds among the messages sent before" in err
        assert cluster.store.read_topic("events").partitions == 4
        assert [q for q in cluster.store.list_queues() if q.startswith("events.")] == [
            "events.p0", "events.p1", "events.p2", "events.p3"]

        # The producer reads the topic from the coordinator every TOPIC_POLL_S (1 s; it held a
        # ZooKeeper watch before issue 37): sends within that second still go by the old count.
        late: list[SendFuture] = []

        def refused() -> bool:
            try:
                late.append(p.send(b"after", key="k7"))
            except TopicChanged:
                return True
            return False
        wait_until(refused, timeout_s=30, what="the producer sees the re-key")
        for f in late:
            f.result(timeout=30)
    assert [k for _, k, _ in read_all(cluster, f"events.p{part}", 4 + len(late))] == [b"k7"] * (4 + len(late))

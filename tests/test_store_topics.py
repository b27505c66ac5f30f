"""Keyed topics in the ZooKeeper store (coordinator/store_topics.py), against a real ZooKeeper:
one transaction per creation, name clashes, partitions deleted only with their topic, and the
refusals of a partition-count change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ordq.common.errors import AlreadyExists, ConfigError, OrdqError, TopicNotFound
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import QueueConfig
from ordq.coordinator.topics import TopicConfig, check_alter, topic_of

pytestmark = pytest.mark.zk


@pytest.fixture
def store(zk_server, zk_root) -> Iterator[ZkStore]:
    with ZkStore.connect(zk_server.connection_string, zk_root) as s:
        s.add_group("g1")
        s.add_group("g2")
        yield s


def test_a_topic_is_its_record_and_its_partition_queues(store: ZkStore) -> None:
    states = store.create_topic("orders", 3, config=QueueConfig(segment_bytes=1 << 20))
    assert sorted(states) == ["orders.p0", "orders.p1", "orders.p2"]
    assert store.read_topic("orders") == TopicConfig(partitions=3)
    assert store.list_topics() == ["orders"]
    assert store.list_queues() == ["orders.p0", "orders.p1", "orders.p2"]
    for q in states:
        cfg = store.queue_config(q)
        assert cfg.topic == "orders" and cfg.segment_bytes == 1 << 20
    # each partition's group order is rotated, so their heads spread over the groups
    assert [states[f"orders.p{i}"].groups for i in range(3)] == [("g1", "g2"), ("g2", "g1"), ("g1", "g2")]


def test_names_clash_and_a_failed_creation_leaves_nothing(store: ZkStore) -> None:
    store.create_topic("t", 2)
    with pytest.raises(AlreadyExists, match="topic 't'"):
        store.create_topic("t", 2)
    for name in ("t", "t.p1", "t.p7"):  # the topic's name, a partition, a future partition
        with pytest.raises(AlreadyExists, match="belongs to topic 't'"):
            store.create_queue(name)
    store.create_queue("q")
    with pytest.raises(AlreadyExists, match="queue named 'q'"):
        store.create_topic("q", 2)
    store.create_queue("u.p1")
    with pytest.raises(AlreadyExists, match="queue 'u.p1'"):
        store.create_topic("u", 3)
    assert store.list_topics() == ["t"]  # u's record and u.p0 were in the same transaction
    assert "u.p0" not in store.list_queues()


def test_a_partition_is_deleted_only_with_its_topic(store: ZkStore) -> None:
    store.create_topic("t", 2)
    with pytest.raises(OrdqError, match="partition of topic 't'.*ordq topic delete t"):
        store.delete_queue("t.p0")
    store.delete_topic("t")
    assert store.list_topics() == [] and store.list_queues() == []
    with pytest.raises(TopicNotFound, match="ordq topic create t"):
        store.read_topic("t")
    with pytest.raises(TopicNotFound):
        store.delete_topic("t")


def test_the_partition_count_changes_only_by_a_rekey_that_grows(store: ZkStore) -> None:
    store.create_topic("t", 2, groups=["g2", "g1"], config=QueueConfig(max_message_bytes=4096))
    with pytest.raises(ConfigError, match="breaks their order.*--rekey"):
        store.alter_topic("t", 4)
    with pytest.raises(ConfigError, match="would drop partitions t.p1..t.p1"):
        store.alter_topic("t", 1, rekey=True)
    assert store.alter_topic("t", 4, rekey=True) == TopicConfig(partitions=4)
    assert store.read_topic("t").partitions == 4
    assert store.queue_config("t.p3") == QueueConfig(max_message_bytes=4096, topic="t")
    assert store.load_state("t.p3")[0].groups == ("g1", "g2")  # partition 3 of [g2, g1], rotated


def test_refusals_are_pure() -> None:
    old = TopicConfig(partitions=4)
    with pytest.raises(ConfigError, match="has 4 partitions already"):
        check_alter("t", old, 4, rekey=True)
    with pytest.raises(ConfigError, match="partitions"):
        check_alter("t", old, 0, rekey=True)
    assert check_alter("t", old, 8, rekey=True).partitions == 8
    assert [topic_of(n) for n in ("t.p0", "a.b.p12", "t.p", "t.p01", ".p1", "q")] == ["t", "a.b", None, None, None,
                                                                                        None]


def test_a_topic_producer_config_is_checked_when_built() -> None:
    from ordq.coordinator.store_topics import spread
    from ordq.sdk import TopicProducerConfig

    cfg = TopicProducerConfig(zk_hosts="127.0.0.1:2181", topic="t", partitions=[2, 0], producer_id="w")
    assert cfg.partitions == (2, 0)
    p2 = cfg.partition_config(2)
    assert (p2.queue, p2.producer_id, p2.send_timeout_s) == ("t.p2", "w.p2", 2.0)  # ProducerConfig's default
    for bad in ([], [1, 1], [-1]):
        with pytest.raises(ConfigError, match="partitions"):
            TopicProducerConfig(zk_hosts="127.0.0.1:2181", topic="t", partitions=bad)
    with pytest.raises(ConfigError, match="topic"):
        TopicProducerConfig(zk_hosts="127.0.0.1:2181", topic="a/b")
    assert [spread(["g1", "g2", "g3"], i) for i in range(4)] == [
        ("g1", "g2", "g3"), ("g2", "g3", "g1"), ("g3", "g1", "g2"), ("g1", "g2", "g3")]

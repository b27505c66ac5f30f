"""Keyed topics in ZooKeeper: a topic's record ``<root>/topics/<T>`` (``TopicConfig``) and its
partition queues ``T.p0`` .. ``T.p<N-1>`` (coordinator/topics.py has the model).

Guarantee: a topic and all its partitions are created in one transaction (all or nothing), each
partition a full queue whose settings name the topic; a re-key adds the new partitions and
changes the record in one transaction, conditionally on the record's version. Deleting a topic
deletes its partitions first and its record last, so a deletion cut short is finished by
running it again.

Rules: a part of ``ZkStore`` (coordinator/store.py); kazoo errors become ordq's here, as
everywhere in the store. What may change is decided by ``topics.check_alter`` (pure).
"""

from __future__ import annotations

import contextlib

import attrs
from kazoo.exceptions import NoNodeError

from ordq.common.errors import AlreadyExists, ConfigError, QueueNotFound, TopicNotFound
from ordq.coordinator import state as sm
from ordq.coordinator.paths import check_name
from ordq.coordinator.state import QueueState
from ordq.coordinator.store_create import NewNode, NewQueue, QueueCreation
from ordq.coordinator.store_values import QueueConfig, json_bytes, json_value
from ordq.coordinator.topics import MAX_TOPIC_NAME, PARTITION_SEPARATOR, TopicConfig, check_alter, partition_queue


class TopicRecords(QueueCreation):
    """Keyed topics: their records and partition queues (a part of ZkStore)."""

    def create_topic(
        self, topic: str, partitions: int, groups: list[str] | None = None, config: QueueConfig | None = None
    ) -> dict[str, QueueState]:
        """Create ``topic`` with ``partitions`` partition queues, served by ``groups`` (default:
        every registered group; each partition's group order rotated so their heads spread) with
        the queue settings ``config``, in one transaction. Returns each partition's initial state
        by queue name. AlreadyExists when the topic, a queue of that name or one of its
        partition queues exists; ConfigError for a bad name or count; GroupNotFound."""
        check_name("topic", topic)
        if len(topic) > MAX_TOPIC_NAME:
            raise ConfigError(f"a topic name has at most {MAX_TOPIC_NAME} characters (its partitions add "
                              f"{PARTITION_SEPARATOR}N), not {len(topic)}")
        tc = TopicConfig(partitions=partitions)
        gids = list(groups) if groups is not None else self.list_groups()
        if not gids:
            raise ConfigError("a topic needs at least one broker group (add one: ordq group add G)")
        if self._exists(self.paths.queue(topic)):
            raise AlreadyExists(f"a queue named {topic!r} exists: a topic may not share its name")
        cfg = attrs.evolve(config or QueueConfig(), topic=topic)
        with self._errors():
            self._wait(self.client.ensure_path_async(self.paths.topics))
        record = NewNode(self.paths.topic(topic), json_bytes(attrs.asdict(tc)), f"topic {topic!r}")
        news = [NewQueue(partition_queue(topic, i), sm.spread(gids, i), cfg) for i in range(tc.partitions)]
        states = self._create_queues(news, [record])
        return {st.queue: st for st in states}

    def read_topic(self, topic: str) -> TopicConfig:
        """The topic's config; TopicNotFound."""
        return self._read_topic(topic)[0]

    def list_topics(self) -> list[str]:
        """Every topic's name, sorted."""
        with self._errors():
            try:
                return sorted(self._read(self.client.get_children_async, self.paths.topics))
            except NoNodeError:
                return []

    def delete_topic(self, topic: str) -> None:
        """Delete the topic's partition queues (each as ``delete_queue`` would), then its record
        and what lies under it. TopicNotFound."""
        tc = self.read_topic(topic)
        with self._errors():
            for i in range(tc.partitions):
                with contextlib.suppress(NoNodeError):  # deleted by an earlier run cut short
                    self._delete_queue(partition_queue(topic, i))
                self.written.forget(partition_queue(topic, i))
            try:
                self._delete_tree(self.paths.topic(topic))
            except NoNodeError as exc:
                raise TopicNotFound(topic) from exc

    def alter_topic(self, topic: str, partitions: int, *, rekey: bool = False) -> TopicConfig:
        """Change the topic's partition count (``topics.check_alter`` says when that is
        refused: without ``rekey``, always). The new partitions get partition 0's groups and
        settings; they and the record's change are one transaction, conditional on the record
        not having changed since read. Returns the new config."""
        old, version = self._read_topic(topic)
        new = check_alter(topic, old, partitions, rekey=rekey)
        first = partition_queue(topic, 0)
        try:
            cfg = self.queue_config(first)
            st, _ = self.load_state(first)
        except QueueNotFound as exc:
            raise ConfigError(f"topic {topic!r} lacks its partition {first}: delete and create it again") from exc
        news = [NewQueue(partition_queue(topic, i), sm.spread(st.groups, i), cfg)
                for i in range(old.partitions, new.partitions)]
        record = NewNode(self.paths.topic(topic), json_bytes(attrs.asdict(new)), f"topic {topic!r}", version)
        self._create_queues(news, [record])
        return new

    def _read_topic(self, topic: str) -> tuple[TopicConfig, int]:
        with self._errors():
            try:
                data, stat = self._read(self.client.get_async, self.paths.topic(topic))
            except NoNodeError as exc:
                raise TopicNotFound(topic) from exc
        return TopicConfig(**json_value(data)), int(stat.version)

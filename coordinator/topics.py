"""Keyed topics: N ordered queues that share one name and settings (issue 29). Pure.

A topic ``T`` with ``N`` partitions is the N queues ``T.p0`` .. ``T.p<N-1>``, each a full ordq
queue (its own send and consume lists, producer election, subscriptions), plus the record
``<root>/topics/T`` (``TopicConfig``) written in the same ZooKeeper transaction as the queues.
Each partition queue's config names its topic, so the queue verbs can refuse to delete one
partition of a topic on its own.

Routing: a message goes to partition ``partition_of(key, N)``: the first 8 bytes of the key's
BLAKE2b digest (``digest_size=8``), read big-endian, modulo N. It is stable across processes,
machines and Python versions, and independent of ``zlib.crc32``, which ``Consumer.run_keyed``
uses to pick a worker inside one partition (the same hash for both would send all keys of a
partition to a fraction of the workers). Changing N moves keys between partitions, which breaks
their order: refused unless the user asks for a re-key.
"""

from __future__ import annotations

import hashlib

import attrs

from ordq.common.errors import ConfigError

# The names and bounds, in a module without attrs for the CLI (issue 42); re-exported here.
from ordq.coordinator.topic_names import HASH_NAME as HASH_NAME
from ordq.coordinator.topic_names import MAX_PARTITIONS as MAX_PARTITIONS
from ordq.coordinator.topic_names import MAX_TOPIC_NAME as MAX_TOPIC_NAME
from ordq.coordinator.topic_names import PARTITION_SEPARATOR as PARTITION_SEPARATOR
from ordq.coordinator.topic_names import REKEY_NOTE as REKEY_NOTE
from ordq.coordinator.topic_names import partition_queue as partition_queue


@attrs.frozen
class TopicConfig:
    partitions: int
    hash: str = HASH_NAME

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(f"a topic has 1..{MAX_PARTITIONS} partitions, not {self.partitions!r}")
        if self.hash != HASH_NAME:
            raise ConfigError(f"unknown topic hash {self.hash!r} (this version routes keys with {HASH_NAME})")


def partition_queues(topic: str, config: TopicConfig) -> list[str]:
    return [partition_queue(topic, i) for i in range(config.partitions)]


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (see the module's docstring)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % partitions


def check_alter(topic: str, old: TopicConfig, partitions: int, *, rekey: bool) -> TopicConfig:
    """The topic's config after changing its partition count to ``partitions``, or ConfigError
    saying why not: a change moves keys between partitions, which breaks their order, so it is
    refused unless the caller asks for a re-key; and even then the count only grows (shrinking
    would drop partitions that hold messages)."""
    new = TopicConfig(partitions=partitions, hash=old.hash)
    if new.partitions == old.partitions:
        raise ConfigError(f"topic {topic!r} has {old.partitions} partitions already")
    if not rekey:
        raise ConfigError(
            f"changing topic {topic!r} from {old.partitions} to {new.partitions} partitions moves keys to other "
            "partitions, which breaks their order (a key's earlier and later messages would sit in two "
            "partitions, read in no set order); refused. To do it anyway, add --rekey (growing only)")
    if new.partitions < old.partitions:
        raise ConfigError(
            f"topic {topic!r}: shrinking from {old.partitions} to {new.partitions} partitions would drop "
            f"partitions {partition_queue(topic, new.partitions)}..{partition_queue(topic, old.partitions - 1)}"
            " and the messages they hold; a re-key may only grow a topic")
    return new


def topic_of(queue: str) -> str | None:
    """The topic whose partition ``queue`` would be by its name (``T.p3`` -> ``T``), else None."""
    base, sep, number = queue.rpartition(PARTITION_SEPARATOR)
    if not sep or not base or not number.isdigit() or str(int(number)) != number:
        return None
    return base

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

MAX_PARTITIONS = 256
HASH_NAME = "blake2b-64-mod"  # recorded with the topic, so a future hash cannot be mixed in silently
PARTITION_SEPARATOR = ".p"
MAX_TOPIC_NAME = 120  # room for ".p255" within the 128-character queue name


@attrs.frozen
class TopicConfig:
    partitions: int
    hash: str = HASH_NAME

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= MAX_PARTITIONS:
            raise ConfigError(f"a topic has 1..{MAX_PARTITIONS} partitions, not {self.partitions!r}")
        if self.hash != HASH_NAME:
            raise ConfigError(f"unknown topic hash {self.hash!r} (this version routes keys with {HASH_NAME})")


def partition_queue(topic: str, partition: int) -> str:
    """The queue that holds partition ``partition`` of ``topic``."""
    return f"{topic}{PARTITION_SEPARATOR}{partition}"


def partition_queues(topic: str, config: TopicConfig) -> list[str]:
    return [partition_queue(topic, i) for i in range(config.partitions)]


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (see the module's docstring)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % partitions

"""A mirror of a keyed topic: partition i of the source topic to partition i of the target's.

Guarantee: each key's order holds in the copy. A key lives in one partition of a topic
(``coordinator.topics.partition_of``: its hash modulo the partition count), so when both
topics have the same partition count and hash, the target's partition i holds exactly the
keys of the source's partition i, and a mirror of each partition queue (``ordq.mirror.runner``,
one subscription and one producer lease per partition) keeps each key's order and copies each
message once. Different counts (or hashes) would split a key over two target partitions, so
they are refused before anything is copied (``partition_configs``).

Rules: ``partition_pairs`` is pure; ``partition_configs`` asks both clusters' coordinators for
their topic's config.
"""

from __future__ import annotations

import attrs

from ordq.common.errors import ConfigError
from ordq.coordinator.topics import TopicConfig, partition_queue
from ordq.mirror.config import MirrorConfig, MirrorEnd


def partition_pairs(source: MirrorEnd, target: MirrorEnd, source_topic: TopicConfig,
                    target_topic: TopicConfig) -> list[tuple[MirrorEnd, MirrorEnd]]:
    """The (source, target) queue ends of each partition, in partition order. ConfigError
    (one line, saying what to do) when the two topics do not route keys alike."""
    if source_topic.partitions != target_topic.partitions:
        raise ConfigError(
            f"the topic {source} has {source_topic.partitions} partitions and {target} has "
            f"{target_topic.partitions}: a mirror copies partition i to partition i, so that each key keeps its "
            f"order; give the target topic {source_topic.partitions} partitions")
    if source_topic.hash != target_topic.hash:
        raise ConfigError(f"the topics {source} and {target} route keys with different hashes "
                          f"({source_topic.hash}, {target_topic.hash}): a key would change partition")
    return [(attrs.evolve(source, queue=partition_queue(source.queue, i), topic=False),
             attrs.evolve(target, queue=partition_queue(target.queue, i), topic=False))
            for i in range(source_topic.partitions)]


def partition_configs(config: MirrorConfig) -> list[MirrorConfig]:
    """The mirrors that copy ``config``: itself for a queue, one per partition for a topic.
    TopicNotFound (on either side), ConfigError as ``partition_pairs``."""
    if not config.source.topic:
        return [config]
    topics = [_describe_topic(end) for end in (config.source, config.target)]
    return [attrs.evolve(config, source=s, target=t)
            for s, t in partition_pairs(config.source, config.target, topics[0], topics[1])]


def _describe_topic(end: MirrorEnd) -> TopicConfig:
    from ordq.sdk._cluster import open_coordinator

    coord, _creds = open_coordinator(None, end.zk_hosts, end.root, None)
    try:
        config: TopicConfig = coord.describe_topic(end.queue, timeout_s=10.0)
        return config
    finally:
        coord.close()

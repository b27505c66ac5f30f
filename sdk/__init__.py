"""ordq client SDK: ordered producer and consumer (sync and asyncio), audit hook.

    from ordq.sdk import Producer, ProducerConfig, Consumer, ConsumerConfig

    with Producer(ProducerConfig(zk_hosts="127.0.0.1:2181", queue="orders")) as p:
        p.send(b"payload").result()          # (seq, seg, offset) once on both replicas

    with Consumer(ConsumerConfig(zk_hosts=..., queue="orders", subscription="billing")) as c:
        for m in c:                           # in seq order, each seq once
            handle(m.seq, m.payload)

    with TopicProducer(TopicProducerConfig(zk_hosts=..., topic="payments")) as p:
        p.send(b"paid", key="customer-42")    # same key, same partition: in order
"""

from __future__ import annotations

# For mypy only (the names below are loaded on first use); not ``typing.TYPE_CHECKING``, as in
# ``ordq/__init__.py``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ordq.common.steady_gc import freeze_startup_objects
    from ordq.sdk._consumer_core import CommitConfig
    from ordq.sdk._consumer_types import ConsumerConfig, Delivered
    from ordq.sdk._futures import SendFuture, SendResult
    from ordq.sdk._producer_core import BatchingConfig
    from ordq.sdk._producer_types import ProducerConfig, StoredMessage
    from ordq.sdk.aio import AsyncConsumer, AsyncProducer
    from ordq.sdk.consumer import Consumer
    from ordq.sdk.failure import FailurePolicy
    from ordq.sdk.find import FindResult, FoundMessage, find_messages
    from ordq.sdk.group import GroupConfig, GroupMember
    from ordq.sdk.parking import BlockedMessage
    from ordq.sdk.producer import Producer
    from ordq.sdk.topic_producer import TopicProducer, TopicProducerConfig

# Each name is loaded on first use (as ``ordq``'s): a command that only produces loads neither
# the consumer, the asyncio clients, groups, topics nor the metrics (issue 42: a one-message
# ``ordq produce`` imported all of them).
_HOMES = {
    "CommitConfig": "ordq.sdk._consumer_core",
    "ConsumerConfig": "ordq.sdk._consumer_types",
    "Delivered": "ordq.sdk._consumer_types",
    "SendFuture": "ordq.sdk._futures",
    "SendResult": "ordq.sdk._futures",
    "BatchingConfig": "ordq.sdk._producer_core",
    "ProducerConfig": "ordq.sdk._producer_types",
    "StoredMessage": "ordq.sdk._producer_types",
    "AsyncConsumer": "ordq.sdk.aio",
    "AsyncProducer": "ordq.sdk.aio",
    "Consumer": "ordq.sdk.consumer",
    "FailurePolicy": "ordq.sdk.failure",
    "FindResult": "ordq.sdk.find",
    "FoundMessage": "ordq.sdk.find",
    "find_messages": "ordq.sdk.find",
    "GroupConfig": "ordq.sdk.group",
    "GroupMember": "ordq.sdk.group",
    "BlockedMessage": "ordq.sdk.parking",
    "Producer": "ordq.sdk.producer",
    "TopicProducer": "ordq.sdk.topic_producer",
    "TopicProducerConfig": "ordq.sdk.topic_producer",
    "freeze_startup_objects": "ordq.common.steady_gc",
}

__all__ = [
    "AsyncConsumer",
    "AsyncProducer",
    "BatchingConfig",
    "BlockedMessage",
    "CommitConfig",
    "Consumer",
    "ConsumerConfig",
    "Delivered",
    "FailurePolicy",
    "GroupConfig",
    "GroupMember",
    "Producer",
    "ProducerConfig",
    "SendFuture",
    "SendResult",
    "StoredMessage",
    "TopicProducer",
    "TopicProducerConfig",
    "FindResult",
    "FoundMessage",
    "find_messages",
    "freeze_startup_objects",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ordq.sdk' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

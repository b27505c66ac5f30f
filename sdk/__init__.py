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
]

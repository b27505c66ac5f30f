"""ordq client SDK: ordered producer and consumer (sync and asyncio), audit hook.

    from ordq.sdk import Producer, ProducerConfig, Consumer, ConsumerConfig

    with Producer(ProducerConfig(zk_hosts="127.0.0.1:2181", queue="orders")) as p:
        p.send(b"payload").result()          # (seq, seg, offset) once on both replicas

    with Consumer(ConsumerConfig(zk_hosts=..., queue="orders", subscription="billing")) as c:
        for m in c:                           # in seq order, each seq once
            handle(m.seq, m.payload)
"""

from ordq.sdk._consumer_core import CommitConfig
from ordq.sdk._consumer_types import ConsumerConfig, Delivered
from ordq.sdk._futures import SendFuture, SendResult
from ordq.sdk._producer_core import BatchingConfig
from ordq.sdk._producer_types import ProducerConfig, StoredMessage
from ordq.sdk.aio import AsyncConsumer, AsyncProducer
from ordq.sdk.consumer import Consumer
from ordq.sdk.failure import FailurePolicy
from ordq.sdk.group import GroupConfig, GroupMember
from ordq.sdk.parking import BlockedMessage
from ordq.sdk.producer import Producer

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
]

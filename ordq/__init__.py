"""ordq: a strictly ordered, replicated message queue.

    from ordq import Producer, ProducerConfig, Consumer, ConsumerConfig

One namespace, in layers that import only downward (docs/CONTRIBUTING.md): ``ordq.common``
(errors, units, processes, TLS, metrics) and ``ordq.wire`` (the wire protocol and the broker
client) at the ground; ``ordq.coordinator``; ``ordq.broker_group``; ``ordq.sdk``; what is built
on the SDK (``ordq.outbox``, ``ordq.cdc``, ``ordq.spark_source``, ``ordq.spark_order_check``);
the ``ordq`` CLI, local cluster and drills on top.

The SDK's names are loaded on first use, so a broker or a CLI command that never touches them
does not import the client.
"""

from __future__ import annotations

from ordq.common.version import VERSION

__version__ = VERSION

# Not ``typing.TYPE_CHECKING``: importing typing was a tenth of ``ordq --help`` (issue 42); mypy
# takes any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ordq.sdk import (
        AsyncConsumer,
        AsyncProducer,
        BatchingConfig,
        BlockedMessage,
        CommitConfig,
        Consumer,
        ConsumerConfig,
        Delivered,
        FailurePolicy,
        GroupConfig,
        GroupMember,
        Producer,
        ProducerConfig,
        SendFuture,
        SendResult,
        StoredMessage,
        TopicProducer,
        TopicProducerConfig,
        freeze_startup_objects,
    )
    from ordq.sdk.find import FindResult, FoundMessage, find_messages

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
    "__version__",
    "FindResult",
    "FoundMessage",
    "find_messages",
    "freeze_startup_objects",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import ordq.sdk

        return getattr(ordq.sdk, name)
    raise AttributeError(f"module 'ordq' has no attribute {name!r}")

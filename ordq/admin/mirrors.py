"""How far each mirror of a queue is behind, as its source cluster sees it (``ordq top``'s
mirrors table and the status page's "Mirrors" section).

A mirror reads its source through a subscription named ``mirror.<target cluster id>``
(``ordq.mirror.config``); that subscription's committed cursor never passes what the target
acked, so the source alone tells how far the copy is behind, even while the target cluster or
every mirror instance is away: ``lag_messages`` is the source's last readable seq minus the
cursor's, ``lag_seconds`` the age of the oldest source message not yet committed (0 when none
waits). Both are upper bounds of the mirror's own ``ordq_mirror_lag_*`` series by at most one
commit interval (the mirror commits every 1,000 messages / 500 ms).

Rules: ``mirror_lag`` is pure; ``mirror_views`` reads one message per lagging mirror (its
timestamp), and a message it cannot read leaves ``lag_seconds`` unknown (None), never fails
the view.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ordq.admin.queue_views import QueueView, SubscriptionView
from ordq.common.errors import OrdqError
from ordq.coordinator.store import ZkStore
from ordq.sdk.replicas import ReplicaReader, read_message

MIRROR_PREFIX = "mirror."


def is_mirror_subscription(name: str) -> bool:
    return name.startswith(MIRROR_PREFIX) and len(name) > len(MIRROR_PREFIX)


@attrs.frozen
class MirrorLagView:
    queue: str  # the source queue
    subscription: str  # the mirror's subscription on it
    target: str  # the target cluster's id, as the subscription names it
    source_last_seq: int | None  # None: a replica of an open segment did not answer
    copied_seq: int  # the last source seq the copy holds (committed)
    lag_messages: int | None
    lag_seconds: float | None
    held_by: str | None  # the mirror instance holding the subscription (None: no mirror runs)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def mirror_lag(queue: str, sub: SubscriptionView, source_last_seq: int | None, oldest_ts_us: int | None,
               now_us: int) -> MirrorLagView:
    """The lag of the mirror reading ``queue`` through ``sub``: ``oldest_ts_us`` is the
    timestamp of the first source message past the cursor (None: not read or none waits)."""
    copied = sub.cursor.last_seq
    if source_last_seq is None:
        messages, seconds = None, None
    elif source_last_seq <= copied:
        messages, seconds = 0, 0.0
    else:
        messages = source_last_seq - copied
        seconds = None if oldest_ts_us is None else round(max(now_us - oldest_ts_us, 0) / 1e6, 3)
    return MirrorLagView(queue=queue, subscription=sub.name, target=sub.name[len(MIRROR_PREFIX):],
                         source_last_seq=source_last_seq, copied_seq=copied, lag_messages=messages,
                         lag_seconds=seconds, held_by=sub.held_by)


def mirror_views(store: ZkStore, reader: ReplicaReader, views: Mapping[str, QueueView], *,
                 now_us: Callable[[], int] = lambda: time.time_ns() // 1000) -> list[MirrorLagView]:
    """Every mirror of the queues in ``views`` (queue, then subscription order)."""
    out = []
    for queue, view in views.items():
        for sub in view.subscriptions:
            if not is_mirror_subscription(sub.name):
                continue
            oldest = None
            if view.last_seq is not None and view.last_seq > sub.cursor.last_seq:
                try:
                    oldest = read_message(store, reader, queue, sub.cursor.last_seq + 1).message.timestamp_us
                except OrdqError:  # popped meanwhile, no replica answers: unknown for now
                    oldest = None
            out.append(mirror_lag(queue, sub, view.last_seq, oldest, now_us()))
    return out

"""Operator actions behind the admin CLI (``ordq queue describe``, ``ordq sub list|reset``,
``ordq peek``, ``ordq top``, ``ordq group drain|undrain|remove``): one library that the CLI,
drills and tests call.

- ``ordq.sdk.replicas``: segment extents (best effort from the replicas, ``None`` when none
  answers), queue views with backlog and lag, ``locate_seq`` (the one seq -> (seg, offset)
  mapping), ``locate_time``, ``read_message``.
- ``ordq.sdk.positions``: ``reset_subscription`` (refused while a consumer holds the
  subscription unless forced; conditional on cursor and queue state).
- ``ordq.admin.groups``: ``drain_group``, ``undrain_group``, ``remove_group``.
- ``ordq.admin.top``: samples and frames of ``ordq top``.
"""

from ordq.admin.groups import DrainedQueue, UndrainedQueue, drain_group, remove_group, undrain_group
from ordq.admin.top import Sample, frames, sample, top_frame
from ordq.sdk.positions import (
    ResetResult,
    ResetTarget,
    SubscriptionHeld,
    latest_cursor,
    parse_reset_target,
    reset_subscription,
    resolve_target,
)
from ordq.sdk.replicas import (
    Extent,
    Location,
    PeekedMessage,
    QueueView,
    ReplicaReader,
    SeqNotFound,
    SubscriptionView,
    describe_queue,
    format_time_us,
    lag,
    last_readable_seq,
    locate_seq,
    locate_time,
    parse_time,
    read_message,
    render_bytes,
)

__all__ = [
    "DrainedQueue",
    "Extent",
    "Location",
    "PeekedMessage",
    "QueueView",
    "ReplicaReader",
    "ResetResult",
    "ResetTarget",
    "Sample",
    "SeqNotFound",
    "SubscriptionHeld",
    "SubscriptionView",
    "UndrainedQueue",
    "describe_queue",
    "drain_group",
    "format_time_us",
    "frames",
    "lag",
    "last_readable_seq",
    "latest_cursor",
    "locate_seq",
    "locate_time",
    "parse_reset_target",
    "parse_time",
    "read_message",
    "remove_group",
    "render_bytes",
    "reset_subscription",
    "resolve_target",
    "sample",
    "top_frame",
    "undrain_group",
]

"""Operator actions behind the admin CLI (``ordq queue describe``, ``ordq sub list|reset``,
``ordq peek``, ``ordq top``, ``ordq group drain|undrain|remove``): one library that the CLI,
drills and tests call.

- ``ordq.sdk.replicas``: segment extents (best effort from the replicas, ``None`` when none
  answers), ``locate_seq`` (the one seq -> (seg, offset) mapping), ``locate_time``,
  ``read_message``.
- ``ordq.admin.queue_views``: queue views with backlog, lag and lease holders.
- ``ordq.admin.subscriptions``: ``reset_subscription`` (refused while a consumer holds the
  subscription unless forced; conditional on cursor and queue state), create, delete.
- ``ordq.admin.groups``: ``drain_group``, ``undrain_group``, ``remove_group``.
- ``ordq.admin.top``: samples and frames of ``ordq top``.
"""

from ordq.admin.groups import DrainedQueue, UndrainedQueue, drain_group, remove_group, undrain_group
from ordq.admin.queue_views import QueueView, SubscriptionView, describe_queue
from ordq.admin.subscriptions import ResetResult, SubscriptionHeld, reset_subscription
from ordq.admin.top import Sample, frames, sample, top_frame
from ordq.sdk.positions import ResetTarget, latest_cursor, parse_reset_target, resolve_target
from ordq.sdk.replicas import (
    Extent,
    Location,
    PeekedMessage,
    ReplicaReader,
    SeqNotFound,
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

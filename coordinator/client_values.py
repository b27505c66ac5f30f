"""The values the coordinator client's calls answer with (``coordinator/client.py``): a claimed
epoch, a lease held or refused, a queue described. Apart from the client so that a call that
needs none of them (an admin command's) loads neither attrs nor the queue state's classes
(issue 42); ``ordq.coordinator.client`` still gives each of these names.
"""

from __future__ import annotations

from typing import Any

import attrs

from ordq.coordinator.state import Cursor, QueueState


@attrs.frozen
class Claimed:
    """What a Claim gives the producer leader: its epoch and the key that goes with it (a
    secret: sent with every Produce), the head and open segment, and the last stored message
    as (seq, seg, offset) — None for an empty queue; seg and offset -1 when only the seq is known."""

    epoch: int
    key: str = attrs.field(repr=False)
    gid: str
    seg: int
    last: tuple[int, int, int] | None
    state: QueueState


@attrs.frozen
class Held:
    """A lease the coordinator granted (coordinator/leases.py): ``key`` is a secret only its
    holder learns; ``generation`` and ``key`` go with the requests it guards."""

    kind: str
    queue: str
    sub: str
    holder: str
    generation: int
    key: str = attrs.field(repr=False)
    ttl_ms: int
    group_generation: int = 0  # member leases: the group's generation and this member's partitions
    partitions: tuple[int, ...] = ()
    # a consumer lease renewed ``with_state``: the queue state's stamp (ZkStore.state_stamp) the
    # renewal read; 0: not told (not asked, or a coordinator that does not tell it)
    state_zxid: int = 0


@attrs.frozen
class Refusal:
    """A lease not granted: who holds it and in how many seconds to ask again at the soonest."""

    holder: str
    retry_s: float


@attrs.frozen
class Described:
    """What Describe answered (None/-1 for what was not asked)."""

    state: QueueState
    version: int
    config: Any = None  # QueueConfig
    live: Any = None  # {gid: {role: LiveInfo}} (pid 0: not told)
    cursor: Cursor | None = None
    cursor_version: int = -1
    zxid: int = 0  # the state's stamp (ZkStore.state_stamp); 0: not told

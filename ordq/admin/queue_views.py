"""What ``ordq queue describe`` and ``sub list`` show of a queue, read at one moment from the
cluster's records (the operator's ZooKeeper store) and its replicas (``ReplicaReader``): its
lists, extents and backlog per group, its subscriptions' cursors, lag and lease holders."""

from __future__ import annotations

import time
from typing import Any

import attrs

from ordq.common.errors import NotFound
from ordq.coordinator.state import Cursor, QueueState
from ordq.coordinator.store import ZkStore
from ordq.coordinator.store_values import QueueConfig
from ordq.sdk.replicas import Extent, ReplicaReader, lag, last_readable_seq


@attrs.frozen
class SubscriptionView:
    name: str
    cursor: Cursor
    lag: int | None
    held_by: str | None  # the consumer its consumer lease was last granted to (None: released, never)
    blocked: dict[str, Any] | None = None  # the message its consumer is blocked on (Consumer.run, block)
    delay_ms: int = 0  # the subscription's delay (ordq sub create|alter --delay; sdk/delay.py)
    waiting: dict[str, Any] | None = None  # what its consumer reports waiting on: {seq, due_us, at_us, holder}
    state: str = ""  # sub_state(): blocked | waiting on time | caught up | no consumer | delivering

    def to_dict(self) -> dict[str, Any]:
        return {"subscription": self.name, **self.cursor.to_dict(), "lag": self.lag, "held_by": self.held_by,
                "blocked": self.blocked, "delay_ms": self.delay_ms, "state": self.state,
                "waiting": self.waiting if self.state == WAITING_ON_TIME else None}


WAITING_ON_TIME = "waiting on time"
# A consumer that holds the head of the line reports it at most once a second (sdk/consumer.py):
# a report older than this, for a time already past, is no longer what it does.
WAITING_FRESH_US = 5_000_000


def sub_state(*, lag: int | None, held_by: str | None, blocked: dict[str, Any] | None,
              waiting: dict[str, Any] | None, now_us: int) -> str:
    """What ``ordq sub list`` says a subscription is doing: ``blocked`` (its consumer retries a
    message past its failure policy's attempts), ``waiting on time`` (its consumer holds the
    head of the line until the message's due time: a delay, not a stall), ``caught up``,
    ``no consumer`` (messages wait and no consumer holds it) or ``delivering``."""
    if blocked is not None:
        return "blocked"
    if (waiting is not None and held_by is not None and waiting.get("holder") == held_by
            and (int(waiting.get("due_us", 0)) > now_us or now_us - int(waiting.get("at_us", 0)) < WAITING_FRESH_US)):
        return WAITING_ON_TIME
    if lag == 0:
        return "caught up"
    if held_by is None:
        return "no consumer"
    return "delivering"


@attrs.frozen
class QueueView:
    """Everything ``ordq queue describe`` shows, read at one moment."""

    state: QueueState
    version: int
    config: QueueConfig
    extents: tuple[Extent, ...]
    live: dict[str, tuple[str, ...]]  # group -> live roles
    drained: frozenset[str]
    subscriptions: tuple[SubscriptionView, ...]
    last_seq: int | None
    sizes: dict[int, int | None] = attrs.field(factory=dict)  # seg -> bytes on disk (None: unknown)

    def group_bytes(self, gid: str) -> int | None:
        """Bytes on disk of ``gid``'s segments of this queue (per replica)."""
        sizes = [self.sizes.get(s.seg) for s in self.state.consume if s.gid == gid]
        return None if any(b is None for b in sizes) else sum(b for b in sizes if b is not None)

    def backlog(self, gid: str) -> int | None:
        """Messages stored in ``gid``'s segments of this queue that are not popped yet."""
        total = 0
        for e in self.extents:
            if e.gid == gid:
                if e.end is None:
                    return None
                total += e.end
        return total

    @property
    def stored(self) -> int | None:
        ends = [e.end for e in self.extents]
        return None if any(e is None for e in ends) else sum(e for e in ends if e is not None)

    def group_rows(self) -> list[dict[str, Any]]:
        st = self.state
        return [{"group": g, "live": list(self.live.get(g, ())), "drained": g in self.drained,
                 "in_send": g in st.send, "segments": [s.seg for s in st.consume if s.gid == g],
                 "backlog": self.backlog(g), "bytes": self.group_bytes(g)} for g in st.groups]

    def to_dict(self) -> dict[str, Any]:
        st = self.state
        open_seg = st.open_segment
        return {
            "queue": st.queue,
            "version": self.version,
            "config": attrs.asdict(self.config),
            "producer_epoch": st.producer_epoch,
            "send": list(st.send),
            "head": st.head,
            "open_segment": open_seg.seg if open_seg else None,
            "next_seg": st.next_seg,
            "trimmed_seq": st.trimmed_seq,
            "last_seq": self.last_seq,
            "stored": self.stored,
            "consume": [{**e.to_dict(), "bytes": self.sizes.get(e.seg)} for e in self.extents],
            "groups": self.group_rows(),
            "subscriptions": [s.to_dict() for s in self.subscriptions],
        }


def subscription_views(store: ZkStore, queue: str, last_seq: int | None) -> list[SubscriptionView]:
    out = []
    for sub in store.list_subscriptions(queue):
        try:
            cursor, _ = store.get_cursor(queue, sub)
            holder = store.subscription_holder(queue, sub)
            blocked = store.blocked(queue, sub)
            delay_ms = int(store.sub_settings(queue, sub).get("delay_ms", 0))
            waiting = store.waiting(queue, sub)
        except NotFound:
            continue  # deleted meanwhile
        behind = lag(cursor, last_seq)
        state = sub_state(lag=behind, held_by=holder, blocked=blocked, waiting=waiting, now_us=time.time_ns() // 1000)
        out.append(SubscriptionView(sub, cursor, behind, holder, blocked, delay_ms, waiting, state))
    return out


def describe_queue(store: ZkStore, reader: ReplicaReader, queue: str) -> QueueView:
    st, version = store.load_state(queue)
    cfg = store.queue_config(queue)
    extents = reader.extents(st)
    last = last_readable_seq(st, extents)
    return QueueView(
        state=st, version=version, config=cfg, extents=tuple(extents),
        live={g: tuple(sorted(store.live_members(g))) for g in st.groups},
        drained=store.drained_groups(st.groups),
        subscriptions=tuple(subscription_views(store, queue, last)),
        last_seq=last,
        sizes={s.seg: reader.stored_bytes(queue, s) for s in st.consume},
    )
